"""The Hydra task function: one composed config -> one isolated worker run."""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from .process import execute
from .spec import spec_or_exit

log = logging.getLogger("memsweep")


def run_condition(cfg: DictConfig) -> dict:
    """Validate ``cfg``, run it in a fresh worker inside the Hydra job directory.

    Returns the result envelope (see ``sweeper.process.execute``).

    Raises:
        SystemExit(2): bad input, with a message naming the field (before any worker starts).
        sweeper.process.RunDirError: the job directory already holds a run.
    """
    from hydra.core.hydra_config import HydraConfig

    spec = spec_or_exit(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    result = execute(spec, run_dir)
    where = f" in {result['failed_phase']}" if result["failed_phase"] else ""
    log.info("%s: batch=%d context=%d width=%d dtype=%s mode=%s device=%s -> %s%s (%.1f s)",
             run_dir, spec.batch, spec.context, spec.width, spec.dtype, spec.mode, spec.device,
             result["outcome"], where, result["wall_s"])
    return result
