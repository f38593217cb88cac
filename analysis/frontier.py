"""The success/OOM frontier of each swept variable, everything else fixed.

For an axis and a group of runs identical in every other load field: ``max_ok`` is the largest
value that ran ``ok``, ``min_oom`` the smallest that ran out of memory (``oom``); ``error``,
``crash`` and ``timeout`` are never either side. On an axis whose load per rank shrinks as it grows
(``world_size`` under FSDP, ``conf.contract.AXIS_DIRECTIONS``) the row says ``direction``
decreasing and gives ``min_ok`` and ``max_oom`` instead. ``exact``: the two are neighbours among
the values run (on the search's lattice when the frontier sweeper searched) and the results are
monotonic; a non-monotonic group is flagged, never smoothed; ``stable`` is null when no value ran
twice. An OOM is a point of an axis only when the phase that failed scales with that axis
(``conf.contract.oom_attribution``); others are counted in ``n_oom_elsewhere``. The frontier
sweeper's ``search.jsonl`` adds its columns (``strategy``, ``runs_used``, ``upper_reached``,
``stopped_by``, ``error_values``, ``margin_edge``, ``fastest*``, ``search_status``) to the row it searched.
"""

from __future__ import annotations

import json
import math
from operator import itemgetter
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa

from memsweep.conf.contract import (
    ALL_VARIABLES,
    AXES,
    DTYPE_BYTES,
    INTEGER_AXES,
    PEAK_COUNTERS,
    SEARCH_LOG,
    axis_direction,
    failure_words,
    oom_attribution,
    phase_variables,
    planned_phases,
)

from .schemas import OPTIONS, coerce_table, table_schema
from .throughput import FRONTIER_THROUGHPUT, frontier_throughput

SPREAD = ("devices", "parallel", "world_size", "reshard_after_forward")
"""How a load is spread: devices per run (a load on 2 GPUs is not the same load as on 1), DDP/FSDP
ranks and their sharding (runs table columns)."""
IDENTITY = (
    "sweep_dir",
    "workload",
    "workload_params",
    "mode",
    "device",
    "capacity_bytes",
    "capacity_mode",
    "warmup",
    "repeats",
    *AXES,
    *(o for o in OPTIONS if o not in AXES),  # a different optimizer, precision... is a different load;
    # eval_batch is both an axis and a mode option
    *SPREAD,
)


def group_keys(axis: str) -> tuple[str, ...]:
    """The fields that are one load along ``axis``: ``IDENTITY`` but the axis, and, along ``dtype``,
    but ``precision`` too (precision=auto resolves with the dtype: autocast in 16 bits, pure in
    float32 for training). The frontier groups runs by them; the report finds a row's runs by them.

    Args:
        axis: a swept axis (``conf.contract.AXES``).

    Returns:
        The field names, in ``IDENTITY``'s order.
    """
    return tuple(k for k in IDENTITY if k != axis and not (axis == "dtype" and k == "precision"))


