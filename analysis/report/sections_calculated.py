"""The calculated section: margins, the context fit, the estimate beside the measurement, other cards.

Everything here is computed from the observed counters or from formulas; sizes in bytes beside GiB.
"""

from __future__ import annotations

from memsweep.conf.contract import gib
from memsweep.estimator import cards as cards_mod
from memsweep.estimator.margin import MarginPolicy

from ..doc import Doc, Image
from .fit import capacity_crossings
from .fitted import limit_words
from .fmt import axis_label, nbytes, pct
from .phases import OBSERVED_COUNTERPART, PART_NAMES, decomposition
from .split import split_section
from .stats import AxisResult, ValueStat

MARGIN_HEADER = [
    "sweep",
    "edge",
    "value",
    "peak counter",
    "capacity B",
    "GiB",
    "peak B",
    "GiB",
    "margin B",
    "GiB",
    "margin % of capacity",
]
"""The columns of the table of the margin at each edge."""


def calculated_section(
    doc: Doc,
    axes: list[AxisResult],
    policy: MarginPolicy,
    est_cols: list[str],
    plots,
    predicted: list[dict] | None = None,
    predicted_phases: list[dict] | None = None,
) -> None:
    """Append the "Calculated" section: margin at the edge (max_ok; min_ok on a decreasing axis)
    and at every value that ran ok, the peak-against-context fit of each context axis, the
    estimate beside the measurement, and which other cards would hold the peaks.

    Args:
        doc: the document appended to.
        axes: the axis results (``stats.analyse_axis``); figures are numbered by their index.
        policy: the margin policy (applied to each card's reported total too).
        est_cols: the estimator's columns of the runs table that hold a value (``est_*``).
        plots: ``analysis.plots``, or a stand-in whose every figure is empty bytes (no plots).
        predicted, predicted_phases: dry runs of these loads and their phase rows, whose
            category split (``predicted_*_bytes``) is preferred for the split of the peak.
    """
    doc.h(1, "Calculated")
    doc.p("Everything here is computed from the observed counters, or from formulas: none of it is a measurement.")
    _margin_tables(doc, axes)
    for i, a in enumerate(axes):
        if a.axis == "context":
            _context_fit(doc, i, a, plots)
    _estimator(doc, axes, est_cols)
    split_section(doc, axes, predicted or [], predicted_phases or [], plots)
    _cards(doc, axes, policy, plots)


def _margin_tables(doc: Doc, axes: list[AxisResult]) -> None:
    """The margin at each edge, then at every value whose runs all ran ok."""
    doc.h(2, "Margin at max_ok (min_ok on a decreasing axis)")
    rows = [
        [
            a.title,
            a.edge_names[0],
            a.edge,
            f"`{a.used_counter}`",
            nbytes(a.capacity),
            gib(a.capacity),
            nbytes(a.used_at_edge),
            gib(a.used_at_edge),
            nbytes(a.margin_at_edge),
            gib(a.margin_at_edge),
            pct(a.margin_at_edge, a.capacity),
        ]
        for a in axes
    ]
    doc.table(
        MARGIN_HEADER,
        rows,
        note="margin = capacity - peak, at the largest value that ran (max_ok), or on a decreasing axis "
        "(world_size under FSDP: more ranks, less memory each) at the smallest (min_ok); see 'Assumed' for "
        "which counter.",
    )
    per_value = [
        [
            a.title,
            s.value,
            nbytes(s.used),
            nbytes(s.margin),
            gib(s.margin),
            pct(s.margin, a.capacity, down=True),  # (never rounded up to the margin it does not leave)
            "yes" if a.margin_bytes is not None and s.margin >= a.margin_bytes else "no",
        ]
        for a in axes
        for s in a.values
        if s.margin is not None
    ]
    if per_value:
        doc.p("Margin at every value whose runs all ran ok:")
        doc.table(["sweep", "value", "peak B", "margin B", "GiB", "% of capacity", "leaves the margin"], per_value)


def _context_fit(doc: Doc, i: int, a: AxisResult, plots) -> None:
    """The peak-against-context fit of context axis ``a`` (figure number ``i``): the curve, its
    limits in words and its plot."""
    fit = a.fit  # stats.analyse_axis: fit.fit_axis, the fit_context of a context axis
    doc.h(2, f"Fitted curve: peak vs context ({a.title})")
    if fit is None:
        doc.p("Fewer than two contexts ran ok: no curve fitted.")
        return
    c = fit["coeffs"]
    terms = (
        f"{c[0]:.6g}·context² + {c[1]:.6g}·context + {c[2]:.6g}"
        if fit["degree"] == 2
        else f"{c[0]:.6g}·context + {c[1]:.6g}"
    )
    doc.p(
        f"Least-squares {'quadratic' if fit['degree'] == 2 else 'affine (two points only)'} fit of the "
        f"peak `{a.used_counter}` (bytes) of the runs that ran ok: peak ≈ {terms}; largest relative "
        f"residual {fit['max_rel_residual'] * 100:.2f} %."
    )
    crossings = capacity_crossings(c, a.capacity, a.margin_bytes)
    lines = [f"fitted: {limit_words(a, k)}" for k in a.limits]
    cap_x = a.limits.get("capacity")
    if cap_x and isinstance(a.min_oom, int) and a.min_oom <= cap_x:
        lines.append(
            f"observed: context={a.min_oom} already ran out of memory, within the fit's limit of the capacity: "
            "the capacity holds more than the counter fitted (see 'Assumed'); trust the runs"
        )
    doc.ul(lines)
    png = plots.fit_plot(
        fit["xs"], fit["ys"], c, a.capacity, a.margin_bytes, "context", f"peak {a.used_counter}", crossings, a.limits
    )
    doc.image(
        Image(
            f"fit{i}_context.png",
            png,
            "Peak against context with the fitted curve (calculated) and where it crosses the capacity.",
        )
    )


