"""The comparison as text (for a terminal or a CI log) and as a document (compare.md / compare.html).

Sizes: raw bytes, differences in bytes and percent of the baseline; GiB = 2^30 B where converted.
"""

from __future__ import annotations

from memsweep.conf.contract import gib

from ..doc import Doc, Image
from .gate import Regression, Threshold
from .load import Sweep
from .match import COUNTERS, Comparison, Difference
from .scale import IN_FULL, NAMED, capped, largest_growth, shown_pairs, summary_table
from .scale import pct as _pct

__all__ = ["IN_FULL", "NAMED", "document", "text", "verdict"]


def _num(v) -> str:
    return "-" if v is None else str(v)


def _sweeps_lines(sweeps: list[Sweep]) -> list[str]:
    out = []
    for i, s in enumerate(sweeps):
        role = "baseline" if i == 0 else f"compared with {sweeps[0].label}"
        line = f"{s.label} ({role}): {s.path}  read from {s.source}; {len(s.runs)} measured runs"
        if s.dry_runs:
            line += f" ({s.dry_runs} dry runs left out: predictions)"
        if s.missing_columns:
            line += (
                f"; written by an older memsweep: {len(s.missing_columns)} columns absent, read as unknown "
                f"({', '.join(s.missing_columns[:6])}{', ...' if len(s.missing_columns) > 6 else ''})"
            )
        out.append(line)
    return out


def text(
    sweeps: list[Sweep],
    diffs: list[Difference],
    comparisons: list[Comparison],
    threshold: Threshold | None,
    failed: list[Regression],
) -> str:
    """The comparison for a terminal: sweeps, what differs, per pair the run peaks per value and
    the per-phase differences of the four counters, what was not comparable, the gate's verdict.

    Returns:
        The text, lines joined by newlines.
    """
    out = ["memsweep compare"] + ["  " + line for line in _sweeps_lines(sweeps)]
    out.append("what differs between the sweeps (spec and environment):")
    if diffs:
        out += [
            f"  {kind:<11} {f:<22} " + " | ".join(f"{s.label}: {v}" for s, v in zip(sweeps, per))
            for kind, f, per in diffs
        ]
    else:
        out.append("  nothing recorded differs (a code change, or the same load measured twice)")
    paired = [c for c in comparisons if c.other is not None and c.rows]
    in_full = shown_pairs(paired)
    for c in paired:
        if not any(c is s for s in in_full):
            value, diff, pct = largest_growth(c)
            out.append(f"{c.title}: largest growth of the run peak at {c.base.axis}={value}: {_num(diff)} B ({pct})")
    for c in in_full:
        assert c.other is not None
        a, b = c.base.sweep.label, c.other.sweep.label
        out.append(f"{c.title}: {a} -> {b}; gate counter {c.gate_counter} (bytes; diff = {b} - {a}, % of {a})")
        head = f"  {c.base.axis:>8} {'phase':<24}" + "".join(f" {'d ' + k:>27} {'%':>8}" for k in COUNTERS)
        first = f"run peak {c.gate_counter} {a}"
        out.append(f"  {c.base.axis:>8} {first:>40} {b:>14} {'diff B':>12} {'%':>8} {b + '/' + a:>7}")
        for row in c.rows:
            if row.phase == "run peak":
                r = row.ratio(c.gate_counter)
                g = c.gate_counter
                ratio = "-" if r is None else f"{r:.3f}"
                out.append(
                    f"  {row.value!s:>8} {_num(row.base.get(g)):>40} {_num(row.other.get(g)):>14} "
                    f"{_num(row.diff(g)):>12} {_pct(row, g):>8} {ratio:>7}"
                )
        out.append("  per value and phase, the four counters' differences (bytes, % of the baseline):")
        out.append(head)
        for row in c.rows:
            if row.phase != "run peak":
                out.append(
                    f"  {row.value!s:>8} {row.phase:<24}"
                    + "".join(f" {_num(row.diff(k)):>27} {_pct(row, k):>8}" for k in COUNTERS)
                )
    reasons = [line for c in comparisons for line in c.not_comparable]
    out.append(
        "not comparable:" if reasons else "not comparable: none (every value and phase of the paired sweeps lined up)"
    )
    out += [f"  {line}" for line in capped(reasons)]
    out.append(verdict(comparisons, threshold, failed))
    return "\n".join(out)