FRONTIER_SCHEMA = table_schema(
    "sweep_dir",
    ("axis", pa.string()),
    ("direction", pa.string()),
    # the fixed load (IDENTITY): two rows differing only here are two loads
    *(c for c in dict.fromkeys(IDENTITY) if c != "sweep_dir"),
    ("values", pa.string()),
    ("n_runs", pa.int64()),
    ("n_ok", pa.int64()),
    ("n_oom", pa.int64()),
    ("n_other", pa.int64()),
    ("n_memory_suspect", pa.int64()),
    ("n_oom_elsewhere", pa.int64()),
    ("oom_elsewhere_phases", pa.string()),
    ("oom_elsewhere_variables", pa.string()),
    ("not_reached", pa.string()),
    ("max_ok", pa.int64()),
    ("min_oom", pa.int64()),
    ("max_ok_label", pa.string()),
    ("min_oom_label", pa.string()),
    ("min_ok", pa.int64()),
    ("max_oom", pa.int64()),
    ("exact", pa.bool_()),
    ("monotonic", pa.bool_()),
    ("stable", pa.bool_()),
    *((f"{edge}_{c}", pa.int64()) for edge in ("max_ok", "min_ok") for c in PEAK_COUNTERS),
    ("strategy", pa.string()),
    ("runs_used", pa.int64()),
    ("upper_reached", pa.bool_()),
    ("stopped_by", pa.string()),
    ("error_values", pa.string()),
    ("margin_edge", pa.int64()),
    ("fastest", pa.int64()),
    ("fastest_runs", pa.int64()),
    ("search_status", pa.string()),
    *FRONTIER_THROUGHPUT,
)
"""One row per (sweep, axis, fixed load). The swept column (batch|context|width|dtype) is
null. ``direction`` (conf.contract.DIRECTIONS, from the axis and the row's ``parallel``) says
which pair holds the edge: ``increasing`` and ``constant`` (DDP's world_size: the same load per
rank at every value) fill ``max_ok``/``min_oom`` and their labels and ``max_ok_max_memory_*``;
``decreasing`` (FSDP's world_size: more ranks, less each) fills ``min_ok`` (smallest value that
ran ok), ``max_oom`` (largest that ran out of memory) and ``min_ok_max_memory_*``, the other
pair null. ``max_ok``/``min_oom`` are null for the dtype axis, whose answer is in the labels
(dtypes ordered by bytes per element, then name); ``values`` lists the values run, in order;
``max_ok_max_memory_*``: the peaks (bytes) of the max_ok run (of its completed phases when it ran
out of memory later, in a phase that does not scale with the axis). ``n_oom_elsewhere``: OOM runs
whose failing phase does not scale with the axis (conf.contract.PHASE_SIZE_VARIABLES: an eval
OOM in a batch sweep); they are no ``min_oom`` of the axis, and a run whose every phase that
scales with the axis ran ok before that failure counts for ``max_ok``; ``oom_elsewhere_phases``
and ``oom_elsewhere_variables`` name those phases and the variable that sets each one's size;
``not_reached`` says in words that the axis' frontier was not reached when no OOM of the axis
was seen but such OOMs were (null otherwise). ``n_memory_suspect``: runs among ``n_other`` whose error
probably means memory but does not say so (runs table ``failure_class`` = memory_suspect; neither
side of the frontier). The last seven columns are
null unless the frontier sweeper searched that axis (see the module docstring): ``error_values``
lists the values whose run raised an error the search stepped past (the value's shape, not
memory: a layer that refuses a batch of 1), null when none did; ``margin_edge`` is the largest
value it ran ok whose measured peak leaves the report's margin below the capacity, null when
none does or no margin edge was searched (dry runs, light probes); ``fastest`` and
``fastest_runs``: with ``hydra.sweeper.objective=throughput``, the value with the highest
measured median samples/s inside the margin (a run; its rate and noise are ``fastest_samples_per_s``
and ``fastest_noise_rel``) and the throughput search's runs. ``warmup`` and
``repeats``: the protocol of the row's runs (the frontier sweeper's light probes,
``hydra.sweeper.light``, form their own row next to the full-protocol one). ``devices``: devices
per run (runs on 1 and on 2 GPUs form separate rows). ``workload_params`` and the mode options
(``precision`` ... ``kv_cache``) and ``capacity_mode`` (what the capacity capped: allocator or
process; null without an emulated capacity): the rest of the row's fixed load, as in the runs table; with
them a row names its whole load (IDENTITY), so its runs can be found again without mixing loads.
``max_ok_samples_per_s`` (``min_ok_`` on a decreasing axis), ``margin_edge_samples_per_s``,
``fastest_label``, ``fastest_samples_per_s``, ``fastest_noise_rel``: measured throughput
(analysis.throughput.FRONTIER_THROUGHPUT), null where no ok run of that value was timed; along
context the fastest is the value with the most tokens per second (its column: its samples/s)."""

ROW_KEY = ("sweep_dir", "axis", "workload", "mode", "device", "capacity_bytes", *AXES)


