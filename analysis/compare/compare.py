"""Comparing sweeps: read them, pair their series, note what differs, apply the gate; write the document."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from memsweep.conf.contract import SpecError

from ..doc import Doc, to_html, to_markdown
from ..publish import publish_doc
from ..report import ReportExists, report_paths
from .gate import Regression, Threshold, regressions
from .load import Sweep, load_sweep
from .match import (
    GATE_COUNTERS,
    PHASE_COLUMNS,
    RUN_COLUMNS,
    Comparison,
    Difference,
    compare_series,
    differences,
    name_series,
    series_index,
    series_of,
)
from .render import document, text
from .speed import Slowdown, rate_changes, slowdowns, speed_lines, speed_section


@dataclass
class CompareResult:
    """What ``compare`` found.

    Attributes:
        sweeps: the sweeps read, baseline first, labelled A, B, C...
        differences: what differs between them (``match.differences``).
        comparisons: each baseline series against each other sweep.
        regressions: the peaks that grew beyond the threshold (empty without one).
        rates: the samples per second of every value compared with a measured rate in both sweeps.
        slowdowns: those that fell beyond ``--fail-slower`` (empty without it).
    """

    sweeps: list[Sweep]
    differences: list[Difference]
    comparisons: list[Comparison]
    regressions: list[Regression]
    rates: list[Slowdown] = field(default_factory=list)
    slowdowns: list[Slowdown] = field(default_factory=list)


def compare(
    paths: list[Path],
    threshold: Threshold | None = None,
    counter: str = "allocated",
    fail_slower: Fraction | None = None,
) -> CompareResult:
    """Compare every sweep after the first with the first (the baseline).

    Args:
        paths: sweep directories (Parquet tables of any memsweep version, else run records).
        threshold: the gate's allowed growth; None: no gate.
        counter: the peak the memory gate reads, a key of ``match.GATE_COUNTERS``: ``allocated``
            (``max_memory_allocated``, the default: on CUDA the steadiest, the reserved peak moves with
            the allocator's warm-up history; on the CPU the tracked tensor bytes) or ``reserved``
            (``max_memory_reserved``: on CUDA what the allocator holds, on the CPU the resident set).
        fail_slower: the fall of samples per second allowed (a fraction of the baseline's); None: no
            throughput gate.

    Returns:
        The comparison.

    Raises:
        SweepNotFound: a path is not a directory.
        SpecError: ``counter`` not one of GATE_COUNTERS.
    """
    if counter not in GATE_COUNTERS:
        raise SpecError("--counter", counter, " | ".join(GATE_COUNTERS))
    labels = [chr(ord("A") + i) if i < 26 else f"S{i}" for i in range(len(paths))]
    sweeps = [load_sweep(p, label, RUN_COLUMNS, PHASE_COLUMNS) for p, label in zip(paths, labels)]
    base_series = series_of(sweeps[0])
    others = [series_of(other) for other in sweeps[1:]]
    name_series([*base_series, *(s for candidates in others for s in candidates)])
    comparisons = []
    for candidates in others:
        if not base_series:
            cmp = Comparison(None, None, GATE_COUNTERS[counter], comparable=False)  # type: ignore[arg-type]
            cmp.not_comparable.append(
                f"{sweeps[0].label}: no axis swept over two or more values with everything else fixed: "
                "nothing to compare"
            )
            comparisons.append(cmp)
            continue
        index = series_index(candidates)
        comparisons += [compare_series(s, candidates, GATE_COUNTERS[counter], index) for s in base_series]
    axes = sorted({s.axis for s in base_series})
    found = regressions([c for c in comparisons if c.base is not None], threshold) if threshold else []
    paired = [c for c in comparisons if c.base is not None]
    slow = slowdowns(paired, fail_slower) if fail_slower is not None else []
    return CompareResult(sweeps, differences(sweeps, axes), comparisons, found, rate_changes(paired), slow)


def write_doc(doc: Doc, out_dir: Path) -> tuple[Path, Path]:
    """Write ``compare.md``, ``compare_plots/*.png`` and ``compare.html`` into ``out_dir``, as one set
    or not at all (``publish.publish_doc``), never over existing files.

    Returns:
        (the markdown path, the HTML path).

    Raises:
        ReportExists: one of them exists already.
        OSError: the files could not be written (nothing of them is published).
    """
    md, html_, plot_dir, _ = report_paths(out_dir, "compare")
    out_dir.mkdir(parents=True, exist_ok=True)

    def write(staging: Path) -> None:
        (staging / plot_dir.name).mkdir()
        for img in doc.images:
            (staging / plot_dir.name / img.name).write_bytes(img.png)
        (staging / md.name).write_text(to_markdown(doc, plot_dir.name), encoding="utf-8")
        (staging / html_.name).write_text(to_html(doc, "memsweep compare"), encoding="utf-8")

    try:
        publish_doc(out_dir, "compare", [plot_dir.name, md.name, html_.name], write)
    except FileExistsError as exc:
        where = Path(exc.filename or md)
        raise ReportExists(f"{where} already exists", where) from None
    return md, html_


def compare_text(result: CompareResult, threshold: Threshold | None, slower: str | None) -> str:
    """What ``memsweep compare`` prints: the memory comparison and its gate (``render.text``), then
    the throughput and its gate (``speed.speed_lines``).

    Args:
        result: the comparison.
        threshold: ``--fail-above``, or None.
        slower: ``--fail-slower`` as given, or None.

    Returns:
        The text, lines joined by newlines.
    """
    memory = text(result.sweeps, result.differences, result.comparisons, threshold, result.regressions)
    return "\n".join([memory, *speed_lines(result.rates, slower, result.slowdowns)])


def compare_document(result: CompareResult, threshold: Threshold | None, slower: str | None, plots) -> Doc:
    """The comparison's document (``render.document``) with its "Throughput" section.

    Args:
        result: the comparison.
        threshold: ``--fail-above``, or None.
        slower: ``--fail-slower`` as given, or None.
        plots: ``analysis.compare.plot``.

    Returns:
        The document.
    """
    doc = document(result.sweeps, result.differences, result.comparisons, threshold, result.regressions, plots)
    speed_section(doc, result.rates, slower, result.slowdowns)
    return doc
