"""Per swept axis: the values run, their peaks, the frontier, the margin and the recommended value.

One frontier row (analysis.frontier.FRONTIER_SCHEMA: one swept axis, everything else fixed)
becomes one ``AxisResult``; each value of the axis that ran becomes one ``ValueStat``. Every
size is in bytes; the peak compared with the capacity is the counter ``margin.basis`` names.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from memsweep.conf.contract import AXES, gib
from memsweep.estimator.labels import load_words
from memsweep.estimator.margin import MarginPolicy, basis, device_kind, margin_leaves_nothing

from ..frontier import ROW_KEY, differing, direction_words, edge_columns, group_keys, order_key, search_results
from .fit import capacity_limits, fit_axis
from .fmt import axis_label, pct


@dataclass
class ValueStat:
    """Everything measured at one value of the swept variable (bytes, or None where not recorded).

    Attributes:
        value: the value of the swept axis (an int; a dtype name for the dtype axis).
        runs: the run rows at this value (enriched by ``enrich_runs``, ``attach_phases``).
        outcomes: how many of them ended with each outcome (``ok``, ``oom``, ``error``, ...).
        used: the peak compared with the capacity (``basis``): the largest over the runs that
            ran ok, else over all runs (a partial peak, before the failure).
        other: the other counter's peak, over the same runs.
        above_start: CPU only, the resident set's peak minus its value when the first phase began.
        failed_phases: the phases the runs failed in, sorted.
        margin: capacity - used, only where every run at this value ran ok.
    """

    value: Any
    runs: list[dict]
    outcomes: Counter
    used: int | None  # the peak compared with the capacity: max over ok runs (else over all: partial)
    other: int | None  # the other counter's peak, same selection
    above_start: int | None  # CPU: resident set peak minus its value at the first phase's start
    failed_phases: list[str]
    margin: int | None  # capacity - used, for a value whose runs all ran ok

    @property
    def status(self) -> str:
        """The outcomes as printed: ``ok``, ``oom x2``, ``mixed (ok x1, oom x1)``; ``-`` when no run."""
        if not self.outcomes:
            return "-"
        if len(self.outcomes) == 1:
            ((o, n),) = self.outcomes.items()
            return str(o) if n == 1 else f"{o} x{n}"
        return "mixed (" + ", ".join(f"{o} x{n}" for o, n in sorted(self.outcomes.items(), key=str)) + ")"

    @property
    def all_ok(self) -> bool:
        """True when every run at this value ran ok (and there is at least one)."""
        return set(self.outcomes) == {"ok"}


@dataclass
class AxisResult:
    """One swept axis of one load (one frontier row): its values, frontier, margin and recommended value.

    Attributes:
        sweep_dir: the sweep directory of the row.
        axis: the swept axis (batch, context, width, dtype).
        frontier: the frontier row itself (FRONTIER_SCHEMA, plus any search columns).
        fixed: the other axes' values, ``{axis: value}``.
        kind: the device kind of the runs (``device_kind``).
        capacity: the capacity compared with the peak (bytes); None when not recorded.
        margin_bytes: the margin policy's bytes at that capacity; None when unknown.
        values: one ``ValueStat`` per value run, in the axis's order (``order_key``).
        runs: every run of this load (all values).
        max_ok, min_oom: the frontier: the largest value that ran, the smallest that ran out of
            memory (None when none, and on a ``decreasing`` axis); dtype names on the dtype axis.
        min_ok, max_oom: the frontier of a ``decreasing`` axis (world_size under FSDP): the
            smallest value that ran, the largest that ran out of memory (None otherwise).
        margin_at_edge: capacity - ``used_at_edge`` (bytes).
        used_at_edge: the largest peak (``used_counter``) of the ok runs at ``edge`` (``max_ok``, or
            ``min_ok`` on a decreasing axis; bytes); when none ran ok there (they ran out of memory
            in a later phase that does not scale with the axis), the frontier row's peak of their
            completed phases.
        recommended: the value chosen under the margin policy; None when none qualifies.
        reason: why that value (or none) was chosen, in a sentence for the report.
        notes: warnings that go with the choice (non-monotonic results, CPU optimism...).
        show_dir: True when the report covers several sweep directories (the title names this one).
        detail: what tells this load from another with the same axes (set by ``tell_loads_apart``).
        step: the distance between the axis's values (the frontier sweeper's ``multiple_of`` from
            ``search.jsonl``; 1 otherwise).
        fit: the fitted peak of the values whose every run ran ok (``fit.fit_axis``); None without one.
        limits: the largest values of the lattice whose fitted peak stays within the capacity and
            within the capacity minus the margin (``fit.capacity_limits``: calculated, not measured).
    """

    sweep_dir: str
    axis: str
    frontier: dict
    fixed: dict
    kind: str
    capacity: int | None
    margin_bytes: int | None
    values: list[ValueStat]
    runs: list[dict]
    max_ok: Any = None
    min_oom: Any = None
    min_ok: Any = None
    max_oom: Any = None
    margin_at_edge: int | None = None
    used_at_edge: int | None = None
    recommended: Any = None
    reason: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def decreasing(self) -> bool:
        """True when a larger value of the axis needs less memory (the row's ``direction``:
        world_size under FSDP): it fits from ``min_ok`` up, not up to ``max_ok``."""
        return self.frontier.get("direction") == "decreasing"

    @property
    def edge_names(self) -> tuple[str, str]:
        """The frontier's names of the edge (``analysis.frontier.edge_columns``): ``("max_ok",
        "min_oom")``, or ``("min_ok", "max_oom")`` on a decreasing axis."""
        return edge_columns(self.frontier.get("direction"))

    @property
    def edge(self) -> Any:
        """The value that fits at the edge: ``max_ok``, or ``min_ok`` on a decreasing axis (None when none)."""
        return getattr(self, self.edge_names[0])

    @property
    def miss(self) -> Any:
        """The value that ran out of memory at the edge: ``min_oom``, or ``max_oom`` on a decreasing axis."""
        return getattr(self, self.edge_names[1])

    @property
    def heavy_end(self) -> str:
        """Which end of the axis needs the most memory, in words: ``largest``, or ``smallest`` on a
        decreasing axis (``light_end`` the other)."""
        return "smallest" if self.decreasing else "largest"

    @property
    def light_end(self) -> str:
        """Which end of the axis needs the least memory, in words (the opposite of ``heavy_end``)."""
        return "largest" if self.decreasing else "smallest"

    def by_load(self, stats: list[ValueStat]) -> list[ValueStat]:
        """``stats`` from the value that needs the least memory to the one that needs the most.

        Args:
            stats: ValueStats of this axis.

        Returns:
            a new list in the axis' order (``order_key``), reversed on a decreasing axis.
        """
        return sorted(stats, key=lambda s: order_key(self.axis, s.value), reverse=self.decreasing)

    @property
    def used_counter(self) -> str:
        """The counter compared with the capacity on this load's device (``basis``)."""
        return basis(self.kind)[0]

    show_dir: bool = False  # several sweep directories in one report: name the directory too
    detail: str = ""  # what tells this load from another with the same axes (set by build_report)
    step: int = 1  # the distance between the axis's values (the frontier sweeper's multiple_of)
    fit: dict | None = None  # fit.fit_axis of the values whose every run ran ok
    limits: dict[str, int | None] = field(default_factory=dict)  # fit.capacity_limits

    @property
    def margin_limit_unmeasured(self) -> int | None:
        """The fit's largest value under the capacity minus the margin (``limits``) when it lies
        above ``recommended`` and nothing measured speaks against it: no run at it, below
        ``min_oom``, and every value run up to it ran ok within the margin. None otherwise."""
        x = self.limits.get("capacity - margin")
        if not x or self.decreasing or self.capacity is None or self.margin_bytes is None:
            return None
        if self.recommended is not None and x <= self.recommended:
            return None
        if self.stat(x) is not None or (self.min_oom is not None and x >= self.min_oom):
            return None
        level = self.capacity - self.margin_bytes
        below = [s for s in self.values if s.value <= x]
        if any(not s.all_ok or s.used is None or s.used > level for s in below):
            return None
        return x

    @property
    def load_title(self) -> str:
        """``"batch sweep (context=128 width=256 dtype=float32)"`` (``analysis.labels.load_words``: a
        non-default workload, precision or parallel named too), plus ``detail`` where set."""
        fixed = " ".join(load_words({**self.frontier, **self.fixed, self.axis: None}))
        return f"{self.axis} sweep ({fixed}{' ' + self.detail if self.detail else ''})"

    @property
    def title(self) -> str:
        """``load_title``, followed by ``in SWEEP_DIR`` when the report covers several directories."""
        return self.load_title + (f" in {self.sweep_dir}" if self.show_dir else "")

    def stat(self, value) -> ValueStat | None:
        """The ``ValueStat`` of ``value``; None when that value was not run (or ``value`` is None)."""
        return next((s for s in self.values if s.value == value), None)


