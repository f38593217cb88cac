"""Hydra callbacks: analyze a sweep directory when the multirun ends (any sweeper, any launcher)."""

from __future__ import annotations

import datetime
import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("memsweep")


class AnalyzeAtEnd(Callback):
    """Writes runs/phases/frontier Parquet tables into the sweep directory and prints the frontier."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from analysis.cli import OutputExists, analyze

        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            log.warning("no sweep directory %s: nothing ran, nothing to analyze", sweep_dir)
            return
        try:
            analyze([sweep_dir], out_dir=sweep_dir)
        except OutputExists:  # a resumed sweep, or a second orchestrator on the same directory
            out_dir = sweep_dir / "analysis" / datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S-%f")
            log.info("%s already holds an analysis; this one goes to %s", sweep_dir, out_dir)
            analyze([sweep_dir], out_dir=out_dir)
