"""The frontier sweeper's settings (``hydra.sweeper.*`` under ``hydra/sweeper=frontier``): their
declaration for Hydra's ConfigStore and their validation into one search range per axis.

Nothing here starts a process or reads a run: ``sweeper.frontier_sweeper`` checks the settings
with ``check_settings`` before any worker starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from omegaconf import MISSING, OmegaConf

from memsweep.conf.contract import SpecError

from .frontier_throughput import OBJECTIVES
from .plain import plain_dict
from .search import SEARCH_AXES, STRATEGIES, Lattice, check_search_axis

# The light probe policy: the cold step (or forward) and one warm one.
LIGHT = ["warmup=0", "repeats=1"]
# A search on dry runs: what the capacity is for (conf.contract.predicted_outcome).
DRY_RUN_NEEDS_CAPACITY = (
    "a size with dry_run=true, e.g. capacity=24GiB: a dry run never runs out of memory, its verdict is its "
    "predicted peak against the capacity"
)
# A measured search on the CPU: without a capacity it would aim at the whole host's RAM, whose
# exhaustion is the kernel's OOM killer (a crash), never an `oom` the search can read.
CPU_NEEDS_CAPACITY = (
    "a size on the CPU, e.g. capacity=1GiB: without one the search aims at this host's whole RAM, where running "
    "out is the kernel's OOM killer (a crash), not an oom (the CPU tracker caps nothing without a capacity)"
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
    # The axis to search (batch | context | width; null: batch); `axes` searches several, one at a
    # time (give one of the two: searched_axes).
    axis: str | None = None
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
    # (light and seed_from_dry_run are typed Any so that OmegaConf keeps what was given: as bool it
    # would read 2 as true; check_settings refuses anything but true or false.)
    light: Any = False
    # Before the first real probe, bisect the axis on dry runs (fake tensors, `memsweep predict`)
    # against the run's capacity and probe the predicted edge first (FrontierSearch seed).
    seed_from_dry_run: Any = False
    # A failure that usually means memory but does not say so (failure_class memory_suspect,
    # worker.classify): "stop" the axis there (as an error), or read it as an "oom".
    suspect: str = "stop"
    # What the search answers: "edge" (the memory edge and the margin's) or "throughput" (the
    # fastest value inside the margin too, sweeper.frontier_throughput).
    objective: str = "edge"


def check_settings(
    settings: FrontierSweeperConf, axes: list[str], axes_field: str = "hydra.sweeper.axes"
) -> dict[str, Lattice]:
    """Validate the frontier sweeper's settings and give the search range of each axis.

    Args:
        settings: ``hydra.sweeper.*``; read here: ``bounds`` (per-axis overrides, axis ->
            {lower, upper, multiple_of}), ``lower``/``upper``/``multiple_of`` (the range and step of
            every axis without its own), ``strategy`` (one of ``sweeper.search.STRATEGIES``),
            ``confirm`` (re-runs of each edge value, an integer from 0 to 100), ``parallel``
            (probes per round, None or a positive integer), ``suspect`` (how a ``memory_suspect``
            failure is read, one of ``SUSPECT_READINGS``), ``objective`` (one of
            ``sweeper.frontier_throughput.OBJECTIVES``), ``light`` and ``seed_from_dry_run``
            (true or false).
        axes: the axes to search, in order (``searched_axes`` of ``settings.axis``/``settings.axes``).
        axes_field: the setting the axes came from, as the user typed it
            (``hydra.sweeper.axis`` or ``hydra.sweeper.axes``), named when one is refused.

    Returns:
        axis -> its ``Lattice`` (``bounds`` of the axis over ``lower``/``upper``/``multiple_of``).

    Raises:
        SpecError: a bad setting, naming its field as the user gave it (``hydra.sweeper.strategy``,
            ``objective``, ``suspect``, ``confirm``, ``parallel``, ``light``, ``seed_from_dry_run``, ``axis``/``axes``,
            ``bounds``, ``bounds.<axis>.<key>`` for a bound given there, else ``lower``, ``upper``,
            ``multiple_of``) and the values accepted.
    """
    for name, choices in (("strategy", STRATEGIES), ("objective", OBJECTIVES), ("suspect", SUSPECT_READINGS)):
        if getattr(settings, name) not in choices:
            raise SpecError(f"hydra.sweeper.{name}", getattr(settings, name), "one of " + ", ".join(choices))
    confirm, parallel = settings.confirm, settings.parallel
    if isinstance(confirm, bool) or not isinstance(confirm, int) or not 0 <= confirm <= 100:
        raise SpecError("hydra.sweeper.confirm", confirm, "an integer from 0 to 100")
    if parallel is not None and (isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1):
        raise SpecError("hydra.sweeper.parallel", parallel, "null or a positive integer")
    for name in ("light", "seed_from_dry_run"):
        if not isinstance(getattr(settings, name), bool):
            raise SpecError(f"hydra.sweeper.{name}", getattr(settings, name), "true or false")
    for axis in axes:  # an axis that cannot be searched: named as typed, with the way out
        check_search_axis(axis, axes_field)
    if len(set(axes)) != len(axes):
        raise SpecError(axes_field, axes, "each axis once")
    check_bounds_keys(axes, settings.bounds)
    out = {}
    for axis, b in settings.bounds.items():
        extra = sorted(set(b or {}) - {"lower", "upper", "multiple_of"})
        if extra:
            raise SpecError(f"hydra.sweeper.bounds.{axis}.{extra[0]}", b[extra[0]], "lower, upper or multiple_of")
    for axis in axes:
        b = settings.bounds.get(axis) or {}
        lower, upper = b.get("lower", settings.lower), b.get("upper", settings.upper)
        try:
            out[axis] = Lattice.make(lower, upper, b.get("multiple_of", settings.multiple_of), axis)
        except SpecError as exc:  # Lattice.make names hydra.sweeper.<key>: name the key the value came from
            key = exc.field.rpartition(".")[2]
            field_name = f"hydra.sweeper.bounds.{axis}.{key}" if key in b else exc.field
            raise SpecError(field_name, exc.value, exc.accepted) from None
    return out


def frontier_conf(given: Mapping[str, Any]) -> FrontierSweeperConf:
    """The frontier sweeper's settings from what Hydra passes its plugin (``hydra.sweeper.*``,
    ``bounds`` and ``axes`` as OmegaConf containers or plain values).

    Args:
        given: setting name -> value.

    Returns:
        The ``FrontierSweeperConf`` (``bounds`` a plain dict, ``axes`` a list or None); not yet
        validated (``check_settings``).

    Raises:
        SpecError: a key ``FrontierSweeperConf`` does not declare (``+hydra.sweeper.bogus=1``), as
            ``hydra.sweeper.<key>``, listing the accepted keys.
    """
    accepted = [f.name for f in fields(FrontierSweeperConf)]
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        keys = ", ".join(k for k in accepted if k != "_target_")
        raise SpecError(f"hydra.sweeper.{unknown[0]}", given[unknown[0]], f"a key of the frontier sweeper: {keys}")
    settings = dict(given)
    bounds, axes = settings.get("bounds"), settings.get("axes")
    settings["bounds"] = dict(plain_dict(bounds, resolve=True) if OmegaConf.is_config(bounds) else bounds or {})
    settings["axes"] = None if axes is None else list(axes)
    return FrontierSweeperConf(**settings)


def searched_axes(axis: Any, axes: Any) -> list[str]:
    """The axes a frontier sweep searches, from ``hydra.sweeper.axis`` and ``hydra.sweeper.axes``.

    Args:
        axis: ``hydra.sweeper.axis``, one axis or None (not given).
        axes: ``hydra.sweeper.axes``, a list of axes or None (not given).

    Returns:
        ``axes`` when given, else ``[axis]``, else ``["batch"]`` (the default); not yet checked
        against ``sweeper.search.SEARCH_AXES`` (``check_settings`` does).

    Raises:
        SpecError: both given (field ``hydra.sweeper.axes``): which one wins would be a guess; an
            empty list (``hydra.sweeper.axes=[]``): it asks to search nothing, never batch quietly.
    """
    if axes is not None and len(axes) == 0:
        raise SpecError(
            "hydra.sweeper.axes",
            [],
            "a non-empty list of axes to search, of " + ", ".join(SEARCH_AXES) + " (or leave it out: batch)",
        )
    if axes and axis is not None:
        raise SpecError(
            "hydra.sweeper.axes",
            list(axes),
            f"axes without hydra.sweeper.axis (given both: axis={axis}); to search several, list them all in axes",
        )
    return list(axes) if axes else [axis if axis is not None else "batch"]


def check_bounds_keys(axes: list[str], bounds: Mapping[str, Any]) -> None:
    """Refuse per-axis bounds (``hydra.sweeper.bounds.<axis>``) of an axis the sweep does not
    search: a misspelt axis, or one left out of ``axis``/``axes``, would be ignored silently.

    Args:
        axes: the axes searched.
        bounds: ``hydra.sweeper.bounds``, axis -> {lower, upper, multiple_of}.

    Raises:
        SpecError: field ``hydra.sweeper.bounds.<key>``, listing the axes searched.
    """
    for key, value in bounds.items():
        if key not in axes:
            raise SpecError(
                f"hydra.sweeper.bounds.{key}",
                value,
                "bounds of an axis this sweep searches: " + ", ".join(axes) + " (hydra.sweeper.axis/axes)",
            )


def check_search_load(baseline: Any, objective: str = "edge") -> None:
    """Refuse a search with nothing to find the edge against: a dry run (no memory) or a
    measured run on the CPU without an emulated ``capacity``; and a throughput search of dry runs.

    Args:
        baseline: the sweep's baseline ``RunSpec`` (``device`` resolved, ``capacity_bytes`` in
            bytes or None).
        objective: ``hydra.sweeper.objective``.

    Raises:
        SpecError: field ``capacity``, suggesting a size (``DRY_RUN_NEEDS_CAPACITY``,
            ``CPU_NEEDS_CAPACITY``); field ``hydra.sweeper.objective``: ``throughput`` on dry runs.
    """
    if baseline.dry_run and objective == "throughput":
        raise SpecError(
            "hydra.sweeper.objective",
            objective,
            "edge with dry_run=true: a dry run measures no time (or dry_run=false)",
        )
    if baseline.capacity_bytes is not None:
        return
    if baseline.dry_run:
        raise SpecError("capacity", None, DRY_RUN_NEEDS_CAPACITY)
    if baseline.device == "cpu":
        raise SpecError("capacity", None, CPU_NEEDS_CAPACITY)


def check_sweep_choice(overrides: list[str], sweep: Any, axes: list[str]) -> None:
    """Refuse a preset sweep (``sweep=ovat``) given with the frontier sweeper when it sweeps an
    axis the search does not: its values would be dropped without a word.

    Args:
        overrides: the command line's overrides (``sweep=ovat`` among them when given).
        sweep: the composed ``sweep`` node (``axes``: axis -> values).
        axes: the axes searched (``searched_axes``).

    Raises:
        SpecError: field ``sweep``, naming the axes searched.
    """
    given = [o.partition("=")[2] for o in overrides if o.partition("=")[0].lstrip("+~") == "sweep"]
    if not given:
        return
    swept = list((sweep.get("axes") if sweep is not None else None) or {})
    if any(a not in axes for a in swept):
        raise SpecError(
            "sweep",
            given[-1],
            f"sweep=none or no sweep with hydra/sweeper=frontier: it searches {', '.join(axes)} "
            f"(hydra.sweeper.axis/axes) and runs no preset's values ({given[-1]} sweeps {', '.join(swept)}); "
            "to search several axes: 'hydra.sweeper.axes=[batch,context,width]'",
        )