def record_unread(run: dict) -> bool:
    """Whether a run's record could not be read, so nothing of it is known: the runs table names a
    ``record_problem`` (a newer memsweep's record.json or result.json, an unreadable file) and holds
    no outcome. Such a run is neither unfinished nor measured; a damaged record with an outcome
    (``crash``: ``conf.contract.read_run``'s ``record_damage``) is a measured run.

    Args:
        run: a row of the runs table (RUNS_SCHEMA as a dict).

    Returns:
        True when ``record_problem`` is set and ``outcome`` is None.
    """
    return bool(run.get("record_problem")) and run.get("outcome") is None


def enrich_runs(runs: list[dict], starts: dict[tuple, int | None]) -> None:
    """Add to each run row, in place, what the report reads from it besides the runs table.

    Args:
        runs: run rows (RUNS_SCHEMA as dicts). Each gets ``kind`` (``device_kind``),
            ``used``/``other`` (the peaks of ``basis``'s two counters, bytes), ``rss_start`` (CPU:
            the first phase's ``memory_reserved_start``, bytes), ``above_start`` (CPU: peak
            resident set minus ``rss_start``, bytes), and no phase rows yet (``_phases`` empty,
            ``_last_phase`` None: ``attach_phases`` adds them).
        starts: each run's first phase's ``memory_reserved_start`` by (sweep_dir, run_id)
            (``rows.phase_starts``).
    """
    for r in runs:
        start = starts.get((r["sweep_dir"], r["run_id"]))
        kind = device_kind(r)
        used_key, other_key = basis(kind)
        r["kind"] = kind
        r["rss_start"] = start if kind == "cpu" else None
        r["used"] = r.get(used_key)
        r["other"] = r.get(other_key)
        peak = r.get("max_memory_reserved")
        r["above_start"] = peak - start if kind == "cpu" and peak is not None and start is not None else None
        r["_phases"], r["_last_phase"] = [], None


