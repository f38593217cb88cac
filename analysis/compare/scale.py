"""A comparison of many series, bounded as the report of many loads is (analysis.report.sections_scale).

Up to ``DETAIL_PAIRS`` pairs of series are shown in full (the four counters' plot, the run peaks, the
per-phase tables); past it ``IN_FULL`` are (``shown_pairs``: those whose run peak grew most) and every
pair gets one row of "Every pair of series" (``summary_table``). Lists (values slower, peaks beyond the
gate, reasons not comparable) name at most ``NAMED`` entries and count the rest; the runs.parquet and
phases.parquet of each sweep hold every run and phase. Sizes in bytes.
"""

from __future__ import annotations

from ..doc import Doc
from .match import Comparison, Row

DETAIL_PAIRS = 4
"""The most pairs of series a comparison shows in full; past it, ``IN_FULL`` are."""
IN_FULL = 2
"""The pairs shown in full (plot, per-phase tables) in a comparison of more than ``DETAIL_PAIRS``;
each of the others gets one row of "Every pair of series"."""
NAMED = 60
"""The most entries of a list (reasons not comparable, peaks beyond the gate, rates) shown; the rest
are counted."""


def capped(lines: list[str]) -> list[str]:
    """At most ``NAMED`` lines, then how many more there are."""
    return lines[:NAMED] + ([f"... and {len(lines) - NAMED} more"] if len(lines) > NAMED else [])


def pct(row: Row, counter: str) -> str:
    """``row``'s difference of ``counter`` in % of the baseline (``+4.0 %``); ``-`` when unknown."""
    d, a = row.diff(counter), row.base.get(counter)
    return "-" if d is None or not a else f"{100 * d / a:+.1f} %"


def largest_growth(c: Comparison) -> tuple[object, int | None, str]:
    """The value whose run peak (the gate's counter) grew most in ``c``.

    Returns:
        (the value, its growth in bytes, in % of the baseline); (None, None, ``-``) when no run peak
        was compared.
    """
    peaks = [r for r in c.rows if r.phase == "run peak" and r.diff(c.gate_counter) is not None]
    if not peaks:
        return None, None, "-"
    top = max(peaks, key=lambda r: r.diff(c.gate_counter) or 0)
    return top.value, top.diff(c.gate_counter), pct(top, c.gate_counter)


def shown_pairs(paired: list[Comparison]) -> list[Comparison]:
    """The pairs shown in full: all when there are at most ``DETAIL_PAIRS``; else the ``IN_FULL``
    whose run peak grew most (bytes, ``largest_growth``; at equal growth the first).

    Returns:
        Those of ``paired``, in its order.
    """
    if len(paired) <= DETAIL_PAIRS:
        return list(paired)
    growth = [largest_growth(c)[1] for c in paired]
    ranked = sorted(range(len(paired)), key=lambda i: (growth[i] is None, -(growth[i] or 0), i))
    keep = set(ranked[:IN_FULL])
    return [c for i, c in enumerate(paired) if i in keep]


def summary_table(doc: Doc, paired: list[Comparison]) -> None:
    """Append "Every pair of series": each pair in one row, the values compared and the largest
    growth of the run peak."""
    doc.h(1, "Every pair of series")
    doc.table(
        ["series", "values compared", "largest growth at", "diff B", "diff %"],
        [
            [
                f"{c.title}: {c.base.sweep.label} -> {c.other.sweep.label}" if c.other else c.title,
                sum(1 for r in c.rows if r.phase == "run peak"),
                *largest_growth(c),
            ]
            for c in paired
        ],
        note=f"{len(paired)} pairs; the {IN_FULL} whose run peak grew most are shown in full above. The "
        "runs.parquet and phases.parquet of each sweep hold every run and phase.",
    )
