"""The worker's life bound to its parent's (stdlib only: the fork server imports it before torch)."""

from __future__ import annotations

import ctypes
import signal


def die_with_parent() -> None:
    """Linux prctl(PR_SET_PDEATHSIG, SIGKILL): if the orchestrator is killed, its worker dies
    too, instead of running on unobserved; the partial record stays for the resumed sweep.

    Where prctl is unavailable (not Linux) nothing happens (no error): prctl(2).
    """
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