def attach_phases(runs: list[dict], phases: list[dict]) -> None:
    """Give each run row, in place, its phase rows: ``_phases`` (by ``phase_index``) and
    ``_last_phase`` (the last of them, or None).

    Args:
        runs: run rows (RUNS_SCHEMA as dicts).
        phases: phase rows (PHASES_SCHEMA as dicts), matched to runs by (sweep_dir, run_id).
    """
    by_run: dict[tuple, list[dict]] = {}
    for p in phases:
        by_run.setdefault((p["sweep_dir"], p["run_id"]), []).append(p)
    for r in runs:
        ps = sorted(by_run.get((r["sweep_dir"], r["run_id"]), []), key=lambda p: p.get("phase_index") or 0)
        r["_phases"] = ps
        r["_last_phase"] = ps[-1] if ps else None


def _max(values: Iterable[int | None]) -> int | None:
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


class RunIndex:
    """The runs of each frontier row's load, found by one dictionary look-up: the runs grouped once
    per (axis, fields compared), so that finding the runs of every row stays linear in the runs;
    and each sweep's search log, read once for all its rows (``searches``).

    Args:
        runs: the measured run rows.
    """

    def __init__(self, runs: list[dict]):
        self.runs = runs
        self._groups: dict[tuple, dict[tuple, list[dict]]] = {}
        self._searches: dict[str, dict[tuple, dict]] = {}

    def searches(self, sweep_dir: str) -> dict[tuple, dict]:
        """``analysis.frontier.search_results`` of ``sweep_dir``, read the first time it is asked for."""
        if sweep_dir not in self._searches:
            self._searches[sweep_dir] = search_results(sweep_dir)
        return self._searches[sweep_dir]

    def of(self, row: dict) -> list[dict]:
        """The runs of one frontier row: its whole fixed load (``analysis.frontier.group_keys``, the
        grouping that made the row), never the runs of another load that only shares the axes. A
        field the row does not carry (a frontier table written before it had it) is not compared.

        Args:
            row: a frontier row (FRONTIER_SCHEMA as a dict).

        Returns:
            Its runs with a value of the row's axis, in the order of ``runs``.
        """
        axis = row["axis"]
        keys = tuple(k for k in group_keys(axis) if k in row)
        groups = self._groups.get((axis, keys))
        if groups is None:
            groups = {}
            for r in self.runs:
                if r.get(axis) is not None:
                    groups.setdefault(_key([r.get(k) for k in keys]), []).append(r)
            self._groups[(axis, keys)] = groups
        return groups.get(_key([row.get(k) for k in keys]), [])


