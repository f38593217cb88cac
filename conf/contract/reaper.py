"""What a run leaves behind that escaped its session, found and killed by the process that waited
for it: Linux's child subreaper (prctl(2) ``PR_SET_CHILD_SUBREAPER``).

A worker's children that start a session of their own (``os.setsid()``) or daemonize (a double
fork) are beyond ``host.kill_session``; once their parent dies the kernel re-parents them to the
nearest living ancestor that is a subreaper instead of to init. The process that waits for a
worker (a fork server's handler, the orchestrator's direct spawn) marks itself one, and once the
worker has ended kills and reaps its own children of the run (``kill_orphans``), round after
round, as each one's children are re-parented to it in turn. The fork server is one too: when its
owner dies it kills its handlers, and so their workers, and then what was re-parented to it
(``worker.forkserver``), since a handler killed with its server can no longer. Only children of the calling
process are signalled, and each is reaped by it: a pid that is its unreaped child cannot name
another process meanwhile, so nothing that is not a descendant is ever killed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable

from .host import process_stats

PR_SET_CHILD_SUBREAPER = 36
"""prctl(2)'s option that makes the calling process a subreaper of its descendants (Linux 3.4)."""

ORPHAN_REAP_S = 5.0
"""How long ``kill_orphans`` waits for the children it killed to end (seconds): SIGKILL ends a
process at once unless it is in an uninterruptible wait (a hung file system or driver)."""


def set_subreaper(on: bool = True) -> bool:
    """Make this process a child subreaper (``on``) or undo it: prctl(PR_SET_CHILD_SUBREAPER).

    The setting is the process's (all its threads), kept across execve(2) and not inherited by
    children created by fork(2).

    Args:
        on: True to become a subreaper, False to stop being one.

    Returns:
        Whether prctl accepted it (False where there is no prctl: not Linux).
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    return prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0


def child_pids(parent: int | None = None) -> list[int]:
    """The processes whose parent is ``parent``, zombies included: from the ``children`` file of each
    of its threads (/proc/<pid>/task/<tid>/children, Linux 4.2), else from every process's
    /proc/<pid>/stat field 4 (proc(5)).

    Args:
        parent: the parent's pid; None: this process.

    Returns:
        Their pids; [] where /proc cannot be read.
    """
    parent = os.getpid() if parent is None else parent
    try:
        tids = os.listdir(f"/proc/{parent}/task")
        found: set[int] = set()
        for tid in tids:
            with open(f"/proc/{parent}/task/{tid}/children") as f:
                found.update(int(p) for p in f.read().split())
        return sorted(found)
    except (OSError, ValueError):  # a kernel without the children files, or a thread gone meanwhile
        return _scanned_children(parent)


def _scanned_children(parent: int) -> list[int]:
    """``child_pids`` by reading every process's /proc/<pid>/stat (``host.process_stats``)."""
    return [pid for pid, fields in process_stats() if fields[1] == str(parent)]


def environment_holds(pid: int, entry: str) -> bool:
    """Whether process ``pid`` was started with ``entry`` in its environment (/proc/<pid>/environ).

    Args:
        pid: the process.
        entry: ``NAME=VALUE``.

    Returns:
        Whether it holds it; False when it cannot be read (a zombie, another user's process).
    """
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry.encode() in f.read().split(b"\0")
    except OSError:
        return False


def kill_orphans(belongs: Callable[[int], bool] | None = None, bound_s: float = ORPHAN_REAP_S) -> list[int]:
    """SIGKILL and reap this process's children (those ``belongs`` says are the run's; None: all),
    then again those re-parented to it meanwhile, until none is left or ``bound_s`` has passed.

    Call it in a subreaper (``set_subreaper``) once the worker has ended and has been reaped: its
    orphans are then this process's children. A child stays this process's until reaped here, so
    its pid names it while it is signalled.

    Args:
        belongs: which children are the run's (a test on the pid); None: every child.
        bound_s: the longest wait for the children killed to end (seconds).

    Returns:
        The pids killed (zombies reaped included).
    """
    me, killed = os.getpid(), []
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        children = [p for p in child_pids(me) if belongs is None or belongs(p)]
        if not children:
            break
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in children:
            _reap(pid, deadline)
        killed += children
    return killed


def _reap(pid: int, deadline: float) -> None:
    """Wait for the child ``pid`` to end and reap it, at most until ``deadline`` (monotonic)."""
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped already
            return
        if done or time.monotonic() >= deadline:
            return
        time.sleep(0.005)
