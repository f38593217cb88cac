"""A DDP or FSDP run (spec ``parallel``): ``world_size`` rank processes started for this run,
watched, stopped together, and their records merged into the run's one record.json.

The run's worker forks the ranks (``torch.multiprocessing.start_processes``, start method
``fork``) and waits on them; each rank (``worker/rank.py``) writes ``ranks/rank_N.json``. The
first rank that fails stops the others (SIGTERM, SIGKILL after ``ABORT_GRACE_S``). The outcome is
the root cause: a signal memsweep did not send (``crash``; the worker then dies by it), else an
OOM, else an error; a rank memsweep stopped is ``aborted``. The merged record is rank 0's with
``ranks``, ``failed_rank``, ``peak_rank`` and, per phase, the root-cause rank's entry with every
rank's (``conf.contract.record.RANK_FIELDS``, ``PHASE_RANK_FIELDS``). For ranks as SLURM tasks, rank 0's
task merges the records the others write (``MERGE_WAIT_S``); other tasks run ``task_rank``.

See the docs' page on parallel runs for the full account.
References: https://pytorch.org/docs/stable/multiprocessing.html (start_processes).
"""

from __future__ import annotations

import json
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from memsweep.conf.contract import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_OOM,
    EXIT_UNAVAILABLE,
    PHASE_RANK_FIELDS,
    RunSpec,
    SpecError,
    ranks_are_tasks,
)

from .measure import Recorder
from .slurm import slurm_rendezvous

ABORT_GRACE_S = 5.0
"""Seconds a rank stopped by the run (SIGTERM) has before SIGKILL."""

MERGE_WAIT_S = 330.0
"""Seconds rank 0's task waits, after its own rank ended, for the other tasks' rank records to
complete (their ranks fail at a collective within COLLECTIVE_TIMEOUT_S, 300 s, of a peer's end)."""

POLL_S = 0.5
"""Seconds between two merges of the rank records into record.json while the ranks run."""

RANKS_DIR = "ranks"
"""The run directory's folder of rank records (``rank_N.json``) and logs (``rank_N.log``)."""

TOP_FIELDS = (
    "device",
    "device_kind",
    "counter_sources",
    "capacity_bytes",
    "capacity",
    "device_total_memory",
    "device_free_memory_start",
    "device_index",
    "environment",
    "model",
    "source",
    "cuda_initialized",
)
"""The record fields a DDP/FSDP run takes from rank 0's record."""

RANK_PHASE_FIELDS = tuple(f.name for f in PHASE_RANK_FIELDS if f.name != "rank")
"""What a phase's ``ranks`` entry copies from each rank's phase (conf.contract.PHASE_RANK_FIELDS)."""

_OUTCOME_OF_EXIT = {EXIT_OK: "ok", EXIT_OOM: "oom", EXIT_ERROR: "error", EXIT_UNAVAILABLE: "error"}