def _key(values: list) -> tuple:
    """Fields' values as a dictionary key: as they are, or, where one is a list or mapping, each
    such one as its text (``_hashable``)."""
    key = tuple(values)
    try:
        hash(key)
    except TypeError:
        return tuple(_hashable(v) for v in values)
    return key


def _hashable(value):
    """A field's value as a dictionary key (a list or mapping as its text)."""
    return repr(value) if isinstance(value, (list, dict)) else value


def analyse_axis(row: dict, runs: list[dict] | RunIndex, policy: MarginPolicy) -> AxisResult:
    """The per-value table, frontier, margin at its edge and recommended value of one frontier row.

    Args:
        row: a frontier row (FRONTIER_SCHEMA as a dict).
        runs: the measured run rows, enriched by ``enrich_runs`` (or their ``RunIndex``, built once
            for many rows); those of the row's load are used.
        policy: the margin policy (its bytes at the row's ``capacity_bytes``).

    Returns:
        The axis's result, with ``recommended`` and ``reason`` filled in.
    """
    axis = row["axis"]
    index = runs if isinstance(runs, RunIndex) else RunIndex(runs)
    group = index.of(row)
    kind = device_kind(group[0]) if group else "unknown"
    capacity = row.get("capacity_bytes")
    margin_bytes = policy.bytes_for(capacity)
    by_value: dict[Any, list[dict]] = OrderedDict()
    for r in sorted(group, key=lambda r: order_key(axis, r[axis])):
        by_value.setdefault(r[axis], []).append(r)
    stats = []
    for value, rs in by_value.items():
        ok = [r for r in rs if r.get("outcome") == "ok"]
        pick = ok or rs
        used = _max(r["used"] for r in pick)
        stats.append(
            ValueStat(
                value=value,
                runs=rs,
                outcomes=Counter(r.get("outcome") or "unfinished" for r in rs),
                used=used,
                other=_max(r["other"] for r in pick),
                above_start=_max(r["above_start"] for r in pick),
                failed_phases=sorted({r["failed_phase"] for r in rs if r.get("failed_phase")}),
                margin=capacity - used if capacity is not None and used is not None and len(ok) == len(rs) else None,
            )
        )
    fixed = {a: row.get(a) for a in AXES if a != axis}
    result = AxisResult(str(row.get("sweep_dir")), axis, row, fixed, kind, capacity, margin_bytes, stats, group)
    numeric = axis != "dtype"
    result.max_ok = row.get("max_ok") if numeric else row.get("max_ok_label")
    result.min_oom = row.get("min_oom") if numeric else row.get("min_oom_label")
    result.min_ok, result.max_oom = row.get("min_ok"), row.get("max_oom")
    at = result.stat(result.edge)
    if at is not None:
        ok_runs = [r for r in at.runs if r.get("outcome") == "ok"]
        result.used_at_edge = _max(r["used"] for r in ok_runs)
        if not ok_runs:  # it fits for this axis, failing later in a phase that does not scale with it
            result.used_at_edge = row.get(f"{result.edge_names[0]}_{result.used_counter}")
        if capacity is not None and result.used_at_edge is not None:
            result.margin_at_edge = capacity - result.used_at_edge
    result.step = _lattice_step(row, index.searches(str(row.get("sweep_dir"))))
    fitted = [(s.value, s.used) for s in stats if s.all_ok and s.used is not None]
    result.fit = fit_axis(axis, [x for x, _ in fitted], [y for _, y in fitted])
    if result.fit is not None:
        result.limits = capacity_limits(result.fit["coeffs"], capacity, margin_bytes, result.step)
    _recommend(result, policy)
    return result


