"""The closing sections: assumed, chosen setting, comparable loads, predicted (dry runs), raw results.

Sizes are printed as raw bytes beside GiB.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

from memsweep.conf.contract import AXES, gib, predicted_outcome
from memsweep.estimator import cards as cards_mod
from memsweep.estimator.margin import BASIS_TEXT, MarginPolicy

from ..doc import Doc
from ..frontier import order_key
from .fitted import unmeasured_limit_note
from .fmt import axis_label, dry_runs_text, nbytes, pct
from .stats import AxisResult


def assumed_section(doc: Doc, kinds: list[str], policy: MarginPolicy) -> None:
    """Append the "Assumed" section: the margin policy, which counter is compared with the
    capacity on each device kind (BASIS_TEXT), and the card catalog with its sources.

    Args:
        doc: the document appended to.
        kinds: the device kinds of the measured runs (``margin.device_kind``), sorted.
        policy: the margin policy.
    """
    doc.h(1, "Assumed")
    items = [
        f"Margin policy: {policy.describe()}. The margin must cover what these runs did not: longer "
        "inputs, other batch sizes, evaluation or export phases, another library version, other users "
        "of the device. It is a policy, not a measurement (no margin percentage is universal)."
    ]
    for k in kinds:
        items.append(BASIS_TEXT.get(k, BASIS_TEXT["cuda"]))
    items.append(
        "Other cards: each card's total is the figure its management tool reports (nvidia-smi "
        "memory.total, rocm-smi VRAM total), from the public logs cited below; PyTorch's own "
        "total_memory is 1.5-2 % lower and the CUDA context takes a few hundred MiB more, so a card "
        "marked 'yes' with little headroom may still not fit. Several GPUs do not pool their memory "
        "into one: a load that fails on one card can fail with free memory on another."
    )
    items.append(
        "Only the conditions run were measured; nothing between or beyond them is known except by "
        "the calculations above."
    )
    doc.ul(items)
    doc.table(
        [
            "card",
            "vendor's spec",
            "what the vendor's GB means here",
            "reported total B",
            "GiB",
            "reported by",
            "source",
            "note",
        ],
        [
            [
                c.name,
                c.vendor_spec,
                c.vendor_unit,
                nbytes(c.reported_bytes),
                gib(c.reported_bytes),
                c.reported_by,
                c.source,
                c.note or None,
            ]
            for c in cards_mod.CARDS
        ],
    )


def decision_section(doc: Doc, axes: list[AxisResult], policy: MarginPolicy) -> None:
    """Append the "Chosen setting" section: per axis the recommended value, why, and its notes.

    Args:
        doc: the document appended to.
        axes: the axis results (``stats.analyse_axis``: ``recommended``, ``reason``, ``notes``).
        policy: the margin policy the choice was made under.
    """
    doc.h(1, "Chosen setting")
    doc.p(f"Chosen only among values that ran ok, under the assumed margin: {policy.describe()}.")
    if not axes:
        doc.p("No variable was swept: no setting to choose.")
    for a in axes:
        head = (
            f"**{a.title}: {axis_label(a.axis, a.recommended)}**"
            if a.recommended is not None
            else f"**{a.title}: no setting recommended**"
        )
        note = unmeasured_limit_note(a)
        doc.p(f"{head}. {a.reason}" + (f" Calculated, not measured: {note}." if note else ""))
        for n in a.notes:
            doc.note("warning", n)


def comparable_section(doc: Doc, axes: list[AxisResult]) -> None:
    """Append "Comparable loads across sweeps": the same load (axis, workload, mode, fixed axes)
    in several sweep directories, side by side, with their peaks at every value run.

    Args:
        doc: the document appended to.
        axes: the axis results of every sweep directory in the report.
    """
    doc.h(1, "Comparable loads across sweeps")
    doc.p(
        "The same load (workload, mode, fixed dimensions, swept axis) in several sweep directories, lined up: "
        "different devices, capacities or library versions."
    )
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
        _comparable_group(doc, key, members)
    if not any_shown:
        doc.p("No load appears in more than one sweep directory.")


COMPARABLE_HEADER = [
    "sweep",
    "device",
    "name",
    "torch",
    "capacity B",
    "GiB",
    "fits (max_ok; min_ok if decreasing)",
    "out of memory (min_oom; max_oom)",
    "peak counter",
    "peak at that edge B",
    "GiB",
    "margin %",
    "chosen",
]
"""The columns of the table of one load across sweep directories."""


def _comparable_row(m: AxisResult) -> list:
    """One sweep's row of a comparable load: device, capacity, edge, peak there, margin, chosen value."""
    r = m.runs[0] if m.runs else {}
    return [
        m.sweep_dir,
        r.get("device"),
        r.get("device_name"),
        r.get("torch"),
        nbytes(m.capacity),
        gib(m.capacity),
        None if m.edge is None else f"{m.edge_names[0]} {m.edge}",
        None if m.miss is None else f"{m.edge_names[1]} {m.miss}",
        f"`{m.used_counter}`",
        nbytes(m.used_at_edge),
        gib(m.used_at_edge),
        pct(m.margin_at_edge, m.capacity),
        m.recommended,
    ]