def _read(path: Path) -> dict:
    """A rank's record, or {} when it is missing or cut short (a rank killed mid-write)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _peak(phases: list, counter: str) -> int | None:
    values = [p.get(counter) for p in phases if isinstance(p, Mapping)]
    counts = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    return max(counts) if counts else None


def _rank_outcome(record: dict, exit_code: int | None, stopped: bool) -> str | None:
    """What one rank did: its recorded outcome; ``aborted`` when the run stopped it; ``crash``
    when it died by a signal of its own or left no complete record; None while it runs."""
    if exit_code is None:
        return None
    if record.get("complete") and record.get("outcome") in ("ok", "oom", "error"):
        return record["outcome"]
    if stopped:
        return "aborted"
    return "crash" if exit_code < 0 else _OUTCOME_OF_EXIT.get(exit_code, "error")


def root_cause(ranks: list[dict]) -> dict | None:
    """The rank whose failure ended the run: a crash first (its peers' errors follow from its
    death), then an OOM, then an error; the lowest rank among equals; None when none failed.

    Args:
        ranks: the ``ranks`` entries (RANK_FIELDS), ``outcome`` set.
    """
    for outcome in ("crash", "oom", "error"):
        for r in ranks:
            if r.get("outcome") == outcome:
                return r
    return None


def merge(records: list[dict], ranks: list[dict], root: dict | None) -> dict:
    """The run's record fields from its ranks' records (see the module docstring).

    Args:
        records: each rank's record (``{}`` where unreadable), in rank order.
        ranks: the ``ranks`` entries, in rank order.
        root: the root-cause entry (``root_cause``), or None.

    Returns:
        The fields to update record.json with: TOP_FIELDS of rank 0, ``phases``, ``ranks``,
        ``failed_rank``, ``peak_rank``.
    """
    first = records[0] if records else {}
    out: dict[str, Any] = {k: first.get(k) for k in TOP_FIELDS}
    main_rank = root["rank"] if root is not None else 0
    lists = [[p for p in r.get("phases") or [] if isinstance(p, dict)] for r in records]
    phases = []
    for i in range(max((len(x) for x in lists), default=0)):
        have = [(r, x[i]) for r, x in enumerate(lists) if i < len(x)]
        rank, main = next(((r, p) for r, p in have if r == main_rank), have[0])
        entries = [{"rank": r, **{k: p.get(k) for k in RANK_PHASE_FIELDS}} for r, p in have]
        peaks = [(e["max_memory_allocated"], e["rank"]) for e in entries if isinstance(e["max_memory_allocated"], int)]
        phases.append({**main, "rank": rank, "peak_rank": max(peaks)[1] if peaks else None, "ranks": entries})
    out["phases"] = phases
    for entry, record, phase_list in zip(ranks, records, lists):
        model = record.get("model")
        model = model if isinstance(model, dict) else {}
        entry.update(
            device=record.get("device"),
            local_parameter_bytes=model.get("local_parameter_bytes"),
            max_memory_allocated=_peak(phase_list, "max_memory_allocated"),
            max_memory_reserved=_peak(phase_list, "max_memory_reserved"),
        )
    out["ranks"] = ranks
    peaks = [(r["max_memory_allocated"], r["rank"]) for r in ranks if isinstance(r.get("max_memory_allocated"), int)]
    out["peak_rank"] = max(peaks)[1] if peaks else None
    out["failed_rank"] = root["rank"] if root is not None else None
    return out


def _rank_entries(records: list[dict], procs: list, stopped: set[int], run_dir: Path) -> list[dict]:
    entries = []
    for rank, (record, proc) in enumerate(zip(records, procs)):
        code = proc.exitcode
        outcome = _rank_outcome(record, code, rank in stopped)
        entries.append(
            {
                "rank": rank,
                "pid": proc.pid,
                "outcome": outcome,
                "exit_code": code,
                "failed_phase": record.get("failed_phase") or (record.get("current_phase") if outcome else None),
                "error_type": record.get("error_type"),
                "error_message": record.get("error_message"),
                "record": f"{RANKS_DIR}/rank_{rank}.json",
            }
        )
    return entries


def _stop(procs: list, stopped: set[int]) -> None:
    """SIGTERM every rank still running, SIGKILL those still there after ABORT_GRACE_S."""
    for rank, p in enumerate(procs):
        if p.exitcode is None:
            stopped.add(rank)
            p.terminate()
    deadline = time.monotonic() + ABORT_GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.exitcode is None:
            p.kill()
            p.join()


class _Remote:
    """A rank run by another SLURM task, seen through its record: ``pid`` and ``exitcode`` (None
    until the record is complete) as a local rank's ``multiprocessing.Process`` has them."""

    def __init__(self, record: dict, gave_up: bool):
        complete = bool(record.get("complete"))
        self.pid = record.get("pid")
        code = record.get("exit_code")
        self.exitcode: int | None = (code if isinstance(code, int) else EXIT_ERROR) if complete else None
        if gave_up and not complete:
            self.exitcode = -signal.SIGKILL  # never finished its record: read as a crash


