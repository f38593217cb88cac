"""A launcher worker lost mid-sweep costs no run that its fork server kept, and never the sweep.

joblib's loky backend (``hydra/launcher=joblib``) reports a worker process that died (the OOM
killer, ``kill -9``) by raising ``TerminatedWorkerError`` (a ``BrokenProcessPool``) from
``Parallel.__call__``, which Hydra's joblib launcher lets through; loky then also kills the
pool's other workers with all their descendants (``loky.backend.utils.kill_process_tree``,
called by ``_ExecutorManagerThread.terminate_broken``), and the launcher returns no result for
the batch.

A run of a sweep is not a descendant of a launcher worker: the sweep's fork server, a child of
the orchestrator, forked it (``isolation=forkserver``) or its handler started it as a new
interpreter (``isolation=spawn``), and that handler keeps it when its launcher worker dies
(``worker.forkserver``), to its end or its ``timeout_s``, writing its exit status into the run
directory. Only a run started from a launcher worker's own fork server (the sweep's was gone)
is the launcher worker's descendant and dies with it.

``launch_surviving`` catches the loss; ``mark_lost`` leaves the kept runs alone and records
every other run left in flight as a ``crash`` of the launcher's worker
(``conf.contract.LAUNCHER_WORKER_LOST``, never the load's outcome); the batch is then launched
once more in a fresh pool: finished runs are found, a kept run is waited for and taken over
(its result built from its handler's exit status: it runs once), a run recorded lost is set
aside into ``.attempts/N/`` and run again (``sweeper.process``). A batch lost twice keeps its
lost records, for a resume to run again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from conf.contract import (
    LAUNCHER_WORKER_LOST,
    RESULT_FILE,
    SCHEMA_VERSION,
    find_run_dirs,
    try_read,
    write_json_atomic,
)

from .kept_runs import HANDOVER_S, read_exit_status
from .liveness import POLL_S, worker_alive
from .process import LOCK_FILE

log = logging.getLogger("memsweep")

DYING_S = 2.0
"""How long a run's worker may take to die with its launcher worker (seconds; PR_SET_PDEATHSIG
kills it at once). One that still runs after it was kept by its fork-server handler."""

LOST_ERRORS = ("TerminatedWorkerError", "BrokenProcessPool")
"""Exception class names (loky, concurrent.futures) by which a launcher says one of its worker
processes died; matched by name so that the sweeper does not import joblib."""


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
    }


def mark_lost(sweep_dir: Path, why: str) -> tuple[list[Path], list[Path]]:
    """Record every run of ``sweep_dir`` left in flight by a lost launcher worker, except those
    its fork-server handler kept.

    A run is in flight when it holds a spec.json but no result.json, its record (if any) is not
    complete, and no live process holds its run lock (another orchestrator's runs are left
    alone). A run whose handler says it kept it (``EXIT_STATUS_FILE``, awaited ``HANDOVER_S``:
    the handler writes it as it takes the run over), or whose worker still runs after ``DYING_S``,
    was kept: the next launch takes it over (``sweeper.kept_runs``). Every other one gets its
    result.json (``lost_envelope``).

    Args:
        sweep_dir: the sweep directory.
        why: the launcher's error, in words.

    Returns:
        (the run directories recorded lost, those kept by their handler).
    """
    lost, kept = [], []
    for run_dir in find_run_dirs([sweep_dir]):
        if (run_dir / RESULT_FILE).exists():
            continue
        try:
            with FileLock(run_dir / LOCK_FILE, timeout=0):
                record, _ = try_read(run_dir, "record.json")
                if record is not None and record.get("complete"):
                    continue  # it ended: the next launch (or a resume) writes its result
                deadline = time.monotonic() + DYING_S
                while worker_alive(record) and read_exit_status(run_dir) is None and time.monotonic() < deadline:
                    time.sleep(POLL_S)
                if worker_alive(record) or _status_within(run_dir, HANDOVER_S) is not None:
                    kept.append(run_dir)
                    continue
                write_json_atomic(run_dir / RESULT_FILE, lost_envelope(record, why))
                lost.append(run_dir)
        except Timeout:
            continue  # a live process runs it
    return lost, kept


def _status_within(run_dir: Path, bound_s: float) -> dict | None:
    deadline = time.monotonic() + bound_s
    while (status := read_exit_status(run_dir)) is None and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return status


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
    for attempt in (1, 2):
        try:
            return launcher.launch(job_overrides, initial_job_idx=initial_job_idx)
        except Exception as exc:
            if not is_lost_worker(exc):
                raise
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
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
