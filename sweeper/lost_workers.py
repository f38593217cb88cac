"""A launcher worker lost mid-sweep costs no run that its fork server kept, and never the sweep.

joblib's loky backend reports a worker process that died by raising ``TerminatedWorkerError``
(a ``BrokenProcessPool``) and kills the pool's other workers. A run of a sweep is not their
descendant (the sweep's fork server started it, and its handler keeps it).

``launch_surviving`` catches the loss; ``mark_lost`` records every run left in flight that was
not kept as a ``crash`` of the launcher's worker (``conf.contract.LAUNCHER_WORKER_LOST``), and
the batch is launched once more in a fresh pool: finished runs are found, kept runs taken over,
lost ones set aside into ``.attempts/N/`` and run again. A batch lost twice keeps its lost
records, for a resume to run again. submitit says the same of a SLURM job that ended without its
result (``scancel``, a failure): ``UncompletedJobError``; one SLURM ended at its time limit is
recorded as its run's ``timeout`` (``mark_time_limit``), never run again.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from memsweep.conf.contract import (
    LAUNCHER_WORKER_LOST,
    RECORD_FILE,
    RESULT_FILE,
    SCHEMA_VERSION,
    SLURM_TIME_LIMIT,
    find_run_dirs,
    try_read,
    write_json_atomic,
)

from .kept_runs import HANDOVER_S, read_exit_status
from .launcher_bounds import bound_launcher
from .liveness import POLL_S, worker_alive
from .process import LOCK_FILE

log = logging.getLogger("memsweep")

DYING_S = 2.0
"""How long a run's worker may take to die with its launcher worker (seconds; PR_SET_PDEATHSIG
kills it at once). One that still runs after it was kept by its fork-server handler."""

LOST_ERRORS = ("TerminatedWorkerError", "BrokenProcessPool", "UncompletedJobError")
"""Exception class names (loky, concurrent.futures; submitit: a SLURM job that ended without its
result, cancelled, failed or at its time limit) by which a launcher says one of its worker
processes died; matched by name so that the sweeper imports neither joblib nor submitit."""

SLURM_JOB = re.compile(r"Job (?P<job>\d+)_(?P<index>\d+) \(task|/(?P<job2>\d+)_(?P<index2>\d+)_\d+_log\.err")
"""The SLURM array job (``ID_INDEX``) a submitit error names: UncompletedJobError's first words,
FailedJobError's path of the job's log."""
TIME_LIMIT = re.compile(r"\(state: TIMEOUT\)|Job not requeued because: timed-out")
"""submitit's words for a job ended at its time limit: sacct's state TIMEOUT (SLURM killed it), or
submitit's own stop at SLURM's warning signal (``hydra.launcher.signal_delay_s`` before the limit)."""


def is_lost_worker(exc: BaseException) -> bool:
    """Tell whether ``exc`` says that a launcher's worker process died (``LOST_ERRORS``)."""
    return any(cls.__name__ in LOST_ERRORS for cls in type(exc).__mro__)


def lost_envelope(record: dict | None, why: str) -> dict:
    """The result envelope (RESULT_FIELDS) of a run stopped with its launcher worker.

    Args:
        record: the run's record so far, or None.
        why: the launcher's error, in words.

    Returns:
        A ``crash`` with ``error_type`` ``LAUNCHER_WORKER_LOST`` and a message saying it is
        not the load's doing.
    """
    record = record or {}
    return {
        "schema_version": SCHEMA_VERSION,
        "outcome": "crash",
        "failed_phase": record.get("current_phase") if isinstance(record.get("current_phase"), str) else None,
        "error_type": LAUNCHER_WORKER_LOST,
        "error_message": f"the launcher's worker process running this job died ({why}); the run was stopped "
        "with it: not the load's doing. The sweep runs it again once; else a resume does",
        "returncode": None,
        "signal": None,
        "timed_out": False,
        "wall_s": None,
        "worker_pid": record.get("pid") if isinstance(record.get("pid"), int) else None,
        "record_problem": None,
        "predicted_outcome": None,  # crashed with its launcher worker: no verdict
    }


def mark_time_limit(exc: BaseException, run_dirs: list[Path]) -> Path | None:
    """Record the run of a SLURM job that SLURM ended at its time limit as a ``timeout``
    (``error_type`` ``SLURM_TIME_LIMIT``: the load's outcome under that limit, not run again), when
    ``exc`` is submitit's word that job ``ID_INDEX`` (``SLURM_JOB``) ended at its time limit
    (``TIME_LIMIT``); its array index is the job's place in ``run_dirs``. A run that already has its result keeps it.

    Returns:
        The run directory recorded, or None (another error, another state, a result already there).
    """
    found = SLURM_JOB.search(str(exc))
    if found is None or not TIME_LIMIT.search(str(exc)):
        return None
    job, index = found["job"] or found["job2"], int(found["index"] or found["index2"])
    if index >= len(run_dirs) or (run_dirs[index] / RESULT_FILE).exists():
        return None
    run_dir = run_dirs[index]
    record, _ = try_read(run_dir, RECORD_FILE)
    envelope = at_time_limit(
        lost_envelope(record, f"SLURM job {job}_{index} ended at its time limit"), f"{job}_{index}"
    )
    write_json_atomic(run_dir / RESULT_FILE, envelope)
    return run_dir


