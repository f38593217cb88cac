"""memsweep: does this PyTorch load fit on this device, and where exactly is the edge?

The Python API is imported lazily from ``memsweep.sweeper.api`` (PEP 562), so that importing
``memsweep``, which every worker process does, imports nothing more.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

__all__: list[str] = []


def __getattr__(name: str) -> Any:
    """An API name of ``__all__``, imported from ``memsweep.sweeper.api`` on first use."""
    if name not in __all__:
        raise AttributeError(f"module 'memsweep' has no attribute {name!r}")
    return getattr(importlib.import_module("memsweep.sweeper.api"), name)
