"""The summary card: the load, the environment, the frontier, the margin and the chosen setting.

Each section function appends to a ``Doc`` (analysis.doc); sizes are printed as raw bytes beside GiB.
"""

from __future__ import annotations

import json
from collections import Counter

from memsweep.conf.contract import gib
from memsweep.estimator.labels import load_words, set_fields
from memsweep.estimator.margin import MarginPolicy

from ..doc import Doc
from ..frontier import direction_words
from .fitted import unmeasured_limit_note
from .fmt import axis_label, nbytes, pct, unread_text
from .stats import AxisResult

UNREAD_OUTCOME = "record not readable"
"""How the card counts a run whose record could not be read (``stats.record_unread``), beside the outcomes."""


def _text(value) -> str:
    """A value for printing; a missing one is '-', never 'None'."""
    return "-" if value is None else str(value)


def alloc_text(r: dict) -> str:
    """The allocator settings of a run as printed: its ``alloc_conf`` (JSON of the allocator
    environment variables) and ``allocator_backend``; "not recorded" when absent."""
    conf = r.get("alloc_conf")
    try:
        settings = json.loads(conf) if conf else None
    except json.JSONDecodeError:
        settings = conf
    if isinstance(settings, dict):
        set_ = {k: v for k, v in settings.items() if v is not None}
        text = (
            ", ".join(f"{k}={v}" for k, v in set_.items())
            if set_
            else "none of " + ", ".join(settings) + " set (PyTorch's defaults)"
        )
    else:
        text = "not recorded" if settings is None else str(settings)
    backend = r.get("allocator_backend")
    return text + (f"; allocator backend {backend}" if backend else "")


def param_words(params: dict, prefix: str = "") -> list[str]:
    """A workload's parameters as ``key=value`` words, as a command line sets them: a nested
    mapping by dotted keys (``overrides.num_hidden_layers=2``), a list comma-joined, None as
    ``null`` (the default), an empty mapping or list as ``none``."""
    words = []
    for k, v in params.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            words += param_words(v, key + ".")
        elif isinstance(v, (dict, list)) and not v:
            words.append(f"{key}=none")
        elif isinstance(v, list):
            words.append(f"{key}=" + ",".join("null" if x is None else str(x) for x in v))
        else:
            words.append(f"{key}={'null' if v is None else v}")
    return words


def _load_text(r: dict) -> str:
    """The load of a run as printed: workload and its parameters, mode, dtype, a non-default precision
    and parallel, warmup, repeats."""
    params = r.get("workload_params")
    try:
        params = json.loads(params) if params else {}
    except json.JSONDecodeError:
        params = {"params": params}
    ptext = ", ".join(param_words(params if isinstance(params, dict) else {"params": params}))
    # a non-default precision or parallel (analysis.labels); world_size is an axis, in the titles
    spread = "".join(f", {k} `{v}`" for k, v in set_fields(r).items() if k != "workload")
    return (
        f"workload `{r.get('workload')}`"
        + (f" ({ptext})" if ptext else "")
        + f", mode `{r.get('mode')}`, dtype `{r.get('dtype')}`{spread}"
        + f", warmup {r.get('warmup')}, repeats {r.get('repeats')}"
    )


def _capacity_text(r: dict) -> str:
    """The capacity of a run as printed: bytes, GiB and how it was set (emulated or the device's)."""
    cap = r.get("capacity_bytes")
    method = r.get("capacity_method") or "not recorded"
    if cap is None:
        return "not recorded"
    emulated = method != "device total_memory"
    mode = f"emulated (capacity_mode={r.get('capacity_mode')}): " if r.get("capacity_mode") else "emulated: "
    return f"{cap} B ({gib(cap)} GiB), " + (mode if emulated else "") + method


def _weights_text(w: int) -> str:
    """An estimated weights figure as printed: bytes, then GiB."""
    return f"{nbytes(w)} B ({gib(w)} GiB)"


def _weights_span(runs: list[dict], axis: str | None) -> str:
    """The estimated weights of ``runs`` (each with ``est_weights_bytes``) as printed: one figure,
    "for every run", when they are all equal; else the smallest and the largest, each named by
    its value of ``axis`` (by its run id when ``axis`` is None)."""
    low = min(runs, key=lambda r: r["est_weights_bytes"])
    high = max(runs, key=lambda r: r["est_weights_bytes"])
    if low["est_weights_bytes"] == high["est_weights_bytes"]:
        return f"{_weights_text(low['est_weights_bytes'])} for every run"
    return " to ".join(
        f"{_weights_text(r['est_weights_bytes'])} at "
        + (axis_label(axis, r.get(axis)) if axis else f"run `{r.get('run_id')}`")
        for r in (low, high)
    )


