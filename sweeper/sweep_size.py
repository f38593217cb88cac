"""The number of conditions a sweep asks for, counted before any list of values is expanded.

Hydra's sweep overrides expand lazily (``batch=range(1,100000000)`` is a ``RangeSweep``) until a
sweeper lists their values: a sweep of 10^8 values would grow the orchestrator by gigabytes
before any check. ``check_sweep_size`` (``sweeper.upfront.CheckBeforeLaunch``, at the multirun's
start) counts each override's values from its bounds and refuses, naming the axis and the
count, a sweep of more than ``MAX_CONDITIONS`` conditions: the ovat sweeper's union of its
axes, the basic sweeper's cartesian product.
"""

from __future__ import annotations

import math
from typing import Any

from omegaconf import OmegaConf

from memsweep.conf.contract import SpecError

MAX_CONDITIONS = 4096
"""The most conditions (runs, one worker process each) one sweep may plan."""


def values_count(override: Any) -> int:
    """How many values one of Hydra's overrides stands for, without listing them.

    Args:
        override: a parsed ``hydra.core.override_parser.types.Override``.

    Returns:
        ``range(a,b,s)``: its length from its bounds (floats too); a list or ``choice``: its
        length; anything else (a single value, an interval, a glob of config files): 1.
    """
    from hydra.core.override_parser.types import ChoiceSweep, RangeSweep

    if not override.is_sweep_override():
        return 1
    value = override.value()
    if isinstance(value, RangeSweep):
        start, stop, step = value.start, value.stop, value.step
        if not step or start is None or stop is None:
            return 0
        return max(0, math.ceil((stop - start) / step))
    if isinstance(value, ChoiceSweep):
        return len(value.list)
    return 1


def _refuse(field: str, typed: str, count: int, how: str) -> SpecError:
    """The refusal of ``field`` as typed (``typed``: its override's value) for its ``count`` conditions."""
    return SpecError(
        field,
        f"{typed} ({count} conditions)",
        f"at most {MAX_CONDITIONS} conditions in one sweep ({how}); sweep fewer values (a coarser range step), "
        "or search the edge with hydra/sweeper=frontier",
    )


def check_sweep_size(config: Any, product: bool) -> int:
    """Refuse a sweep of more than ``MAX_CONDITIONS`` conditions before any value is listed.

    Args:
        config: the multirun's composed config (``hydra.overrides.task``, ``hydra.sweeper.params``).
        product: the conditions are the cartesian product of the sweeps (Hydra's basic
            sweeper); otherwise their union (the ovat sweeper: one axis at a time).

    Returns:
        The count (an upper bound for the union: the baseline is counted per axis).

    Raises:
        SpecError: naming the axis whose values alone pass the cap, or (``product``) the axes
            multiplied, with the count.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
    lines = [f"{k}={v}" for k, v in params.items()] + list(OmegaConf.select(config, "hydra.overrides.task") or [])
    parser = OverridesParser.create()
    counts, typed = {}, {}
    for line in lines:
        override = parser.parse_override(str(line))
        if override.is_sweep_override():
            key = override.get_key_element()
            counts[key], typed[key] = values_count(override), str(line).partition("=")[2]
    for axis, count in counts.items():
        if count > MAX_CONDITIONS:
            raise _refuse(axis, typed[axis], count, f"{axis} alone asks for {count}")
    total = math.prod(counts.values()) if product else sum(counts.values())
    if total > MAX_CONDITIONS:
        how = " x ".join(f"{a} {c}" for a, c in counts.items()) if product else f"{' + '.join(counts)} together"
        raise _refuse(" ".join(counts), " ".join(typed.values()), total, how)
    return total
