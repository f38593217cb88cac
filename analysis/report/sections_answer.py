"""The answer, first: in words and numbers, beside the main plot (the top of the report).

Per swept axis: ``max_ok`` and ``min_oom`` (observed), the recommended value under the stated
margin (calculated under the assumed policy) and the headroom it leaves, in bytes and percent
of the capacity; the fitted peak (calculated, ``analysis.fit``) and where it reaches the
capacity and the capacity minus the margin; the measured throughput (``throughput.throughput_answer``).
"""

from __future__ import annotations

from memsweep.conf.contract import gib
from memsweep.estimator.margin import MarginPolicy, basis

from ..doc import Doc, Image
from ..frontier import direction_words
from .fit import capacity_crossings, evaluate
from .fitted import limit_words, unmeasured_limit_note
from .fmt import axis_label, nbytes, pct
from .stats import AxisResult
from .throughput import throughput_answer

CURVE_POINTS = 80
"""Points of the fitted curve drawn on a plot."""


def axis_fit(a: AxisResult) -> tuple[dict | None, dict[str, float | None]]:
    """The fitted peak of an axis's ok values (``AxisResult.fit``) and where its curve crosses the
    capacity levels, for drawing (the text prints ``AxisResult.limits``, floored to the lattice).

    Args:
        a: the axis result.

    Returns:
        (``fit_axis``'s dict or None, ``capacity_crossings``: the axis values, extrapolated,
        where the fit reaches the capacity and the capacity minus the margin; empty without a fit
        or a capacity).
    """
    fit = a.fit
    crossings = {} if fit is None else capacity_crossings(fit["coeffs"], a.capacity, a.margin_bytes)
    return fit, crossings


def _curve(fit: dict | None, crossings: dict) -> tuple[list[float], list[float]] | None:
    """The fitted curve drawn: ``CURVE_POINTS`` points from the smallest value fitted to the largest, or
    to a crossing of the capacity up to 4 times beyond it; spaced geometrically over a range of 4x or
    more. None without a fit or a range."""
    if fit is None:
        return None
    lo = min(fit["xs"])
    hi = max([max(fit["xs"])] + [x for x in crossings.values() if x and x < 4 * max(fit["xs"])])
    if hi <= lo:
        return None
    geometric = lo > 0 and hi / lo >= 4
    xs = [
        lo * (hi / lo) ** (i / (CURVE_POINTS - 1)) if geometric else lo + (hi - lo) * i / (CURVE_POINTS - 1)
        for i in range(CURVE_POINTS)
    ]
    return xs, [evaluate(fit["coeffs"], x) for x in xs]


def axis_image(a: AxisResult, plots, name: str, figsize: tuple[float, float] = (7.5, 4.6), other: bool = True) -> Image:
    """The main plot of an axis: its peaks (ok runs joined, failed runs as unjoined markers),
    the fitted curve and its crossings, capacity and capacity minus the margin, the frontier.

    Args:
        a: the axis result.
        plots: ``analysis.plots``, or a stand-in whose every figure is empty bytes.
        name: the image's file name.
        figsize: inches.
        other: also draw the other counter (on the CPU the resident set above its start, which
            would set the scale of the figure; the answer's plot leaves it out there).

    Returns:
        The figure, with its caption.
    """
    used_c, other_c = basis(a.kind)
    cpu = a.kind == "cpu"
    other = other or not cpu
    points = [
        {
            "value": s.value,
            "outcome": "ok" if s.all_ok else (s.status if len(s.outcomes) == 1 else "mixed"),
            "used": s.used,
            "other": None if not other else (s.other if not cpu else s.above_start),
        }
        for s in a.values
    ]
    fit, crossings = axis_fit(a)
    curve = _curve(fit, crossings)
    png = plots.axis_plot(
        a.axis,
        points,
        a.capacity,
        a.margin_bytes,
        f"peak {used_c}",
        "reserved above start (RSS)" if cpu else f"peak {other_c}",
        a.edge,
        a.miss,
        title=f"peak memory vs {a.axis}: {a.load_title}",
        curve=curve,
        crossings={k: v for k, v in crossings.items() if v and curve and v <= curve[0][-1]},
        figsize=figsize,
        edge_names=a.edge_names,
        limits=a.limits,
    )
    return Image(
        name,
        png,
        f"Peak `{used_c}` (compared with the capacity)"
        + ((" and the resident set above its start" if cpu else f" and peak `{other_c}`") if other else "")
        + f" against {a.axis} (observed; ok runs joined, a run that did not complete is a red cross with its "
        "partial peak), the fitted peak (calculated) and where it reaches the capacity and the capacity minus "
        "the margin (assumed).",
    )


def _size(n: int | None) -> str:
    return f"{nbytes(n)} B ({gib(n)} GiB)"