def _estimator(doc: Doc, axes: list[AxisResult], est_cols: list[str]) -> None:
    """The estimate's components beside their observed counterparts at each edge (max_ok, or
    min_ok on a decreasing axis), and the estimate error of every run that ran ok."""
    doc.h(2, "Estimate beside the measurement")
    if not est_cols:
        doc.p(
            "No estimate available: runs.parquet has no `est_*` columns, or only empty ones (no estimate "
            "was made for these runs)."
        )
        return
    comps = [c for c in est_cols if c.endswith("_bytes") and c != "est_peak_bytes"]
    for a in axes:
        st = a.stat(a.edge)
        if st is None:
            continue
        r = next((r for r in st.runs if r.get("outcome") == "ok"), None)
        if r is None:
            continue
        _edge_estimate(doc, a, r, comps)
        _estimate_errors(doc, a)


def _observed_parts(r: dict) -> dict[str, tuple[str, int]]:
    """The observed split of run ``r``'s peak (``phases.decomposition``), keyed as ``PART_NAMES``:
    key -> (the part's name, bytes)."""
    observed = {}
    for name, value in decomposition(r.get("_phases") or [], r.get("max_memory_allocated"), r.get("mode")):
        for key, label in PART_NAMES.items():
            if name.startswith(label):
                observed[key] = (name, value)
    return observed


def _edge_estimate(doc: Doc, a: AxisResult, r: dict, comps: list[str]) -> None:
    """The estimate's components ``comps`` of the ok run ``r`` at the edge of ``a``, beside their
    observed counterparts, and the largest component."""
    est_peak = r.get("est_peak_bytes")
    observed = _observed_parts(r)
    doc.p(
        f"{a.title}, at {a.edge_names[0]} {axis_label(a.axis, a.edge)} (estimate: calculated before the run; "
        "of one rank for a DDP/FSDP run; observed: "
        "differences of the counters between phases, see 'Observed'):"
    )
    rows = []
    for c in comps:
        if r.get(c) is None:
            continue
        comp = c[len("est_") : -len("_bytes")]
        obs = observed.get(OBSERVED_COUNTERPART.get(comp, ""))
        rows.append(
            [comp, nbytes(r.get(c)), gib(r.get(c)), pct(r.get(c), est_peak), f"{obs[1]} B: {obs[0]}" if obs else None]
        )
    obs_peak = r.get("max_memory_allocated")
    peak_row = [
        "estimated peak",
        nbytes(est_peak),
        gib(est_peak),
        pct(est_peak, est_peak),
        f"{nbytes(obs_peak)} B: max_memory_allocated",
    ]
    doc.table(
        ["component (calculated)", "bytes", "GiB", "share of estimated peak", "observed counterpart"],
        rows + [peak_row],
    )
    dominant = max(((c, v) for c in comps if (v := r.get(c)) is not None), key=lambda t: t[1], default=None)
    if dominant:
        doc.p(
            f"Largest estimated component: **{dominant[0][len('est_') : -len('_bytes')]}** "
            f"({pct(dominant[1], est_peak)} of the estimated peak)."
        )


def _estimate_errors(doc: Doc, a: AxisResult) -> None:
    """The estimated and observed peak, and the estimate error, of every run of ``a`` that ran ok."""
    rows = []
    for s in a.values:
        for run in s.runs:
            if run.get("outcome") != "ok":
                continue
            est, obs = run.get("est_peak_bytes"), run.get("max_memory_allocated")
            err = run.get("estimate_error")
            if err is None and est is not None and obs:
                err = (est - obs) / obs
            rows.append(
                [
                    s.value,
                    nbytes(est),
                    gib(est),
                    nbytes(obs),
                    gib(obs),
                    f"{err * 100:+.1f} %" if err is not None else None,
                ]
            )
    doc.table(
        [a.axis, "estimated peak B", "GiB", "observed max_memory_allocated B", "GiB", "estimate error"],
        rows,
        note="estimate error = (estimated - observed) / observed, on runs that ran ok.",
    )


