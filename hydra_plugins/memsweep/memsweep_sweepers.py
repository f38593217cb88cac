"""Hydra discovers plugins only under the ``hydra_plugins`` namespace: this shim registers
memsweep's sweepers there and delegates to ``sweeper/`` (imported lazily)."""

from typing import Any, List

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper

from sweeper.frontier_sweeper import FrontierSweeperConf
from sweeper.ovat import OvatSweeperConf


class OvatSweeper(Sweeper):
    """One variable at a time (``hydra/sweeper=ovat``); see ``sweeper.ovat``."""

    def __init__(self, **kwargs: Any) -> None:
        from sweeper.ovat import OvatSweeperImpl

        self.impl = OvatSweeperImpl(**kwargs)

    def setup(self, **kwargs: Any) -> None:
        self.impl.setup(**kwargs)

    def sweep(self, arguments: List[str]) -> Any:
        return self.impl.sweep(arguments)


class FrontierSweeper(Sweeper):
    """Adaptive search of the exact OOM edge (``hydra/sweeper=frontier``); see ``sweeper.frontier_sweeper``."""

    def __init__(self, **kwargs: Any) -> None:
        from sweeper.frontier_sweeper import FrontierSweeperImpl

        self.impl = FrontierSweeperImpl(**kwargs)

    def setup(self, **kwargs: Any) -> None:
        self.impl.setup(**kwargs)

    def sweep(self, arguments: List[str]) -> Any:
        return self.impl.sweep(arguments)


ConfigStore.instance().store(group="hydra/sweeper", name="ovat", node=OvatSweeperConf, provider="memsweep")
ConfigStore.instance().store(group="hydra/sweeper", name="frontier", node=FrontierSweeperConf, provider="memsweep")