def search_results(sweep_dir: str) -> dict[tuple, dict]:
    """The frontier sweeper's answers in ``sweep_dir/search.jsonl``, by frontier row key
    (ROW_KEY); a later ``result`` line for the same key (a resumed sweep) wins."""
    path = Path(sweep_dir) / SEARCH_LOG
    out: dict[tuple, dict] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a killed sweeper
            continue
        if not isinstance(event, dict) or event.get("event") != "result" or not isinstance(event.get("fixed"), dict):
            continue
        row = {
            **event["fixed"],
            event["axis"]: None,
            "sweep_dir": sweep_dir,
            "axis": event["axis"],
            "workload": event.get("workload"),
            "capacity_bytes": event.get("capacity_bytes"),
        }
        # warmup/repeats tell the full-protocol runs from light probes (hydra.sweeper.light)
        out[tuple(row.get(k) for k in ROW_KEY + ("warmup", "repeats"))] = event
    return out


LOAD_DETAIL = ("capacity_mode", "workload_params", *OPTIONS, "parallel", "reshard_after_forward")
"""The fields of IDENTITY a frontier row carries besides the axes, protocol and device."""
LOAD_FIELDS = tuple(k for k in IDENTITY if k not in ("sweep_dir", *AXES))
"""A row's fixed load besides its directory and axes: workload, workload_params, mode, device..."""


def differing(rows: list[dict], fields: tuple[str, ...] = LOAD_FIELDS) -> list[str]:
    """The ``fields`` whose values differ among ``rows`` (frontier rows), in order: what tells
    loads apart where their axes alone would read alike (the text table, the report's titles)."""
    return [k for k in fields if len({str(r.get(k)) for r in rows}) > 1]


EDGE_COLUMNS = {
    "increasing": ("max_ok", "min_oom"),
    "constant": ("max_ok", "min_oom"),
    "decreasing": ("min_ok", "max_oom"),
}
"""Direction (``conf.contract.DIRECTIONS``) -> the frontier columns that hold its edge: (the value
that fits at the edge, the value that runs out of memory there)."""


def edge_columns(direction: str | None) -> tuple[str, str]:
    """The frontier columns of a row's edge (``EDGE_COLUMNS``): ``("max_ok", "min_oom")``, or
    ``("min_ok", "max_oom")`` for a ``decreasing`` axis.

    Args:
        direction: the row's ``direction``; None (a table written before the column) reads as
            ``increasing``, as every axis then was.

    Returns:
        (the column of the value that fits at the edge, the column of the one that ran out of memory).

    Raises:
        KeyError: a direction ``conf.contract.DIRECTIONS`` does not name.
    """
    return EDGE_COLUMNS[direction or "increasing"]


def direction_words(row: dict) -> str | None:
    """The edge of a frontier row whose axis is not read "larger is harder", in words.

    Args:
        row: a frontier row (``FRONTIER_SCHEMA`` as a dict).

    Returns:
        For ``direction`` decreasing: its ``min_ok`` and ``max_oom`` ("world_size decreasing under
        parallel=fsdp (more ranks, less memory each): fits from world_size=4 (min_ok); 2 runs out
        of memory (max_oom)"); for constant: what its ``max_ok``/``min_oom`` can mean; None for an
        increasing axis (its ``max_ok``/``min_oom`` say it) or a row without a direction.
    """
    axis, direction, parallel = row.get("axis"), row.get("direction"), row.get("parallel")
    if direction == "decreasing":
        fits = "no value ran ok" if row.get("min_ok") is None else f"fits from {axis}={row['min_ok']} (min_ok)"
        oom = (
            "none ran out of memory" if row.get("max_oom") is None else f"{row['max_oom']} runs out of memory (max_oom)"
        )
        return f"{axis} decreasing under parallel={parallel} (more ranks, less memory each): {fits}; {oom}"
    if direction == "constant":
        return (
            f"{axis} constant under parallel={parallel} (each rank holds the same load at every {axis}): an edge "
            f"here comes from what grows with {axis} beside the load (communication buffers), not from the load"
        )
    return None


