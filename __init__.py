"""memsweep: does this PyTorch load fit on this device, and where exactly is the edge?

The Python API is imported lazily from ``memsweep.sweeper.api`` (PEP 562), so that importing
``memsweep``, which every worker process does, imports nothing more.
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
