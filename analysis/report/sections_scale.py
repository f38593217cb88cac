"""The report of a sweep of many loads: a bounded page and one detail page per load.

Past ``DETAIL_LOADS`` frontier rows the page shows every section for a few loads only
(``shown_axes``: the answer's load, then one with failures or a non-monotonic edge, else the
tightest margin), and for every load one row of the "All loads" table, linked to its own page
(``load_page``: its values, frontier facts and runs). Failures and outliers are named on the page
(``failures_section``), up to ``NAMED`` each, the rest counted, with every run in the Parquet tables.
"""

from __future__ import annotations

from memsweep.conf.contract import gib

from ..doc import Doc
from .fmt import nbytes
from .sections_answer import main_axis
from .sections_observed import _frontier_facts, _runs_table, _values_table
from .stats import AxisResult

DETAIL_LOADS = 6
"""The most loads (frontier rows) a report shows in full; past it, ``FULL_LOADS`` are, and every
load gets a page of its own."""
FULL_LOADS = 2
"""The loads shown in full (plots included) in a report of more than ``DETAIL_LOADS`` loads."""
NAMED = 40
"""The most failures, and outliers, a report names one by one (the rest are counted)."""
OUTLIER_RATIO = 1.25
"""A value is an outlier when its peak per unit of the axis exceeds its load's median by this factor."""


def shown_axes(axes: list[AxisResult]) -> list[AxisResult]:
    """The loads shown in full: all when there are at most ``DETAIL_LOADS``; else the answer's load
    (``main_axis``), those with a failure or a non-monotonic edge, then the smallest margins at the edge.

    Returns:
        All of ``axes``, or ``FULL_LOADS`` of them, in the order of ``axes``.
    """
    if len(axes) <= DETAIL_LOADS:
        return list(axes)
    main = main_axis(axes)
    ranked = sorted(
        axes,
        key=lambda a: (
            a is not main,
            not (a.frontier.get("n_other") or a.frontier.get("monotonic") is False),
            a.margin_at_edge if a.margin_at_edge is not None else float("inf"),
        ),
    )
    keep = {id(a) for a in ranked[:FULL_LOADS]}
    return [a for a in axes if id(a) in keep]


def page_name(i: int) -> str:
    """The file name of load ``i``'s page in the report's detail directory."""
    return f"load{i:05d}.html"


def loads_section(doc: Doc, axes: list[AxisResult], detail_dir: str) -> None:
    """Append "All loads": one row per frontier row (its edge, recommended value, margin, runs and
    failures), each linked to its page in ``detail_dir``."""
    doc.h(1, "All loads")
    doc.table(
        ["load", "max_ok", "min_oom", "recommended", "margin at max_ok B", "GiB", "runs", "not ok/oom", "detail"],
        [
            [
                a.title,
                a.edge,
                a.miss,
                a.recommended,
                nbytes(a.margin_at_edge),
                gib(a.margin_at_edge),
                a.frontier.get("n_runs"),
                a.frontier.get("n_other"),
                f"[page]({detail_dir}/{page_name(i)})",
            ]
            for i, a in enumerate(axes)
        ],
        note=f"{len(axes)} loads; the sections below show {FULL_LOADS} in full. Each page holds "
        "a load's values, frontier and runs; runs.parquet and phases.parquet hold every run and phase.",
    )


def outliers(a: AxisResult) -> list[tuple[object, int]]:
    """The values of a numeric axis whose peak per unit of the axis exceeds the load's median by
    ``OUTLIER_RATIO`` (observed peaks of values that ran ok).

    Returns:
        (value, peak in bytes) per outlier, in the axis's order.
    """
    per = [(s.value, s.used) for s in a.values if s.all_ok and s.used and isinstance(s.value, int) and s.value > 0]
    if len(per) < 3:
        return []
    ratios = sorted(u / v for v, u in per)
    median = ratios[len(ratios) // 2]
    return [(v, u) for v, u in per if u / v > OUTLIER_RATIO * median]


def failures_section(doc: Doc, runs: list[dict], axes: list[AxisResult]) -> None:
    """Append "Failures and outliers": the runs that neither ran ok nor ran out of memory (an
    error, crash, timeout or none yet), with their error and directory, and the outlier peaks per
    load (``outliers``); up to ``NAMED`` of each, the rest counted."""
    doc.h(1, "Failures and outliers")
    failed = [r for r in runs if r.get("outcome") not in ("ok", "oom")]
    items = [
        f"`{r.get('run_id')}` ({r.get('outcome') or 'unfinished'}"
        + (f" in {r['failed_phase']}" if r.get("failed_phase") else "")
        + f"): {r.get('error_type') or ''} {str(r.get('error_message') or '')[:100]} - `{r.get('run_dir')}/stderr.log`"
        for r in failed[:NAMED]
    ]
    if len(failed) > NAMED:
        items.append(f"{len(failed) - NAMED} more (runs.parquet: outcome other than ok and oom)")
    doc.p(
        f"{len(failed)} of {len(runs)} runs failed otherwise than by running out of memory" + (":" if failed else ".")
    )
    if items:
        doc.ul(items)
    found = [(a, v, u) for a in axes for v, u in outliers(a)]
    doc.p(
        f"{len(found)} outlier peak(s): a value whose peak per unit of {axes[0].axis if axes else 'the axis'} is more "
        f"than {OUTLIER_RATIO:g} times its load's median (observed, ok runs)" + (":" if found else ".")
    )
    if found:
        doc.ul(
            [f"{a.title}: {a.axis}={v}, peak {u} B ({gib(u)} GiB)" for a, v, u in found[:NAMED]]
            + ([f"{len(found) - NAMED} more"] if len(found) > NAMED else [])
        )


def load_page(a: AxisResult, main_page: str) -> Doc:
    """One load's page: its values (outcomes, peaks), its frontier facts and its runs (no plots).

    Args:
        a: the load's axis result.
        main_page: the report's HTML file name, linked back to.

    Returns:
        The page's document.
    """
    doc = Doc(a.title)
    doc.p(f"Part of [the report](../{main_page}): the values, frontier and runs of one load (observed).")
    _values_table(doc, a)
    _frontier_facts(doc, a)
    _runs_table(doc, a.runs)
    return doc