def _lattice_step(row: dict, found: dict[tuple, dict]) -> int:
    """The distance between the values the frontier sweeper could probe for ``row`` (its
    ``multiple_of`` in the ``result`` line of ``search.jsonl``, matched as
    ``analysis.frontier.frontier_rows`` matches it; a row of light probes takes its search's,
    logged with the full protocol's warmup and repeats); 1 for a sweep over values given by hand.
    ``found``: the search results of the row's sweep (``RunIndex.searches``)."""
    key = tuple(row.get(k) for k in ROW_KEY)
    event = found.get(key + (row.get("warmup"), row.get("repeats")), found.get(key + (None, None)))
    if event is None:  # light probes (hydra.sweeper.light): the search's lattice, logged for the full protocol
        event = next((e for k, e in found.items() if k[: len(key)] == key), {})
    step = event.get("multiple_of")
    return step if isinstance(step, int) and step > 0 else 1


def _no_margin_reason(res: AxisResult, policy: MarginPolicy) -> str | None:
    """Why no value of ``res`` can be recommended before looking at its values (no capacity, a
    decreasing axis, a margin not below the capacity); None when the values decide."""
    cap, margin = res.capacity, res.margin_bytes
    if cap is None or margin is None:
        return "no capacity is recorded for these runs, so no margin can be computed"
    if res.decreasing:  # the margin walk reads "larger is harder"
        return f"no value is recommended: {direction_words(res.frontier)}; choose it by the devices you have"
    if margin_leaves_nothing(cap, margin):
        return (
            f"the margin {margin} B ({policy.short()}) is not below the capacity {cap} B ({gib(cap)} GiB): "
            "no peak can leave it; give a --margin smaller than the capacity"
        )
    return None


def _rejection(res: AxisResult, s: ValueStat, limit: int) -> str | None:
    """Why value ``s`` of ``res`` is not the recommendation (not every run ok, no peak recorded,
    a peak above ``limit`` bytes); "" for a value without runs; None for a candidate."""
    cap, margin, counter = res.capacity, res.margin_bytes, f"`{res.used_counter}`"
    assert cap is not None  # _no_margin_reason returned None
    if not s.all_ok:
        if s.outcomes:
            return (
                f"{axis_label(res.axis, s.value)} is not a candidate: {s.status} "
                "(only values whose every run ran ok are)"
            )
        return ""
    if s.used is None:
        return f"{axis_label(res.axis, s.value)} ran ok but its peak was not recorded"
    if s.used > limit:
        return (
            f"{axis_label(res.axis, s.value)} ran ok but its peak {counter} {s.used} B "
            f"({gib(s.used)} GiB) leaves {cap - s.used} B ({pct(cap - s.used, cap)}) of the "
            f"capacity, less than the margin {margin} B"
        )
    return None


def _chosen_reason(res: AxisResult, s: ValueStat, policy: MarginPolicy, first_oom, rejected: list[str]) -> str:
    """Why ``s`` is the recommended value of ``res``, and what the larger values did."""
    axis, cap, margin = res.axis, res.capacity, res.margin_bytes
    assert cap is not None and s.used is not None
    above = []
    if first_oom is not None:
        st = res.stat(first_oom)
        where = f" in {', '.join(st.failed_phases)}" if st and st.failed_phases else ""
        above.append(f"{axis_label(axis, first_oom)} ran out of memory{where}")
    reason = (
        f"{axis_label(axis, s.value)}: the largest value whose every run ran ok "
        f"({s.outcomes['ok']} run{'s' if s.outcomes['ok'] > 1 else ''}) and whose measured "
        f"peak `{res.used_counter}` {s.used} B ({gib(s.used)} GiB) leaves {cap - s.used} B "
        f"({pct(cap - s.used, cap)}) of the capacity {cap} B, at least the margin "
        f"{margin} B ({policy.short()})."
    )
    if rejected or above:
        reason += " Larger values: " + "; ".join(above + rejected[::-1]) + "."
    nxt = res.stat(s.value + res.step) if isinstance(s.value, int) else None
    if res.frontier.get("margin_edge") == s.value and nxt is not None and margin is not None:
        if "oom" in nxt.outcomes:
            what = "ran out of memory"
        elif nxt.all_ok and nxt.used is not None and nxt.used > cap - margin:
            what = "ran ok but leaves less than the margin"
        else:
            what = None
        if what:  # measured next to a value past the margin: the margin's edge
            nearby = axis_label(axis, nxt.value)
            reason += f" The frontier search measured it as the margin's edge: the next value, {nearby}, {what}."
    return reason


