"""The worker's life bound to its parent's (stdlib only: the fork server imports it before torch)."""

from __future__ import annotations

import ctypes
import os
import signal


def die_with_parent(parent: int | None = None) -> None:
    """Linux prctl(PR_SET_PDEATHSIG, SIGKILL): if the orchestrator is killed, its worker dies
    too, instead of running on unobserved; the partial record stays for the resumed sweep.

    The signal is armed only from this call on: a parent that died before it is not signalled
    (prctl(2)). With ``parent`` (the pid of the process that started this one), a process whose
    parent is already another one kills itself at once, as the signal would have.

    Where prctl is unavailable (not Linux) nothing happens (no error): prctl(2).

    Args:
        parent: the pid this process was started by, or None (no check).
    """
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:  # re-parented before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)


def parent_from_env(value: str | None) -> int | None:
    """The parent pid named by ``conf.contract.PARENT_ENV``'s value, or None (unset, not a pid)."""
    return int(value) if value and value.isdigit() else None