def _scalar(value):
    """A field value as a plain Python value: a missing one (None, NaN) is None, a whole float an int."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value) if isinstance(value, float) and value.is_integer() else value


def order_key(axis: str, value):
    """The sort key of ``value`` on ``axis``: the value itself, or for dtype (bytes per element, name).

    Args:
        axis: one of AXES.
        value: a value of that axis (an int; a dtype name for ``dtype``; an unknown dtype sorts first).

    Returns:
        A key for ``sorted``/``max``: dtypes by their size in bytes, then by name.
    """
    return (DTYPE_BYTES.get(value, 0), value) if axis == "dtype" else value


def _reads(axis: str, run: dict) -> str:
    """What one run says on ``axis``: ``ok`` (it ran, or it ran out of memory only in a phase after
    every phase that scales with ``axis``), ``oom`` (it ran out of memory in a phase that scales with
    ``axis``), or ``other`` (an error, crash or timeout; or an OOM in a phase that does not scale
    with ``axis`` before one that does: the run says nothing about ``axis``). conf.contract.oom_attribution."""
    if run.get("outcome") == "ok":
        return "ok"
    if run.get("outcome") != "oom":
        return "other"
    planned = planned_phases(
        run.get("mode"), _scalar(run.get("eval_batch")), _scalar(run.get("export")), run.get("train_step")
    )
    return {"axis": "oom", "past": "ok", "short": "other"}[oom_attribution(run.get("failed_phase"), axis, planned)]


def _fit_peak(runs: list[dict], counter: str) -> int | None:
    """The largest peak (bytes) of ``counter`` over runs that read ``ok``: the run's own peak for an ok
    run, the peak of its completed phases (runs table ``completed_*``) for a run that failed later
    in a phase that does not scale with the axis; None when none is recorded."""
    values = [r.get(counter) if r.get("outcome") == "ok" else r.get(f"completed_{counter}") for r in runs]
    ints = [int(v) for v in values if v is not None]
    return max(ints) if ints else None


def _edge(ok: list[int], oom: list[int], direction: str) -> tuple[int | None, int | None, bool, int | None]:
    """The edge of a frontier row among its values, by their ranks in the row's order.

    Args:
        ok: the ranks (ascending) of the values that read ``ok`` (``_reads``).
        oom: the ranks (ascending) of the values that read ``oom``.
        direction: the axis' direction (``conf.contract.axis_direction``).

    Returns:
        (fit, miss, monotonic, gap): the rank that fit nearest the OOM side (the largest ok; the
        smallest under ``decreasing``) and the OOM nearest the fitting side (the smallest oom; the
        largest under ``decreasing``), each None when there is none; monotonic false when an ok
        lies beyond an oom on the OOM side; gap the ranks between them (1: neighbours), None unless both.
    """
    if direction == "decreasing":  # more of the axis, less per rank: oks above, ooms below
        fit, miss = (ok[0] if ok else None), (oom[-1] if oom else None)
        monotonic = fit is None or miss is None or miss <= fit
        return fit, miss, monotonic, None if fit is None or miss is None else fit - miss
    fit, miss = (ok[-1] if ok else None), (oom[0] if oom else None)
    monotonic = fit is None or miss is None or fit <= miss
    return fit, miss, monotonic, None if fit is None or miss is None else miss - fit


def elsewhere_words(axis: str, group: list[dict], unreached: bool) -> dict:
    """The OOMs of a frontier row that are not points of its axis, and what they say, in words.

    Args:
        axis: the row's axis.
        group: its runs (runs-table rows).
        unreached: no run ran out of memory in a phase that scales with ``axis`` (no ``min_oom``).

    Returns:
        ``n_oom_elsewhere`` (runs whose OOM is in a phase that does not scale with ``axis``),
        ``oom_elsewhere_phases`` / ``oom_elsewhere_variables`` (those phases and the variable that
        names each, comma-separated; null when none), ``not_reached`` (when ``unreached`` and such
        OOMs exist: "the batch frontier was not reached: eval at eval_batch=4096 runs out of
        memory in every run"; else null).
    """
    runs = group
    planned = {
        id(r): planned_phases(
            r.get("mode"), _scalar(r.get("eval_batch")), _scalar(r.get("export")), r.get("train_step")
        )
        for r in runs
    }
    failed = [
        r
        for r in runs
        if r.get("outcome") == "oom" and oom_attribution(r.get("failed_phase"), axis, planned[id(r)]) != "axis"
    ]
    if not failed:
        return {
            "n_oom_elsewhere": 0,
            "oom_elsewhere_phases": None,
            "oom_elsewhere_variables": None,
            "not_reached": None,
        }
    phases = list(dict.fromkeys(str(r.get("failed_phase")) for r in failed))
    variables = list(dict.fromkeys(phase_variables(p)[0] for p in phases))
    counts: dict[str, int] = {}
    for r in failed:
        words = failure_words(str(r.get("failed_phase")), {k: _scalar(r.get(k)) for k in ALL_VARIABLES if k in r})
        counts[words] = counts.get(words, 0) + 1
    said = "; ".join(
        f"{w} runs out of memory in {'every run' if n == len(runs) else f'{n} of {len(runs)} runs'}"
        for w, n in counts.items()
    )
    return {
        "n_oom_elsewhere": len(failed),
        "oom_elsewhere_phases": ",".join(phases),
        "oom_elsewhere_variables": ",".join(variables),
        "not_reached": f"the {axis} frontier was not reached: {said}" if unreached else None,
    }


def _sort_key(key: tuple) -> tuple:
    """A group key's sort key: each field by its value, a missing one (None) after every value."""
    return tuple((v is None, v if v is not None else 0) for v in key)


def _measured_runs(runs: list[dict]) -> list[dict]:
    """The runs that are points of a measured frontier: no dry run (source ``predicted``: a prediction
    is never a measured point), and a run directory read twice only once (its first row)."""
    seen: set = set()
    out = []
    for r in runs:
        if r.get("source") == "predicted":
            continue
        d = r.get("run_dir")
        if d is not None:
            if d in seen:
                continue
            seen.add(d)
        out.append(r)
    return out


def frontier_rows(runs: list[dict]) -> list[dict]:
    """The frontier of every axis, one row per axis and group of runs equal elsewhere.

    Runs are grouped by ``IDENTITY`` without the axis; a group with two or more values of
    the axis (or one the frontier sweeper searched, per its ``search.jsonl``) gives a row:
    ``max_ok`` (largest value that ran ok, or ran out of memory only in a phase after every
    phase that scales with the axis: ``_reads``) and ``min_oom`` (smallest value that ran out of
    memory in a phase that scales with the axis; other OOMs in ``elsewhere_words``), or on a
    ``decreasing`` axis (``conf.contract.axis_direction``) ``min_ok`` and ``max_oom``, ``exact``
    when they are neighbours among the values run, ``monotonic`` false when a success lies above
    an OOM (flagged, never smoothed), ``stable`` false when one value both fit and ran out of
    memory (None when no value ran twice), and the peaks at max_ok in bytes.
    Dry runs (source ``predicted``) are left out: a prediction is never a measured point. A run
    directory (``run_dir``) read twice is one run: only its first row counts. Grouping is one
    pass over the runs per axis (a dictionary of groups), so it grows linearly with the runs.

    Args:
        runs: the rows of the runs table (``analysis.tables.RUNS_SCHEMA``), as dicts.

    Returns:
        Rows with the columns of ``FRONTIER_SCHEMA``, per axis ordered by their fixed load (a
        missing field last); values of ``dtype`` are ordered by their size in bytes and given
        as labels only.
    """
    rows: list[dict] = []
    runs = _measured_runs(runs)
    if not runs:
        return rows
    searched: dict[tuple, dict] = {}
    for sweep_dir in dict.fromkeys(r.get("sweep_dir") for r in runs if r.get("sweep_dir") is not None):
        searched.update(search_results(str(sweep_dir)))
    identities = [tuple(r.get(k) for k in IDENTITY) for r in runs]  # each run's load, once
    for axis in AXES:
        keys = group_keys(axis)
        pick = itemgetter(*(IDENTITY.index(k) for k in keys))
        groups: dict[tuple, list[dict]] = {}
        for r, identity in zip(runs, identities):
            groups.setdefault(pick(identity), []).append(r)
        found = []  # the groups that can give a row: two values or more, or a search's
        for key, group in groups.items():
            several = len(group) > 1 and len({r.get(axis) for r in group} - {None}) > 1
            if several or searched:
                fixed = dict(zip(keys, key))
                search = _search_of(searched, axis, fixed) if searched else None
                if several or search is not None:
                    found.append((_sort_key(key), fixed, group, search))
        for _, fixed, group, search in sorted(found, key=itemgetter(0)):
            row = _group_row(axis, fixed, group, search)
            if row is not None:
                rows.append(row)
    return rows


def _search_of(searched: dict[tuple, dict], axis: str, fixed: dict) -> dict | None:
    """The search's ``result`` line (``search_results``) of the group of runs along ``axis`` whose
    other identity fields are ``fixed``: the one of their protocol (warmup, repeats), else one without."""
    row_key = tuple(axis if k == "axis" else fixed.get(k) for k in ROW_KEY)
    return searched.get(row_key + (fixed.get("warmup"), fixed.get("repeats")), searched.get(row_key + (None, None)))


class _Edge(NamedTuple):
    """The edge of one group of runs along an axis (``_group_edge``)."""

    fit: Any  # the value that fits at the edge (max_ok; min_ok on a decreasing axis), or None
    miss: Any  # the value that ran out of memory at the edge (min_oom; max_oom), or None
    monotonic: bool
    stable: bool | None  # None: no value ran twice
    exact: bool  # neighbours among the values run, monotonic and not unstable
    peak: dict  # counter -> bytes, the peaks of the ok runs at ``fit``


def _group_edge(axis: str, group: list[dict], values: list, direction: str) -> _Edge:
    """Read the edge of ``group`` along ``axis``: what each run reads as (``_reads``), the values that
    fit and ran out of memory, and whether they are neighbours, monotonic and stable."""
    reads = [_reads(axis, r) for r in group]
    rank = {v: i for i, v in enumerate(values)}
    by_value: dict = {v: set() for v in values}
    counted: dict = {}
    for r, read in zip(group, reads):
        v = r.get(axis)
        if v in by_value:
            by_value[v].add(read)
        if read in ("ok", "oom"):
            counted[v] = counted.get(v, 0) + 1
    ok = [v for v in values if "ok" in by_value[v]]
    oom = [v for v in values if "oom" in by_value[v]]
    fit, miss, monotonic, gap = _edge([rank[v] for v in ok], [rank[v] for v in oom], direction)
    fit, miss = (None if i is None else values[i] for i in (fit, miss))
    rerun = any(n > 1 for v, n in counted.items() if v is not None)
    stable = not any({"ok", "oom"} <= s for s in by_value.values()) if rerun else None
    exact = bool(ok and oom and monotonic and stable is not False and gap == 1)
    peak = {}
    if fit is not None:
        at = [r for r, read in zip(group, reads) if r.get(axis) == fit and read == "ok"]
        peak = {c: _fit_peak(at, c) for c in ("max_memory_allocated", "max_memory_reserved")}
    return _Edge(fit, miss, monotonic, stable, exact, peak)


def _group_row(axis: str, fixed: dict, group: list[dict], search: dict | None) -> dict | None:
    """The frontier row (``FRONTIER_SCHEMA``) of one group of runs equal but for ``axis`` (``fixed``:
    their other identity fields), with its search's columns when ``search`` (a ``result`` line of
    ``search.jsonl``) is given; None when the group has fewer than two values and no search."""
    values = sorted({r[axis] for r in group if r.get(axis) is not None}, key=lambda v: order_key(axis, v))
    if not values or (len(values) < 2 and search is None):
        return None
    direction = axis_direction(axis, _scalar(fixed.get("parallel")))
    e = _group_edge(axis, group, values, direction)
    fit, miss = e.fit, e.miss
    numeric = axis in INTEGER_AXES
    down = direction == "decreasing"
    max_ok, min_oom = (None, None) if down else (fit, miss)
    edge_of = edge_columns(direction)[0]
    row = {
        **{k: fixed.get(k) for k in ("sweep_dir", "workload", "mode", "device", "capacity_bytes", *AXES)},
        "axis": axis,
        "values": ",".join(str(v) for v in values),
        "n_runs": len(group),
        "n_ok": sum(r.get("outcome") == "ok" for r in group),
        "n_oom": sum(r.get("outcome") == "oom" for r in group),
        "n_other": sum(r.get("outcome") not in ("ok", "oom") for r in group),
        "n_memory_suspect": sum(r.get("failure_class") == "memory_suspect" for r in group),
        **elsewhere_words(axis, group, miss is None),
        "direction": direction,
        "max_ok": int(max_ok) if numeric and max_ok is not None else None,
        "min_oom": int(min_oom) if numeric and min_oom is not None else None,
        "max_ok_label": None if max_ok is None else str(max_ok),
        "min_oom_label": None if min_oom is None else str(min_oom),
        "min_ok": int(fit) if down and fit is not None else None,
        "max_oom": int(miss) if down and miss is not None else None,
        "exact": e.exact,
        "monotonic": e.monotonic,
        "stable": e.stable,
        **{f"{edge_of}_{c}": v for c, v in e.peak.items()},
        **{k: None if fixed.get(k) is None else int(fixed[k]) for k in ("warmup", "repeats", "devices")},
        **{k: _scalar(fixed.get(k)) for k in LOAD_DETAIL},
    }
    if search is not None:
        row.update(
            strategy=search.get("strategy"),
            runs_used=search.get("runs_used"),
            upper_reached=search.get("upper_reached"),
            stopped_by=search.get("stopped_by"),
            error_values=",".join(str(v) for v in search.get("error_values") or []) or None,
            margin_edge=search.get("margin_edge"),
            **fastest_columns(search.get("throughput")),
            search_status=search.get("status"),
            exact=bool(search.get("exact")) and e.monotonic and e.stable is not False,
        )
    row.update(frontier_throughput(group, axis, edge_of, fit, row.get("margin_edge")))
    row.update(searched_fastest(search))
    return row


def searched_fastest(search: dict | None) -> dict[str, Any]:
    """The fastest value's columns from a throughput search's answer (the fastest inside the
    margin, a run), which take the place of the runs' own; empty without one."""
    tput = search.get("throughput") if search is not None else None
    if not isinstance(tput, dict) or tput.get("best") is None:
        return {}
    return {
        "fastest_label": str(tput["best"]),
        "fastest_samples_per_s": tput.get("samples_per_s"),
        "fastest_noise_rel": tput.get("noise_rel"),
    }


def fastest_columns(tput: Any) -> dict[str, Any]:
    """``fastest`` and ``fastest_runs`` from a search's ``throughput`` answer
    (``hydra.sweeper.objective=throughput``): the fastest value run inside the margin and the runs
    the throughput search made; both null without one."""
    tput = tput if isinstance(tput, dict) else {}
    return {"fastest": tput.get("best"), "fastest_runs": tput.get("runs") if tput else None}


FRONTIER_INPUTS = tuple(
    dict.fromkeys(
        (
            *IDENTITY,
            *ALL_VARIABLES,
            "source",
            "run_dir",
            "outcome",
            "failed_phase",
            "failure_class",
            "train_step",
            "export",
            *PEAK_COUNTERS,
            *(f"completed_{c}" for c in PEAK_COUNTERS),
            "samples_per_s",  # analysis.throughput.value_rates'
            "tokens_per_s",  # and rate_column's, along context
            "throughput_noise_rel",
        )
    )
)
"""The runs-table columns ``frontier_rows`` reads (``frontier_table`` hands it these only)."""


def frontier_table(runs: pa.Table) -> pa.Table:
    """Frontier rows (FRONTIER_SCHEMA) from a runs table (analysis.tables.RUNS_SCHEMA): of its
    ``FRONTIER_INPUTS`` columns, the others left in the table."""
    used = runs.select([c for c in FRONTIER_INPUTS if c in runs.column_names])
    return coerce_table(frontier_rows(used.to_pylist()), FRONTIER_SCHEMA)
