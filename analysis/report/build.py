"""The report of the analysis tables: the document, section by section, and what it computed."""

from __future__ import annotations

import datetime
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from memsweep.estimator.margin import MarginPolicy, parse_margin

from ..doc import Doc
from .figures import figure_pool, fill_figures
from .fmt import dry_runs_text, unread_text
from .loading import loading_section
from .model_states import model_states_section
from .rows import Rows, phase_starts, phases_of, split_rows
from .sections_answer import answer_section
from .sections_calculated import calculated_section
from .sections_closing import (
    RawFiles,
    assumed_section,
    comparable_section,
    decision_section,
    predicted_section,
    raw_section,
)
from .sections_observed import observed_section
from .sections_scale import failures_section, load_page, loads_section, page_name, shown_axes
from .sections_summary import summary_card
from .stats import AxisResult, RunIndex, analyse_axis, attach_phases, enrich_runs, tell_loads_apart
from .throughput import throughput_section


@dataclass
class Report:
    """What ``build_report`` computed, for the writer and for tests.

    Attributes:
        doc: the document (analysis.doc.Doc), plots included as PNG bytes.
        axes: one result per frontier row (``stats.AxisResult``).
        policy: the margin policy applied.
        runs: the measured run rows, enriched (``stats.enrich_runs``; their phase rows attached,
            ``stats.attach_phases``, where shown in full); a dry run is in ``predicted``.
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


def _intro(doc: Doc, rows: Rows, sweep_dirs: list[Path] | None, notes: list[str], kinds: list[str]) -> None:
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
    tables_read: bool = False,
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
        tables_read: the tables are ``analysis_files``, read in the place of the run directories
            (``analysis.current.current_tables``); said under "Raw results".

    Returns:
        The report: its document (plots rendered here, as PNG bytes) and what it computed.
    """
    # matplotlib (behind analysis.plots) takes seconds to import: only when plots are drawn
    with figure_pool() if render_plots else nullcontext(_NoPlots()) as plots:
        files = RawFiles(analysis_files or [], tables_read)
        report = _build(runs_table, phases_table, frontier_table, policy, sweep_dirs, files, notes, name, plots)
        fill_figures(plots, report.doc)
    return report


def _build(
    runs_table: pa.Table,
    phases_table: pa.Table,
    frontier_table: pa.Table,
    policy: MarginPolicy | None,
    sweep_dirs: list[Path] | None,
    files: RawFiles,
    notes: list[str] | None,
    name: str,
    plots,
) -> Report:
    """``build_report``'s work, its figures drawn by ``plots`` (``analysis.plots``, a
    ``figures.FigurePool`` or ``_NoPlots``)."""
    policy = policy or parse_margin(None)
    rows = split_rows(runs_table, phases_table)
    runs, predicted = rows.runs, rows.predicted
    axes = _axes(frontier_table, rows, phase_starts(phases_table), policy)
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
    rows = rows._replace(phases=phases_of(phases_table, rows.runs))
    attach_phases(rows.runs, rows.phases)
    _sections(doc, rows, shown, policy, est_cols, kinds, plots)
    raw_section(doc, rows.all_runs, shown, sweep_dirs, files)
    return report


def _scale_sections(doc: Doc, report: Report, rows: Rows, axes: list[AxisResult], name: str) -> None:
    """A sweep of many loads: every load in one table, failures and outliers named, one page per load
    (in ``<name>_loads/``, ``write.report_paths``)."""
    loads_section(doc, axes, f"{name}_loads")
    failures_section(doc, rows.runs, axes)
    report.pages = {page_name(i): load_page(a, f"{name}.html") for i, a in enumerate(axes)}


def _rows_of(rows: Rows, axes: list[AxisResult]) -> Rows:
    """The rows of the runs of ``axes`` only, for the sections shown in full."""
    ids = {id(r) for a in axes for r in a.runs}
    return rows._replace(runs=[r for r in rows.runs if id(r) in ids])


def _axes(
    frontier_table: pa.Table, rows: Rows, starts: dict[tuple, int | None], policy: MarginPolicy
) -> list[AxisResult]:
    """One result per frontier row; the measured runs are enriched (``stats.enrich_runs``, with their
    first phases' ``starts``) in place. Loads that would carry the same title are told apart, and the
    sweep directory is named when there are several."""
    enrich_runs(rows.runs, starts)
    index = RunIndex(rows.runs)
    axes = [analyse_axis(row, index, policy) for row in frontier_table.to_pylist()]
    tell_loads_apart(axes)
    if len({a.sweep_dir for a in axes}) > 1:
        for a in axes:
            a.show_dir = True
    return axes


def _sections(
    doc: Doc,
    rows: Rows,
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
