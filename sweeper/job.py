"""The Hydra task function: one composed config -> one isolated worker run."""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from .owner import guard_launcher_worker
from .pool import placement
from .process import execute
from .spec import launch_settings, probe_device, spec_or_exit

log = logging.getLogger("memsweep")


def run_condition(cfg: DictConfig, new_run_dir: bool = False) -> dict:
    """Validate ``cfg``, run it in a fresh worker inside the Hydra job directory.

    ``new_run_dir``: a single run's directory did not exist before this command (Hydra made
    it), so that a run refused on bad input may remove it again.

    Returns the result envelope (see ``sweeper.process.execute``).

    Raises:
        SystemExit(2): bad input, with a message naming the field (before any worker starts).
        sweeper.process.RunDirError: the job directory already holds a run.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    guard_launcher_worker()  # a launcher worker whose orchestrator is gone takes no more work
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        spec = spec_or_exit(cfg)
    except SystemExit:
        if new_run_dir and hydra_cfg.mode == RunMode.RUN:  # a refused `memsweep run` leaves no empty directory
            remove_bookkeeping_only(run_dir)
        raise
    # A sweep started again on its directory resumes (finished runs are not run twice);
    # a single `memsweep run` never reuses a directory.
    launch = launch_settings(cfg)
    probe = probe_device(spec.device) if spec.device.startswith("cuda") else None
    with placement(
        launch["pool"], spec.device, launch["cores_per_run"], probe, devices=max(spec.devices, spec.world_size)
    ) as extra_env:
        result = execute(
            spec, run_dir, resume=hydra_cfg.mode == RunMode.MULTIRUN, isolation=launch["isolation"], extra_env=extra_env
        )
    where = f" in {result['failed_phase']}" if result["failed_phase"] else ""
    if result.get("resumed"):
        log.info("%s: already ran (%s), not run again", run_dir, result["outcome"])
        return result
    kind = " (DRY RUN: a prediction on fake tensors, nothing measured)" if spec.dry_run else ""
    log.info(
        "%s: batch=%d context=%d width=%d dtype=%s mode=%s device=%s -> %s%s (%.1f s)%s",
        run_dir,
        spec.batch,
        spec.context,
        spec.width,
        spec.dtype,
        spec.mode,
        spec.device,
        result["outcome"],
        where,
        result["wall_s"],
        kind,
    )
    return result


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