def weights_rows(runs: list[dict], axes: list[AxisResult]) -> list[list[str]]:
    """The card's "weights estimate (calculated)" rows: per axis, the figure of the run the card is
    about (an ok run at the edge: ``max_ok``, or ``min_ok`` on a decreasing axis), the axis value
    named, then the range over the axis's runs when the estimate differs along it (world_size,
    width); without that run, the range alone; without an axis, the runs' range named by run id.

    Args:
        runs: the measured run rows (``est_weights_bytes``: bytes, or None where not estimated).
        axes: the axis results (``stats.analyse_axis``).

    Returns:
        [label, value] rows; "no estimate available" where no run has the estimate.
    """
    label = "weights estimate{} (calculated)"
    if not axes:
        estimated = [r for r in runs if r.get("est_weights_bytes") is not None]
        span = _weights_span(estimated, None) if estimated else None
        return [[label.format(""), span or "no estimate available"]]
    rows = []
    for a in axes:
        of = f", {a.title}" if len(axes) > 1 else ""
        estimated = [r for r in a.runs if r.get("est_weights_bytes") is not None]
        if not estimated:
            rows.append([label.format(of), "no estimate available"])
            continue
        span = _weights_span(estimated, a.axis)
        st = a.stat(a.edge)
        at = next((r for r in (st.runs if st else []) if r.get("outcome") == "ok" and r in estimated), None)
        if at is None:
            rows.append([label.format(of), span])
            continue
        text = f"{_weights_text(at['est_weights_bytes'])} at {a.edge_names[0]} {axis_label(a.axis, a.edge)}"
        equal = len({r["est_weights_bytes"] for r in estimated}) == 1
        rows.append([label.format(of), text if equal else f"{text}; over the runs: {span}"])
    return rows


def _environment_text(r: dict) -> str:
    """The device, PyTorch, Python and CUDA/HIP versions of a run as printed."""
    return (
        f"{_text(r.get('device'))} ({_text(r.get('device_name'))}), "
        f"torch {_text(r.get('torch'))}, python {_text(r.get('python'))}"
        + (f", CUDA {r['cuda']}" if r.get("cuda") else "")
        + (f", HIP {r['hip']}" if r.get("hip") else "")
    )


def _observed_rows(runs: list[dict], unread: list[dict]) -> list[list[str]]:
    """The card's observed rows: load, environment, allocator, capacity, outcomes, failed phases and
    the runs whose record could not be read."""
    outcomes = Counter(r.get("outcome") or "unfinished" for r in runs)
    failed = Counter((r.get("failed_phase"), r.get("outcome")) for r in runs if r.get("failed_phase"))
    rows = [
        ["load (observed)", "; ".join(sorted({_load_text(r) for r in runs}))],
        ["environment (observed)", "; ".join(sorted({_environment_text(r) for r in runs}))],
        ["allocator settings (observed)", "; ".join(sorted({alloc_text(r) for r in runs}))],
        ["capacity (observed)", "; ".join(sorted({_capacity_text(r) for r in runs}))],
        [
            "runs (observed)",
            f"{len(runs) + len(unread)}: "
            + ", ".join(
                [f"{o} {n}" for o, n in outcomes.most_common()]
                + ([UNREAD_OUTCOME + f" {len(unread)}"] if unread else [])
            ),
        ],
        [
            "phases that failed (observed)",
            ", ".join(f"{p} ({o} x{n})" for (p, o), n in failed.items())
            or "none: every phase of every run "
            + (f"whose record was read succeeded ({unread_text(len(unread))})" if unread else "succeeded"),
        ],
    ]
    if unread:
        rows.append(
            [
                f"{UNREAD_OUTCOME} (not measured)",
                "; ".join(
                    f"run `{r.get('run_id')}` ({' '.join(load_words(r))}): {r.get('record_problem')}" for r in unread
                ),
            ]
        )
    return rows


