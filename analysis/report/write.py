"""Writing a report as markdown (plots beside it) and self-contained HTML, never over an existing one.

Nothing here prints or exits: a refusal is an exception (``ReportExists``, ``SweepDirNotFound``,
``conf.contract.SpecError``) that the command line (``cli``) turns into a message and exit status.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pyarrow as pa

from memsweep.conf.contract import remove_stale_temps
from memsweep.estimator.margin import parse_margin, refuse_margin_at_capacity

from ..current import current_tables
from ..doc import to_html, to_markdown
from ..frontier import frontier_table
from ..outputs import OUTPUTS, recover_set
from ..publish import publish_doc, recover_doc, recover_outputs
from ..tables import build_tables, no_sweep_dir, unique_dirs
from .build import Report, build_report


class ReportExists(FileExistsError):
    """A report of that name is already in the output directory (nothing was written).

    Args:
        message: what exists, and what to do instead (the command line prints it).
        path: the report file or plot directory that exists, kept as ``self.path``.
    """

    def __init__(self, message: str, path: Path):
        super().__init__(message)
        self.path = Path(path)


class SweepDirNotFound(FileNotFoundError):
    """A sweep directory given does not exist (nothing was read or written).

    Args:
        path: the directory given (an existing sweep directory is expected), kept as ``self.path``.
    """

    def __init__(self, path: Path):
        super().__init__(no_sweep_dir(path))
        self.path = Path(path)


class ReportPaths(NamedTuple):
    """The paths of a report (``report_paths``)."""

    md: Path  # <name>.md
    html: Path  # <name>.html
    plots: Path  # the plot directory <name>_plots
    loads: Path  # the directory of one page per load <name>_loads (a report of many loads)


class WrittenReport(NamedTuple):
    """A report and where ``report_for_dirs`` wrote it."""

    report: Report
    md: Path
    html: Path


def report_paths(out_dir: Path, name: str = "report") -> ReportPaths:
    """The paths a report named ``name`` takes in ``out_dir``.

    Returns:
        ``<name>.md``, ``<name>.html``, the plot directory ``<name>_plots`` and the load pages'
        directory ``<name>_loads``.
    """
    out_dir = Path(out_dir)
    return ReportPaths(
        out_dir / f"{name}.md", out_dir / f"{name}.html", out_dir / f"{name}_plots", out_dir / f"{name}_loads"
    )


def write_report(report: Report, out_dir: Path, name: str = "report") -> tuple[Path, Path]:
    """Write ``<name>.md``, ``<name>_plots/*.png``, ``<name>_loads/`` (a report of many loads) and
    ``<name>.html`` into ``out_dir``, as one set or not at all (``publish.publish_doc``: written into
    a staging directory, then renamed into place; what a killed writer left is undone first).

    Args:
        report: what ``build_report`` returned.
        out_dir: the output directory, created when missing.
        name: the report's name (``report``; the sweep's end picks a timestamped one when taken).

    Returns:
        (the markdown path, the HTML path).

    Raises:
        ReportExists: one of these paths exists already (nothing is written or changed).
        OSError: the report could not be written (a full disk): nothing of it is published.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path, html_path, plot_dir, loads_dir = report_paths(out_dir, name)
    footer = f"memsweep report · {md_path.name} holds the same content with the plots in {plot_dir.name}/"

    def write(staging: Path) -> None:
        (staging / plot_dir.name).mkdir()
        for img in report.doc.images:
            (staging / plot_dir.name / img.name).write_bytes(img.png)
        if report.pages:
            (staging / loads_dir.name).mkdir()
            for page, doc in report.pages.items():
                page_html = to_html(doc, f"memsweep report · one load of {html_path.name}")
                (staging / loads_dir.name / page).write_text(page_html, encoding="utf-8")
        (staging / md_path.name).write_text(to_markdown(report.doc, plot_dir.name), encoding="utf-8")
        (staging / html_path.name).write_text(to_html(report.doc, footer), encoding="utf-8")

    entries = [plot_dir.name, loads_dir.name, md_path.name, html_path.name]  # the pages last: their plots are there
    try:
        publish_doc(out_dir, REPORT_KIND, entries, write)
    except FileExistsError as exc:
        where = Path(exc.filename or md_path)
        raise ReportExists(
            f"{where} already exists: memsweep never overwrites a report; use --out NEW_DIR", where
        ) from None
    return md_path, html_path


REPORT_KIND = "report"
"""The kind of a report's staging directory and marker (``publish.publish_doc``), whatever its name."""


def recover_reports(out_dir: Path) -> list[Path]:
    """Undo what report writers that died left in ``out_dir`` (``publish.recover_doc``), and the
    temporary files of an older memsweep's report writer (``.NAME.md.PID.tmp``, ``.NAME.html.PID.tmp``)
    whose writer is gone. Call it holding ``out_dir``'s ``publish.LOCK``.

    Returns:
        The paths removed.
    """
    removed = recover_doc(out_dir, REPORT_KIND)
    older = {p.name.split(".")[1] for p in out_dir.glob(".*.md.*.tmp")} | {
        p.name.split(".")[1] for p in out_dir.glob(".*.html.*.tmp")
    }
    for stem in sorted(older):
        removed += remove_stale_temps(out_dir, (f"{stem}.md", f"{stem}.html"))
    return removed


def recover_sweep_outputs(sweep_dir: Path) -> list[Path]:
    """At a sweep's end (a resume's included): undo what killed writers of tables and reports left
    in the sweep directory and in each of its ``analysis/<time>/`` directories (``recover_set``,
    ``recover_reports``), where no live writer holds the directory (``publish.recover_outputs``).

    Returns:
        The paths removed.
    """
    sweep_dir = Path(sweep_dir)
    later = [d for d in (sweep_dir / "analysis").glob("*") if d.is_dir() and not d.is_symlink()]
    return recover_outputs([sweep_dir, *later], (recover_set, recover_reports))


def find_analysis_files(sweep_dir: Path) -> list[Path]:
    """The newest Parquet tables of a sweep: its own, or the latest under analysis/.

    Args:
        sweep_dir: a sweep directory.

    Returns:
        The paths of the three tables (analysis.outputs.OUTPUTS) of the newest ``analysis/<time>/``
        directory that holds all three; else those of the three present in ``sweep_dir``
        itself (possibly none).
    """
    sweep_dir = Path(sweep_dir)
    names = OUTPUTS
    later = sorted((d for d in (sweep_dir / "analysis").glob("*") if d.is_dir()), key=lambda d: d.name)
    for d in reversed(later):
        if all((d / n).exists() for n in names):
            return [d / n for n in names]
    return [sweep_dir / n for n in names if (sweep_dir / n).exists()]


def smallest_capacity(runs: pa.Table) -> tuple[str, int] | None:
    """The smallest capacity recorded in a runs table (``capacity_bytes``, bytes) and the sweep
    directory of a run that has it; None when no run records one."""
    pairs = zip(runs["sweep_dir"].to_pylist(), runs["capacity_bytes"].to_pylist())
    known = [(cap, str(d)) for d, cap in pairs if cap is not None]
    if not known:
        return None
    cap, sweep_dir = min(known)
    return sweep_dir, cap


def report_for_dirs(
    sweep_dirs: list[Path], out_dir: Path, margin: str | None = None, name: str = "report"
) -> WrittenReport:
    """Build the tables from the run records of ``sweep_dirs`` (as ``memsweep analyze`` does), or,
    for one sweep whose newest tables are current with its run directories (``current_tables``),
    read those instead; then write the report into ``out_dir``.

    Args:
        sweep_dirs: the sweep directories reported on; one given twice (the same resolved path) is
            read once, with a note in the report (``Report.notes``).
        out_dir: where the report goes.
        margin: the margin policy's text (``parse_margin``); None: the default.
        name: the report's name (``report_paths``).

    Returns:
        (the report, the markdown path, the HTML path).

    Raises:
        SweepDirNotFound: a sweep directory does not exist (a FileNotFoundError).
        SpecError: a bad ``margin`` (field ``margin``, with the accepted forms), or a fixed one not
            below the smallest capacity of the runs (``refuse_margin_at_capacity``: nothing could fit).
        ReportExists: a report of that name exists in ``out_dir``; checked before any work.
    """
    policy = parse_margin(margin)
    for d in sweep_dirs:
        if not Path(d).is_dir():
            raise SweepDirNotFound(d)
    md, html_, plot_dir, loads_dir = report_paths(out_dir, name)
    for p in (md, html_, plot_dir, loads_dir):  # refuse before the work, not only after it
        if p.exists():
            raise ReportExists(f"{p} already exists: memsweep never overwrites a report; use --out NEW_DIR", p)
    sweep_dirs, notes = unique_dirs(sweep_dirs)  # a directory given twice is one sweep
    files = [f for d in sweep_dirs for f in find_analysis_files(Path(d))]
    current = current_tables(sweep_dirs[0], files) if len(sweep_dirs) == 1 else None
    if current is None:
        runs, phases, _ = build_tables(sweep_dirs)
    else:
        runs, phases = current.runs, current.phases
    smallest = smallest_capacity(runs)
    if smallest is not None:
        refuse_margin_at_capacity(policy, smallest[1], "margin", f" of {smallest[0]}")
    frontier = frontier_table(runs)
    report = build_report(
        runs, phases, frontier, policy, sweep_dirs, files, notes=notes, name=name, tables_read=current is not None
    )
    md, html_ = write_report(report, out_dir, name)
    return WrittenReport(report, md, html_)
