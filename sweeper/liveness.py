"""Whether a process memsweep started is still that process: a pid alone is not enough.

A run's record names its worker by pid and by identity (``conf.contract.process_identity``:
the boot's id and the process's start time). After a restart, or when a sweep is resumed on
another host of a shared file system, the pid may belong to an unrelated live process; these
checks tell the two apart, so a resume never waits on a stranger.
"""

from __future__ import annotations

import datetime as _dt
import logging
import time
from collections.abc import Mapping

from memsweep.conf.contract import pid_exists, process_identity, process_started_epoch

log = logging.getLogger("memsweep")

POLL_S = 0.2
"""How often a bounded wait looks again (seconds)."""

START_SLACK_S = 2.0
"""A process that started more than this after a record's ``started_at`` is not its writer
(seconds; the record is written after its process started, clocks read at ~10 ms)."""


def is_process(pid: int | None, identity: str | None, started_at: str | None = None) -> bool:
    """Tell whether ``pid`` is still the process that was given that pid and identity.

    Args:
        pid: the process id.
        identity: its ``process_identity`` when it was recorded; None when unknown.
        started_at: without an identity, the UTC ISO 8601 time the process wrote its record
            (record ``started_at``): a process that started later is not the writer.

    Returns:
        False when no process has this pid, or the one that has it is another process (another
        identity, or started after ``started_at``); True otherwise (a live process that cannot
        be told apart is taken to be it).
    """
    if pid is None or not pid_exists(pid):
        return False
    if identity is not None:
        return process_identity(pid) == identity  # None: /proc unreadable or the process just ended
    if started_at:
        try:
            written = _dt.datetime.fromisoformat(started_at).timestamp()
        except (TypeError, ValueError):
            return True
        began = process_started_epoch(pid)
        if began is not None and began > written + START_SLACK_S:
            return False
    return True


def wait_for_old_worker(record: Mapping | None, timeout_s: float, where: object) -> bool:
    """Wait, at most ``timeout_s`` seconds, for the worker an earlier attempt left running to end.

    Its orchestrator was killed; the worker dies with it (PR_SET_PDEATHSIG), or is still
    finishing. A pid that now belongs to another process (``is_process``) is not waited for.

    Args:
        record: the earlier attempt's record (``pid``, ``pid_identity``, ``started_at``), or None.
        timeout_s: the bound (seconds): the run's ``timeout_s``.
        where: the run directory, for the message.

    Returns:
        True when that worker is gone (or was never there), False when it still ran at the bound.
    """
    record = record if isinstance(record, Mapping) else {}
    pid, identity, started = record.get("pid"), record.get("pid_identity"), record.get("started_at")
    if not is_process(pid, identity, started):
        return True
    log.warning(
        "%s: the earlier attempt's worker (pid %s) still runs; waiting at most %.0f s for it to end",
        where,
        pid,
        timeout_s,
    )
    deadline = time.monotonic() + timeout_s
    while is_process(pid, identity, started):
        if time.monotonic() >= deadline:
            log.warning("%s: the earlier attempt's worker (pid %s) still runs after %.0f s", where, pid, timeout_s)
            return False
        time.sleep(POLL_S)
    return True


def worker_alive(record: Mapping | None) -> bool:
    """Tell whether the worker a run's record names still runs (``is_process`` on its ``pid``,
    ``pid_identity`` and ``started_at``).

    Args:
        record: the run's record, or None (no worker known: False).

    Returns:
        True while that process lives (a zombie not yet reaped included).
    """
    record = record if isinstance(record, Mapping) else {}
    return is_process(record.get("pid"), record.get("pid_identity"), record.get("started_at"))
