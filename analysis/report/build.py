"""The report of the analysis tables: the document, section by section, and what it computed."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa

from memsweep.estimator.margin import MarginPolicy, parse_margin

from ..doc import Doc
from .fmt import dry_runs_text, unread_text
from .loading import loading_section
from .model_states import model_states_section
from .sections_answer import answer_section
from .sections_calculated import calculated_section
from .sections_closing import assumed_section, comparable_section, decision_section, predicted_section, raw_section
from .sections_observed import observed_section
from .sections_scale import failures_section, load_page, loads_section, page_name, shown_axes
from .sections_summary import summary_card
from .stats import AxisResult, RunIndex, analyse_axis, enrich_runs, record_unread, tell_loads_apart
from .throughput import throughput_section


@dataclass
class Report:
    """What ``build_report`` computed, for the writer and for tests.

    Attributes:
        doc: the document (analysis.doc.Doc), plots included as PNG bytes.
        axes: one result per frontier row (``stats.AxisResult``).
        policy: the margin policy applied.
        runs: the measured run rows, enriched (``stats.enrich_runs``); a dry run is in ``predicted``.
        has_estimate: True when the runs table has an ``est_*`` column holding a value.
        predicted: the dry runs (source ``predicted``), never part of an observed figure.
        notes: what was given twice and read once (``analysis.tables.unique_dirs``), one line each.
        unread: the runs whose record could not be read (``stats.record_unread``), never measured.
        pages: past ``sections_scale.DETAIL_LOADS`` loads, one page per load (file name -> document),
            written into the report's detail directory.
    """

    doc: Doc
    axes: list[AxisResult]
    policy: MarginPolicy
    runs: list[dict]  # the measured runs (a dry run is in ``predicted``)
    has_estimate: bool
    predicted: list[dict] = field(default_factory=list)  # the dry runs (source "predicted")
    notes: list[str] = field(default_factory=list)  # what was read once of what was given twice
    unread: list[dict] = field(default_factory=list)  # runs whose record could not be read
    pages: dict[str, Doc] = field(default_factory=dict)  # detail page file name -> document (many loads)


class _NoPlots:
    """Stands in for analysis.plots when plots are not rendered: every figure is empty bytes."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: b""


class _Rows(NamedTuple):
    """The rows of the analysis tables, kept apart by what they are."""

    all_runs: list[dict]  # every run row, dry runs and unread records included
    runs: list[dict]  # the measured runs whose record was read
    predicted: list[dict]  # the dry runs (source "predicted")
    unread: list[dict]  # runs whose record could not be read
    phases: list[dict]  # the measured phase rows
    predicted_phases: list[dict]  # the dry runs' phase rows


def _rows(runs_table: pa.Table, phases_table: pa.Table) -> _Rows:
    """Split the tables' rows: a dry run (source "predicted": fake tensors, nothing measured) is never
    an observation, and a run whose record could not be read is neither measured nor unfinished."""
    all_runs = runs_table.to_pylist()
    predicted = [r for r in all_runs if r.get("source") == "predicted"]
    runs = [r for r in all_runs if r.get("source") != "predicted"]
    unread = [r for r in runs if record_unread(r)]
    runs = [r for r in runs if not record_unread(r)]
    all_phases = phases_table.to_pylist()
    phases = [p for p in all_phases if p.get("source") != "predicted"]
    predicted_phases = [p for p in all_phases if p.get("source") == "predicted"]
    return _Rows(all_runs, runs, predicted, unread, phases, predicted_phases)


def _title(all_runs: list[dict]) -> str:
    """The report's title: its workloads, modes and devices."""
    if not all_runs:
        return "memsweep report: no runs"
    devices = sorted({str(r.get("device")) for r in all_runs})
    workloads = sorted({str(r.get("workload")) for r in all_runs})
    modes = sorted({str(r.get("mode")) for r in all_runs})
    return f"memsweep report: {', '.join(workloads)} · {', '.join(modes)} · {', '.join(devices)}"


def _plural(n: int, word: str) -> str:
    """``n`` and ``word``, with an s unless ``n`` is 1."""
    return f"{n} {word}{'s' if n != 1 else ''}"


def _intro(doc: Doc, rows: _Rows, sweep_dirs: list[Path] | None, notes: list[str], kinds: list[str]) -> None:
    """The paragraph after the answer (when generated, from what) and its notes: what was read once,
    unread records, dry runs, CPU counters."""
    runs, predicted, unread = rows.runs, rows.predicted, rows.unread
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    doc.p(
        f"Generated {now} from {_plural(len(runs), 'measured run')}"
        + (f" and {_plural(len(predicted), 'dry run')} (predicted)" if predicted else "")
        + (f" ({unread_text(len(unread))}, not counted)" if unread else "")
        + " in "
        + ", ".join(f"`{d}`" for d in (sweep_dirs or sorted({r["sweep_dir"] for r in rows.all_runs})))
        + ". "
        "Sections keep apart what was **observed** (the counters of the runs), what was **calculated** "
        "from it (margins, fits, estimates, other cards) and what is **assumed** (the margin policy and "
        "the catalog's figures). Sizes: raw bytes (B) beside GiB = 2^30 B."
    )
    if notes:
        doc.note("info", "Read once: " + "; ".join(notes) + ".")
    if unread:
        doc.note(
            "warning",
            f"{unread_text(len(unread))}: nothing of them is known here (no outcome, no counter), "
            "so they are left out of every figure below: "
            + "; ".join(f"`{r.get('run_id')}` ({r.get('record_problem')})" for r in unread)
            + ".",
        )
    if predicted:
        doc.note(
            "warning",
            f"{dry_runs_text(len(predicted))}: predictions on fake tensors, nothing was measured. "
            "They are left out of every observed figure, frontier and margin below, and shown "
            'apart under "Predicted (dry runs)".',
        )
    if "cpu" in kinds:
        doc.note(
            "warning",
            "CPU runs: `allocated` = live tensor bytes tracked by the worker, `reserved` = the "
            "process resident set. This is not a GPU measurement.",
        )