def at_time_limit(envelope: dict[str, Any], job: str | None) -> dict[str, Any]:
    """A lost run's result envelope as the ``timeout`` of SLURM job ``job`` at its time limit
    (error type ``SLURM_TIME_LIMIT``), updated in place and returned."""
    envelope.update(
        outcome="timeout",
        error_type=SLURM_TIME_LIMIT,
        timed_out=True,
        error_message=f"SLURM ended job {job} at its time limit (hydra.launcher.timeout_min)",
    )
    return envelope


def mark_lost(sweep_dir: Path, why: str) -> tuple[list[Path], list[Path]]:
    """Record every run of ``sweep_dir`` left in flight by a lost launcher worker, except those
    its fork-server handler kept.

    A run is in flight when it holds a spec.json but no result.json, its record (if any) is not
    complete, and no live process holds its run lock (another orchestrator's runs are left
    alone). A run whose handler says it kept it (``EXIT_STATUS_FILE``: the handler writes it as
    it takes the run over), or whose worker still runs ``DYING_S`` after the loss, was kept: the
    next launch takes it over (``sweeper.kept_runs``). A run whose worker died and whose handler
    wrote nothing within ``HANDOVER_S`` of that gets its result.json (``lost_envelope``). The runs
    are watched together, each under its lock: however many were in flight, the whole wait is
    at most ``DYING_S + HANDOVER_S``.

    Args:
        sweep_dir: the sweep directory.
        why: the launcher's error, in words.

    Returns:
        (the run directories recorded lost, those kept by their handler), each in
        ``find_run_dirs`` order.
    """
    with contextlib.ExitStack() as locks:
        in_flight: dict[Path, dict | None] = {}
        for run_dir in find_run_dirs([sweep_dir]):
            if (run_dir / RESULT_FILE).exists():
                continue
            try:
                locks.enter_context(FileLock(run_dir / LOCK_FILE, timeout=0))
            except Timeout:
                continue  # a live process runs it
            record, _ = try_read(run_dir, RECORD_FILE)
            if record is None or not record.get("complete"):  # a complete one: the next launch writes its result
                in_flight[run_dir] = record
        kept = _watch(in_flight)
        lost = [run_dir for run_dir in in_flight if run_dir not in kept]
        for run_dir in lost:
            write_json_atomic(run_dir / RESULT_FILE, lost_envelope(in_flight[run_dir], why))
    return lost, [run_dir for run_dir in in_flight if run_dir in kept]


def _watch(in_flight: dict[Path, dict | None]) -> set[Path]:
    """The runs of ``in_flight`` (run directory -> record) kept by their handler: see ``mark_lost``."""
    start = time.monotonic()
    died_at: dict[Path, float] = {}
    kept: set[Path] = set()
    undecided = set(in_flight)
    while undecided:
        now = time.monotonic()
        for run_dir in sorted(undecided):
            if read_exit_status(run_dir) is not None:
                kept.add(run_dir)  # its handler took it over
            elif not worker_alive(in_flight[run_dir]):
                if now - died_at.setdefault(run_dir, now) < HANDOVER_S:
                    continue  # its handler may still be writing its status
            elif now - start < DYING_S:
                continue  # it may still die with its launcher worker
            else:
                kept.add(run_dir)  # it outlived its launcher worker: its handler keeps it
            undecided.discard(run_dir)
        if undecided:
            time.sleep(POLL_S)
    return kept


def launch_surviving(
    launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int, sweep_dir: Path, run_dirs: list[Path]
) -> Sequence[Any]:
    """``launcher.launch`` that survives the loss of a launcher worker process.

    Args:
        launcher: the Hydra launcher.
        job_overrides: the jobs' overrides.
        initial_job_idx: the first job's number.
        sweep_dir: the sweep directory (scanned for runs left in flight).
        run_dirs: each job's run directory, in order (for the results of a batch lost twice).

    Returns:
        The launcher's JobReturns; for a batch lost twice, one JobReturn per job whose
        ``return_value`` is the result envelope its directory holds (``lost_envelope`` where none).

    Raises:
        Exception: whatever else the launcher raised.
    """
    bound_launcher(launcher, len(job_overrides))
    for attempt in (1, 2):
        try:
            return launcher.launch(job_overrides, initial_job_idx=initial_job_idx)
        except Exception as exc:
            if not is_lost_worker(exc) and not TIME_LIMIT.search(str(exc)):
                raise
            why = f"{type(exc).__name__}: {' '.join(str(exc).splitlines()[:2])}"
            timed_out = mark_time_limit(exc, run_dirs)
        if timed_out is not None:
            log.warning("%s: SLURM ended its job at its time limit: recorded as a timeout", timed_out)
        lost, kept = mark_lost(sweep_dir, why)
        again = "launching the batch once more" if attempt == 1 else "left for a resume"
        log.warning(
            "a launcher worker process died (%s); runs that went on under the fork server, taken over "
            "(not run again): %s; runs stopped with it, recorded as %s: %s; %s",
            why,
            ", ".join(p.name for p in kept) or "none",
            LAUNCHER_WORKER_LOST,
            ", ".join(p.name for p in lost) or "none",
            again,
        )
    from hydra.core.utils import JobReturn, JobStatus

    returns = []
    for run_dir in run_dirs:
        result, _ = try_read(run_dir, RESULT_FILE)
        ret = JobReturn(status=JobStatus.COMPLETED, _return_value=result or lost_envelope(None, why))
        returns.append(ret)
    return returns
