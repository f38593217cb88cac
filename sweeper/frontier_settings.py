"""The frontier sweeper's settings (``hydra.sweeper.*`` under ``hydra/sweeper=frontier``): their
declaration for Hydra's ConfigStore and their validation into one search range per axis.

Nothing here starts a process or reads a run: ``sweeper.frontier_sweeper`` checks the settings
with ``check_settings`` before any worker starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from conf.contract import SpecError

from .search import STRATEGIES, Lattice, check_search_axis

# The light probe policy: the cold step (or forward) and one warm one.
LIGHT = ["warmup=0", "repeats=1"]
# A search on dry runs: what the capacity is for (conf.contract.predicted_outcome).
DRY_RUN_NEEDS_CAPACITY = (
    "a size with dry_run=true, e.g. capacity=24GiB: a dry run never runs out of memory, its verdict is its "
    "predicted peak against the capacity"
)
SUSPECT_READINGS = ("stop", "oom")
"""``hydra.sweeper.suspect``: how the search reads a ``memory_suspect`` failure."""


@dataclass
class FrontierSweeperConf:
    """The settings of ``hydra/sweeper=frontier`` (``hydra.sweeper.*``), registered by the plugin
    shim ``hydra_plugins.memsweep.memsweep_sweepers``; validated by ``check_settings``.

    ``_target_`` (the plugin class Hydra instantiates) is filled in by the shim from the class
    itself when it registers this node: this module cannot import the shim, which imports it.
    """

    _target_: str = MISSING
    # The axis to search (batch | context | width); `axes` searches several, one at a time.
    axis: str = "batch"
    axes: list[str] | None = None
    # Search range and granularity (values are multiples of multiple_of in [lower, upper]).
    lower: int = 1
    upper: int = 65536
    multiple_of: int = 1
    # Per-axis overrides of lower/upper/multiple_of: {context: {lower: 16, multiple_of: 16}}.
    bounds: dict[str, Any] = field(default_factory=dict)
    strategy: str = "model"  # model | bisect
    # Fresh-process re-runs of max_ok and of min_oom once found; a flip marks the edge unstable.
    confirm: int = 1
    # Probes per round; None: the launcher's parallelism (hydra.launcher.n_jobs), else 1.
    parallel: int | None = None
    # Light probes: the search runs warmup=0 repeats=1 (the cold step and one warm step); the
    # edge it finds is then run with the full protocol at max_ok and min_oom (and searched
    # again with it, inside the range left, if the full protocol disagrees).
    light: bool = False
    # Before the first real probe, bisect the axis on dry runs (fake tensors, `memsweep predict`)
    # against the run's capacity and probe the predicted edge first (FrontierSearch seed).
    seed_from_dry_run: bool = False
    # A failure that usually means memory but does not say so (failure_class memory_suspect,
    # worker.classify): "stop" the axis there (as an error), or read it as an "oom".
    suspect: str = "stop"


def check_settings(
    axes: list[str],
    bounds: Mapping[str, Any],
    lower: int,
    upper: int,
    multiple_of: int,
    strategy: str,
    confirm: Any,
    parallel: Any,
    suspect: Any = "stop",
    axes_field: str = "hydra.sweeper.axes",
) -> dict[str, Lattice]:
    """Validate the frontier sweeper's settings and give the search range of each axis.

    Args:
        axes: the axes to search, in order.
        bounds: per-axis overrides, axis -> {lower, upper, multiple_of}.
        lower: the lowest value of every axis without its own.
        upper: the highest value of every axis without its own.
        multiple_of: the step of every axis without its own.
        strategy: one of ``sweeper.search.STRATEGIES``.
        confirm: re-runs of each edge value, an integer from 0 to 100.
        parallel: probes per round, None or a positive integer.
        suspect: how a ``memory_suspect`` failure is read, one of ``SUSPECT_READINGS``.
        axes_field: the setting the axes came from, as the user typed it
            (``hydra.sweeper.axis`` or ``hydra.sweeper.axes``), named when one is refused.

    Returns:
        axis -> its ``Lattice`` (``bounds`` of the axis over ``lower``/``upper``/``multiple_of``).

    Raises:
        SpecError: a bad setting, naming its field (``hydra.sweeper.strategy``, ``suspect``,
            ``confirm``, ``parallel``, ``axis``/``axes``, ``bounds``, ``bounds.<axis>.<key>``, ``lower``, ``upper``,
            ``multiple_of``) and the values accepted.
    """
    if strategy not in STRATEGIES:
        raise SpecError("hydra.sweeper.strategy", strategy, "one of " + ", ".join(STRATEGIES))
    if suspect not in SUSPECT_READINGS:
        raise SpecError("hydra.sweeper.suspect", suspect, "one of " + ", ".join(SUSPECT_READINGS))
    if isinstance(confirm, bool) or not isinstance(confirm, int) or not 0 <= confirm <= 100:
        raise SpecError("hydra.sweeper.confirm", confirm, "an integer from 0 to 100")
    if parallel is not None and (isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1):
        raise SpecError("hydra.sweeper.parallel", parallel, "null or a positive integer")
    for axis in axes:  # an axis that cannot be searched: named as typed, with the way out
        check_search_axis(axis, axes_field)
    for axis in bounds:
        check_search_axis(axis, "hydra.sweeper.bounds")
    if len(set(axes)) != len(axes):
        raise SpecError(axes_field, axes, "each axis once")
    out = {}
    for axis, b in bounds.items():
        extra = sorted(set(b or {}) - {"lower", "upper", "multiple_of"})
        if extra:
            raise SpecError(f"hydra.sweeper.bounds.{axis}.{extra[0]}", b[extra[0]], "lower, upper or multiple_of")
    for axis in axes:
        b = bounds.get(axis) or {}
        out[axis] = Lattice.make(b.get("lower", lower), b.get("upper", upper), b.get("multiple_of", multiple_of), axis)
    return out
