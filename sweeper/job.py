"""The Hydra task function: one composed config -> one isolated worker run."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import DictConfig

from memsweep.conf.contract import (
    RECORD_FILE,
    SPEC_FILE,
    STDERR_FILE,
    RunSpec,
    ranks_are_tasks,
    run_peak,
    try_read,
)
from memsweep.estimator.labels import load_words

from .answer import run_answer
from .errors import InputRefused
from .owner import guard_launcher_worker
from .pool import placement
from .process import execute
from .slurm_job import ended_by_slurm
from .spec import checked_spec, launch_settings, probe_device
from .sweep_dir import register_job

log = logging.getLogger("memsweep")


def run_condition(cfg: DictConfig, new_run_dir: bool = False, existed: Path | None = None) -> dict:
    """Validate ``cfg``, run it in a fresh worker inside the Hydra job directory.

    ``new_run_dir``: a single run's directory did not exist before this command (Hydra made
    it), so that a run refused on bad input may remove it again, with the folders Hydra made
    above it: up to ``existed`` (the deepest folder of a given ``hydra.run.dir`` that existed
    before the command), else up to ``results_dir``.

    A single ``memsweep run`` (not a dry run) also prints its answer (``sweeper.answer.run_answer``:
    both peaks, the capacity, the headroom and the load). Returns the result envelope (see
    ``sweeper.process.execute``); a dry run's
    ``predicted_outcome`` (``conf.contract.predicted_outcome``: ok, oom when the predicted peak
    is above the capacity, None without a capacity; written in result.json) is what
    ``memsweep run`` exits with. A job of a sweep adds its run to the sweep's manifest before
    its worker starts (``sweeper.sweep_dir.register_job``).

    Raises:
        InputRefused: bad input, naming the field (before any worker starts), a run directory
            outside its sweep directory or another job's; ``sweeper.cli`` prints it and exits 2.
        sweeper.process.RunDirError: the job directory already holds a run.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    guard_launcher_worker()  # a launcher worker whose orchestrator is gone takes no more work
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        spec = checked_spec(cfg, run=hydra_cfg.mode == RunMode.RUN)
    except InputRefused:
        if new_run_dir and hydra_cfg.mode == RunMode.RUN:  # a refused `memsweep run` leaves no empty directory
            if remove_bookkeeping_only(run_dir):
                top = existed if existed is not None else Path(str(cfg.get("results_dir") or "results"))
                remove_empty_parents(run_dir, top, keep_top=existed is not None)
        raise
    task = rank_task(spec)
    if task is not None:  # ranks as SLURM tasks: this task runs its rank only; task 0 runs the run
        return run_rank_task(spec, run_dir, task)
    token = None  # the sweep's manifest names its run before its worker starts; its spec.json holds the token
    if hydra_cfg.mode == RunMode.MULTIRUN:
        token = register_job(Path(str(hydra_cfg.sweep.dir)), run_dir, list(hydra_cfg.overrides.task))
    # A sweep started again on its directory resumes (finished runs are not run twice);
    # a single `memsweep run` never reuses a directory.
    launch = launch_settings(cfg)
    # A CUDA dry run holds no device memory and never initialises CUDA (fake tensors): it leases
    # no GPU, so it neither waits for one nor records a lease it did not use.
    gpu_free = spec.dry_run and spec.device.startswith("cuda")
    pool = "none" if gpu_free else launch["pool"]
    probe = probe_device(spec.device) if spec.device.startswith("cuda") and not gpu_free else None
    with placement(
        pool, spec.device, launch["cores_per_run"], probe, devices=max(spec.devices, spec.ranks_per_node)
    ) as extra_env:
        resume = hydra_cfg.mode == RunMode.MULTIRUN  # a SLURM job ended mid-run is no crash of the load:
        result = ended_by_slurm(run_dir, lambda: execute(spec, run_dir, resume, launch["isolation"], extra_env, token))
    if result.get("resumed"):
        log.info("%s: already ran (%s), not run again", run_dir, result["outcome"])
        return result
    log_outcome(spec, run_dir, result, single=hydra_cfg.mode == RunMode.RUN)
    return result


def log_outcome(spec: RunSpec, run_dir: Path, result: dict, single: bool) -> None:
    """Log a finished run's console line; the cause of an error, crash or timeout (``cause_line``:
    the ERROR line, before any answer); for a single measured ``memsweep run`` its answer (both
    peaks, the capacity, the headroom of an ok run, the load).

    Args:
        spec: the run's spec; run_dir: its directory; result: its result envelope.
        single: a ``memsweep run`` (Hydra's run mode), not a job of a sweep.
    """
    # read once: the line and a dry run's verdict, or the rank whose failure ended a DDP/FSDP run
    record = try_read(run_dir, RECORD_FILE)[0] if spec.dry_run or spec.world_size > 1 or single else None
    log.info("%s", outcome_line(spec, run_dir, result, record))
    cause = cause_line(run_dir, result)
    if cause is not None:  # the error first, before the answer's (partial) peaks
        log.error("%s", cause)
    if single and not spec.dry_run:
        for line in run_answer(spec.to_dict(), record):
            log.info("%s", line)


RANK_TASK_WAIT_S = 600.0
"""Seconds a SLURM task of a rank other than 0 waits for task 0 to write the run's spec.json."""


def rank_task(spec: RunSpec) -> str | None:
    """This SLURM task's rank (``SLURM_PROCID``) when ``spec``'s ranks are SLURM tasks
    (``conf.contract.ranks_are_tasks``) and it is not rank 0; else None (the run's own task)."""
    rank = os.environ.get("SLURM_PROCID")
    if not ranks_are_tasks(spec) or rank in (None, "0"):
        return None
    return rank


