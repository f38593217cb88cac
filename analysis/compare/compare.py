"""Comparing sweeps: read them, pair their series, note what differs, apply the gate; write the document."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..doc import Doc, to_html, to_markdown
from ..report import ReportExists, report_paths
from .gate import Regression, Threshold, regressions
from .load import Sweep, load_sweep
from .match import Comparison, Difference, compare_series, differences, series_index, series_of


@dataclass
class CompareResult:
    """What ``compare`` found.

    Attributes:
        sweeps: the sweeps read, baseline first, labelled A, B, C...
        differences: what differs between them (``match.differences``).
        comparisons: each baseline series against each other sweep.
        regressions: the peaks that grew beyond the threshold (empty without one).
    """

    sweeps: list[Sweep]
    differences: list[Difference]
    comparisons: list[Comparison]
    regressions: list[Regression]


def compare(paths: list[Path], threshold: Threshold | None = None) -> CompareResult:
    """Compare every sweep after the first with the first (the baseline).

    Args:
        paths: sweep directories (Parquet tables of any memsweep version, else run records).
        threshold: the gate's allowed growth; None: no gate.

    Returns:
        The comparison.

    Raises:
        SweepNotFound: a path is not a directory.
    """
    sweeps = [load_sweep(p, chr(ord("A") + i) if i < 26 else f"S{i}") for i, p in enumerate(paths)]
    base_series = series_of(sweeps[0])
    comparisons = []
    for other in sweeps[1:]:
        candidates = series_of(other)
        if not base_series:
            cmp = Comparison(None, None, "max_memory_allocated", comparable=False)  # type: ignore[arg-type]
            cmp.not_comparable.append(
                f"{sweeps[0].label}: no axis swept over two or more values with everything else fixed: "
                "nothing to compare"
            )
            comparisons.append(cmp)
            continue
        index = series_index(candidates)
        comparisons += [compare_series(s, candidates, index) for s in base_series]
    axes = sorted({s.axis for s in base_series})
    found = regressions([c for c in comparisons if c.base is not None], threshold) if threshold else []
    return CompareResult(sweeps, differences(sweeps, axes), comparisons, found)


def write_doc(doc: Doc, out_dir: Path) -> tuple[Path, Path]:
    """Write ``compare.md``, ``compare_plots/*.png`` and ``compare.html`` into ``out_dir`` (never over
    existing files).

    Returns:
        (the markdown path, the HTML path).

    Raises:
        ReportExists: one of them exists already.
    """
    md, html_, plot_dir, _ = report_paths(out_dir, "compare")
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        plot_dir.mkdir()
    except FileExistsError:
        raise ReportExists(f"{plot_dir} already exists", plot_dir) from None
    for img in doc.images:
        (plot_dir / img.name).write_bytes(img.png)
    for path, data in ((md, to_markdown(doc, plot_dir.name)), (html_, to_html(doc, "memsweep compare"))):
        with open(path, "x") as f:
            f.write(data)
    return md, html_