def build_report(
    runs_table: pa.Table,
    phases_table: pa.Table,
    frontier_table: pa.Table,
    policy: MarginPolicy | None = None,
    sweep_dirs: list[Path] | None = None,
    analysis_files: list[Path] | None = None,
    render_plots: bool = True,
    notes: list[str] | None = None,
    name: str = "report",
) -> Report:
    """Compute the report of the analysis tables.

    Args:
        runs_table: the runs (analysis.tables.RUNS_SCHEMA, plus any ``est_*`` columns); dry runs
            (source ``predicted``) are shown apart, never as observations.
        phases_table: the phases (analysis.tables.PHASES_SCHEMA).
        frontier_table: the frontier (analysis.frontier.FRONTIER_SCHEMA, plus any search columns).
        policy: the margin policy; None: the default (``parse_margin(None)``).
        sweep_dirs: the directories named in the report; None: those of the runs.
        analysis_files: the Parquet tables listed under "Raw results".
        render_plots: False leaves the plots out (empty PNG bytes; faster, for checks of the
            text alone).
        notes: what was given twice and read once (``analysis.tables.unique_dirs``), shown as a note.
        name: the report's file name (``write.report_paths``), for the links of its load pages.

    Returns:
        The report: its document (plots rendered here, as PNG bytes) and what it computed.
    """
    # matplotlib (behind analysis.plots) takes seconds to import: only when plots are drawn
    from .. import plots as plot_mod

    plots = plot_mod if render_plots else _NoPlots()
    policy = policy or parse_margin(None)
    rows = _rows(runs_table, phases_table)
    runs, predicted = rows.runs, rows.predicted
    axes = _axes(frontier_table, rows, policy)
    # the estimator's columns, when it filled any (a column of nulls is no estimate)
    est_cols = [c for c in runs_table.column_names if c.startswith("est_") and any(r.get(c) is not None for r in runs)]
    kinds, notes = sorted({r["kind"] for r in runs}), list(notes or [])
    doc = Doc(_title(rows.all_runs))
    shown = shown_axes(axes)
    if runs:
        answer_section(doc, shown, policy, plots)
    _intro(doc, rows, sweep_dirs, notes, kinds)
    report = Report(doc, axes, policy, runs, bool(est_cols), predicted, notes, rows.unread)
    if not runs:
        doc.p(
            "No measured run was found: nothing observed to report."
            + (f" The directory holds only {dry_runs_text(len(predicted))} (predictions)." if predicted else "")
        )
        if predicted:
            predicted_section(doc, predicted)
        return report
    if len(shown) < len(axes):
        _scale_sections(doc, report, rows, axes, name)
        rows = _rows_of(rows, shown)
    _sections(doc, rows, shown, policy, est_cols, kinds, plots)
    raw_section(doc, rows.all_runs, shown, sweep_dirs, analysis_files)
    return report


def _scale_sections(doc: Doc, report: Report, rows: _Rows, axes: list[AxisResult], name: str) -> None:
    """A sweep of many loads: every load in one table, failures and outliers named, one page per load
    (in ``<name>_loads/``, ``write.report_paths``)."""
    loads_section(doc, axes, f"{name}_loads")
    failures_section(doc, rows.runs, axes)
    report.pages = {page_name(i): load_page(a, f"{name}.html") for i, a in enumerate(axes)}


def _rows_of(rows: _Rows, axes: list[AxisResult]) -> _Rows:
    """The rows of the runs of ``axes`` only (and their phases), for the sections shown in full."""
    ids = {id(r) for a in axes for r in a.runs}
    runs = [r for r in rows.runs if id(r) in ids]
    keys = {(r["sweep_dir"], r["run_id"]) for r in runs}
    phases = [p for p in rows.phases if (p["sweep_dir"], p["run_id"]) in keys]
    return rows._replace(runs=runs, phases=phases)


def _axes(frontier_table: pa.Table, rows: _Rows, policy: MarginPolicy) -> list[AxisResult]:
    """One result per frontier row; the measured runs are enriched (``stats.enrich_runs``) in place.
    Loads that would carry the same title are told apart, and the sweep directory is named when
    there are several."""
    enrich_runs(rows.runs, rows.phases)
    index = RunIndex(rows.runs)
    axes = [analyse_axis(row, index, policy) for row in frontier_table.to_pylist()]
    tell_loads_apart(axes)
    if len({a.sweep_dir for a in axes}) > 1:
        for a in axes:
            a.show_dir = True
    return axes


def _sections(
    doc: Doc,
    rows: _Rows,
    axes: list[AxisResult],
    policy: MarginPolicy,
    est_cols: list[str],
    kinds: list[str],
    plots,
) -> None:
    """The sections of a report with measured runs, from the summary card to the dry runs."""
    runs, predicted = rows.runs, rows.predicted
    summary_card(doc, runs, axes, policy, rows.unread)
    observed_section(doc, runs, rows.phases, axes, plots)
    throughput_section(doc, axes, plots)
    loading_section(doc, runs, rows.phases)
    calculated_section(doc, axes, policy, est_cols, plots, predicted, rows.predicted_phases)
    model_states_section(doc, runs)
    assumed_section(doc, kinds, policy)
    decision_section(doc, axes, policy)
    if len({r["sweep_dir"] for r in runs}) > 1:
        comparable_section(doc, axes)
    if predicted:
        predicted_section(doc, predicted)