def run_rank_task(spec: RunSpec, run_dir: Path, rank: str) -> dict:
    """Run rank ``rank`` of a run whose ranks are SLURM tasks: wait for task 0's spec.json in the
    (shared) run directory, then the worker on it in this task (``worker.ranks.task_rank``: its
    ``ranks/rank_N.*`` only; task 0's worker merges them into record.json and its result is the run's).

    Returns:
        ``{"rank_task": rank, "exit_code": N}``, or ``exit_code`` None when spec.json never came.
    """
    spec_path = run_dir / SPEC_FILE
    deadline = time.monotonic() + RANK_TASK_WAIT_S
    while not spec_path.is_file() and time.monotonic() < deadline:
        time.sleep(1.0)
    if not spec_path.is_file():
        log.error("%s: rank %s: no %s from task 0 after %.0f s", run_dir, rank, SPEC_FILE, RANK_TASK_WAIT_S)
        return {"rank_task": rank, "exit_code": None}
    code = subprocess.call([sys.executable, "-m", "memsweep.worker", str(spec_path)], env=dict(os.environ))
    return {"rank_task": rank, "exit_code": code}


def outcome_line(spec: RunSpec, run_dir: Path, result: dict, record: dict | None = None) -> str:
    """The console line of one finished run: its load (``estimator.labels.load_words``: the axes, and
    workload, precision, parallel and world_size where not the default; no width where the load
    ignores it) and outcome, with the
    rank whose failure ended a DDP/FSDP run (record ``failed_rank``); for a dry run, its verdict
    (the result's ``predicted_outcome``: the predicted peak against the capacity), never the
    worker's plain ``ok``.

    Args:
        spec: the run's spec.
        run_dir: its directory.
        result: its result envelope (``sweeper.process.execute``).
        record: its record.json (read for a dry run or a DDP/FSDP run; None when it has none).

    Returns:
        One line.
    """
    where = f" in {result['failed_phase']}" if result["failed_phase"] else ""
    failed_rank = (record or {}).get("failed_rank")
    if where and isinstance(failed_rank, int):  # a DDP/FSDP run: the rank whose failure ended it
        where += f" on rank {failed_rank}"
    head = f"{run_dir}: " + " ".join([*load_words(spec.to_dict()), f"mode={spec.mode}", f"device={spec.device}"])
    wall = f" ({result['wall_s']:.1f} s)" if isinstance(result.get("wall_s"), (int, float)) else ""
    if not spec.dry_run:
        return f"{head} -> {result['outcome']}{where}{wall}"
    peak, counter = run_peak(record)
    verdict = result.get("predicted_outcome")
    if verdict == "ok":
        text = f"fits (predicted {counter} {peak} B <= capacity {spec.capacity_bytes} B)"
    elif verdict == "oom":
        text = f"does not fit (predicted {counter} {peak} B > capacity {spec.capacity_bytes} B)"
    elif verdict is None:
        text = f"predicted {counter} {peak} B (no capacity given: no verdict)"
    else:
        text = f"{verdict}{where}"
    return f"{head} -> {text}{wall} (DRY RUN: a prediction on fake tensors, nothing measured)"


def cause_line(run_dir: Path, result: dict) -> str | None:
    """The cause of an ``error``, ``crash`` or ``timeout`` in one line, with the log that holds
    the rest.

    Args:
        run_dir: the run's directory.
        result: its result envelope.

    Returns:
        ``<run_dir>: <outcome> in <phase>: <error type>: <message> (log: <stderr.log>)``, the
        message cut to its first line; None for ``ok`` and ``oom``.
    """
    if result.get("outcome") not in ("error", "crash", "timeout"):
        return None
    message = str(result.get("error_message") or "no message").strip().splitlines()
    first = message[0] if message else "no message"
    where = f" in {result['failed_phase']}" if result.get("failed_phase") else ""
    kind = f"{result['error_type']}: " if result.get("error_type") else ""
    return f"{run_dir}: {result['outcome']}{where}: {kind}{first[:300]} (log: {run_dir / STDERR_FILE})"


HYDRA_BOOKKEEPING = {".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", "memsweep.log"}


def remove_bookkeeping_only(run_dir: Path) -> bool:
    """Remove ``run_dir`` when it holds nothing but what Hydra wrote before the task started
    (``.hydra/`` and the job's log): the directory of a run refused on bad input. Anything
    else in it (a spec, a record) keeps it. Returns whether it was removed."""
    import shutil

    files = {p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if not p.is_dir()}
    if not files <= HYDRA_BOOKKEEPING:
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    return True


def remove_empty_parents(run_dir: Path, top: Path, keep_top: bool = False) -> None:
    """Remove the folders above a removed ``run_dir`` that are now empty (``results/run/``), up to
    ``top`` (included unless ``keep_top``); a folder that holds anything stops it, and one outside
    ``top`` is never touched.

    Args:
        run_dir: the refused run's directory, already removed.
        top: the config's ``results_dir``, or the deepest folder of a given ``hydra.run.dir`` that
            existed before the command (relative to the working directory or absolute).
        keep_top: keep ``top`` itself (it existed before the command).
    """
    top = top.resolve()
    folder = run_dir.resolve().parent
    while folder == top or top in folder.parents:
        if folder == top and keep_top:
            return
        try:
            folder.rmdir()  # only an empty folder
        except OSError:
            return
        if folder == top:
            return
        folder = folder.parent