def verdict(comparisons: list[Comparison], threshold: Threshold | None, failed: list[Regression]) -> str:
    """The gate's verdict in words (no threshold: says so)."""
    if threshold is None:
        return "gate: none (--fail-above not given)"
    if not any(c.rows for c in comparisons):
        return f"gate --fail-above {threshold.text}: NOTHING COMPARABLE, nothing was checked"
    if failed:
        return f"gate --fail-above {threshold.text}: FAILED, {len(failed)} peak(s) grew beyond it:\n" + "\n".join(
            f"  {line}" for line in _grown_lines(failed)
        )
    n = sum(1 for c in comparisons for r in c.rows if r.phase == "run peak")
    return f"gate --fail-above {threshold.text}: passed ({n} value(s) compared, no peak grew beyond it)"


def _grown_lines(failed: list[Regression]) -> list[str]:
    """The peaks beyond the gate, one line each: all, in the comparisons' order, when at most
    ``NAMED``; else the ``NAMED`` that grew most in % of the baseline, then how many more."""
    if len(failed) <= NAMED:
        return [r.text() for r in failed]
    top = sorted(failed, key=lambda r: (r.other - r.base) / r.base if r.base else float("inf"), reverse=True)
    return [r.text() for r in top[:NAMED]] + [
        f"... and {len(failed) - NAMED} more (the {NAMED} that grew most, in % of the baseline, are named)"
    ]


def _comparison_tables(doc: Doc, i: int, c: Comparison, plots) -> None:
    """One pair of series (figure ``i``): the four counters' plot, the run peaks of the gate's counter
    side by side, then per value and phase the four counters."""
    assert c.other is not None
    a, b = c.base.sweep.label, c.other.sweep.label
    doc.h(1, f"{c.title}: {a} -> {b}")
    doc.image(
        Image(
            f"counters{i}_{c.base.axis}.png",
            plots.counters_plot([c.base, c.other], f"{c.title}: the four counters, {a} and {b}"),
            f"The four counters against {c.base.axis} for {a} and {b} (observed; ok runs joined, a run that "
            "did not complete is a cross with its partial value).",
        )
    )
    g = c.gate_counter
    doc.table(
        [c.base.axis, f"{a} peak {g} B", f"{b} peak B", "diff B", "diff %", f"{b} / {a}", f"{b} GiB"],
        [
            [
                row.value,
                row.base.get(g),
                row.other.get(g),
                row.diff(g),
                _pct(row, g),
                f"{row.ratio(g):.3f}" if row.ratio(g) else None,
                gib(row.other.get(g)),
            ]
            for row in c.rows
            if row.phase == "run peak"
        ],
        note=f"The run's peak of `{g}`, the counter compared with the capacity on this device (the gate's).",
    )
    headers = [c.base.axis, "phase"]
    for k in COUNTERS:
        headers += [f"{k} {a} B", f"{b} B", "diff B", "%"]
    doc.table(
        headers,
        [
            [row.value, row.phase]
            + [x for k in COUNTERS for x in (row.base.get(k), row.other.get(k), row.diff(k), _pct(row, k))]
            for row in c.rows
            if row.phase != "run peak"
        ],
        note="Per value and phase: the four counters in both sweeps, their difference in bytes and in % of "
        "the baseline.",
    )


def document(
    sweeps: list[Sweep],
    diffs: list[Difference],
    comparisons: list[Comparison],
    threshold: Threshold | None,
    failed: list[Regression],
    plots,
) -> Doc:
    """The comparison as a document: verdict and sweeps first, the plots, then the tables.

    Args:
        sweeps, diffs, comparisons, threshold, failed: as for ``text``.
        plots: ``analysis.compare.plot`` (``counters_plot``).

    Returns:
        The document (plots as PNG bytes).
    """
    doc = Doc("memsweep compare: " + " vs ".join(f"{s.label} ({s.path.name})" for s in sweeps))
    first, *grown = verdict(comparisons, threshold, failed).splitlines()
    doc.p(first)
    if grown:  # the peaks that failed the gate, one item each
        doc.ul([line.strip() for line in grown])
    doc.ul(_sweeps_lines(sweeps))
    doc.h(1, "What differs between the sweeps")
    doc.table(
        ["kind", "field"] + [s.label for s in sweeps],
        [[k, f, *per] for k, f, per in diffs] or [["-", "nothing recorded differs", *["" for _ in sweeps]]],
    )
    paired = [c for c in comparisons if c.other is not None and c.rows]
    in_full = shown_pairs(paired)
    for i, c in enumerate(comparisons):  # i: the figure's number, the comparison's place
        if any(c is s for s in in_full):
            _comparison_tables(doc, i, c, plots)
    if len(in_full) < len(paired):
        summary_table(doc, paired)
    doc.h(1, "Not comparable")
    reasons = [line for c in comparisons for line in c.not_comparable]
    doc.ul(capped(reasons) or ["nothing: every value and phase of the paired sweeps lined up"])
    return doc
