"""A run inside a SLURM job that SLURM ends: ``scancel``, preemption or the time limit.

SLURM ends a job by sending SIGTERM to all its processes (and SIGKILL ``KillWait`` seconds later);
submitit's job process ignores that SIGTERM, the run's worker dies of it. Such a run is not the
load's doing: ``ended_by_slurm`` turns it into its run's result instead of the ``crash`` the worker's
signal would read as: a ``timeout`` (``conf.contract.SLURM_TIME_LIMIT``, kept on resume) when SLURM
says the job reached its time limit (``scontrol show job``: state TIMEOUT) or submitit stopped it at
SLURM's warning signal before the limit; else a lost launcher worker
(``conf.contract.LAUNCHER_WORKER_LOST``), which a resume runs again. Outside a SLURM job
(no ``SLURM_JOB_ID``) nothing changes. Reference: https://slurm.schedmd.com/scancel.html,
https://slurm.schedmd.com/sbatch.html (``--signal``, ``--time``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from memsweep.conf.contract import RECORD_FILE, RESULT_FILE, try_read, write_json_atomic

from .lost_workers import TIME_LIMIT, at_time_limit, lost_envelope

log = logging.getLogger("memsweep")


@contextlib.contextmanager
def sigterm_seen() -> Iterator[list[int]]:
    """Inside a SLURM job's main thread, note every SIGTERM (the list it yields grows by one per
    signal) and pass it on to the handler before (submitit's); elsewhere a list that stays empty."""
    seen: list[int] = []
    if not os.environ.get("SLURM_JOB_ID"):
        yield seen
        return
    before = signal.getsignal(signal.SIGTERM)

    def note(signum: int, frame: Any) -> None:
        seen.append(signum)
        if callable(before):
            before(signum, frame)

    try:
        signal.signal(signal.SIGTERM, note)
    except ValueError:  # not the main thread
        yield seen
        return
    try:
        yield seen
    finally:
        signal.signal(signal.SIGTERM, before)


def job_state(job_id: str | None) -> str | None:
    """The SLURM job's state as ``scontrol show job -o`` gives it (RUNNING, TIMEOUT, CANCELLED,
    PREEMPTED...), None when scontrol does not answer within 10 s."""
    if not job_id:
        return None
    try:
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = dict(w.split("=", 1) for w in out.split() if "=" in w)
    return words.get("JobState")


def ended_by_slurm(run_dir: Path, run: Callable[[], dict]) -> dict:
    """``run()`` (the run's ``sweeper.process.execute``), its result replaced when SLURM ended the
    job meanwhile (the module's docstring): result.json rewritten and returned.

    Returns:
        ``run()``'s result envelope, or the envelope of the run SLURM ended.

    Raises:
        Exception: whatever ``run()`` raised, when SLURM did not end the job.
    """
    if not os.environ.get("SLURM_JOB_ID"):
        return run()
    with sigterm_seen() as seen:
        try:
            result = run()
        except Exception as exc:
            if not seen and not TIME_LIMIT.search(str(exc)):
                raise
            timed_out = bool(TIME_LIMIT.search(str(exc)))
        else:
            if not seen or result.get("resumed") or result.get("outcome") != "crash":
                return result  # the run ended by itself (ok, oom, error) before SLURM ended the job
            timed_out = False
    job = os.environ.get("SLURM_JOB_ID")
    timed_out = timed_out or job_state(job) == "TIMEOUT"
    record, _ = try_read(run_dir, RECORD_FILE)
    envelope = lost_envelope(record, f"SLURM ended job {job}")
    if timed_out:
        at_time_limit(envelope, job)
    write_json_atomic(run_dir / RESULT_FILE, envelope)
    log.warning(
        "%s: SLURM ended job %s: recorded as %s (%s)", run_dir, job, envelope["outcome"], envelope["error_type"]
    )
    return envelope