def _comparable_group(doc: Doc, key: tuple, members: list[AxisResult]) -> None:
    """One load in several sweep directories: a row per sweep, then the peak of each at every value run."""
    doc.p(f"{members[0].load_title}, workload {key[1]}, mode {key[2]}:")
    doc.table(COMPARABLE_HEADER, [_comparable_row(m) for m in members])
    values = sorted({s.value for m in members for s in m.values}, key=lambda v: order_key(key[0], v))
    doc.table(
        [key[0]] + [f"{m.sweep_dir} peak GiB" for m in members],
        [
            [v] + [(lambda s: f"{gib(s.used)} ({s.status})" if s else "not run")(m.stat(v)) for m in members]
            for v in values
        ],
    )


def predicted_verdict(row: dict) -> str:
    """A dry run's verdict in words: its predicted peak against its capacity
    (``conf.contract.predicted_outcome``); a dry run never runs out of memory, so its worker's
    ``ok`` is never shown as a fit.

    Args:
        row: a run row whose ``source`` is ``predicted``.

    Returns:
        ``fits``, ``does not fit``, ``no verdict (no capacity)``, the worker's outcome when the
        dry run failed, or ``unfinished``.
    """
    if not row.get("outcome"):
        return "unfinished"
    verdict = predicted_outcome(row["outcome"], row.get("max_memory_allocated"), row.get("capacity_bytes"))
    return {"ok": "fits", "oom": "does not fit", None: "no verdict (no capacity)"}.get(verdict, str(verdict))


def predicted_section(doc: Doc, predicted: list[dict]) -> None:
    """Append "Predicted (dry runs)": the dry runs, apart from the measured ones: what they
    predict, never an observation.

    Args:
        doc: the document appended to.
        predicted: the run rows whose ``source`` is ``predicted``.
    """
    doc.h(1, "Predicted (dry runs)")
    doc.p(
        f"{dry_runs_text(len(predicted))}: each ran the load on fake tensors and predicted its counters; "
        "nothing was measured on a device. Their outcomes and peaks are predictions."
    )
    several = len({r["sweep_dir"] for r in predicted}) > 1
    doc.table(
        (["sweep"] if several else [])
        + [
            "run",
            *AXES,
            "mode",
            "device",
            "capacity B",
            "verdict (predicted peak vs capacity)",
            "peak max_memory_allocated B (predicted)",
            "GiB (predicted)",
        ],
        [
            ([r["sweep_dir"]] if several else [])
            + [
                r["run_id"],
                *(r.get(a) for a in AXES),
                r.get("mode"),
                r.get("device"),
                nbytes(r.get("capacity_bytes")),
                predicted_verdict(r),
                nbytes(r.get("max_memory_allocated")),
                gib(r.get("max_memory_allocated")),
            ]
            for r in sorted(predicted, key=lambda r: (r["sweep_dir"], len(r["run_id"]), r["run_id"]))
        ],
    )


class RawFiles(NamedTuple):
    """The Parquet tables found beside the runs, and whether the report read them (``raw_section``)."""

    files: list[Path]  # empty: none found
    read: bool  # True: read in the place of the run directories (``analysis.current.current_tables``)


def raw_section(
    doc: Doc, runs: list[dict], axes: list[AxisResult], sweep_dirs: list[Path] | None, tables: RawFiles
) -> None:
    """Append "Raw results": where the run directories and Parquet tables are, and the run at the
    edge of each axis (max_ok; min_ok on a decreasing axis).

    Args:
        doc: the document appended to.
        runs: every run row, dry runs included (their count is given per directory).
        axes: the axis results.
        sweep_dirs: the sweep directories of the report; None: those of ``runs``.
        tables: the Parquet tables beside the runs, and whether they were read for the report.
    """
    doc.h(1, "Raw results")
    items = []
    for d in sweep_dirs or sorted({r["sweep_dir"] for r in runs}):
        n_dry = sum(1 for r in runs if r["sweep_dir"] == str(d) and r.get("source") == "predicted")
        items.append(
            f"`{d}`: {sum(1 for r in runs if r['sweep_dir'] == str(d))} run directories"
            + (f" ({n_dry} of them dry runs, predicted)" if n_dry else "")
            + ", each with "
            "spec.json, record.json (all counters of every phase), result.json, stdout.log, stderr.log"
        )
    for f in tables.files:
        items.append(f"`{f}`")
    if tables.read:
        items.append(
            "this report read those tables, not the run directories: they were written by this memsweep "
            "after every file of every run (none added, removed or changed since)"
        )
    if not tables.files:
        items.append("no Parquet tables found beside the runs: `memsweep analyze SWEEP_DIR` writes them")
    for a in axes:
        st = a.stat(a.edge)
        if st:
            items += [
                f"{a.edge_names[0]} run of the {a.title}: `{r['run_dir']}`" for r in st.runs if r.get("outcome") == "ok"
            ][:1]
    doc.ul(items)
