"""Starting a worker process: its environment, a new interpreter per run (``isolation=spawn``),
and killing what a run left behind.

The fork server's client (``sweeper.forkserver_client``) and ``sweeper.process.execute`` start
workers through these; nothing here reads or classifies what a worker left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from memsweep.conf.contract import (
    PARENT_ENV,
    SPEC_FILE,
    STDERR_FILE,
    STDOUT_FILE,
    WORKER_COMMAND,
    RunSpec,
    environment_holds,
    kill_orphans,
    kill_session,
    set_subreaper,
)

RUN_TOKEN_ENV = "MEMSWEEP_RUN_TOKEN"
"""A directly spawned worker's environment variable holding a random token of its run: its
descendants inherit it, which tells the run's orphans from this process's other children
(``run_spawn``)."""


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker process (or of the fork server that forks workers).

    This process's environment, plus ``extra``, plus the C allocator settings that keep a CPU
    capacity (RLIMIT_DATA) about tensors: ``MALLOC_ARENA_MAX=2`` and
    ``MALLOC_MMAP_THRESHOLD_=131072`` (set only when not set already; mallopt(3)), and
    ``PYTHONUNBUFFERED=1`` so that a killed worker's logs are complete.

    Args:
        extra: variables for the worker only (a device lease's CUDA_VISIBLE_DEVICES,
            MEMSWEEP_CPU_CORES, the isolation); they win over this process's.

    Returns:
        A new mapping; ``os.environ`` is not changed.
    """
    env = dict(os.environ)
    env.update(extra or {})
    # CPU capacity emulation (RLIMIT_DATA) should be about tensors, not the C allocator's
    # bookkeeping: few malloc arenas, and blocks from 128 KiB up served by mmap and returned
    # at free (mallopt(3) M_MMAP_THRESHOLD; a fixed threshold also turns off glibc's dynamic
    # one, whose heap growth made identical runs OOM at different sizes).
    env.setdefault("MALLOC_ARENA_MAX", "2")
    env.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
    env["PYTHONUNBUFFERED"] = "1"
    return env


class WorkerExit(NamedTuple):
    """How a worker process ended.

    Attributes:
        returncode: its exit status; negative: the signal that ended it; None: unknown (its
            handler never said, after it was killed at its timeout).
        timed_out: whether it was killed at ``spec.timeout_s``.
        pid: its process id.
        wall_s: seconds from its start to its end.
    """

    returncode: int | None
    timed_out: bool
    pid: int
    wall_s: float


def run_spawn(run_dir: Path, env: dict[str, str], spec: RunSpec) -> WorkerExit:
    """Run one worker in a new interpreter: ``python -m memsweep.worker spec.json`` in its own session,
    its output in the run directory's stdout.log and stderr.log, killed (with its process
    group) after ``spec.timeout_s`` seconds. A sweep's spawned runs are started the same way by
    its fork server's handler instead (``worker.launch.spawn``), so that they outlive a killed
    launcher worker; this is for a process without the sweep's server.

    Whatever ended the worker, what it started dies with it: its session, then the run's orphans
    (children that left its session), which this process, a child subreaper while it waits for a
    run (``conf.contract.reaper``), finds among its own children by the run's ``RUN_TOKEN_ENV``.

    Args:
        run_dir: the run directory, holding spec.json already.
        env: the worker's environment (``worker_env``); ``PARENT_ENV`` is added, naming this
            process as the worker's parent, and ``RUN_TOKEN_ENV``.
        spec: the run's spec (for its ``timeout_s``).

    Returns:
        Its ``WorkerExit``.
    """
    timed_out = False
    token = uuid.uuid4().hex
    with subreaper(), open(run_dir / STDOUT_FILE, "wb") as out, open(run_dir / STDERR_FILE, "wb") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, *WORKER_COMMAND, str(run_dir / SPEC_FILE)],
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            cwd=run_dir,
            # the worker dies with this process; the token names its descendants
            env={**env, PARENT_ENV: str(os.getpid()), RUN_TOKEN_ENV: token},
            start_new_session=True,
        )
        if not ended_within(proc.pid, t0 + spec.timeout_s):
            timed_out = True
            kill_process_group(proc.pid)
            ended_within(proc.pid, None)
        kill_session(proc.pid)  # whatever ended it, what it started dies with it (not yet reaped)
        returncode = proc.wait()
        kill_orphans(lambda pid: environment_holds(pid, f"{RUN_TOKEN_ENV}={token}"))  # and what left its session
    return WorkerExit(returncode, timed_out, proc.pid, time.monotonic() - t0)


_subreaping = [0]  # runs of this process being waited for (``subreaper``)
_subreaping_lock = threading.Lock()


@contextmanager
def subreaper() -> Iterator[None]:
    """This process is a child subreaper (``conf.contract.set_subreaper``) while at least one of its
    runs is waited for (runs may be waited for from several threads), and no more after: a
    process re-parented to it outside a run would stay its zombie."""
    with _subreaping_lock:
        if _subreaping[0] == 0:
            set_subreaper(True)
        _subreaping[0] += 1
    try:
        yield
    finally:
        with _subreaping_lock:
            _subreaping[0] -= 1
            if _subreaping[0] == 0:
                set_subreaper(False)


def ended_within(pid: int, deadline: float | None, poll_s: float = 0.05) -> bool:
    """Wait until the child ``pid`` has ended, without reaping it (waitid(2) WNOWAIT: its pid stays
    its own, and its group's, until it is reaped), at most until ``deadline``.

    Args:
        pid: a child of this process.
        deadline: a ``time.monotonic()`` time; None: no bound.
        poll_s: how often to look (seconds) while a deadline is set.

    Returns:
        Whether it has ended (a zombie, or already reaped by someone else).
    """
    try:
        if deadline is None:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            return True
        while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
    except ChildProcessError:
        pass
    return True


def kill_process_group(pid: int) -> None:
    """SIGKILL the process group and session led by ``pid`` (a worker runs in a session of its own,
    ``conf.contract.kill_session``), and the process itself; a process already gone is not an
    error."""
    kill_session(pid)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
