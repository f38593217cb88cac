"""Writing a report as markdown (plots beside it) and self-contained HTML, never over an existing one."""

from __future__ import annotations

import os
from pathlib import Path

from ..cli import OUTPUTS
from ..doc import to_html, to_markdown
from ..frontier import frontier_table
from ..tables import build_tables
from .build import Report, build_report
from .margin import parse_margin


class ReportExists(FileExistsError):
    """A report of that name is already in the output directory (nothing was written)."""


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


def report_for_dirs(sweep_dirs: list[Path], out_dir: Path, margin: str | None = None,
                    name: str = "report") -> tuple[Report, Path, Path]:
    """Build the tables from the run records of ``sweep_dirs`` (as ``memsweep analyze`` does),
    then write the report into ``out_dir``.

    Raises:
        FileNotFoundError: a sweep directory does not exist.
        SpecError: a bad ``margin``.
        ReportExists: a report of that name exists in ``out_dir``.
    """
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
