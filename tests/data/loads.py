"""Loads the integration tests share (Hydra overrides), written once."""

import sys
from pathlib import Path

TINY_CPU = ["context=64", "width=64", "workload.depth=2", "warmup=1", "repeats=1", "threads=1", "device=cpu"]
"""Hydra overrides of a tiny mlp load on the CPU (a run takes seconds); add batch and capacity."""

MEMSWEEP = str(Path(sys.executable).with_name("memsweep"))
"""The installed console script beside this Python."""
