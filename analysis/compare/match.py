"""Lining up comparable loads of two sweeps: per value and phase, the four counters and their
differences; what differs between the sweeps; what could not be compared, and why.

A series is one swept axis of one load in one sweep (everything but the axis fixed). The
baseline's series are each paired with the other sweep's series of the same axis whose load
differs in the fewest fields (the "one thing changed": dtype, precision, optimizer, allocator
settings, torch version...). All sizes in bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import NamedTuple

from memsweep.conf.contract import AXES, device_kind_of
from memsweep.estimator.labels import load_words

from ..frontier import SPREAD, order_key
from ..schemas import ENV_COLUMNS, OPTIONS
from .load import Sweep
from .names import digest, name_of, param_names

COUNTERS = ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved")
"""The four counters compared, per phase (PyTorch's names)."""

GATE_COUNTERS = {"allocated": "max_memory_allocated", "reserved": "max_memory_reserved"}
"""``--counter``'s names -> the peak the memory gate reads. ``allocated`` (the default) is the
steadiest on every device: on CUDA the tensors' bytes, while the reserved peak also holds what the
caching allocator kept from earlier phases (it moves with warm-up history); on the CPU the worker's
tracked tensor bytes, while its reserved figure is the process resident set (code and libraries too)."""

SWEPT = tuple(a for a in AXES if a != "dtype")
"""Axes a series can sweep (dtype is what comparisons usually change, not an axis here)."""

SPEC_FIELDS = (
    "workload",
    "workload_params",
    "mode",
    "batch",
    "context",
    "width",
    "dtype",
    "device",
    "capacity_bytes",
    "capacity_mode",
    "warmup",
    "repeats",
    "seed",
    *OPTIONS,
    *SPREAD,  # devices per run, DDP/FSDP and its world_size: a DDP and an FSDP run are two loads
    "isolation",
)
"""Run fields of the spec (what was asked for) shown when they differ between sweeps."""
_GROUP = tuple(f for f in SPEC_FIELDS if f not in ("seed", "isolation"))

RUN_COLUMNS = tuple(
    dict.fromkeys(
        (
            "sweep_dir",
            "run_id",
            "source",
            "outcome",
            *SPEC_FIELDS,
            *ENV_COLUMNS,
            *(c for c in COUNTERS if c.startswith("max_")),
            "samples_per_s",
            "throughput_noise_rel",
        )
    )
)
"""The runs-table columns a comparison reads (``load.load_sweep``): the run's identity and outcome,
its spec and environment (``differences``), its peaks and its measured rate (``speed``)."""
PHASE_COLUMNS = ("sweep_dir", "run_id", "phase", "phase_index", *COUNTERS)
"""The phases-table columns a comparison reads: the phase's run, name, order and four counters."""


@dataclass
class Series:
    """One swept axis of one load in one sweep.

    Attributes:
        sweep: the sweep.
        axis: ``batch``, ``context`` or ``width``.
        load: the fixed load (``_GROUP`` fields but the axis) of its runs.
        by_value: value -> its runs.
        kind: the device kind (``cpu``, ``cuda``, ``unknown``).
        params_name: its workload parameters' name among the loads compared (``name_series``:
            the differing ones, or a digest; ``""`` none needed); None: not named.
    """

    sweep: Sweep
    axis: str
    load: dict
    by_value: dict
    kind: str
    params_name: str | None = None

    @property
    def title(self) -> str:
        """``"batch sweep (context=64 width=64 dtype=float32)"``: the fixed load as
        ``analysis.labels.load_words`` names it (parallel and world_size of a DDP/FSDP load), then
        its ``params_name`` (``workload=user model.blocks=2``)."""
        return self.titled(self.params_name)

    def titled(self, params_name: str | None) -> str:
        """The title with ``params_name`` as its workload parameters' name (None or ``""``: none)."""
        words = load_words({k: v for k, v in self.load.items() if k != self.axis})
        return f"{self.axis} sweep ({' '.join([*words, params_name] if params_name else words)})"


def name_series(series: list[Series]) -> None:
    """Name the workload parameters of every series compared (``Series.params_name``), so that two
    loads of one workload read apart by what differs between them, never by their whole JSON.

    Args:
        series: every series of the sweeps compared (``series_of`` of each); changed in place.
    """
    names = param_names(s.load for s in series)
    for s in series:
        s.params_name = name_of(names, s.load)


def series_of(sweep: Sweep) -> list[Series]:
    """Every axis of ``sweep`` swept over two or more values with everything else fixed.

    Args:
        sweep: the sweep.

    Returns:
        One series per (axis, fixed load), in axis order.
    """
    keys = [tuple(map(str, map(r.get, _GROUP))) for r in sweep.runs]  # each run's load as text, once
    out = []
    for axis in SWEPT:
        i = _GROUP.index(axis) if axis in _GROUP else len(_GROUP)
        groups: dict[tuple, list[dict]] = {}
        for r, key in zip(sweep.runs, keys):
            if r.get(axis) is not None:
                groups.setdefault(key[:i] + key[i + 1 :], []).append(r)
        for rs in groups.values():
            by_value: dict = {}
            for r in rs:
                by_value.setdefault(r[axis], []).append(r)
            if len(by_value) < 2:
                continue
            load = {k: rs[0].get(k) for k in _GROUP if k != axis}
            kinds = {device_kind_of(*pair) for pair in {(r.get("device_kind"), r.get("device")) for r in rs}}
            by_value = {v: by_value[v] for v in sorted(by_value)}
            out.append(Series(sweep, axis, load, by_value, kinds.pop() if len(kinds) == 1 else "mixed"))
    return out


@dataclass
class Row:
    """One value and phase (or the run's peak, ``phase`` = ``run peak``) of a comparison.

    Attributes:
        value: the axis's value.
        phase: the phase name; ``run peak`` for the largest over the run's phases.
        base, other: counter -> bytes in the baseline and the other sweep (None: not recorded).
    """

    value: object
    phase: str
    base: dict
    other: dict

    def diff(self, counter: str) -> int | None:
        """other - base (bytes); None when either is missing."""
        a, b = self.base.get(counter), self.other.get(counter)
        return None if a is None or b is None else b - a

    def ratio(self, counter: str) -> float | None:
        """other / base; None when either is missing or the base is 0."""
        a, b = self.base.get(counter), self.other.get(counter)
        return None if a is None or b is None or not a else b / a


@dataclass
class Comparison:
    """A series of the baseline against one of another sweep.

    Attributes:
        base, other: the two series (``other`` None when the other sweep has none to pair).
        gate_counter: the peak compared with the capacity on their device (the gate's counter).
        rows: per common value, the run-peak row then one row per phase in both runs.
        not_comparable: why the pair, a value or a phase could not be compared (one line each).
        comparable: False when nothing of the pair could be compared.
    """

    base: Series
    other: Series | None
    gate_counter: str
    rows: list[Row] = field(default_factory=list)
    not_comparable: list[str] = field(default_factory=list)
    comparable: bool = True

    @property
    def title(self) -> str:
        """The pair's heading: the baseline's series title, and where the other series' fixed load
        differs (another dtype, workload parameter...), what it is there, so that rows of two loads
        never read as like-for-like: ``"batch sweep (context=64 width=64 dtype=float32) in A;
        dtype=bfloat16 in B"``."""
        if self.other is None:
            return self.base.title
        base, other = self.base, self.other
        differ = [k for k in _GROUP if k != base.axis and str(base.load.get(k)) != str(other.load.get(k))]
        if not differ:
            return base.title
        named = (base.params_name, other.params_name)
        if None in named:  # not named by name_series: the pair's own differences
            pair = param_names([base.load, other.load])
            named = (name_of(pair, base.load), name_of(pair, other.load))
        there = [f"{k}={other.load.get(k)}" for k in differ if k != "workload_params"]
        if "workload_params" in differ and (named[1] or "workload" not in differ):
            there.append(named[1] or digest(other.load.get("workload_params")))
        return f"{base.titled(named[0])} in {base.sweep.label}; {' '.join(there)} in {other.sweep.label}"


def _run_of(runs: list[dict], counter: str) -> dict | None:
    """The run a value is represented by: its ok run with the largest ``counter`` peak."""
    ok = [r for r in runs if r.get("outcome") == "ok"]
    return max(ok, key=lambda r: r.get(counter) or 0) if ok else None


def _phase_counters(sweep: Sweep, run: dict) -> dict[str, tuple[int, dict]]:
    """phase name -> (its ``phase_index``, the four counters: a phase recorded several times keeps
    its first index and the largest of each counter; None where never recorded)."""
    out: dict[str, tuple[int, dict]] = {}
    for p in sweep.phases_of(run):
        name = str(p.get("phase"))
        seen = out.get(name)
        if seen is None:
            out[name] = (p.get("phase_index") or 0, {c: p.get(c) for c in COUNTERS})
            continue
        cur = seen[1]
        for c in COUNTERS:
            v = p.get(c)
            if v is not None and (cur[c] is None or v > cur[c]):
                cur[c] = v
    return out


def _differing(base: Series, other: Series) -> int:
    return sum(1 for k in base.load if str(base.load.get(k)) != str(other.load.get(k)))


def _load_key(s: Series) -> tuple:
    """A series' axis and fixed load, as text: two series of one key differ in no field."""
    return (s.axis, *(f"{k}={s.load.get(k)}" for k in sorted(s.load)))


def series_index(candidates: list[Series]) -> dict[tuple, Series]:
    """The first series of each axis and load among ``candidates``, for ``compare_series``'s look-up.

    Args:
        candidates: another sweep's series (``series_of``).

    Returns:
        ``_load_key`` -> the first series with it, in the order of ``candidates``.
    """
    out: dict[tuple, Series] = {}
    for c in candidates:
        out.setdefault(_load_key(c), c)
    return out


def compare_series(
    base: Series,
    candidates: list[Series],
    gate: str = "max_memory_allocated",
    index: dict[tuple, Series] | None = None,
) -> Comparison:
    """Compare a baseline series with the best-matching series of another sweep.

    Args:
        base: the baseline's series.
        candidates: the other sweep's series.
        gate: the peak the memory gate reads (a value of GATE_COUNTERS); a value's run is its ok
            run with the largest of it.
        index: their ``series_index``, built once for many baseline series: a series of the same
            load is then found by one look-up (else the one differing in the fewest fields is sought).

    Returns:
        The comparison; ``comparable`` False (with the reason) when no series of the same axis
        exists, the devices' counters mean different things, or no value ran ok in both.
    """
    same_axis = [c for c in candidates if c.axis == base.axis]
    if not same_axis:
        cmp = Comparison(base, None, gate, comparable=False)
        cmp.not_comparable.append(f"{base.title}: the other sweep has no {base.axis} sweep")
        return cmp
    exact = (index or {}).get(_load_key(base))
    other = exact if exact is not None else min(same_axis, key=lambda c: _differing(base, c))
    cmp = Comparison(base, other, gate)
    if base.kind != other.kind:
        cmp.comparable = False
        cmp.not_comparable.append(
            f"{base.title}: measured on {base.kind} in {base.sweep.label} and on {other.kind} in "
            f"{other.sweep.label}: the counters measure different things (CPU: tracked tensor bytes and the "
            "process resident set; CUDA: the caching allocator)"
        )
        return cmp
    values = sorted(set(base.by_value) | set(other.by_value), key=lambda v: order_key(base.axis, v))
    for v in values:
        _compare_value(cmp, base, other, v)
    if not cmp.rows:
        cmp.comparable = False
        cmp.not_comparable.append(f"{base.title}: no value ran ok in both sweeps")
    return cmp


def _compare_value(cmp: Comparison, base: Series, other: Series, v) -> None:
    """Append to ``cmp`` the rows of value ``v`` (the run peak, then each phase recorded in both), or
    why it is not comparable (not run in one sweep, no run ok in both, a phase recorded in one)."""
    where = f"{base.axis}={v}"
    if v not in base.by_value or v not in other.by_value:
        missing = base.sweep.label if v not in base.by_value else other.sweep.label
        cmp.not_comparable.append(f"{where}: not run in {missing}")
        return
    a, b = _run_of(base.by_value[v], cmp.gate_counter), _run_of(other.by_value[v], cmp.gate_counter)
    if a is None or b is None:
        outcomes = {
            s.label: ", ".join(sorted({str(r.get("outcome")) for r in rs}))
            for s, rs in ((base.sweep, base.by_value[v]), (other.sweep, other.by_value[v]))
        }
        cmp.not_comparable.append(
            f"{where}: no run ok in both ({'; '.join(f'{k}: {o}' for k, o in outcomes.items())}); a run that "
            "did not complete has a partial peak, not the memory the load needs"
        )
        return
    peaks = [c for c in COUNTERS if c.startswith("max_")]
    cmp.rows.append(Row(v, "run peak", {c: a.get(c) for c in peaks}, {c: b.get(c) for c in peaks}))
    pa_, pb = _phase_counters(base.sweep, a), _phase_counters(other.sweep, b)
    # in phase order; at an equal index the baseline's phases first (a stable sort, not a set's order)
    for name in sorted(dict.fromkeys([*pa_, *pb]), key=lambda n: (pa_[n] if n in pa_ else pb[n])[0]):
        if name not in pa_ or name not in pb:
            cmp.not_comparable.append(
                f"{where} phase {name}: recorded only in {base.sweep.label if name in pa_ else other.sweep.label}"
            )
            continue
        cmp.rows.append(Row(v, name, pa_[name][1], pb[name][1]))


def _distinct(values: list) -> list:
    """The distinct values of ``values``, told apart by type and value (1, 1.0 and True are three;
    a set alone would keep one of them); unhashable values (lists) are all kept."""
    try:
        if len(set(map(type, values)) - {type(None)}) <= 1:
            return list(set(values))
        return [v for _, v in {(type(v), v) for v in values}]
    except TypeError:
        return values


def _values(sweep: Sweep, key: str, names: dict | None = None) -> list[str]:
    """The distinct values of a column over the sweep's runs, as JSON text (``null``), sorted;
    ``workload_params`` by their name in ``names`` (``names.param_names`` of every sweep's runs),
    else their digest, after the workload's name when the sweeps ran several workloads."""
    if key in sweep.missing_columns:
        return ["not recorded (older Parquet)"]
    if key == "workload_params" and names is not None:
        several = len({w for w, _ in names}) > 1
        return sorted(
            {
                (f"{r.get('workload')}: " if several else "") + (name_of(names, r) or digest(r.get(key)))
                for r in sweep.runs
            }
        )
    values = _distinct([r.get(key) for r in sweep.runs])
    return sorted({json.dumps(v, default=str) if v is not None else "null" for v in values})


SHOWN_VALUES = 12
"""The most values of a field shown per sweep in "what differs" (the rest are counted)."""


def _shown(values: list[str]) -> str:
    """Values joined by commas: at most ``SHOWN_VALUES``, then how many there are in all."""
    if len(values) <= SHOWN_VALUES:
        return ", ".join(values)
    return ", ".join(values[:SHOWN_VALUES]) + f", ... ({len(values)} values)"


class Difference(NamedTuple):
    """A spec or environment field whose values are not the same in every sweep."""

    kind: str  # ``spec`` or ``environment``
    field: str
    values: list[str]  # in each sweep, baseline first


def differences(sweeps: list[Sweep], axes: list[str]) -> list[Difference]:
    """What differs between the sweeps, field by field.

    Args:
        sweeps: the sweeps, baseline first.
        axes: the swept axes (their values differ by design and are left out).

    Returns:
        ``(kind, field, [values in each sweep])`` for every spec or environment field whose set of
        values is not the same in every sweep; kind is ``spec`` or ``environment``; the values of
        a sweep joined by commas, at most ``SHOWN_VALUES`` of them, then their count. The workload
        parameters are named compactly (``names.param_names``: those that differ, or a digest).
    """
    names = param_names(r for s in sweeps if "workload_params" not in s.missing_columns for r in s.runs)
    out = []
    for kind, fields in (("spec", SPEC_FIELDS), ("environment", ENV_COLUMNS)):
        for f in fields:
            if f in axes:
                continue
            per = [_values(s, f, names) for s in sweeps]
            if any(p != per[0] for p in per[1:]):
                out.append(Difference(kind, f, [_shown(p) for p in per]))
    return out
