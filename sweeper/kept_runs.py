"""Runs that went on after their launcher worker died, kept by their fork-server handler.

A run of a sweep, forked (``isolation=forkserver``) or spawned by the server's handler
(``isolation=spawn``), belongs to the sweep's fork server, not to the launcher worker (a
joblib/loky worker) that asked for it. When that worker dies (killed, or
killed by loky with the rest of a broken pool), the run's handler keeps it, to its end or its
``timeout_s``, and says so in the run directory (``conf.contract.EXIT_STATUS_FILE``): first
``ended: false`` once it has taken the run over, then the worker's exit status once it ended
(``worker.forkserver``). The sweeper that launches the job again reads it here and takes the
run over instead of running it twice (``sweeper.process``), and ``sweeper.lost_workers`` leaves
such a run alone instead of recording it lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

from memsweep.conf.contract import EXIT_STATUS_FILE, document_problems, try_read

from .liveness import POLL_S, is_process, wait_for_old_worker, worker_alive

log = logging.getLogger("memsweep")

HANDOVER_S = 3.0
"""How long a fork-server handler may take to write a kept run's exit status once its worker
ended (seconds; an atomic write with fsync: milliseconds, more on a loaded file system)."""


def read_exit_status(run_dir: Path) -> dict | None:
    """The exit status a fork-server handler wrote for a run it kept (``EXIT_STATUS_FILE``).

    Args:
        run_dir: the run directory.

    Returns:
        The document (``ended`` false while the run goes on), or None when there is none, or it
        cannot be read or breaks the published schema (``document_problems``; said in the log).
    """
    if not (run_dir / EXIT_STATUS_FILE).exists():
        return None
    status, problem = try_read(run_dir, EXIT_STATUS_FILE)
    wrong = "; ".join(document_problems(status, "exit_status")) if status is not None else problem
    if wrong:
        log.warning("%s: %s ignored (%s)", run_dir, EXIT_STATUS_FILE, wrong)
        return None
    return status


def wait_for_kept_run(run_dir: Path, record: Mapping | None, bound_s: float) -> dict | None:
    """Wait for a run kept by its handler to end; returns its final exit status.

    Waits while its worker runs (at most ``bound_s`` seconds: the run's ``timeout_s``, which its
    handler enforces from the fork), then at most ``HANDOVER_S`` for the handler's final status,
    not at all once the handler is gone (``handler_alive``).

    Args:
        run_dir: the run directory.
        record: the run's record (names its worker), or None (the status's ``worker_pid`` is used).
        bound_s: the bound on the run (seconds).

    Returns:
        The exit status with ``ended`` true; None when the run was not kept, or no final status
        came (its handler died: the orchestrator that started it is gone).
    """
    status = read_exit_status(run_dir)
    if status is None or status.get("ended"):
        return status
    if isinstance(record, Mapping) and record.get("pid") is not None:
        wait_for_old_worker(record, bound_s, run_dir)
    else:
        deadline = time.monotonic() + bound_s
        while is_process(status.get("worker_pid"), None) and time.monotonic() < deadline:
            time.sleep(POLL_S)
    deadline = time.monotonic() + HANDOVER_S
    while True:
        status = read_exit_status(run_dir) or status
        if status.get("ended"):
            return status
        if not handler_alive(status):  # it died with the sweep's fork server: nothing more will come
            log.info("%s: its fork-server handler ended before the run (the sweep that started it is gone)", run_dir)
            return None
        if time.monotonic() >= deadline or worker_alive(record):
            log.warning(
                "%s: the run's fork-server handler kept it but wrote no final exit status within %.0f s",
                run_dir,
                HANDOVER_S,
            )
            return None
        time.sleep(POLL_S)


def handler_alive(status: Mapping) -> bool:
    """Tell whether the fork-server handler that wrote a kept run's status may still write its final one.

    Args:
        status: the run's exit status (``handler_pid``, ``handler_identity``; a status written
            before they were recorded names neither).

    Returns:
        False when the handler is known to be gone (its pid gone, or now another process's);
        True when it lives or is not named (then only ``HANDOVER_S`` bounds the wait).
    """
    pid = status.get("handler_pid")
    return pid is None or is_process(pid, status.get("handler_identity"))
