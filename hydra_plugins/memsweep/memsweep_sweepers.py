"""Hydra discovers plugins only under the ``hydra_plugins`` namespace: this shim registers
memsweep's sweepers there and delegates to their logic in ``sweeper/``."""

from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper

from memsweep.sweeper.frontier_settings import FrontierSweeperConf
from memsweep.sweeper.frontier_sweeper import FrontierSweeperImpl
from memsweep.sweeper.ovat import OvatSweeperConf, OvatSweeperImpl


class _Delegating(Sweeper):
    """A Sweeper plugin whose logic lives in ``IMPL`` (a class of ``sweeper/``)."""

    IMPL: type = object

    def __init__(self, **kwargs: Any) -> None:
        self.impl = self.IMPL(**kwargs)

    def setup(self, **kwargs: Any) -> None:
        """Hydra's ``Sweeper.setup`` (hydra_context, task_function, config), passed to ``IMPL``."""
        self.impl.setup(**kwargs)

    def sweep(self, arguments: list[str]) -> Any:
        """Hydra's ``Sweeper.sweep``: ``IMPL.sweep(arguments)``, the launcher's JobReturns."""
        return self.impl.sweep(arguments)


class OvatSweeper(_Delegating):
    """One variable at a time (``hydra/sweeper=ovat``); see ``sweeper.ovat``."""

    IMPL = OvatSweeperImpl


class FrontierSweeper(_Delegating):
    """Adaptive search of the exact OOM edge (``hydra/sweeper=frontier``); see ``sweeper.frontier_sweeper``."""

    IMPL = FrontierSweeperImpl


def target_of(cls: type) -> str:
    """The dotted path of ``cls`` that Hydra instantiates (a config's ``_target_``)."""
    return f"{cls.__module__}.{cls.__qualname__}"


# Each node is its settings dataclass with _target_ naming the plugin class above.
ConfigStore.instance().store(
    group="hydra/sweeper", name="ovat", node=OvatSweeperConf(_target_=target_of(OvatSweeper)), provider="memsweep"
)
ConfigStore.instance().store(
    group="hydra/sweeper",
    name="frontier",
    node=FrontierSweeperConf(_target_=target_of(FrontierSweeper)),
    provider="memsweep",
)