def answer_lines(a: AxisResult, policy: MarginPolicy) -> list[str]:
    """The answer for one axis, in words and numbers (inline markup).

    Args:
        a: the axis result.
        policy: the margin policy.

    Returns:
        A few sentences: the edge (observed), the recommended value and its headroom
        (calculated under the assumed margin; with the fit's larger unmeasured value under the
        margin beside it, ``fitted.unmeasured_limit_note``), the headroom at the edge (max_ok;
        min_ok on a decreasing axis) and the fit's limits (``AxisResult.limits``).
    """
    ax, counter = a.axis, f"`{a.used_counter}`"
    out = []
    if a.decreasing:  # world_size under FSDP: fits above, OOM below
        exact = "exact: neighbours among the values run" if a.frontier.get("exact") else "values between were not run"
        out.append(f"**{direction_words(a.frontier)}** (observed; {exact}).")
    elif a.max_ok is not None and a.min_oom is not None:
        exact = "exact: neighbours among the values run" if a.frontier.get("exact") else "values between were not run"
        out.append(
            f"**{axis_label(ax, a.max_ok)} fits; {axis_label(ax, a.min_oom)} runs out of memory** (observed; {exact})."
        )
    elif a.max_ok is not None and ax == "dtype":  # dtypes are ordered by bytes per element: no value "above"
        out.append(f"**Every dtype run fits (largest: {a.max_ok})** (observed).")
    elif a.max_ok is not None:
        out.append(f"**Every value run fits, up to {axis_label(ax, a.max_ok)}** (observed): the edge lies above.")
    elif a.min_oom is not None:
        out.append(f"**Nothing fits**: already {axis_label(ax, a.min_oom)} ran out of memory (observed).")
    elif a.frontier.get("not_reached"):  # every run failed in a phase that does not scale with the axis
        out.append(f"**No value of {ax} ran ok**: {a.frontier['not_reached']} (observed).")
    else:
        out.append(f"**No value of {ax} ran ok and none ran out of memory**: see the outcomes (observed).")
    cap = a.capacity
    st = a.stat(a.recommended)
    if a.recommended is not None and st is not None and st.used is not None and cap is not None:
        used = st.used
        out.append(
            f"Recommended: **{axis_label(ax, a.recommended)}** under the margin {policy.short()} "
            f"({nbytes(a.margin_bytes)} B kept free, assumed): peak {counter} {_size(used)}, headroom "
            f"**{_size(cap - used)}, {pct(cap - used, cap)}** of the capacity {_size(cap)}"
            + (f"; {note}." if (note := unmeasured_limit_note(a)) else ".")
        )
    else:
        note = unmeasured_limit_note(a)
        out.append(
            f"Recommended: none under the margin {policy.short()} ({a.reason})" + (f"; {note}." if note else ".")
        )
    if a.margin_at_edge is not None and a.edge != a.recommended:
        out.append(
            f"At {a.edge_names[0]} ({axis_label(ax, a.edge)}): peak {_size(a.used_at_edge)}, headroom "
            f"{_size(a.margin_at_edge)}, {pct(a.margin_at_edge, cap)} of the capacity."
        )
    if a.limits:
        out.append("Fitted peak (calculated, not measured): " + "; ".join(limit_words(a, k) for k in a.limits) + ".")
    out += throughput_answer(a)
    if a.kind == "cpu":
        out.append("CPU runs: tracked tensor bytes, not a GPU measurement.")
    return out


def main_axis(axes: list[AxisResult]) -> AxisResult | None:
    """The axis the answer's plot shows: the first with both sides of the edge, else one
    with an ok value, else the first."""
    for test in (
        lambda a: a.edge is not None and a.miss is not None,
        lambda a: a.edge is not None,
        lambda a: True,
    ):
        found = next((a for a in axes if test(a)), None)
        if found is not None:
            return found
    return None


def answer_section(doc: Doc, axes: list[AxisResult], policy: MarginPolicy, plots) -> None:
    """Append the answer block: each axis's answer in words and numbers beside the main plot.

    Args:
        doc: the document appended to.
        axes: the axis results.
        policy: the margin policy.
        plots: ``analysis.plots``, or a stand-in whose every figure is empty bytes.
    """
    main = main_axis(axes)
    if main is None:
        doc.answer(["No variable was swept over two or more values: no edge to state."], None)
        return
    if len(axes) == 1:
        items = answer_lines(main, policy)
    else:
        items = [
            f"{a.title}: " + " ".join(answer_lines(a, policy)) for a in [main] + [a for a in axes if a is not main]
        ]
    doc.answer(items, axis_image(main, plots, f"answer_{main.axis}.png", figsize=(6.4, 4.4), other=False))
