"""How a load is named in one line: the per-run console line (``sweeper.job.outcome_line``), the
frontier's "fixed load" column (``analysis.outputs.format_frontier``), the report's load row and
the verdict lines (``verdict_words``: mode, precision recipe, optimizer, checkpointing, capacity).

Standard library and ``conf.contract`` only (the sweeper imports it in every job). A label names
the axes' values and the fields that make another load with the same axes (``SHOWN_WHEN_SET``):
a non-default workload or parallel, and the precision recipe in Lightning's words
(``recipe_word``: always in mode=train, else when autocast), so that a DDP and an FSDP run, or a
``bf16-mixed`` and a ``bf16-true`` one, never read alike. ``world_size`` is named under a parallel
load only. No width is named where the load ignores it (``conf.contract.width_ignored``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from memsweep.conf.contract import AXES, RunSpec, SpecError, width_ignored
from memsweep.conf.contract.spec import resolve_precision
from memsweep.conf.contract.units import SIZE_UNITS
from memsweep.conf.contract.vocabulary import RECIPE_DTYPES, RECIPE_KINDS

SHOWN_WHEN_SET = ("workload", "precision", "parallel")
"""Load fields a label names beside the axes: workload and parallel whenever not ``RunSpec``'s
default (mlp, none), precision as ``recipe_word`` says (a label reads ``mode`` too)."""


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
    """The ``SHOWN_WHEN_SET`` fields a label names: workload and parallel when not RunSpec's
    default, precision when ``recipe_word`` names it (as its recipe).

    Args:
        load: a runs-table or frontier row, or a spec as a mapping (its ``workload`` a name or a
            mapping with one); a field missing or None is left out.

    Returns:
        field -> value, in ``SHOWN_WHEN_SET``'s order.
    """
    out = {}
    for k in SHOWN_WHEN_SET:
        if k == "precision":
            word = recipe_word(load)
            if word is not None:
                out[k] = word
            continue
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


def recipe_word(load: Mapping) -> str | None:
    """The precision recipe of a load in Lightning's words (``Trainer(precision=...)``), when a
    label names it: always in mode=train, in another mode when it is autocast.

    ``bf16-mixed`` / ``16-mixed``: float32 master weights, gradients and optimizer states, 16-bit
    compute (``precision=autocast``); ``bf16-true`` / ``16-true`` / ``32-true``: everything in
    ``dtype`` (``precision=pure``). An unresolved ``auto`` or alias is resolved as the spec
    resolves it (``conf.contract.spec.resolve_precision``).

    Args:
        load: a runs-table or frontier row, a spec or a composed config as a mapping: its
            ``precision``, ``mode``, ``dtype`` and ``workload`` are read.

    Returns:
        The recipe (e.g. ``bf16-mixed``); the resolved ``precision`` itself where the dtype is
        not known (a dtype sweep's frontier row) or the pair has no recipe; None when not named
        (not train and not autocast, or no precision or mode known).
    """
    precision, mode, dtype = load.get("precision"), load.get("mode"), load.get("dtype")
    workload = load.get("workload")
    if precision is None or (mode is None and precision not in RECIPE_KINDS):
        return None
    try:
        precision = resolve_precision(precision, mode, dtype, workload if isinstance(workload, Mapping) else None)
    except SpecError:
        return str(precision)
    if mode != "train" and precision != "autocast":
        return None
    if dtype not in RECIPE_DTYPES or (dtype == "float32" and precision == "autocast"):
        return precision
    return f"{RECIPE_DTYPES[dtype]}-{RECIPE_KINDS[precision]}"


def size_word(value: int) -> str:
    """A byte count as the shortest size text ``conf.contract.parse_size`` reads back exactly.

    Args:
        value: bytes (int >= 0).

    Returns:
        e.g. ``80GB``, ``2GiB``, ``256MiB``, ``1500MB``; ``123B`` when no larger unit divides it.
    """
    fits = [(value // n, u) for u, n in SIZE_UNITS.items() if n > 1 and value and value % n == 0]
    count, unit = min(fits, default=(value, "B"))
    return f"{count}{unit}"


def verdict_words(load: Mapping, capacity_bytes: int | None, skip: Iterable[str] = ()) -> list[str]:
    """The load a verdict answered for, as ``key=value`` words: mode, the label (``load_words``,
    the precision recipe among them), a training run's optimizer and checkpointing (and
    micro_steps above 1), then the capacity.

    Args:
        load: a spec as a mapping, or a runs-table or frontier row.
        capacity_bytes: the capacity the verdict is about (bytes); None = the device's own memory.
        skip: fields left out (the axis the verdict is about).

    Returns:
        e.g. ``["mode=train", "context=4096", "dtype=bfloat16", "workload=hf",
        "precision=bf16-mixed", "optimizer=adamw", "checkpointing=true", "capacity=80GB"]``.
    """
    skipped = set(skip)
    words = [f"mode={load.get('mode')}", *load_words({k: v for k, v in load.items() if k not in skipped})]
    if load.get("mode") == "train":
        words.append(f"optimizer={load.get('optimizer')}")
        words.append(f"checkpointing={json.dumps(bool(load.get('checkpointing')))}")
        if load.get("micro_steps") not in (None, 1):
            words.append(f"micro_steps={load.get('micro_steps')}")
    words.append("capacity=" + ("device" if capacity_bytes is None else size_word(capacity_bytes)))
    return words
