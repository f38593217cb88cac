"""The margin report: the short card of seed 003 for one or more sweep directories.

``build_report(runs, phases, frontier, policy)`` turns the analysis tables (RUNS_SCHEMA,
PHASES_SCHEMA, FRONTIER_SCHEMA, plus any columns other modules add: ``est_*`` from the
estimator, ``upper_reached``/``stopped_by``/... from the frontier sweeper) into a document;
``write_report`` writes it as ``report.md`` (plots in ``report_plots/``) and a self-contained
``report.html``, never over an existing report.

What is compared with the capacity
----------------------------------
* CUDA / ROCm: ``max_memory_reserved``, the bytes the caching allocator holds from the
  device at the peak (what the issue calls the margin: capacity - max_memory_reserved). The
  CUDA context and other processes are outside it.
* CPU: ``max_memory_allocated``, the live tensor bytes tracked by the worker. The CPU's
  "reserved" is the process resident set, which includes the Python interpreter and the
  PyTorch libraries (about 0.3 GiB): capacity - RSS would be negative for every run. The
  emulated capacity is a limit on the growth of the worker's data segment above its size at
  start (``worker.counters.apply_cpu_capacity``), which holds the tensors plus the heap's own
  overhead, so the CPU margin is optimistic by that overhead; the report also shows the
  resident set above its value when the worker started measuring (``reserved above start``).

Calculated, observed and assumed figures go to separate sections. Sizes are printed as raw
bytes next to GiB (2^30 B); GB (10^9 B) appears only where a vendor's own words are quoted.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa

from conf.contract import AXES, SpecError, device_kind_of, gib, parse_size, peak_counters
from conf.contract import COLD_PHASES as COLD

from . import cards as cards_mod
from .cli import OUTPUTS
from .doc import Doc, Image, to_html, to_markdown
from .frontier import axis_sort_key as _order
from .frontier import differing

DEFAULT_MARGIN = "10%"
COLD_WARM_FLAG = 1.2  # a cold peak above 1.2 x the warm one is called out


class ReportExists(FileExistsError):
    """A report of that name is already in the output directory (nothing was written)."""


# --------------------------------------------------------------------------------------
# formatting: bytes are kept as integers; GiB only when printed
# --------------------------------------------------------------------------------------

def _text(value) -> str:
    """A value for printing; a missing one is '-', never 'None'."""
    return "-" if value is None else str(value)


def _cut(text: str, n: int) -> str:
    """``text`` in at most about ``n`` characters, cut at a word and marked with an ellipsis."""
    return text if len(text) <= n else text[:n].rsplit(" ", 1)[0] + " …"


def pct(part: int | None, whole: int | None) -> str:
    if part is None or not whole:
        return "-"
    return f"{100 * part / whole:.1f} %"


def nbytes(value: int | None) -> str:
    return "-" if value is None else str(int(value))


# --------------------------------------------------------------------------------------
# the margin policy (assumed)
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MarginPolicy:
    """Headroom kept free below the capacity: a fraction of it, or a fixed number of bytes."""

    text: str
    fraction: Fraction | None = None
    fixed_bytes: int | None = None
    default: bool = False

    def bytes_for(self, capacity: int | None) -> int | None:
        """The margin in bytes for a device of ``capacity`` bytes (None when unknown)."""
        if self.fixed_bytes is not None:
            return self.fixed_bytes
        if capacity is None:
            return None
        return int(math.ceil(self.fraction * capacity))

    def short(self) -> str:
        return (f"{float(self.fraction) * 100:g} % of the capacity" if self.fraction is not None
                else f"{self.fixed_bytes} B")

    def describe(self) -> str:
        what = (f"{float(self.fraction) * 100:g} % of the capacity" if self.fraction is not None
                else f"{self.fixed_bytes} B ({gib(self.fixed_bytes)} GiB) below the capacity")
        return what + (" (memsweep's default; set another with --margin)" if self.default else
                       f" (--margin {self.text})")


def parse_margin(text: Any = None) -> MarginPolicy:
    """``None`` -> the default (10 % of capacity); ``"0.1"`` or ``"10%"`` -> a fraction in [0, 1);
    ``"2GiB"``, ``"1500MB"``, ``"123"`` (bytes) -> fixed bytes (see worker.records.parse_size).

    Raises:
        SpecError: anything else, or a fraction outside [0, 1).
    """
    default = text is None
    text = DEFAULT_MARGIN if default else str(text).strip()
    accepted = "a fraction of the capacity in [0, 1) (0.1 or 10%) or a size (2GiB, 1500MB, bytes)"
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*%", text)
    if m:
        frac = Fraction(m.group(1)) / 100
    elif re.fullmatch(r"\d*\.\d+|0", text):
        frac = Fraction(text)
    else:
        try:
            return MarginPolicy(text, fixed_bytes=parse_size(text, "margin"), default=default)
        except SpecError:
            raise SpecError("margin", text, accepted) from None
    if not 0 <= frac < 1:
        raise SpecError("margin", text, accepted)
    return MarginPolicy(text, fraction=frac, default=default)


# --------------------------------------------------------------------------------------
# what is compared with the capacity (per device kind)
# --------------------------------------------------------------------------------------

def device_kind(run: dict) -> str:
    return device_kind_of(run.get("device_kind"), run.get("device"))


def basis(kind: str) -> tuple[str, str]:
    """(counter compared with the capacity, the other counter) for a device kind."""
    return peak_counters(kind)


BASIS_TEXT = {
    "cpu": ("On the CPU the peak compared with the capacity is `max_memory_allocated`, the live "
            "tensor bytes the worker tracks. The CPU's `max_memory_reserved` is the process resident "
            "set (interpreter and PyTorch libraries included, about 0.3 GiB), so capacity minus it "
            "would be negative for every run; the emulated capacity limits the growth of the worker's "
            "data segment above its size at start (RLIMIT_DATA), which holds the tensors plus the "
            "heap's own overhead. This margin is therefore optimistic: where it and the runs disagree, "
            "trust the first value that ran out of memory. `reserved above start` is the "
            "resident set's peak minus its value when the first phase began, shown for information."),
    "cuda": ("On CUDA/ROCm the peak compared with the capacity is `max_memory_reserved`, the bytes the "
             "caching allocator held from the device at its peak. The CUDA context, cuBLAS/cuDNN "
             "workspaces allocated outside the caching allocator and other processes are not in it."),
}


# --------------------------------------------------------------------------------------
# per swept axis: values, frontier, margin, recommendation
# --------------------------------------------------------------------------------------

@dataclass
class ValueStat:
    """Everything measured at one value of the swept variable (bytes, or None)."""

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
        if not self.outcomes:
            return "-"
        if len(self.outcomes) == 1:
            (o, n), = self.outcomes.items()
            return str(o) if n == 1 else f"{o} x{n}"
        return "mixed (" + ", ".join(f"{o} x{n}" for o, n in sorted(self.outcomes.items(), key=str)) + ")"

    @property
    def all_ok(self) -> bool:
        return set(self.outcomes) == {"ok"}


@dataclass
class AxisResult:
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
    margin_at_max_ok: int | None = None
    used_at_max_ok: int | None = None
    recommended: Any = None
    reason: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def used_counter(self) -> str:
        return basis(self.kind)[0]

    show_dir: bool = False  # several sweep directories in one report: name the directory too
    detail: str = ""  # what tells this load from another with the same axes (set by build_report)

    @property
    def load_title(self) -> str:
        fixed = " ".join(f"{k}={v}" for k, v in self.fixed.items() if v is not None)
        return f"{self.axis} sweep ({fixed}{' ' + self.detail if self.detail else ''})"

    @property
    def title(self) -> str:
        return self.load_title + (f" in {self.sweep_dir}" if self.show_dir else "")

    def stat(self, value) -> ValueStat | None:
        return next((s for s in self.values if s.value == value), None)


def _enrich_runs(runs: list[dict], phases: list[dict]) -> None:
    """Add ``rss_start`` (first phase's memory_reserved_start), ``used``/``other`` (see basis),
    ``above_start`` (CPU) and ``_phases``/``_last_phase`` (its phase rows) to each run row, in place."""
    first: dict[tuple, dict] = {}
    for p in phases:
        key = (p["sweep_dir"], p["run_id"])
        if p.get("phase_index") is not None and (key not in first or p["phase_index"] < first[key]["phase_index"]):
            first[key] = p
    by_run: dict[tuple, list[dict]] = {}
    for p in phases:
        by_run.setdefault((p["sweep_dir"], p["run_id"]), []).append(p)
    for r in runs:
        ps = sorted(by_run.get((r["sweep_dir"], r["run_id"]), []), key=lambda p: p.get("phase_index") or 0)
        r["_phases"] = ps
        r["_last_phase"] = ps[-1] if ps else None
        start = first.get((r["sweep_dir"], r["run_id"]), {}).get("memory_reserved_start")
        kind = device_kind(r)
        used_key, other_key = basis(kind)
        r["kind"] = kind
        r["rss_start"] = start if kind == "cpu" else None
        r["used"] = r.get(used_key)
        r["other"] = r.get(other_key)
        peak = r.get("max_memory_reserved")
        r["above_start"] = peak - start if kind == "cpu" and peak is not None and start is not None else None


def _max(values: Iterable[int | None]) -> int | None:
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def _matching_runs(row: dict, runs: list[dict]) -> list[dict]:
    """The runs of one frontier row: its whole fixed load (analysis.frontier.IDENTITY, the grouping
    that made the row), never the runs of another load that only shares the axes. A field the
    row does not carry (a frontier table written before it had it) is not compared."""
    from .frontier import IDENTITY

    keys = [k for k in IDENTITY if k != row["axis"] and k in row]
    return [r for r in runs if all(r.get(k) == row.get(k) for k in keys) and r.get(row["axis"]) is not None]


def analyse_axis(row: dict, runs: list[dict], policy: MarginPolicy) -> AxisResult:
    """The per-value table, frontier, margin at max_ok and recommended value of one frontier row."""
    axis = row["axis"]
    group = _matching_runs(row, runs)
    kind = device_kind(group[0]) if group else "unknown"
    capacity = row.get("capacity_bytes")
    margin_bytes = policy.bytes_for(capacity)
    by_value: dict[Any, list[dict]] = OrderedDict()
    for r in sorted(group, key=lambda r: _order(axis, r[axis])):
        by_value.setdefault(r[axis], []).append(r)
    stats = []
    for value, rs in by_value.items():
        ok = [r for r in rs if r.get("outcome") == "ok"]
        pick = ok or rs
        used = _max(r["used"] for r in pick)
        stats.append(ValueStat(
            value=value, runs=rs, outcomes=Counter(r.get("outcome") or "unfinished" for r in rs),
            used=used, other=_max(r["other"] for r in pick), above_start=_max(r["above_start"] for r in pick),
            failed_phases=sorted({r["failed_phase"] for r in rs if r.get("failed_phase")}),
            margin=capacity - used if capacity is not None and used is not None and len(ok) == len(rs) else None))
    fixed = {a: row.get(a) for a in AXES if a != axis}
    result = AxisResult(str(row.get("sweep_dir")), axis, row, fixed, kind, capacity, margin_bytes, stats, group)
    numeric = axis != "dtype"
    result.max_ok = (row.get("max_ok") if numeric else row.get("max_ok_label"))
    result.min_oom = (row.get("min_oom") if numeric else row.get("min_oom_label"))
    at = result.stat(result.max_ok)
    if at is not None:
        ok_runs = [r for r in at.runs if r.get("outcome") == "ok"]
        result.used_at_max_ok = _max(r["used"] for r in ok_runs)
        if capacity is not None and result.used_at_max_ok is not None:
            result.margin_at_max_ok = capacity - result.used_at_max_ok
    _recommend(result, policy)
    return result


def _label(axis: str, value) -> str:
    return f"{axis}={value}"


def _recommend(res: AxisResult, policy: MarginPolicy) -> None:
    """Choose the largest value that ran ok (every run of it), lies below the smallest value
    that ran out of memory, and whose peak leaves at least the margin; write out why."""
    axis, cap, margin = res.axis, res.capacity, res.margin_bytes
    counter = f"`{res.used_counter}`"
    rank = {s.value: i for i, s in enumerate(res.values)}
    first_oom = next((s.value for s in res.values if "oom" in s.outcomes), None)
    if cap is None or margin is None:
        res.reason = "no capacity is recorded for these runs, so no margin can be computed"
        return
    limit = cap - margin
    rejected = []
    for s in reversed(res.values):
        if first_oom is not None and rank[s.value] >= rank[first_oom]:
            continue
        if not s.all_ok:
            if s.outcomes:
                rejected.append(f"{_label(axis, s.value)} is not a candidate: {s.status} "
                                f"(only values whose every run ran ok are)")
            continue
        if s.used is None:
            rejected.append(f"{_label(axis, s.value)} ran ok but its peak was not recorded")
            continue
        if s.used > limit:
            rejected.append(f"{_label(axis, s.value)} ran ok but its peak {counter} {s.used} B "
                            f"({gib(s.used)} GiB) leaves {cap - s.used} B ({pct(cap - s.used, cap)}) of the "
                            f"capacity, less than the margin {margin} B")
            continue
        res.recommended = s.value
        above = []
        if first_oom is not None:
            st = res.stat(first_oom)
            where = f" in {', '.join(st.failed_phases)}" if st and st.failed_phases else ""
            above.append(f"{_label(axis, first_oom)} ran out of memory{where}")
        res.reason = (f"{_label(axis, s.value)}: the largest value whose every run ran ok "
                      f"({s.outcomes['ok']} run{'s' if s.outcomes['ok'] > 1 else ''}) and whose measured "
                      f"peak {counter} {s.used} B ({gib(s.used)} GiB) leaves {cap - s.used} B "
                      f"({pct(cap - s.used, cap)}) of the capacity {cap} B, at least the margin "
                      f"{margin} B ({policy.short()}).")
        if rejected or above:
            res.reason += " Larger values: " + "; ".join(above + rejected[::-1]) + "."
        break
    else:
        res.reason = (f"no value leaves the margin {margin} B ({policy.short()}) below the capacity "
                      f"{cap} B among the values that ran ok" + (": " + "; ".join(rejected[::-1]) if rejected else "")
                      + ". Measure smaller values, or use a device with more memory.")
    oom_stat = res.stat(first_oom) if first_oom is not None else None
    if res.kind == "cpu" and oom_stat is not None and oom_stat.used is not None and oom_stat.used < cap:
        res.notes.append("on the CPU this margin is optimistic: the emulated capacity limits the whole heap "
                         "(tensors plus the allocator's overhead) while the margin counts tensor bytes only. "
                         f"{_label(axis, first_oom)} failed with {oom_stat.used} B of tensors live "
                         f"({pct(oom_stat.used, cap)} of the capacity; the request that failed is not counted)")
    if res.frontier.get("monotonic") is False:
        res.notes.append(f"results are not monotonic in {axis}: a value ran ok above one that ran out of "
                         f"memory; only values below {_label(axis, first_oom)} were considered")
    if res.frontier.get("stable") is False:
        res.notes.append(f"at least one value of {axis} both ran ok and ran out of memory (unstable edge); "
                         "such values are never recommended")
    if axis == "dtype" and res.recommended is not None:
        res.notes.append("a dtype changes the numerics, not only the memory: the choice above is the "
                         "largest-element dtype that fits with the margin, to weigh against accuracy")


# --------------------------------------------------------------------------------------
# phases
# --------------------------------------------------------------------------------------

def phase_order(phases: list[dict]) -> list[str]:
    """Phase names in the order runs went through them (by their smallest phase_index)."""
    first: dict[str, int] = {}
    for p in phases:
        name = p.get("phase")
        if name is None:
            continue
        idx = p.get("phase_index") if p.get("phase_index") is not None else 10**6
        first[name] = min(first.get(name, idx), idx)
    return sorted(first, key=lambda n: (first[n], n))


def peak_increments(run_phases: list[dict], order: list[str], counter: str) -> list[int | None]:
    """How much each phase raised the running maximum of ``counter`` (bytes; None: not run).
    A phase recorded several times (a sub-phase of every warm step) counts with its largest peak."""
    peaks: dict[str, int] = {}
    for p in run_phases:
        if p.get(counter) is not None:
            peaks[p["phase"]] = max(peaks.get(p["phase"], p[counter]), p[counter])
    running, out = 0, []
    for name in order:
        if name not in peaks:
            out.append(None)
            continue
        out.append(max(0, peaks[name] - running))
        running = max(running, peaks[name])
    return out


PART_NAMES = {"weights": "weights (left by model_load)", "inputs": "inputs (left by inputs)",
              "state": "kept after the first pass/step (gradients, optimizer states)",
              "transient": "transient at the peak (activations, temporaries)"}
# estimator component -> the observed part it is compared with
OBSERVED_COUNTERPART = {"weights": "weights", "gradients": "state", "optimizer_states": "state",
                        "activations": "transient", "temporaries": "transient"}


def decomposition(run_phases: list[dict], peak: int | None) -> list[tuple[str, int]]:
    """Observed split of a run's peak allocated bytes, from the counters between phases.

    weights = what model_load left allocated; inputs = what the inputs phase left;
    kept after the first step = what cold_forward/cold_step left (gradients and optimizer
    states in training); transient = the peak minus what was live when its phase began
    (activations, temporaries). Whatever else was live at the peak's phase start is 'other'.
    """
    ordered = sorted(run_phases, key=lambda p: p.get("phase_index") or 0)
    out = []

    def delta(*names):
        """memory_allocated at the end of the phase (or of its last sub-phase) minus at its start."""
        rows = [p for p in ordered if str(p.get("phase")).split(".")[0] in names]
        if rows and rows[-1].get("memory_allocated") is not None and rows[0].get("memory_allocated_start") is not None:
            return rows[-1]["memory_allocated"] - rows[0]["memory_allocated_start"]
        return None

    parts = [(PART_NAMES["weights"], delta("model_load")), (PART_NAMES["inputs"], delta("inputs")),
             (PART_NAMES["state"], delta(*COLD))]
    if peak is None:
        return [(n, v) for n, v in parts if v is not None]
    peak_phase = next((p for p in sorted(run_phases, key=lambda p: p.get("phase_index") or 0)
                       if p.get("max_memory_allocated") == peak), None)
    live = peak_phase.get("memory_allocated_start") if peak_phase else None
    known = sum(v for _, v in parts if v is not None)
    for name, v in parts:
        if v is not None:
            out.append((name, v))
    if live is not None:
        if live - known > 0:
            out.append(("other live bytes when the peak's phase began", live - known))
        out.append((f"{PART_NAMES['transient']} in {peak_phase['phase']}", peak - live))
    return out


# --------------------------------------------------------------------------------------
# context fit (calculated)
# --------------------------------------------------------------------------------------

def fit_context(xs: list[int], ys: list[int]) -> dict | None:
    """Least-squares polynomial of the peak (bytes) in context: quadratic with three or more
    distinct contexts (attention scores grow with its square), affine with two.

    Returns {coeffs (numpy.polyfit order), degree, max_rel_residual} or None.
    """
    import numpy as np

    pts = sorted({(x, y) for x, y in zip(xs, ys) if x is not None and y is not None})
    if len({x for x, _ in pts}) < 2:
        return None
    degree = 2 if len({x for x, _ in pts}) >= 3 else 1
    x = np.array([p[0] for p in pts], dtype=float)
    y = np.array([p[1] for p in pts], dtype=float)
    coeffs = np.polyfit(x, y, degree)
    pred = np.polyval(coeffs, x)
    rel = float(np.max(np.abs(pred - y) / np.maximum(y, 1)))
    return {"coeffs": [float(c) for c in coeffs], "degree": degree, "max_rel_residual": rel,
            "xs": [int(v) for v in x], "ys": [int(v) for v in y]}


def crossing(coeffs: list[float], level: float) -> float | None:
    """The smallest positive context where the fitted polynomial reaches ``level`` bytes."""
    import numpy as np

    c = list(coeffs)
    c[-1] -= level
    roots = [r.real for r in np.roots(c) if abs(r.imag) < 1e-9 and r.real > 0]
    return min(roots) if roots else None


# --------------------------------------------------------------------------------------
# the document
# --------------------------------------------------------------------------------------

def _env_rows(runs: list[dict]) -> list[list]:
    seen = OrderedDict()
    for r in runs:
        key = tuple(r.get(k) for k in ("sweep_dir", "device", "device_name", "device_total_memory", "torch",
                                       "python", "cuda", "hip", "driver", "host"))
        seen.setdefault(key, r)
    rows = []
    for r in seen.values():
        rows.append([r.get("sweep_dir"), r.get("device"), r.get("device_name"), nbytes(r.get("device_total_memory")),
                     gib(r.get("device_total_memory")), r.get("torch"), r.get("cuda") or r.get("hip") or "-",
                     r.get("driver"), r.get("python"), r.get("host")])
    return rows


def _alloc_text(r: dict) -> str:
    conf = r.get("alloc_conf")
    try:
        settings = json.loads(conf) if conf else None
    except json.JSONDecodeError:
        settings = conf
    if isinstance(settings, dict):
        set_ = {k: v for k, v in settings.items() if v is not None}
        text = (", ".join(f"{k}={v}" for k, v in set_.items()) if set_ else
                "none of " + ", ".join(settings) + " set (PyTorch's defaults)")
    else:
        text = "not recorded" if settings is None else str(settings)
    backend = r.get("allocator_backend")
    return text + (f"; allocator backend {backend}" if backend else "")


def _load_text(r: dict) -> str:
    params = r.get("workload_params")
    try:
        params = json.loads(params) if params else {}
    except json.JSONDecodeError:
        params = {"params": params}
    ptext = ", ".join(f"{k}={'null' if v is None else v}" for k, v in params.items())  # null: the default
    return (f"workload `{r.get('workload')}`" + (f" ({ptext})" if ptext else "")
            + f", mode `{r.get('mode')}`, dtype `{r.get('dtype')}`, warmup {r.get('warmup')}, repeats {r.get('repeats')}")


def _capacity_text(r: dict) -> str:
    cap = r.get("capacity_bytes")
    method = r.get("capacity_method") or "not recorded"
    if cap is None:
        return "not recorded"
    emulated = method != "device total_memory"
    return (f"{cap} B ({gib(cap)} GiB), " + ("emulated: " if emulated else "") + method)


@dataclass
class Report:
    """What ``build_report`` computed, for the writer and for tests."""

    doc: Doc
    axes: list[AxisResult]
    policy: MarginPolicy
    runs: list[dict]  # the measured runs (a dry run is in ``predicted``)
    has_estimate: bool
    predicted: list[dict] = field(default_factory=list)  # the dry runs (source "predicted")


def build_report(runs_table: pa.Table, phases_table: pa.Table, frontier_table: pa.Table,
                 policy: MarginPolicy | None = None, sweep_dirs: list[Path] | None = None,
                 analysis_files: list[Path] | None = None, render_plots: bool = True) -> Report:
    """Compute the report of the analysis tables. Plots are rendered here (PNG bytes);
    ``render_plots=False`` leaves them out (faster, for checks of the text alone)."""
    from . import plots as plot_mod

    plots = plot_mod if render_plots else _NoPlots()

    policy = policy or parse_margin(None)
    all_runs, frontier = runs_table.to_pylist(), frontier_table.to_pylist()
    # A dry run (source "predicted": fake tensors, nothing measured) is never an observation:
    # it is kept out of every observed figure and shown apart, labelled predicted.
    predicted = [r for r in all_runs if r.get("source") == "predicted"]
    runs = [r for r in all_runs if r.get("source") != "predicted"]
    phases = [p for p in phases_table.to_pylist() if p.get("source") != "predicted"]
    _enrich_runs(runs, phases)
    axes = [analyse_axis(row, runs, policy) for row in frontier]
    _tell_loads_apart(axes)
    if len({a.sweep_dir for a in axes}) > 1:
        for a in axes:
            a.show_dir = True
    # the estimator's columns, when it filled any (a column of nulls is no estimate)
    est_cols = [c for c in runs_table.column_names
                if c.startswith("est_") and any(r.get(c) is not None for r in runs)]
    kinds = sorted({r["kind"] for r in runs})
    devices = sorted({str(r.get("device")) for r in all_runs})
    workloads = sorted({str(r.get("workload")) for r in all_runs})
    modes = sorted({str(r.get("mode")) for r in all_runs})
    title = (f"memsweep report: {', '.join(workloads)} · {', '.join(modes)} · {', '.join(devices)}"
             if all_runs else "memsweep report: no runs")
    doc = Doc(title)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    doc.p(f"Generated {now} from {len(runs)} measured run{'s' if len(runs) != 1 else ''}"
          + (f" and {len(predicted)} dry run{'s' if len(predicted) != 1 else ''} (predicted)" if predicted else "")
          + " in " + ", ".join(f"`{d}`" for d in (sweep_dirs or sorted({r['sweep_dir'] for r in all_runs}))) + ". "
          "Sections keep apart what was **observed** (the counters of the runs), what was **calculated** "
          "from it (margins, fits, estimates, other cards) and what is **assumed** (the margin policy and "
          "the catalog's figures). Sizes: raw bytes (B) beside GiB = 2^30 B.")
    if predicted:
        doc.note("warning", f"{_dry_runs_text(len(predicted))}: predictions on fake tensors, nothing was measured. "
                            "They are left out of every observed figure, frontier and margin below, and shown "
                            "apart under \"Predicted (dry runs)\".")
    if "cpu" in kinds:
        doc.note("warning", "CPU runs: `allocated` = live tensor bytes tracked by the worker, `reserved` = the "
                            "process resident set. This is not a GPU measurement.")
    if not runs:
        doc.p("No measured run was found: nothing observed to report."
              + (f" The directory holds only {_dry_runs_text(len(predicted))} (predictions)." if predicted else ""))
        if predicted:
            _predicted(doc, predicted)
        return Report(doc, axes, policy, runs, bool(est_cols), predicted)

    _card(doc, runs, axes, policy, est_cols)
    _observed(doc, runs, phases, axes, plots)
    _calculated(doc, runs, axes, policy, est_cols, plots)
    _assumed(doc, kinds, policy)
    _decision(doc, axes, policy)
    if len({r["sweep_dir"] for r in runs}) > 1:
        _comparable(doc, axes)
    if predicted:
        _predicted(doc, predicted)
    _raw(doc, all_runs, axes, sweep_dirs, analysis_files)
    return Report(doc, axes, policy, runs, bool(est_cols), predicted)


def _tell_loads_apart(axes: list[AxisResult]) -> None:
    """Where two frontier rows of one directory would carry the same title (the same axes, but a
    different load: another capacity, workload parameter, protocol...), name what differs."""
    by_title: dict[tuple, list[AxisResult]] = {}
    for a in axes:
        by_title.setdefault((a.sweep_dir, a.load_title), []).append(a)
    for same in by_title.values():
        if len(same) < 2:
            continue
        differ = differing([a.frontier for a in same])
        for a in same:
            a.detail = " ".join(f"{k}={a.frontier.get(k)}" for k in differ)


def _dry_runs_text(n: int) -> str:
    return f"{n} dry run{'s' if n != 1 else ''} (source `predicted`)"


def _predicted(doc: Doc, predicted: list[dict]) -> None:
    """The dry runs, apart from the measured ones: what they predict, never an observation."""
    doc.h(1, "Predicted (dry runs)")
    doc.p(f"{_dry_runs_text(len(predicted))}: each ran the load on fake tensors and predicted its counters; "
          "nothing was measured on a device. Their outcomes and peaks are predictions.")
    several = len({r["sweep_dir"] for r in predicted}) > 1
    doc.table((["sweep"] if several else []) + ["run", "batch", "context", "width", "dtype", "mode", "device",
                                                "outcome (predicted)", "peak max_memory_allocated B (predicted)",
                                                "GiB (predicted)"],
              [([r["sweep_dir"]] if several else []) + [
                  r["run_id"], r.get("batch"), r.get("context"), r.get("width"), r.get("dtype"), r.get("mode"),
                  r.get("device"), r.get("outcome") or "unfinished", nbytes(r.get("max_memory_allocated")),
                  gib(r.get("max_memory_allocated"))]
               for r in sorted(predicted, key=lambda r: (r["sweep_dir"], len(r["run_id"]), r["run_id"]))])


class _NoPlots:
    """Stands in for analysis.plots when plots are not rendered: every figure is empty bytes."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: b""


def _card(doc: Doc, runs: list[dict], axes: list[AxisResult], policy: MarginPolicy, est_cols: list[str]) -> None:
    doc.h(1, "Summary card")
    outcomes = Counter(r.get("outcome") or "unfinished" for r in runs)
    failed = Counter((r.get("failed_phase"), r.get("outcome")) for r in runs if r.get("failed_phase"))
    rows = [["load (observed)", "; ".join(sorted({_load_text(r) for r in runs}))],
            ["environment (observed)", "; ".join(sorted({f"{_text(r.get('device'))} ({_text(r.get('device_name'))}), "
                                                         f"torch {_text(r.get('torch'))}, python {_text(r.get('python'))}"
                                                         + (f", CUDA {r['cuda']}" if r.get('cuda') else "")
                                                         + (f", HIP {r['hip']}" if r.get('hip') else "")
                                                         for r in runs}))],
            ["allocator settings (observed)", "; ".join(sorted({_alloc_text(r) for r in runs}))],
            ["capacity (observed)", "; ".join(sorted({_capacity_text(r) for r in runs}))],
            ["runs (observed)", f"{len(runs)}: " + ", ".join(f"{o} {n}" for o, n in outcomes.most_common())],
            ["phases that failed (observed)", ", ".join(f"{p} ({o} x{n})" for (p, o), n in failed.items())
             or "none: every phase of every run succeeded"]]
    weights = [r for r in runs if r.get("est_weights_bytes") is not None]
    if weights:
        w = weights[0]["est_weights_bytes"]
        rows.append(["weights estimate (calculated)", f"{w} B ({gib(w)} GiB)"])
    else:
        rows.append(["weights estimate (calculated)", "no estimate available"])
    # one load per frontier row: each value below is of that load alone, never across loads
    several = len(axes) > 1
    for a in axes:
        of = f", {a.title}" if several else ""
        st = a.stat(a.max_ok)
        if a.max_ok is not None and st is not None:
            value = (f"{_label(a.axis, a.max_ok)}: peak `{a.used_counter}` {nbytes(a.used_at_max_ok)} B "
                     f"({gib(a.used_at_max_ok)} GiB); smallest that ran out of memory: "
                     f"{a.min_oom if a.min_oom is not None else 'none'}")
            if not a.frontier.get("monotonic", True):
                value += " (not monotonic: this load ran out of memory below a value that ran)"
            rows.append([f"largest {a.axis} that ran{of} (observed)", value])
            rows.append([f"margin at max_ok {a.axis}{of} (calculated)",
                         f"{nbytes(a.margin_at_max_ok)} B ({gib(a.margin_at_max_ok)} GiB, "
                         f"{pct(a.margin_at_max_ok, a.capacity)} of capacity)"])
        else:
            rows.append([f"largest {a.axis} that ran{of} (observed)", "none of the values ran ok"])
        rows.append([f"chosen {a.axis}{of} (calculated under the assumed margin)",
                     _label(a.axis, a.recommended) if a.recommended is not None else "none"])
    rows.append(["margin policy (assumed)", policy.describe()])
    doc.table(["item", "value"], rows)
    # the four counters of each max_ok run
    for a in axes:
        st = a.stat(a.max_ok)
        if st is None:
            continue
        run = max((r for r in st.runs if r.get("outcome") == "ok"), key=lambda r: r["used"] or 0, default=None)
        if run is None:
            continue
        doc.p(f"Four counters of the {_label(a.axis, a.max_ok)} run (`{run['run_id']}`, observed; "
              "current values at the end of its last phase, peaks over all its phases):")
        last = run.get("_last_phase") or {}
        doc.table(["counter", "bytes", "GiB", "source"],
                  [["memory_allocated", nbytes(last.get("memory_allocated")), gib(last.get("memory_allocated")),
                    "current value of the counter below"],
                   ["memory_reserved", nbytes(last.get("memory_reserved")), gib(last.get("memory_reserved")),
                    "current value of the counter below"],
                   ["max_memory_allocated", nbytes(run.get("max_memory_allocated")),
                    gib(run.get("max_memory_allocated")), run.get("source_allocated")],
                   ["max_memory_reserved", nbytes(run.get("max_memory_reserved")),
                    gib(run.get("max_memory_reserved")), run.get("source_reserved")]])


def _observed(doc: Doc, runs, phases, axes: list[AxisResult], plots) -> None:
    doc.h(1, "Observed")
    doc.h(2, "Environment")
    doc.table(["sweep", "device", "name", "total memory B", "total GiB", "torch", "CUDA/HIP", "driver",
               "python", "host"], _env_rows(runs))
    doc.p("Allocator settings: " + "; ".join(sorted({_alloc_text(r) for r in runs})) + ".")
    doc.h(2, "Runs and outcomes")
    several = len({r["sweep_dir"] for r in runs}) > 1
    doc.table((["sweep"] if several else []) + ["run", "batch", "context", "width", "dtype", "mode", "outcome",
                                                "failed phase", "error", "wall s"],
              [([r["sweep_dir"]] if several else []) + [
                  r["run_id"], r.get("batch"), r.get("context"), r.get("width"), r.get("dtype"),
                  r.get("mode"), r.get("outcome") or "unfinished", r.get("failed_phase"),
                  (r.get("error_type") or "") + (": " + _cut(r["error_message"], 80) if r.get("error_message") else ""),
                  f"{r['wall_s']:.1f}" if r.get("wall_s") is not None else None]
               for r in sorted(runs, key=lambda r: (r["sweep_dir"], len(r["run_id"]), r["run_id"]))],
              note="Only `oom` means 'does not fit'; an error, crash or timeout is neither a success nor an OOM."
                   + ("" if several else f" Run directories are under `{runs[0]['sweep_dir']}`."))
    order = phase_order(phases)
    if not axes:
        doc.p("No frontier: no variable was swept over two or more values.")
    for i, a in enumerate(axes):
        doc.h(2, f"{a.title}")
        used_c, other_c = basis(a.kind)
        cpu = a.kind == "cpu"
        headers = [a.axis, "runs", "outcome", "failed phase", f"peak {used_c} B", "GiB", f"peak {other_c} B", "GiB"]
        if cpu:
            headers += ["reserved above start B", "GiB"]
        rows = []
        for s in a.values:
            row = [s.value, len(s.runs), s.status, ", ".join(s.failed_phases) or None,
                   nbytes(s.used), gib(s.used), nbytes(s.other), gib(s.other)]
            if cpu:
                row += [nbytes(s.above_start), gib(s.above_start)]
            rows.append(row)
        doc.table(headers, rows, note="A run that did not complete shows its partial peak, before the failure: "
                                      "not the memory the full run would need.")
        f = a.frontier
        facts = [f"`max_ok` = {a.max_ok if a.max_ok is not None else 'none'} (largest value that ran), "
                 f"`min_oom` = {a.min_oom if a.min_oom is not None else 'none'} (smallest that ran out of memory)",
                 f"exact: {'yes' if f.get('exact') else 'no'} (neighbours among the values run"
                 + (", on the search's lattice" if f.get("strategy") else "") + ")",
                 f"monotonic: {'yes' if f.get('monotonic') else 'NO'}; stable: "
                 + {True: "yes", False: "NO"}.get(f.get("stable"), "not checked (no value was run twice; the frontier "
                                                                   "sweeper's confirm re-runs the edge)"),
                 f"runs: {f.get('n_runs')} (ok {f.get('n_ok')}, oom {f.get('n_oom')}, other {f.get('n_other')})"]
        if f.get("strategy"):
            facts.append(f"searched by the frontier sweeper: strategy {f['strategy']}, {f.get('runs_used')} runs"
                         + (f", status {f['search_status']}" if f.get("search_status") else ""))
        if f.get("upper_reached"):
            facts.append(f"upper bound not reached: every value up to {a.max_ok} fit; the edge lies above it")
        if f.get("stopped_by"):
            facts.append(f"the search stopped on a run that ended with `{f['stopped_by']}`"
                         + (f" at {a.axis}={f['stop_value']}" if f.get("stop_value") is not None else "")
                         + ": not an OOM, the edge is unknown above it")
        doc.ul(facts)
        if a.max_ok is None:
            doc.note("warning", f"no value of {a.axis} ran ok: the smallest value tried is already too large, or "
                                "the runs failed for another reason (see outcomes).")
        if not f.get("monotonic", True) or f.get("stable") is False:
            doc.note("warning", "results are not monotonic or not stable here; they are shown as measured, not smoothed.")
        points = [{"value": s.value, "outcome": "ok" if s.all_ok else (s.status if len(s.outcomes) == 1 else "mixed"),
                   "used": s.used, "other": s.other if not cpu else s.above_start} for s in a.values]
        doc.image(Image(f"axis{i}_{a.axis}.png", plots.axis_plot(
            a.axis, points, a.capacity, a.margin_bytes, f"peak {used_c}",
            "reserved above start (RSS)" if cpu else f"peak {other_c}", a.max_ok, a.min_oom),
            f"Peak {used_c} (compared with the capacity) and "
            + ("the resident set above its start" if cpu else f"peak {other_c}")
            + f" against {a.axis}; capacity line, capacity minus the margin, max_ok and min_oom marked "
              "(observed; the lines between points are only a guide)."))
        _phases_section(doc, a, order, plots, i)


def _phases_section(doc: Doc, a: AxisResult, order: list[str], plots, i: int) -> None:
    used_c = basis(a.kind)[0]
    doc.h(3, f"Phases ({a.axis} sweep)")
    run_of = {}
    for s in a.values:
        ok = [r for r in s.runs if r.get("outcome") == "ok"]
        run_of[s.value] = (ok or s.runs)[0]
    present = [n for n in order if any(p["phase"] == n for r in run_of.values() for p in r["_phases"])]
    rows = []
    for s in a.values:
        r = run_of[s.value]
        status = {p["phase"]: p.get("status") for p in r["_phases"]}
        rows.append([s.value] + [status.get(n, "not run") for n in present])
    doc.table([a.axis] + present, rows, note="Status of each phase (one run per value: an ok one where there is one).")
    # cold vs warm, side by side
    cw_rows, flagged = [], []
    cold_key, warm_key = f"cold_{used_c}", f"warm_{used_c}"
    for s in a.values:
        r = run_of[s.value]
        cold, warm = r.get(cold_key), r.get(warm_key)
        ratio = f"{cold / warm:.2f}" if cold is not None and warm else None
        cw_rows.append([s.value, nbytes(cold), gib(cold), nbytes(warm), gib(warm), ratio])
        if cold is not None and warm and cold > COLD_WARM_FLAG * warm:
            flagged.append(f"{_label(a.axis, s.value)}: cold {gib(cold)} GiB vs warm {gib(warm)} GiB "
                           f"(x{cold / warm:.2f})")
    doc.table([a.axis, f"cold peak {used_c} B", "GiB", f"warm peak {used_c} B", "GiB", "cold / warm"], cw_rows,
              note="cold = the first pass, step or generation (cold_forward, cold_step, cold_generate and their "
                   "sub-phases), warm = the measured repeats after warmup (warm_*); '-' where the phase did not run.")
    if flagged:
        doc.note("warning", f"the first (cold) pass peaks more than {COLD_WARM_FLAG:g} x the warm one: "
                 + "; ".join(flagged) + ". Size for the cold peak: it happens on every fresh process "
                 "(allocator warm-up, lazy workspaces, optimizer states created on the first step).")
    else:
        doc.p(f"No cold peak above {COLD_WARM_FLAG:g} x its warm peak.")
    values = [s.value for s in a.values]
    increments = [peak_increments(run_of[v]["_phases"], present, used_c) for v in values]
    outcomes = [run_of[v].get("outcome") or "unfinished" for v in values]
    doc.image(Image(f"phases{i}_{a.axis}.png",
                    plots.phases_plot(a.axis, values, present, increments, outcomes, a.capacity, used_c),
                    f"Stacked phases: each segment is how much that phase raised the run's peak `{used_c}` above "
                    "every phase before it; the bar's height is the run's peak (observed)."))
    # what the peak consists of, at max_ok
    st = a.stat(a.max_ok)
    if st is not None:
        r = run_of[a.max_ok]
        parts = decomposition(r["_phases"], r.get("max_memory_allocated"))
        if parts:
            peak = r.get("max_memory_allocated")
            doc.p(f"What the peak `max_memory_allocated` of the {_label(a.axis, a.max_ok)} run consists of "
                  "(observed: differences of the counters between phases):")
            doc.table(["part", "bytes", "GiB", "share of peak"],
                      [[n, nbytes(v), gib(v), pct(v, peak)] for n, v in parts]
                      + [["peak max_memory_allocated", nbytes(peak), gib(peak), pct(peak, peak)]])


def _calculated(doc: Doc, runs, axes: list[AxisResult], policy: MarginPolicy, est_cols: list[str], plots) -> None:
    doc.h(1, "Calculated")
    doc.p("Everything here is computed from the observed counters, or from formulas: none of it is a measurement.")
    doc.h(2, "Margin at max_ok")
    rows = []
    for a in axes:
        rows.append([a.title, a.max_ok, f"`{a.used_counter}`", nbytes(a.capacity), gib(a.capacity),
                     nbytes(a.used_at_max_ok), gib(a.used_at_max_ok), nbytes(a.margin_at_max_ok),
                     gib(a.margin_at_max_ok), pct(a.margin_at_max_ok, a.capacity)])
    doc.table(["sweep", "max_ok", "peak counter", "capacity B", "GiB", "peak B", "GiB", "margin B", "GiB",
               "margin % of capacity"], rows,
              note="margin = capacity - peak, at the largest value that ran (see 'Assumed' for which counter).")
    per_value = []
    for a in axes:
        for s in a.values:
            if s.margin is not None:
                per_value.append([a.title, s.value, nbytes(s.used), nbytes(s.margin), gib(s.margin),
                                  pct(s.margin, a.capacity), "yes" if a.margin_bytes is not None and s.margin >= a.margin_bytes else "no"])
    if per_value:
        doc.p("Margin at every value whose runs all ran ok:")
        doc.table(["sweep", "value", "peak B", "margin B", "GiB", "% of capacity", "leaves the margin"], per_value)
    for i, a in enumerate(axes):
        if a.axis != "context":
            continue
        ok = [(s.value, s.used) for s in a.values if s.all_ok and s.used is not None]
        fit = fit_context([x for x, _ in ok], [y for _, y in ok])
        doc.h(2, f"Fitted curve: peak vs context ({a.title})")
        if fit is None:
            doc.p("Fewer than two contexts ran ok: no curve fitted.")
            continue
        c = fit["coeffs"]
        terms = (f"{c[0]:.6g}·context² + {c[1]:.6g}·context + {c[2]:.6g}" if fit["degree"] == 2
                 else f"{c[0]:.6g}·context + {c[1]:.6g}")
        doc.p(f"Least-squares {'quadratic' if fit['degree'] == 2 else 'affine (two points only)'} fit of the "
              f"peak `{a.used_counter}` (bytes) of the runs that ran ok: peak ≈ {terms}; largest relative "
              f"residual {fit['max_rel_residual'] * 100:.2f} %.")
        crossings = {}
        if a.capacity:
            crossings["capacity"] = crossing(c, a.capacity)
            if a.margin_bytes:
                crossings["capacity - margin"] = crossing(c, a.capacity - a.margin_bytes)
        lines = [f"the fit reaches the {k} at context ≈ {v:.0f} (extrapolated, not run)" if v else
                 f"the fit never reaches the {k} for a positive context" for k, v in crossings.items()]
        cap_x = crossings.get("capacity")
        if cap_x and isinstance(a.min_oom, int) and a.min_oom < cap_x:
            lines.append(f"observed: context={a.min_oom} already ran out of memory, below the fit's crossing: "
                         "the capacity holds more than the counter fitted (see 'Assumed'); trust the runs")
        doc.ul(lines)
        doc.image(Image(f"fit{i}_context.png", plots.fit_plot(fit["xs"], fit["ys"], c, a.capacity, a.margin_bytes,
                                                              "context", f"peak {a.used_counter}", crossings),
                        "Peak against context with the fitted curve (calculated) and where it crosses the capacity."))
    _estimator(doc, runs, axes, est_cols)
    _cards(doc, axes, policy)


def _estimator(doc: Doc, runs, axes: list[AxisResult], est_cols: list[str]) -> None:
    doc.h(2, "Estimate beside the measurement")
    if not est_cols:
        doc.p("No estimate available: runs.parquet has no `est_*` columns, or only empty ones (no estimate "
              "was made for these runs).")
        return
    comps = [c for c in est_cols if c.endswith("_bytes") and c != "est_peak_bytes"]
    for a in axes:
        st = a.stat(a.max_ok)
        if st is None:
            continue
        r = next((r for r in st.runs if r.get("outcome") == "ok"), None)
        if r is None:
            continue
        est_peak = r.get("est_peak_bytes")
        observed = {}
        for name, value in decomposition(r.get("_phases") or [], r.get("max_memory_allocated")):
            for key, label in PART_NAMES.items():
                if name.startswith(label):
                    observed[key] = (name, value)
        doc.p(f"{a.title}, at {_label(a.axis, a.max_ok)} (estimate: calculated before the run; observed: "
              "differences of the counters between phases, see 'Observed'):")
        rows = []
        for c in comps:
            if r.get(c) is None:
                continue
            comp = c[len("est_"):-len("_bytes")]
            obs = observed.get(OBSERVED_COUNTERPART.get(comp, ""))
            rows.append([comp, nbytes(r.get(c)), gib(r.get(c)), pct(r.get(c), est_peak),
                         f"{obs[1]} B: {obs[0]}" if obs else None])
        obs_peak = r.get("max_memory_allocated")
        doc.table(["component (calculated)", "bytes", "GiB", "share of estimated peak", "observed counterpart"],
                  rows + [["estimated peak", nbytes(est_peak), gib(est_peak), pct(est_peak, est_peak),
                           f"{nbytes(obs_peak)} B: max_memory_allocated"]])
        dominant = max(((c, r.get(c)) for c in comps if r.get(c) is not None), key=lambda t: t[1], default=None)
        if dominant:
            doc.p(f"Largest estimated component: **{dominant[0][len('est_'):-len('_bytes')]}** "
                  f"({pct(dominant[1], est_peak)} of the estimated peak).")
        rows = []
        for s in a.values:
            for run in s.runs:
                if run.get("outcome") != "ok":
                    continue
                est, obs = run.get("est_peak_bytes"), run.get("max_memory_allocated")
                err = run.get("estimate_error")
                if err is None and est is not None and obs:
                    err = (est - obs) / obs
                rows.append([s.value, nbytes(est), gib(est), nbytes(obs), gib(obs),
                             f"{err * 100:+.1f} %" if err is not None else None])
        doc.table([a.axis, "estimated peak B", "GiB", "observed max_memory_allocated B", "GiB", "estimate error"],
                  rows, note="estimate error = (estimated - observed) / observed, on runs that ran ok.")


def _cards(doc: Doc, axes: list[AxisResult], policy: MarginPolicy) -> None:
    doc.h(2, "Other cards (calculated from this device's measurement)")
    doc.note("info", "A calculation, not a measurement on those cards: the peak measured here is compared with "
                     "each card's reported total memory (see 'Assumed'). Kernels, workspaces, the CUDA context and "
                     "library versions differ between devices; measure on the card before relying on it.")
    if any(a.kind == "cpu" for a in axes):
        doc.note("warning", "These peaks come from CPU runs (tracked tensor bytes). A GPU adds the CUDA context, "
                            "library workspaces and the caching allocator's rounding on top.")
    for a in axes:
        ok = [s for s in a.values if s.all_ok and s.used is not None]
        if not ok:
            continue
        top = max(ok, key=lambda s: _order(a.axis, s.value))
        rows = []
        for card in cards_mod.CARDS:
            m = policy.bytes_for(card.reported_bytes)
            fitting = [s for s in ok if cards_mod.holds(card, s.used, m)]
            best = max(fitting, key=lambda s: _order(a.axis, s.value)) if fitting else None
            if best is None:
                largest = f"none of the measured values (smallest needs {gib(ok[0].used + m)} GiB with the margin)"
            elif best is top:
                largest = f"{best.value} (every measured value that ran; larger ones were not measured)" \
                    if top.value == a.max_ok else f"{best.value}"
            else:
                largest = str(best.value)
            rows.append([card.name, card.vendor_spec, nbytes(card.reported_bytes), gib(card.reported_bytes),
                         nbytes(m), "yes" if top.used + m <= card.reported_bytes else "no", largest])
        doc.p(f"{a.title}: would the peak `{a.used_counter}` measured at {_label(a.axis, top.value)} "
              f"({top.used} B, {gib(top.used)} GiB) plus the margin fit, and which largest measured {a.axis} would:")
        doc.table(["card", "vendor's spec (GB as printed by the vendor)", "reported total B", "GiB", "margin B",
                   f"holds {_label(a.axis, top.value)}", f"largest measured {a.axis} that fits"], rows)


def _assumed(doc: Doc, kinds: list[str], policy: MarginPolicy) -> None:
    doc.h(1, "Assumed")
    items = [f"Margin policy: {policy.describe()}. The margin must cover what these runs did not: longer "
             "inputs, other batch sizes, evaluation or export phases, another library version, other users "
             "of the device. It is a policy, not a measurement (seed 003: no margin percentage is universal)."]
    for k in kinds:
        items.append(BASIS_TEXT.get(k, BASIS_TEXT["cuda"]))
    items.append("Other cards: each card's total is the figure its management tool reports (nvidia-smi "
                 "memory.total, rocm-smi VRAM total), from the public logs cited below; PyTorch's own "
                 "total_memory is 1.5-2 % lower and the CUDA context takes a few hundred MiB more, so a card "
                 "marked 'yes' with little headroom may still not fit. Several GPUs do not pool their memory "
                 "into one: a load that fails on one card can fail with free memory on another.")
    items.append("Only the conditions run were measured; nothing between or beyond them is known except by "
                 "the calculations above.")
    doc.ul(items)
    doc.table(["card", "vendor's spec", "what the vendor's GB means here", "reported total B", "GiB", "reported by",
               "source", "note"],
              [[c.name, c.vendor_spec, c.vendor_unit, nbytes(c.reported_bytes), gib(c.reported_bytes),
                c.reported_by, c.source, c.note or None] for c in cards_mod.CARDS])


def _decision(doc: Doc, axes: list[AxisResult], policy: MarginPolicy) -> None:
    doc.h(1, "Chosen setting")
    doc.p(f"Chosen only among values that ran ok, under the assumed margin: {policy.describe()}.")
    if not axes:
        doc.p("No variable was swept: no setting to choose.")
    for a in axes:
        head = (f"**{a.title}: {_label(a.axis, a.recommended)}**" if a.recommended is not None
                else f"**{a.title}: no setting recommended**")
        doc.p(f"{head}. {a.reason}")
        for n in a.notes:
            doc.note("warning", n)


def _comparable(doc: Doc, axes: list[AxisResult]) -> None:
    doc.h(1, "Comparable loads across sweeps")
    doc.p("The same load (workload, mode, fixed dimensions, swept axis) in several sweep directories, lined up: "
          "different devices, capacities or library versions.")
    groups: dict[tuple, list[AxisResult]] = OrderedDict()
    for a in axes:
        f = a.frontier
        key = (a.axis, f.get("workload"), f.get("mode"), *(a.fixed.get(k) for k in AXES if k != a.axis))
        groups.setdefault(key, []).append(a)
    any_shown = False
    for key, members in groups.items():
        if len({m.sweep_dir for m in members}) < 2:
            continue
        any_shown = True
        doc.p(f"{members[0].load_title}, workload {key[1]}, mode {key[2]}:")
        rows = []
        for m in members:
            r = m.runs[0] if m.runs else {}
            rows.append([m.sweep_dir, r.get("device"), r.get("device_name"), r.get("torch"), nbytes(m.capacity),
                         gib(m.capacity), m.max_ok, m.min_oom, f"`{m.used_counter}`", nbytes(m.used_at_max_ok),
                         gib(m.used_at_max_ok), pct(m.margin_at_max_ok, m.capacity), m.recommended])
        doc.table(["sweep", "device", "name", "torch", "capacity B", "GiB", "max_ok", "min_oom", "peak counter",
                   "peak at max_ok B", "GiB", "margin %", "chosen"], rows)
        values = sorted({s.value for m in members for s in m.values}, key=lambda v: _order(key[0], v))
        doc.table([key[0]] + [f"{m.sweep_dir} peak GiB" for m in members],
                  [[v] + [(lambda s: f"{gib(s.used)} ({s.status})" if s else "not run")(m.stat(v)) for m in members]
                   for v in values])
    if not any_shown:
        doc.p("No load appears in more than one sweep directory.")


def _raw(doc: Doc, runs, axes, sweep_dirs, analysis_files) -> None:
    doc.h(1, "Raw results")
    items = []
    for d in sweep_dirs or sorted({r["sweep_dir"] for r in runs}):
        n_dry = sum(1 for r in runs if r['sweep_dir'] == str(d) and r.get("source") == "predicted")
        items.append(f"`{d}`: {sum(1 for r in runs if r['sweep_dir'] == str(d))} run directories"
                     + (f" ({n_dry} of them dry runs, predicted)" if n_dry else "") + ", each with "
                     "spec.json, record.json (all counters of every phase), result.json, stdout.log, stderr.log")
    for f in analysis_files or []:
        items.append(f"`{f}`")
    if not analysis_files:
        items.append("no Parquet tables found beside the runs: `memsweep analyze SWEEP_DIR` writes them")
    for a in axes:
        st = a.stat(a.max_ok)
        if st:
            items += [f"max_ok run of the {a.title}: `{r['run_dir']}`" for r in st.runs if r.get("outcome") == "ok"][:1]
    doc.ul(items)


# --------------------------------------------------------------------------------------
# writing, never over an existing report
# --------------------------------------------------------------------------------------

def report_paths(out_dir: Path, name: str = "report") -> tuple[Path, Path, Path]:
    out_dir = Path(out_dir)
    return out_dir / f"{name}.md", out_dir / f"{name}.html", out_dir / f"{name}_plots"


def _link_new(data: bytes, path: Path) -> None:
    """Create ``path`` with ``data``, atomically, failing if it exists (temp file + hard link)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    try:
        os.link(tmp, path)
    finally:
        tmp.unlink()


def write_report(report: Report, out_dir: Path, name: str = "report") -> tuple[Path, Path]:
    """Write ``<name>.md``, ``<name>_plots/*.png`` and ``<name>.html`` into ``out_dir``.

    Raises:
        ReportExists: one of these paths exists already (nothing is written or changed).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path, html_path, plot_dir = report_paths(out_dir, name)
    existing = [p for p in (md_path, html_path, plot_dir) if p.exists()]
    if existing:
        raise ReportExists(f"{existing[0]} already exists: memsweep never overwrites a report; "
                           "use --out NEW_DIR")
    try:
        plot_dir.mkdir()  # claims the name: a concurrent writer fails here or on the links below
    except FileExistsError:
        raise ReportExists(f"{plot_dir} already exists: memsweep never overwrites a report") from None
    for img in report.doc.images:
        (plot_dir / img.name).write_bytes(img.png)
    footer = f"memsweep report · {md_path.name} holds the same content with the plots in {plot_dir.name}/"
    try:
        _link_new(to_markdown(report.doc, plot_dir.name).encode(), md_path)
        _link_new(to_html(report.doc, footer).encode(), html_path)
    except FileExistsError:
        raise ReportExists(f"{md_path} or {html_path} appeared while writing: not overwritten") from None
    return md_path, html_path


def find_analysis_files(sweep_dir: Path) -> list[Path]:
    """The newest Parquet tables of a sweep: its own, or the latest under analysis/."""
    sweep_dir = Path(sweep_dir)
    names = OUTPUTS
    later = sorted((d for d in (sweep_dir / "analysis").glob("*") if d.is_dir()), key=lambda d: d.name)
    for d in reversed(later):
        if all((d / n).exists() for n in names):
            return [d / n for n in names]
    return [sweep_dir / n for n in names if (sweep_dir / n).exists()]


# --------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------

def report_for_dirs(sweep_dirs: list[Path], out_dir: Path, margin: str | None = None,
                    name: str = "report") -> tuple[Report, Path, Path]:
    """Build the tables from the run records of ``sweep_dirs`` (as ``memsweep analyze`` does),
    then write the report into ``out_dir``.

    Raises:
        FileNotFoundError: a sweep directory does not exist.
        SpecError: a bad ``margin``.
        ReportExists: a report of that name exists in ``out_dir``.
    """
    from .frontier import frontier_table
    from .tables import build_tables

    policy = parse_margin(margin)
    for d in sweep_dirs:
        if not Path(d).is_dir():
            raise FileNotFoundError(f"sweep directory {d} does not exist")
    md, html_, plot_dir = report_paths(out_dir, name)
    for p in (md, html_, plot_dir):  # refuse before the work, not only after it
        if p.exists():
            raise ReportExists(f"{p} already exists: memsweep never overwrites a report; use --out NEW_DIR")
    runs, phases, _ = build_tables(sweep_dirs)
    frontier = frontier_table(runs)
    files = [f for d in sweep_dirs for f in find_analysis_files(Path(d))]
    report = build_report(runs, phases, frontier, policy, [Path(d) for d in sweep_dirs], files)
    md, html_ = write_report(report, out_dir, name)
    return report, md, html_


def main(argv: list[str] | None = None) -> int:
    """``memsweep report SWEEP_DIR [SWEEP_DIR ...] [--out DIR] [--margin 10%|0.1|2GiB]``."""
    import argparse
    import sys

    from .cli import add_sweep_dir_args, parse_sweep_dir_args

    parser = argparse.ArgumentParser(
        prog="memsweep report",
        description="Write report.md (plots in report_plots/) and a self-contained report.html for "
                    "sweep directories: frontier, margin at max_ok, chosen setting under a margin policy, "
                    "phases, estimate, other cards. Never overwrites an existing report.")
    add_sweep_dir_args(parser, "output directory")
    parser.add_argument("--margin", default=None,
                        help=f"headroom kept below the capacity: a fraction (0.1 or 10%%) or a size (2GiB, "
                             f"1500MB); default {DEFAULT_MARGIN} of the capacity")
    args = parse_sweep_dir_args(parser, argv)
    try:
        _, md, html_ = report_for_dirs(args.sweep_dirs, args.out, args.margin)
    except (FileNotFoundError, ReportExists) as exc:
        print(f"memsweep report: {exc}", file=sys.stderr)
        return 1
    except SpecError as exc:
        print(f"memsweep report: {exc}", file=sys.stderr)
        return 2
    print(f"memsweep: report -> {html_}  (and {md})")
    return 0
