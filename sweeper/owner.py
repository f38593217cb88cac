"""Who owns a sweep's processes: the orchestrator (the Hydra process that runs the sweeper).

Everything memsweep starts dies with the process that started it (PR_SET_PDEATHSIG,
``worker/lifecycle.py``). A launcher's worker process (a joblib/loky worker, a
``submitit_local`` job) outlives a killed orchestrator, so the orchestrator names itself to them
(``OwnProcesses``, a Hydra callback, sets ``MEMSWEEP_OWNER``), and each job first calls
``guard_launcher_worker``: a launcher worker whose orchestrator is gone exits at once, and a
watchdog thread makes it exit within ``OWNER_POLL_S`` of the orchestrator's death even in the
middle of a job. A SLURM job, and a job on another host, belong to the scheduler: not guarded.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import secrets
import socket
import sys
import threading
import time
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from memsweep.conf.contract import boot_id, process_identity, process_state

log = logging.getLogger("memsweep")

OWNER_ENV = "MEMSWEEP_OWNER"
"""The orchestrator of the sweep, ``PID=IDENTITY`` (``conf.contract.process_identity``)."""

OWNER_POLL_S = 0.5
"""How often a launcher worker's watchdog looks at its orchestrator (seconds)."""

ORPHAN_EXIT = 1
"""The exit status of a launcher worker that stops because its orchestrator is gone (nobody reads it)."""

_watchdog_started = threading.Event()


def session_id() -> str:
    """Name one sweep session in the logs it appends to (search.jsonl): its start time (UTC),
    host, pid and a random token, so that concurrent sweeps on one directory, even started in the
    same second from one process, are told apart."""
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return f"{now}/{socket.gethostname()}:{os.getpid()}/{secrets.token_hex(4)}"


def claim_sweep() -> None:
    """In the sweep's main process, before its launcher starts: name this process the owner of
    every job (``MEMSWEEP_OWNER``, inherited by the launcher's worker processes)."""
    identity = process_identity()
    if identity is not None:
        os.environ[OWNER_ENV] = f"{os.getpid()}={identity}"


def owner_gone() -> bool:
    """Tell whether this process runs jobs for an orchestrator (``MEMSWEEP_OWNER``) that is gone.

    Returns:
        True when the orchestrator named is another process on this host (same boot) that no
        longer lives (its pid gone, or reused by another process); False when none is named, this
        process is the orchestrator, it runs elsewhere, or this is a SLURM job.
    """
    pid_text, _, identity = os.environ.get(OWNER_ENV, "").partition("=")
    if not pid_text.isdigit() or not identity or os.environ.get("SLURM_JOB_ID"):
        return False
    if int(pid_text) == os.getpid() or identity.split(":")[0] != boot_id():
        return False
    # a killed orchestrator its parent has not reaped yet (a zombie) keeps its identity, and is gone
    return process_identity(int(pid_text)) != identity or process_state(int(pid_text)) in ("Z", "X")


def _orphaned(where: str) -> None:
    """Exit now: the orchestrator is gone. What this process started dies with it (the fork
    server and spawned workers by PR_SET_PDEATHSIG, a forked run by its handler, which sees the
    connection close).

    The process ends itself (os._exit, from the watchdog thread too: no exception could stop
    it from there), with nobody to report to: why goes to the log (the current job's, and
    stderr; Python's last-resort handler when logging is not configured), not to a terminal.
    """
    log.error("memsweep: the sweep's orchestrator is gone; launcher worker %d stops (%s)", os.getpid(), where)
    for handler in logging.getLogger().handlers + log.handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(ORPHAN_EXIT)


def _watch() -> None:
    while True:
        time.sleep(OWNER_POLL_S)
        if owner_gone():
            _orphaned("watchdog")


def stop_if_orphaned(where: str, grace_s: float = 0.0) -> None:
    """In a launcher's worker process whose orchestrator is gone, exit now (``owner_gone``): before
    it starts anything more, such as a new attempt at a run whose fork server went away with the
    orchestrator. No-op otherwise (the orchestrator, a SLURM job, a live owner).

    Args:
        where: what the worker was about to do, for the log line.
        grace_s: in a launcher worker, how long to keep looking (seconds): a dying orchestrator's
            children (its fork server) are told of its death (PR_SET_PDEATHSIG) a moment before
            /proc shows it gone.
    """
    pid_text = os.environ.get(OWNER_ENV, "").partition("=")[0]
    deadline = time.monotonic() + (grace_s if pid_text.isdigit() and int(pid_text) != os.getpid() else 0.0)
    while True:
        if owner_gone():
            _orphaned(where)
        if time.monotonic() >= deadline:
            return
        time.sleep(0.05)


def guard_launcher_worker() -> None:
    """At the start of every job: in a launcher's worker process whose orchestrator is gone, exit
    (take no more work); otherwise make sure a watchdog thread ends this process within
    ``OWNER_POLL_S`` of the orchestrator's death. No-op in the orchestrator itself."""
    if owner_gone():
        _orphaned("before a job")
    pid_text = os.environ.get(OWNER_ENV, "").partition("=")[0]
    if not pid_text.isdigit() or int(pid_text) == os.getpid() or _watchdog_started.is_set():
        return
    _watchdog_started.set()
    threading.Thread(target=_watch, name="memsweep-owner-watchdog", daemon=True).start()


class OwnProcesses(Callback):
    """Hydra callback (``hydra.callbacks.owner``): at the multirun's start, in the main process,
    name it the owner of the launcher's worker processes (``claim_sweep``)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Hydra's hook at the multirun's start, before the launcher starts: ``claim_sweep``.

        Args:
            config: the composed config (unused).
            kwargs: Hydra's other arguments (unused).
        """
        claim_sweep()
