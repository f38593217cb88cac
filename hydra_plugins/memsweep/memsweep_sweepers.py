"""Hydra discovers plugins only under the ``hydra_plugins`` namespace: this shim registers
memsweep's sweepers there and delegates to ``sweeper/`` (imported lazily)."""

import importlib
from typing import Any, List

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper

from sweeper.frontier_sweeper import FrontierSweeperConf
from sweeper.ovat import OvatSweeperConf


class _Delegating(Sweeper):
    """A Sweeper plugin whose logic lives in ``IMPL`` ("module:Class"), imported when instantiated."""

    IMPL = ""

    def __init__(self, **kwargs: Any) -> None:
        module, name = self.IMPL.split(":")
        self.impl = getattr(importlib.import_module(module), name)(**kwargs)

    def setup(self, **kwargs: Any) -> None:
        self.impl.setup(**kwargs)

    def sweep(self, arguments: List[str]) -> Any:
        return self.impl.sweep(arguments)


class OvatSweeper(_Delegating):
    """One variable at a time (``hydra/sweeper=ovat``); see ``sweeper.ovat``."""

    IMPL = "sweeper.ovat:OvatSweeperImpl"


class FrontierSweeper(_Delegating):
    """Adaptive search of the exact OOM edge (``hydra/sweeper=frontier``); see ``sweeper.frontier_sweeper``."""

    IMPL = "sweeper.frontier_sweeper:FrontierSweeperImpl"


ConfigStore.instance().store(group="hydra/sweeper", name="ovat", node=OvatSweeperConf, provider="memsweep")
ConfigStore.instance().store(group="hydra/sweeper", name="frontier", node=FrontierSweeperConf, provider="memsweep")
