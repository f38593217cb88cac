"""How a load is named in one line: the per-run console line (``sweeper.job.outcome_line``), the
frontier's "fixed load" column (``analysis.outputs.format_frontier``) and the report's load row.

Standard library and ``conf.contract`` only (the sweeper imports it in every job). A label names
the axes' values and, whenever they are not ``RunSpec``'s default, the fields that make another
load with the same axes (``SHOWN_WHEN_SET``): a DDP and an FSDP run of the same sizes, an autocast
run beside a pure one, never read alike. ``world_size`` is named under a parallel load only (a
one-process run has world_size 1). No width is named where the load ignores it
(``conf.contract.width_ignored``: the hf workload, a transformer with ``workload.hidden`` set).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from memsweep.conf.contract import AXES, RunSpec, width_ignored

SHOWN_WHEN_SET = ("workload", "precision", "parallel")
"""Load fields a label names whenever their value is not ``RunSpec``'s default (workload mlp,
precision pure, parallel none)."""


def spec_default(name: str) -> Any:
    """``RunSpec``'s default of a field; for ``workload``, its name.

    Args:
        name: a field of ``conf.contract.RunSpec``.

    Returns:
        The default value (``"none"`` for ``parallel``, ``"mlp"`` for ``workload``).

    Raises:
        KeyError: ``name`` is no field of RunSpec.
    """
    f = {f.name: f for f in dataclasses.fields(RunSpec)}[name]
    value = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc, operator]
    return value.get("name") if isinstance(value, dict) else value


def set_fields(load: Mapping) -> dict[str, Any]:
    """The ``SHOWN_WHEN_SET`` fields of a load that are not RunSpec's default.

    Args:
        load: a runs-table or frontier row, or a spec as a mapping (its ``workload`` a name or a
            mapping with one); a field missing or None is left out.

    Returns:
        field -> value, in ``SHOWN_WHEN_SET``'s order.
    """
    out = {}
    for k in SHOWN_WHEN_SET:
        v = load.get(k)
        v = v.get("name") if isinstance(v, Mapping) else v
        if v is not None and v != spec_default(k):
            out[k] = v
    return out


def reads_width(load: Mapping) -> bool:
    """Whether a load reads the width axis (``conf.contract.width_ignored``).

    Args:
        load: a runs-table or frontier row (``workload`` a name, ``workload_params`` JSON text) or
            a spec as a mapping (``workload`` a mapping with ``name`` and its parameters).

    Returns:
        False where the load ignores the width; True otherwise, and when the workload is unknown
        (no ``workload``) or its parameters are not readable JSON.
    """
    workload = load.get("workload")
    if isinstance(workload, Mapping):
        name, params = workload.get("name"), workload
    else:
        try:
            params = json.loads(load.get("workload_params") or "{}")
        except (TypeError, ValueError):
            return True
        name = workload
    if not isinstance(name, str) or not isinstance(params, Mapping):
        return True
    return width_ignored(name, params) is None


def load_words(load: Mapping, also: Iterable[str] = ()) -> list[str]:
    """A load as ``key=value`` words: its axes (None ones left out, and the width where the load
    ignores it, ``reads_width``), then its ``set_fields``, then ``also``.

    Args:
        load: a runs-table or frontier row (the swept axis is None there, so left out), or a spec as
            a mapping.
        also: further fields to name whatever their value (what tells two loads apart), each once.

    Returns:
        e.g. ``["context=8", "width=64", "dtype=bfloat16", "parallel=fsdp", "world_size=2"]``;
        ``world_size`` only when ``parallel`` is set (DDP or FSDP).
    """
    fields = set_fields(load)
    skip = {"world_size"} if reads_width(load) else {"world_size", "width"}
    words = {k: load.get(k) for k in AXES if k not in skip and load.get(k) is not None}
    words.update(fields)
    if "parallel" in fields and load.get("world_size") is not None:
        words["world_size"] = load.get("world_size")
    for k in also:
        words.setdefault(k, load.get(k))
    return [f"{k}={v}" for k, v in words.items()]
