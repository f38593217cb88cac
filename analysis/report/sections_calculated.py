"""The calculated section: margins, the context fit, the estimate beside the measurement, other cards.

Everything here is computed from the observed counters or from formulas; sizes in bytes beside GiB.
"""

from __future__ import annotations

from memsweep.conf.contract import gib
from memsweep.estimate import cards as cards_mod

from ..doc import Doc, Image
from .fit import capacity_crossings
from .fitted import limit_words
from .fmt import axis_label, nbytes, pct
from .margin import MarginPolicy
from .phases import OBSERVED_COUNTERPART, PART_NAMES, decomposition
from .split import split_section
from .stats import AxisResult


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
    and at every value that ran ok, the
    peak-against-context fit of each context axis, the estimate beside the measurement, and
    which other cards would hold the peaks.

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
    doc.h(2, "Margin at max_ok (min_ok on a decreasing axis)")
    rows = []
    for a in axes:
        rows.append(
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
        )
    doc.table(
        [
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
        ],
        rows,
        note="margin = capacity - peak, at the largest value that ran (max_ok), or on a decreasing axis "
        "(world_size under FSDP: more ranks, less memory each) at the smallest (min_ok); see 'Assumed' for "
        "which counter.",
    )
    per_value = []
    for a in axes:
        for s in a.values:
            if s.margin is not None:
                per_value.append(
                    [
                        a.title,
                        s.value,
                        nbytes(s.used),
                        nbytes(s.margin),
                        gib(s.margin),
                        pct(s.margin, a.capacity),
                        "yes" if a.margin_bytes is not None and s.margin >= a.margin_bytes else "no",
                    ]
                )
    if per_value:
        doc.p("Margin at every value whose runs all ran ok:")
        doc.table(["sweep", "value", "peak B", "margin B", "GiB", "% of capacity", "leaves the margin"], per_value)
    for i, a in enumerate(axes):
        if a.axis != "context":
            continue
        fit = a.fit  # stats.analyse_axis: fit.fit_axis, the fit_context of a context axis
        doc.h(2, f"Fitted curve: peak vs context ({a.title})")
        if fit is None:
            doc.p("Fewer than two contexts ran ok: no curve fitted.")
            continue
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
        doc.image(
            Image(
                f"fit{i}_context.png",
                plots.fit_plot(
                    fit["xs"],
                    fit["ys"],
                    c,
                    a.capacity,
                    a.margin_bytes,
                    "context",
                    f"peak {a.used_counter}",
                    crossings,
                    a.limits,
                ),
                "Peak against context with the fitted curve (calculated) and where it crosses the capacity.",
            )
        )
    _estimator(doc, axes, est_cols)
    split_section(doc, axes, predicted or [], predicted_phases or [], plots)
    _cards(doc, axes, policy, plots)


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
        est_peak = r.get("est_peak_bytes")
        observed = {}
        for name, value in decomposition(r.get("_phases") or [], r.get("max_memory_allocated"), r.get("mode")):
            for key, label in PART_NAMES.items():
                if name.startswith(label):
                    observed[key] = (name, value)
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
                [
                    comp,
                    nbytes(r.get(c)),
                    gib(r.get(c)),
                    pct(r.get(c), est_peak),
                    f"{obs[1]} B: {obs[0]}" if obs else None,
                ]
            )
        obs_peak = r.get("max_memory_allocated")
        doc.table(
            ["component (calculated)", "bytes", "GiB", "share of estimated peak", "observed counterpart"],
            rows
            + [
                [
                    "estimated peak",
                    nbytes(est_peak),
                    gib(est_peak),
                    pct(est_peak, est_peak),
                    f"{nbytes(obs_peak)} B: max_memory_allocated",
                ]
            ],
        )
        dominant = max(((c, r.get(c)) for c in comps if r.get(c) is not None), key=lambda t: t[1], default=None)
        if dominant:
            doc.p(
                f"Largest estimated component: **{dominant[0][len('est_') : -len('_bytes')]}** "
                f"({pct(dominant[1], est_peak)} of the estimated peak)."
            )
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
        loaded = a.by_load(ok)  # least memory first
        top = loaded[-1]
        grid = [
            [
                "fits"
                if cards_mod.holds(card, s.used, policy.bytes_for(card.reported_bytes))
                else ("tight" if s.used <= card.reported_bytes else "no")
                for s in ok
            ]
            for card in cards_mod.CARDS
        ]
        doc.image(
            Image(
                f"cards{i}_{a.axis}.png",
                plots.cards_plot(
                    [c.name for c in cards_mod.CARDS],
                    [s.value for s in ok],
                    grid,
                    a.axis,
                    f"which card would hold which {a.axis} (calculated from the peaks measured here, margin "
                    f"{policy.short()})",
                ),
                f"The card catalog as a picture: for each card (its reported total, 'Assumed') and each {a.axis} "
                "that ran ok here, whether the measured peak plus the margin fits (calculated, not measured on "
                "those cards).",
            )
        )
        rows = []
        for card in cards_mod.CARDS:
            m = policy.bytes_for(card.reported_bytes)
            fitting = [s for s in loaded if cards_mod.holds(card, s.used, m)]
            best = fitting[-1] if fitting else None
            if best is None:
                largest = (
                    f"none of the measured values ({a.light_end} needs {gib(loaded[0].used + m)} GiB with the margin)"
                )
            elif best is top:
                beyond = "smaller" if a.decreasing else "larger"
                largest = (
                    f"{best.value} (every measured value that ran; {beyond} ones were not measured)"
                    if top.value == a.edge
                    else f"{best.value}"
                )
            else:
                largest = str(best.value)
            rows.append(
                [
                    card.name,
                    card.vendor_spec,
                    nbytes(card.reported_bytes),
                    gib(card.reported_bytes),
                    nbytes(m),
                    "yes" if top.used + m <= card.reported_bytes else "no",
                    largest,
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