def task_rendezvous(spec: RunSpec) -> dict[str, str] | None:
    """The ``env://`` variables of this process when ``spec``'s ranks are SLURM tasks, else None.

    Args:
        spec: the run (``tasks_per_node`` set: ranks as SLURM tasks).

    Returns:
        None for ranks forked locally (``conf.contract.ranks_are_tasks`` false: no
        ``tasks_per_node``); else ``worker.slurm.slurm_rendezvous``.

    Raises:
        SpecError: no SLURM task environment, or SLURM_NTASKS other than ``world_size``.
    """
    if not ranks_are_tasks(spec):
        return None
    found = slurm_rendezvous(os.environ)
    if found is None:
        raise SpecError("tasks_per_node", spec.tasks_per_node, "null outside a SLURM job (no SLURM_PROCID here)")
    if int(found["WORLD_SIZE"]) != spec.world_size:
        raise SpecError("world_size", spec.world_size, f"SLURM_NTASKS={found['WORLD_SIZE']} (one rank per task)")
    return found


def _fork_rank(spec: RunSpec, run_dir: Path, rendezvous: dict[str, str]) -> Any:
    """Start this SLURM task's one rank (a forked ``rank_main``) with the ``env://`` variables set."""
    import multiprocessing

    from .rank import rank_main

    os.environ.update(rendezvous)
    if spec.device == "cpu" and rendezvous["MASTER_ADDR"] in ("localhost", "127.0.0.1"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every task on this host: loopback
    rank, local = int(rendezvous["RANK"]), int(rendezvous["LOCAL_RANK"])
    (run_dir / RANKS_DIR).mkdir(exist_ok=True)
    args = (rank, spec.to_dict(), str(run_dir), os.getpid(), "env://", local)
    proc = multiprocessing.get_context("fork").Process(target=rank_main, args=args)
    proc.start()
    return proc


def task_rank(spec: RunSpec, run_dir: Path, rendezvous: dict[str, str]) -> int:
    """Run this SLURM task's rank (not rank 0): its own ``ranks/rank_N.*`` only, no record.json.

    Returns:
        The rank's exit code (``conf.contract.EXIT_*``); a rank killed by a signal makes this
        process die by the same signal.
    """
    proc = _fork_rank(spec, run_dir, rendezvous)
    proc.join()
    code = proc.exitcode
    if isinstance(code, int) and code < 0:
        os.kill(os.getpid(), -code)
    return int(code or 0)


def measure_ranks(spec: RunSpec, rec: Recorder) -> int:
    """Run ``spec`` as ``spec.world_size`` rank processes and merge their records into ``rec``.

    Args:
        spec: the run (``parallel`` ddp or fsdp).
        rec: the run's recorder (record.json).

    Returns:
        The worker's exit code from the root cause (``EXIT_OK``, ``EXIT_OOM``, ``EXIT_ERROR``,
        ``EXIT_UNAVAILABLE``). A crashed rank makes this process kill itself by that rank's
        signal once the record is saved (never returns then).
    """
    try:
        import torch.multiprocessing as mp
    except ImportError as exc:
        return rec.finish("error", EXIT_UNAVAILABLE, error_type="TorchUnavailable", message=str(exc))
    from .rank import rank_main

    try:
        task = task_rendezvous(spec)
    except SpecError as exc:
        return rec.finish("error", EXIT_ERROR, error_type="SpecError", message=str(exc))
    run_dir = rec.path.parent
    ranks_dir = run_dir / RANKS_DIR
    ranks_dir.mkdir(exist_ok=True)
    rendezvous = ranks_dir / "rendezvous"
    rendezvous.unlink(missing_ok=True)
    if task is not None:  # this SLURM task is rank 0: one local rank, the others read from their records
        local = [_fork_rank(spec, run_dir, task)]
    else:
        if spec.device == "cpu":
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank on this host: loopback
        args = (spec.to_dict(), str(run_dir), os.getpid(), f"file://{rendezvous}")
        context = mp.start_processes(rank_main, args=args, nprocs=spec.world_size, join=False, start_method="fork")
        local = list(context.processes)
    paths = [ranks_dir / f"rank_{r}.json" for r in range(spec.world_size)]
    stopped: set[int] = set()
    procs_now = _wait_ranks(rec, local, task is not None, paths, stopped, run_dir)
    rendezvous.unlink(missing_ok=True)
    records = [_read(path) for path in paths]
    ranks = _rank_entries(records, procs_now(records), stopped, run_dir)
    root = root_cause(ranks)
    rec.data.update(merge(records, ranks, root))
    rec.data["current_phase"] = None
    return _finish_ranks(rec, root)


def _wait_ranks(
    rec: Recorder, local: list, tasks: bool, paths: list[Path], stopped: set[int], run_dir: Path
) -> Callable[[list[dict]], list]:
    """Wait for every rank to end, merging their records into ``rec`` as they come; stop the
    local ranks once one failed (their indices into ``stopped``).

    Args:
        rec: the run's recorder.
        local: this process's rank processes.
        tasks: the ranks are SLURM tasks (only rank 0 is local; the others are read from records).
        paths: every rank's record, by rank.
        stopped: filled with the ranks this process stopped.
        run_dir: the run directory.

    Returns:
        The function from the rank records to the rank processes (local, and remote ones).
    """
    gave_up_at: float | None = None

    def procs_now(records: list[dict]) -> list:
        if not tasks:
            return local
        late = gave_up_at is not None and time.monotonic() > gave_up_at
        return local + [_Remote(r, late) for r in records[1:]]

    records = [_read(path) for path in paths]
    while any(p.exitcode is None for p in procs_now(records)):
        waiting = [p.sentinel for p in local if p.exitcode is None]
        if waiting:
            multiprocessing.connection.wait(waiting, timeout=POLL_S)
        else:  # only ranks of other tasks left: their records say when they end
            time.sleep(POLL_S)
            gave_up_at = gave_up_at or time.monotonic() + MERGE_WAIT_S
        if any(p.exitcode not in (None, EXIT_OK) for p in local):
            _stop(local, stopped)
        records = [_read(path) for path in paths]
        rec.data.update(merge(records, _rank_entries(records, procs_now(records), stopped, run_dir), None))
        rec.data["current_phase"] = records[0].get("current_phase") if records else None
        rec.save()
    for p in local:
        p.join()
    return procs_now


def _finish_ranks(rec: Recorder, root: dict | None) -> int:
    """Finish the merged record by the root cause ``root`` (None: every rank succeeded); a
    crashed rank's signal kills this process once the record is saved."""
    if root is None:
        return rec.finish("ok", EXIT_OK)
    where = f" in {root['failed_phase']}" if root.get("failed_phase") else ""
    message = f"rank {root['rank']}{where}: {root.get('error_message') or 'exit ' + str(root['exit_code'])}"
    if root["outcome"] == "crash":
        rec.data.update(current_phase=root.get("failed_phase"), error_message=message)
        rec.save()
        code = root["exit_code"]
        os.kill(os.getpid(), -code if isinstance(code, int) and code < 0 else signal.SIGKILL)
    code = EXIT_OOM if root["outcome"] == "oom" else (root.get("exit_code") or EXIT_ERROR)
    return rec.finish(
        root["outcome"],
        code if code in (EXIT_OOM, EXIT_ERROR, EXIT_UNAVAILABLE) else EXIT_ERROR,
        phase=root.get("failed_phase"),
        error_type=root.get("error_type"),
        message=message,
    )
