"""memsweep: does this PyTorch load fit on this device, and where exactly is the edge?

Every run is a fresh worker process; sizes are bytes (int), None where unmeasured (docs/api.md)::

    import memsweep

    one = memsweep.run(batch=8, capacity="2GiB")            # one condition (memsweep run)
    swept = memsweep.sweep(sweep="none", batch=[8, 16, 32])  # one variable at a time (memsweep sweep)
    edge = memsweep.frontier("batch", capacity="2GiB")       # the success/OOM edge: edge.max_ok, edge.min_oom
    guess = memsweep.predict("batch", capacity="2GiB")       # predicted on fake tensors (no device)
    calc = memsweep.estimate(parameters=7_000_000_000, bits=16, train=True)  # calculated, nothing runs
    diff = memsweep.compare("results/batch/A", "results/batch/B", fail_above="5%")
    tables = memsweep.load_tables("results/batch/A")         # runs, phases, frontier (pandas)

On the CPU give a ``capacity``; on a GPU it is the card's memory. Imports are lazy (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

__all__ = [
    "CompareResult",
    "EstimateResult",
    "FrontierResult",
    "PredictResult",
    "RunResult",
    "SpecError",
    "SweepResult",
    "Tables",
    "compare",
    "estimate",
    "frontier",
    "load_tables",
    "predict",
    "run",
    "sweep",
]
"""The API's names, defined in ``memsweep.sweeper.api`` (which exports exactly these)."""


def __dir__() -> list[str]:
    """The module's names, the API's included (for completion in a notebook)."""
    return sorted([*globals(), *__all__])


def __getattr__(name: str) -> Any:
    """An API name of ``__all__``, imported from ``memsweep.sweeper.api`` on first use."""
    if name not in __all__:
        raise AttributeError(f"module 'memsweep' has no attribute {name!r}")
    return getattr(importlib.import_module("memsweep.sweeper.api"), name)