def _recommend(res: AxisResult, policy: MarginPolicy) -> None:
    """Choose the largest value that ran ok (every run of it), lies below the smallest value
    that ran out of memory, and whose peak leaves at least the margin; write out why.

    Args:
        res: the axis result; ``recommended``, ``reason`` and ``notes`` are set in place.
        policy: the margin policy (its short form is quoted in the reason).
    """
    res.reason = _no_margin_reason(res, policy) or ""
    if res.reason:
        return
    cap, margin = res.capacity, res.margin_bytes
    assert cap is not None and margin is not None
    rank = {s.value: i for i, s in enumerate(res.values)}
    first_oom = next((s.value for s in res.values if "oom" in s.outcomes), None)
    rejected: list[str] = []
    for s in reversed(res.values):
        if first_oom is not None and rank[s.value] >= rank[first_oom]:
            continue
        why = _rejection(res, s, cap - margin)
        if why is None:
            res.recommended = s.value
            res.reason = _chosen_reason(res, s, policy, first_oom, rejected)
            break
        if why:
            rejected.append(why)
    else:
        if not any(s.all_ok for s in res.values):
            res.reason = f"no value of {res.axis} ran ok (every run of it), so none can be recommended"
            return
        res.reason = (
            f"no value leaves the margin {margin} B ({policy.short()}) below the capacity "
            f"{cap} B among the values that ran ok"
            + (": " + "; ".join(rejected[::-1]) if rejected else "")
            + ". Measure smaller values, or use a device with more memory."
        )
    _recommend_notes(res, first_oom)


def _recommend_notes(res: AxisResult, first_oom) -> None:
    """Append to ``res.notes`` what qualifies the recommendation: an optimistic CPU process-mode
    margin, results not monotonic, an unstable edge, the search's margin edge under another margin,
    a dtype axis."""
    axis, cap = res.axis, res.capacity
    assert cap is not None
    oom_stat = res.stat(first_oom) if first_oom is not None else None
    process_mode = res.frontier.get("capacity_mode") == "process"  # allocator mode caps the counted bytes exactly
    if (
        res.kind == "cpu"
        and process_mode
        and oom_stat is not None
        and oom_stat.used is not None
        and oom_stat.used < cap
    ):
        res.notes.append(
            "on the CPU with capacity_mode=process this margin is optimistic: the emulated capacity "
            "limits the whole heap "
            "(tensors plus the allocator's overhead) while the margin counts tensor bytes only. "
            f"{axis_label(axis, first_oom)} failed with {oom_stat.used} B of tensors live "
            f"({pct(oom_stat.used, cap)} of the capacity; the request that failed is not counted)"
        )
    if res.frontier.get("monotonic") is False:
        res.notes.append(
            f"results are not monotonic in {axis}: a value ran ok above one that ran out of "
            f"memory; only values below {axis_label(axis, first_oom)} were considered"
        )
    if res.frontier.get("stable") is False:
        res.notes.append(
            f"at least one value of {axis} both ran ok and ran out of memory (unstable edge); "
            "such values are never recommended"
        )
    searched = res.frontier.get("margin_edge")
    if searched is not None and res.recommended is not None and searched != res.recommended:
        res.notes.append(
            f"the frontier search measured the margin's edge at {axis_label(axis, searched)} under the sweep's "
            "margin (hydra.callbacks.analyze.margin); this report's margin differs, so values near its own edge "
            "may not have been measured"
        )
    if axis == "dtype" and res.recommended is not None:
        res.notes.append(
            "a dtype changes the numerics, not only the memory: the choice above is the "
            "largest-element dtype that fits with the margin, to weigh against accuracy"
        )


def tell_loads_apart(axes: list[AxisResult]) -> None:
    """Where two frontier rows of one directory would carry the same title (the same axes, but a
    different load: another capacity, workload parameter, protocol...), name what differs.

    Args:
        axes: the report's axis results; ``detail`` is set, in place, on those that need it.
    """
    by_title: dict[tuple, list[AxisResult]] = {}
    for a in axes:
        by_title.setdefault((a.sweep_dir, a.load_title), []).append(a)
    for same in by_title.values():
        if len(same) < 2:
            continue
        differ = differing([a.frontier for a in same])
        for a in same:
            a.detail = " ".join(f"{k}={a.frontier.get(k)}" for k in differ)
