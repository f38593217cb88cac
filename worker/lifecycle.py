"""The worker's life bound to its parent's (stdlib only: the fork server imports it before torch)."""

from __future__ import annotations

import ctypes
import os
import signal
import threading


def die_with_parent(parent: int | None = None, signum: int = signal.SIGKILL) -> None:
    """Linux prctl(PR_SET_PDEATHSIG, ``signum``): if the orchestrator is killed, its worker dies
    too, instead of running on unobserved; the partial record stays for the resumed sweep.

    The signal is armed only from this call on: a parent that died before it is not signalled
    (prctl(2)). With ``parent`` (the pid of the process that started this one), a process whose
    parent is already another one sends itself the signal at once, as its parent's death would have.

    Where prctl is unavailable (not Linux) nothing happens (no error): prctl(2).

    Args:
        parent: the pid this process was started by, or None (no check).
        signum: the signal (SIGKILL; the fork server takes SIGTERM, which it handles: it kills
            its runs' processes before it exits).
    """
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signum))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:  # re-parented before the signal was armed
        os.kill(os.getpid(), signum)


def parent_from_env(value: str | None) -> int | None:
    """The parent pid named by ``conf.contract.PARENT_ENV``'s value, or None (unset, not a pid)."""
    return int(value) if value and value.isdigit() else None


_forks_armed = threading.Event()


def children_die_with_me() -> None:
    """Make every child this process forks from its main thread die with it: PR_SET_PDEATHSIG
    (SIGKILL) armed in the child right after ``os.fork`` (``os.register_at_fork``; inherited, so
    their own forked children die with them in turn). A forward that forks, a DataLoader worker,
    a DDP rank then goes with a worker killed by any means, its group kill included.

    prctl(2) signals at the death of the forking *thread*: a child forked from another thread is
    left unarmed (that thread may end long before the process). Programs started by
    ``subprocess`` fork in C, past these hooks: they share the worker's process group and session,
    which whoever waits for the worker kills (``conf.contract.kill_session``). Once per process;
    nothing happens where prctl is unavailable.
    """
    if _forks_armed.is_set():
        return
    _forks_armed.set()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up now: nothing to load in the child
    except (OSError, AttributeError):
        return
    from_main = [False]

    def before() -> None:
        from_main[0] = threading.current_thread() is threading.main_thread()

    def in_child() -> None:
        if from_main[0]:
            prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG

    os.register_at_fork(before=before, after_in_child=in_child)