def _cards(doc: Doc, axes: list[AxisResult], policy: MarginPolicy, plots) -> None:
    """Which cards of analysis.cards would hold the largest measured peak plus the margin, and
    the measured value needing the most memory that would fit on each (the largest; the smallest on a
    decreasing axis)."""
    doc.h(2, "Other cards (calculated from this device's measurement)")
    doc.note(
        "info",
        "A calculation, not a measurement on those cards: the peak measured here is compared with "
        "each card's reported total memory (see 'Assumed'). Kernels, workspaces, the CUDA context and "
        "library versions differ between devices; measure on the card before relying on it.",
    )
    if any(a.kind == "cpu" for a in axes):
        doc.note(
            "warning",
            "These peaks come from CPU runs (tracked tensor bytes). A GPU adds the CUDA context, "
            "library workspaces and the caching allocator's rounding on top.",
        )
    for i, a in enumerate(axes):
        ok = [s for s in a.values if s.all_ok and s.used is not None]
        if not ok:
            continue
        _cards_image(doc, i, a, ok, policy, plots)
        _cards_table(doc, a, a.by_load(ok), policy)


def _peak(s: ValueStat) -> int:
    """The peak of a value that ran ok (``ValueStat.used``, bytes).

    Raises:
        ValueError: the value has no recorded peak (the cards take only values with one).
    """
    if s.used is None:
        raise ValueError(f"value {s.value} has no recorded peak")
    return s.used


def _card_margin(policy: MarginPolicy, card: cards_mod.Card) -> int:
    """The margin in bytes the policy keeps free on ``card`` (of its reported total).

    Raises:
        ValueError: the policy gives no bytes for that total (a policy has a fraction or bytes).
    """
    margin = policy.bytes_for(card.reported_bytes)
    if margin is None:
        raise ValueError(f"margin policy {policy.describe()} gives no bytes for {card.name}")
    return margin


def _cards_image(doc: Doc, i: int, a: AxisResult, ok: list[ValueStat], policy: MarginPolicy, plots) -> None:
    """The card catalog against the values ``ok`` of ``a`` that ran ok, as a picture (figure ``i``)."""
    grid = [
        [
            "fits"
            if cards_mod.holds(card, _peak(s), _card_margin(policy, card))
            else ("tight" if _peak(s) <= card.reported_bytes else "no")
            for s in ok
        ]
        for card in cards_mod.CARDS
    ]
    png = plots.cards_plot(
        [c.name for c in cards_mod.CARDS],
        [s.value for s in ok],
        grid,
        a.axis,
        f"which card would hold which {a.axis} (calculated from the peaks measured here, margin {policy.short()})",
    )
    doc.image(
        Image(
            f"cards{i}_{a.axis}.png",
            png,
            f"The card catalog as a picture: for each card (its reported total, 'Assumed') and each {a.axis} "
            "that ran ok here, whether the measured peak plus the margin fits (calculated, not measured on "
            "those cards).",
        )
    )


def _largest_fitting(a: AxisResult, loaded: list[ValueStat], card: cards_mod.Card, margin: int) -> str:
    """The measured value of ``a`` needing the most memory that ``card`` holds with ``margin`` bytes
    left, in words; ``loaded`` holds the values that ran ok, least memory first."""
    top = loaded[-1]
    fitting = [s for s in loaded if cards_mod.holds(card, _peak(s), margin)]
    best = fitting[-1] if fitting else None
    if best is None:
        return f"none of the measured values ({a.light_end} needs {gib(_peak(loaded[0]) + margin)} GiB with the margin)"
    if best is top:
        beyond = "smaller" if a.decreasing else "larger"
        return (
            f"{best.value} (every measured value that ran; {beyond} ones were not measured)"
            if top.value == a.edge
            else f"{best.value}"
        )
    return str(best.value)


def _cards_table(doc: Doc, a: AxisResult, loaded: list[ValueStat], policy: MarginPolicy) -> None:
    """Per card: whether the heaviest measured value of ``a`` fits with the margin, and the heaviest
    that does; ``loaded`` holds the values that ran ok, least memory first."""
    top = loaded[-1]
    rows = []
    for card in cards_mod.CARDS:
        m = _card_margin(policy, card)
        rows.append(
            [
                card.name,
                card.vendor_spec,
                nbytes(card.reported_bytes),
                gib(card.reported_bytes),
                nbytes(m),
                "yes" if _peak(top) + m <= card.reported_bytes else "no",
                _largest_fitting(a, loaded, card, m),
            ]
        )
    doc.p(
        f"{a.title}: would the peak `{a.used_counter}` measured at {axis_label(a.axis, top.value)} "
        f"({top.used} B, {gib(top.used)} GiB) plus the margin fit, and which {a.heavy_end} measured {a.axis} would"
        + (" (more ranks, less memory each)" if a.decreasing else "")
        + ":"
    )
    doc.table(
        [
            "card",
            "vendor's spec (GB as printed by the vendor)",
            "reported total B",
            "GiB",
            "margin B",
            f"holds {axis_label(a.axis, top.value)}",
            f"{a.heavy_end} measured {a.axis} that fits",
        ],
        rows,
    )