def _axis_rows(a: AxisResult, of: str) -> list[list[str]]:
    """The card's rows of one axis: its edge (observed), the margin there and the chosen value
    (calculated); ``of`` names the load when the card holds several."""
    st = a.stat(a.edge)
    rows = []
    margin_row = [
        f"margin at {a.edge_names[0]} {a.axis}{of} (calculated)",
        f"{nbytes(a.margin_at_edge)} B ({gib(a.margin_at_edge)} GiB, {pct(a.margin_at_edge, a.capacity)} of capacity)",
    ]
    if a.decreasing:  # world_size under FSDP: fits above the edge
        rows.append([f"{a.axis} edge{of} (observed)", str(direction_words(a.frontier))])
        if a.edge is not None and st is not None:
            rows.append(
                [
                    f"{a.heavy_end} {a.axis} that ran{of} (observed)",
                    f"{axis_label(a.axis, a.edge)}: peak `{a.used_counter}` {nbytes(a.used_at_edge)} B "
                    f"({gib(a.used_at_edge)} GiB)",
                ]
            )
            rows.append(margin_row)
    elif a.max_ok is not None and st is not None:
        value = (
            f"{axis_label(a.axis, a.max_ok)}: peak `{a.used_counter}` {nbytes(a.used_at_edge)} B "
            f"({gib(a.used_at_edge)} GiB); smallest that ran out of memory: "
            f"{a.min_oom if a.min_oom is not None else 'none'}"
        )
        if not a.frontier.get("monotonic", True):
            value += " (not monotonic: this load ran out of memory below a value that ran)"
        if a.frontier.get("not_reached"):
            value += f" ({a.frontier['not_reached']})"
        rows.append([f"largest {a.axis} that ran{of} (observed)", value])
        rows.append(margin_row)
    else:
        rows.append([f"largest {a.axis} that ran{of} (observed)", "none of the values ran ok"])
    rows.append(
        [
            f"chosen {a.axis}{of} (calculated under the assumed margin)",
            (axis_label(a.axis, a.recommended) if a.recommended is not None else "none")
            + (f"; {note}" if (note := unmeasured_limit_note(a)) else ""),
        ]
    )
    return rows


def _counter_row(name: str, value: int | None, source: object) -> list:
    """One row of the four-counter table: name, bytes, GiB, where the figure came from."""
    return [name, nbytes(value), gib(value), source]


def _edge_counters(doc: Doc, a: AxisResult) -> None:
    """Append the four counters of the ok run at the edge of ``a`` (nothing when there is none)."""
    st = a.stat(a.edge)
    if st is None:
        return
    run = max((r for r in st.runs if r.get("outcome") == "ok"), key=lambda r: r["used"] or 0, default=None)
    if run is None:
        return
    doc.p(
        f"Four counters of the {a.edge_names[0]} {axis_label(a.axis, a.edge)} run (`{run['run_id']}`, observed; "
        "current values at the end of its last phase, peaks over all its phases):"
    )
    last = run.get("_last_phase") or {}
    current = "current value of the counter below"
    doc.table(
        ["counter", "bytes", "GiB", "source"],
        [
            _counter_row("memory_allocated", last.get("memory_allocated"), current),
            _counter_row("memory_reserved", last.get("memory_reserved"), current),
            _counter_row("max_memory_allocated", run.get("max_memory_allocated"), run.get("source_allocated")),
            _counter_row("max_memory_reserved", run.get("max_memory_reserved"), run.get("source_reserved")),
        ],
    )


def summary_card(
    doc: Doc, runs: list[dict], axes: list[AxisResult], policy: MarginPolicy, unread: list[dict] | None = None
) -> None:
    """Append the "Summary card" section: load, environment, capacity, outcomes, frontier, margin
    at the edge (max_ok; min_ok on a decreasing axis) and chosen value per axis, then the four
    counters of the run at each edge.

    Args:
        doc: the document appended to.
        runs: the measured run rows, enriched by ``stats.enrich_runs``.
        axes: the axis results (``stats.analyse_axis``).
        policy: the margin policy.
        unread: the runs whose record could not be read (``stats.record_unread``): counted and named
            apart, in no other figure.
    """
    unread = unread or []
    doc.h(1, "Summary card")
    rows = _observed_rows(runs, unread)
    rows += weights_rows(runs, axes)
    # one load per frontier row: each value below is of that load alone, never across loads
    several = len(axes) > 1
    for a in axes:
        rows += _axis_rows(a, f", {a.title}" if several else "")
    rows.append(["margin policy (assumed)", policy.describe()])
    doc.table(["item", "value"], rows)
    # the four counters of each run at the edge (max_ok; min_ok on a decreasing axis)
    for a in axes:
        _edge_counters(doc, a)
