"""The report's figures, drawn with matplotlib (Agg backend, no display) and returned as PNG bytes.

Every figure plots bytes converted once, to GiB (2^30 B) or, when everything plotted is below
1 GiB, MiB (2^20 B), one unit per figure, named on its axis; the caller passes raw integer bytes. No torch import.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import matplotlib
import numpy as np

matplotlib.use("Agg")  # before pyplot: no display, same output everywhere
import matplotlib.pyplot as plt  # noqa: E402

from memsweep.conf.contract import PEAK_CATEGORY_WORDS  # noqa: E402

from .png import figure_png  # noqa: E402
from .throughput import RATE_WORDS  # noqa: E402

GiB = 2**30
MiB = 2**20
_DPI = 100
_TITLE_Y = 1.0
"""Where an axes' title sits (axes fraction): just above the axes, the x tick labels being below it;
given, matplotlib does not measure the tick labels to place it (``Axes.set_title``'s ``y``)."""


def _unit(*byte_values) -> tuple[int, str]:
    """GiB (2^30 B) when the largest value plotted reaches 1 GiB, else MiB (2^20 B): one unit
    per figure, written on its axis."""
    vals = [abs(v) for v in byte_values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return (GiB, "GiB (2^30 bytes)") if vals and max(vals) >= GiB else (MiB, "MiB (2^20 bytes)")


def pyplot():
    """matplotlib's pyplot, on the Agg backend (for other modules that draw figures)."""
    return plt


def png_bytes(fig) -> bytes:
    """A figure as PNG bytes (the figure is closed)."""
    return _png(fig)


_TEXT_RC: dict[Any, Any] = {"text.hinting": "no_hinting"}
"""How texts are laid out and drawn (measured and drawn alike): FreeType's glyph outlines unhinted,
instead of run through the font's hinting program for every glyph drawn (a sixth of drawing a
report's figures), the letters' shapes the same, their edges a little softer."""


def _png(fig) -> bytes:
    """The figure as PNG bytes at ``_DPI``, its x tick labels thinned (``thin_xticklabels``),
    cropped to what it draws (``analysis.png.figure_png``: drawn once, not measured first), its
    texts as ``_TEXT_RC`` says; the figure is closed."""
    fig.set_dpi(_DPI)
    try:
        with matplotlib.rc_context(_TEXT_RC):
            for ax in fig.axes:
                thin_xticklabels(ax)
            return figure_png(fig, _DPI)
    finally:
        plt.close(fig)


_LABEL_GAP_PX = 4
"""The least space between two x tick labels, in pixels at the figure's dpi."""


def thin_xticklabels(ax, first: Sequence = ()) -> None:
    """Hide the x tick labels that would overlap another: the labels whose text is in ``first``
    are kept first, then the two ends, then the others from left to right, each only where it
    clears every label kept (by ``_LABEL_GAP_PX``); the tick marks stay. Measured with the
    figure's renderer at its current layout, without drawing the figure (``Axis.get_ticklabels``
    places the labels); rotated labels are left as they are.

    Args:
        ax: the axes (its layout set: limits, scale, ticks and the figure's margins).
        first: values whose labels matter most (e.g. the frontier's two edges).
    """
    from matplotlib.transforms import Bbox

    # rotated labels (the split plot's phase names) are set apart by their angle, their boxes not
    labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text() and not t.get_rotation()]
    if len(labels) < 2:
        return
    renderer = ax.figure.canvas.get_renderer()
    wanted = {str(v) for v in first}
    order = sorted(
        range(len(labels)),
        key=lambda i: (labels[i].get_text() not in wanted, i not in (0, len(labels) - 1), i),
    )
    kept: list = []
    for i in order:
        b = labels[i].get_window_extent(renderer)
        box = Bbox.from_extents(b.x0 - _LABEL_GAP_PX / 2, b.y0, b.x1 + _LABEL_GAP_PX / 2, b.y1)
        if any(box.overlaps(k) for k in kept):
            labels[i].set_visible(False)
        else:
            kept.append(box)


def _positions(values: Sequence) -> tuple[list[float], bool]:
    """x positions for the swept values: the values themselves when all are positive numbers
    (a log2 axis when they span a factor of 4 or more, as a doubling sweep does), else 0..n-1
    (categorical, e.g. dtype).

    Returns:
        (positions, whether the values are numeric).
    """
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values)
    return ([float(v) for v in values] if numeric else list(range(len(values)))), numeric


def doubling(values: Sequence) -> bool:
    """True when ``values`` are positive numbers spanning a factor of 4 or more: plotted on a log2 axis."""
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0]
    return len(nums) == len(values) and len(nums) >= 2 and max(nums) >= 4 * min(nums)


def _scaled(values: Sequence[int | None], unit: int) -> list[float]:
    return [math.nan if v is None else v / unit for v in values]


def _legend_below(ax, ncol: int = 2) -> None:
    """The legend under the axes, outside the data (saved with ``bbox_inches='tight'``)."""
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=ncol, frameon=False)


_CURVE_STYLE: dict[str, Any] = {"color": "#9467bd", "linewidth": 1, "alpha": 0.8}
"""How the fitted peak is drawn."""


def _draw_points(ax, xs: list, points: list[dict], unit: int, used_label: str, other_label: str) -> None:
    """The peaks of ``points`` (``axis_plot``'s) in ``unit`` bytes: the ok runs joined (both counters),
    the others as red crosses."""
    used, other = _scaled([p["used"] for p in points], unit), _scaled([p["other"] for p in points], unit)
    ok = [p["outcome"] == "ok" for p in points]
    ok_x = [x for x, k in zip(xs, ok) if k]
    ax.plot(ok_x, [u for u, k in zip(used, ok) if k], "o-", color="#1f77b4", label=f"{used_label}, ok runs")
    if any(not math.isnan(o) for o in other):
        ax.plot(
            ok_x,
            [o for o, k in zip(other, ok) if k],
            "s--",
            color="#2ca02c",
            fillstyle="none",
            label=f"{other_label}, ok",
        )
    bad = [(x, u) for x, u, k in zip(xs, used, ok) if not k]
    if bad:
        ax.plot(
            [x for x, _ in bad],
            [u for _, u in bad],
            "x",
            color="#d62728",
            markersize=9,
            markeredgewidth=2,
            linestyle="none",
            label="did not complete (partial peak)",
        )


def _draw_levels(
    ax,
    axis: str,
    capacity: int | None,
    margin: int | None,
    unit: int,
    short: str,
    crossings: dict[str, float | None] | None,
    limits: dict[str, int | None] | None,
) -> None:
    """The capacity and capacity - margin lines (bytes, drawn in ``unit``, named ``short``), and where
    the fitted curve crosses each, labelled with the largest value of ``axis`` within it."""
    if capacity:
        ax.axhline(capacity / unit, color="#d62728", linewidth=1.5, label=f"capacity {capacity / unit:.3f} {short}")
        if margin and margin < capacity:  # a margin not below the capacity leaves no level to draw
            ax.axhline(
                (capacity - margin) / unit,
                color="#ff7f0e",
                linestyle=":",
                linewidth=1.5,
                label=f"capacity - margin {(capacity - margin) / unit:.3f} {short}",
            )
    levels = {"capacity": capacity, "capacity - margin": (capacity - margin) if capacity and margin else None}
    for name, x in (crossings or {}).items():
        level = levels.get(name)
        if x and level:
            ax.plot([x], [level / unit], "D", color="#9467bd", markersize=6, linestyle="none")
            limit = (limits or {}).get(name)
            if limit is None:
                continue
            ax.annotate(
                f"fit: largest {axis} within: {limit}",
                (x, level / unit),
                textcoords="offset points",
                xytext=(-6, 6 if name == "capacity" else -12),
                ha="right",
                fontsize=7,
                color="#9467bd",
            )


def _draw_frontier(ax, values: list, xs: list, max_ok, min_oom, edge_names: tuple[str, str]) -> None:
    """The frontier as vertical bands at ``max_ok`` and ``min_oom`` (named ``edge_names``), where run."""
    pos = dict(zip(values, xs))
    if max_ok is not None and max_ok in pos:
        ax.axvline(pos[max_ok], color="#2ca02c", alpha=0.35, linewidth=6, label=f"{edge_names[0]} = {max_ok}")
    if min_oom is not None and min_oom in pos:
        ax.axvline(pos[min_oom], color="#d62728", alpha=0.25, linewidth=6, label=f"{edge_names[1]} = {min_oom}")


def _label_axes(ax, axis: str, values: list, xs: list, numeric: bool, unit_name: str, title: str) -> None:
    """Ticks at the values run (a log2 axis for a doubling sweep), labels, title and grid."""
    if numeric and doubling(values):
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(v) for v in values])
    ax.minorticks_off()
    ax.set_xlabel(axis + (" (log2 axis)" if numeric and doubling(values) else ""))
    ax.set_ylabel(unit_name)
    ax.set_ylim(bottom=0)
    ax.set_title(title or f"peak memory vs {axis}", fontsize=10, y=_TITLE_Y)
    ax.grid(True, alpha=0.3)


def axis_plot(
    axis: str,
    points: list[dict],
    capacity: int | None,
    margin: int | None,
    used_label: str,
    other_label: str,
    max_ok=None,
    min_oom=None,
    title: str = "",
    curve: tuple[Sequence[float], Sequence[float]] | None = None,
    crossings: dict[str, float | None] | None = None,
    figsize: tuple[float, float] = (7.5, 4.6),
    edge_names: tuple[str, str] = ("max_ok", "min_oom"),
    limits: dict[str, int | None] | None = None,
) -> bytes:
    """Peak memory against the swept variable.

    Runs that ran ok are joined by a line; a run that did not complete (oom, error...) is a
    red cross, never joined to them (its peak is partial, before the failure). A doubling
    sweep is drawn on a log2 axis. The legend sits below the axes, never over the data.

    Args:
        axis: the swept variable's name (the x label).
        points: one dict per swept value, in order: ``value``, ``outcome`` (ok | oom | mixed
            | error ...), ``used`` (the peak compared with the capacity, bytes) and ``other``
            (the other counter's peak, bytes); None where missing.
        capacity, margin: bytes; the capacity line, and the line ``capacity - margin``.
        used_label, other_label: the legend's names of the two counters.
        max_ok, min_oom: the frontier, marked with vertical bands: the value that fits at the edge
            and the one that ran out of memory (``min_ok`` and ``max_oom`` on a decreasing axis).
        title: the figure's title (a default names the axis).
        curve: the fitted peak (calculated): x values of the axis and the fit's bytes there.
        crossings: where the fit reaches each level, ``{"capacity": x, "capacity - margin": x}``
            (None: never); marked on the curve.
        figsize: inches.
        edge_names: the frontier's names of those two values (``analysis.frontier.edge_columns``).
        limits: the largest value of the axis within each level (``AxisResult.limits``, the fitted
            crossing floored to the lattice), the label of its mark; None: no label.

    Returns:
        The figure as PNG bytes.
    """
    values = [p["value"] for p in points]
    xs, numeric = _positions(values)
    fig, ax = plt.subplots(figsize=figsize)
    unit, unit_name = _unit(capacity, *[p["used"] for p in points], *[p["other"] for p in points])
    _draw_points(ax, xs, points, unit, used_label, other_label)
    if curve is not None and len(curve[0]):
        ax.plot(list(curve[0]), [y / unit for y in curve[1]], "-", **_CURVE_STYLE, label="fitted peak (calculated)")
    _draw_levels(ax, axis, capacity, margin, unit, unit_name.split()[0], crossings, limits)
    _draw_frontier(ax, values, xs, max_ok, min_oom, edge_names)
    _label_axes(ax, axis, values, xs, numeric, unit_name, title)
    _legend_below(ax)
    thin_xticklabels(ax, first=[v for v in (max_ok, min_oom) if v is not None])
    return _png(fig)


class _Bars(NamedTuple):
    """What ``_stacked_bars`` drew: the top of each stack and one legend handle per layer."""

    tops: list[float]
    handles: list[Any]


def _stacked_bars(ax, xs: Sequence[float], layers: Sequence[Sequence[float]], width: float, colors, labels, **style):
    """Stacked bars, one ``PolyCollection`` per layer (one artist drawn at once, where ``Axes.bar``
    adds one patch per bar): layer j's bar at ``xs[i]`` is ``layers[j][i]`` tall (axis units),
    ``width`` wide, on top of the layers before it; zero-height bars are kept as ``Axes.bar`` keeps
    them. The y axis's autoscale stops at 0, as it does for bars.

    Args:
        ax: the axes.
        xs: the bars' centres.
        layers: the heights, one sequence per layer (bottom first), one height per x.
        width: the bars' width (axis units).
        colors, labels: one face colour and one legend label per layer.
        style: further ``PolyCollection`` properties (``edgecolors``, ``linewidths``).

    Returns:
        The stacks' tops and the collections (legend handles), in layer order.
    """
    from matplotlib.collections import PolyCollection

    x = np.asarray(xs, dtype=float)
    left, right = x - width / 2, x + width / 2
    bottom = np.zeros(len(x))
    handles = []
    for heights, color, label in zip(layers, colors, labels):
        top = bottom + np.asarray(heights, dtype=float)
        corners = [(left, bottom), (left, top), (right, top), (right, bottom)]
        verts = np.stack([np.column_stack(c) for c in corners], axis=1)  # (bars, 4 corners, xy)
        bars = PolyCollection(list(verts), facecolors=[color], label=label, **({"edgecolors": "none"} | style))
        bars.sticky_edges.y.append(0)
        ax.add_collection(bars)
        handles.append(bars)
        bottom = top
    return _Bars(bottom.tolist(), handles)


def phases_plot(
    axis: str,
    values: Sequence,
    phases: Sequence[str],
    increments: list[list[int | None]],
    outcomes: Sequence[str],
    capacity: int | None,
    counter: str,
) -> bytes:
    """Stacked bars, one per swept value: how much each phase raised the run's peak.

    ``increments[i][j]`` (bytes): for value i, the rise of the running maximum of ``counter``
    during phase j (0 when that phase did not raise it, None when it did not run). The bar's
    height is the run's peak; a phase's segment is the memory it added on top of everything
    before it.

    Returns:
        The figure as PNG bytes.
    """
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    totals = [sum(i for i in inc if i is not None) for inc in increments]
    unit, unit_name = _unit(capacity, *totals)
    xs = list(range(len(values)))
    cmap = plt.get_cmap("tab20" if len(phases) > 10 else "tab10")
    layers = [[0.0 if (v := inc[j]) is None else v / unit for inc in increments] for j in range(len(phases))]
    colors = [cmap(j % cmap.N) for j in range(len(phases))]
    bars = _stacked_bars(ax, xs, layers, 0.8, colors, list(phases), edgecolors="white", linewidths=0.5)
    for x, top, outcome in zip(xs, bars.tops, outcomes):
        if outcome != "ok":
            ax.annotate(outcome, (x, top), ha="center", va="bottom", fontsize=8, color="#d62728")
    if capacity:
        ax.axhline(capacity / unit, color="#d62728", linewidth=1.2, label="capacity")
    ax.set_xticks(xs)
    ax.set_xticklabels([str(v) for v in values])
    ax.set_xlabel(axis)
    ax.set_ylabel(f"{counter}, {unit_name}")
    ax.set_title(f"rise of the peak {counter} by phase", fontsize=10, y=_TITLE_Y)
    ax.grid(True, axis="y", alpha=0.3)
    # the lines first, then the phases (as Axes.bar's containers came after the lines)
    legend = [*ax.get_lines(), *bars.handles]
    ax.legend(handles=legend, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _png(fig)


def fit_plot(
    xs: Sequence[float],
    ys: Sequence[int],
    coeffs: Sequence[float],
    capacity: int | None,
    margin: int | None,
    x_label: str,
    y_label: str,
    crossings: dict,
    limits: dict[str, int | None] | None = None,
) -> bytes:
    """Measured peaks (bytes) of successful runs against context with the fitted polynomial
    ``coeffs`` (numpy.polyfit order, bytes), extended to the predicted crossings (float axis values,
    where the dashed lines are drawn), each labelled with ``limits[name]``, the largest value of the
    axis within that level (``AxisResult.limits``: the crossing floored to the lattice).

    Returns:
        The figure as PNG bytes.
    """
    top = max([max(xs)] + [c for c in crossings.values() if c])
    grid = np.linspace(0, top * 1.05, 200)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    unit, unit_name = _unit(capacity, *ys)
    ax.plot(xs, [y / unit for y in ys], "o", color="#1f77b4", label="measured (ok runs)")
    ax.plot(grid, np.polyval(coeffs, grid) / unit, "-", color="#9467bd", label="fitted (calculated)")
    if capacity:
        ax.axhline(capacity / unit, color="#d62728", linewidth=1.2, label="capacity")
        if margin and margin < capacity:  # a margin not below the capacity leaves no level to draw
            ax.axhline((capacity - margin) / unit, color="#ff7f0e", linestyle=":", label="capacity - margin")
    for name, x in crossings.items():
        if x:
            ax.axvline(x, color="#7f7f7f", linestyle="--", linewidth=0.8)
            limit = (limits or {}).get(name)
            if limit is not None:
                ax.annotate(f"{name}: largest {limit}", (x, 0), rotation=90, fontsize=7, va="bottom", ha="right")
    ax.set_xlabel(x_label)
    ax.set_ylabel(f"{y_label}, {unit_name}")
    ax.set_title(f"{y_label} vs {x_label}: quadratic fit", fontsize=10, y=_TITLE_Y)
    ax.grid(True, alpha=0.3)
    _legend_below(ax)
    return _png(fig)


SPLIT_COLORS = {
    PEAK_CATEGORY_WORDS[category]: color
    for category, color in (
        ("parameter", "#1f77b4"),
        ("gradient", "#ff7f0e"),
        ("optimizer_state", "#2ca02c"),
        ("activation", "#9467bd"),
    )
}
"""The split plot's colour of each part, by the part's name (``conf.contract.PEAK_CATEGORY_WORDS``)."""


def split_colors(names: Sequence[str]) -> list[str]:
    """One colour per part, never two alike: ``SPLIT_COLORS``' where it names the part, else the
    next colour of matplotlib's tab10 not taken yet.

    Args:
        names: the parts, in stacking order.

    Returns:
        The colours (hex), in that order.
    """
    tab10 = [matplotlib.colors.to_hex(f"C{i}") for i in range(10)]  # matplotlib's default cycle
    spare = [c for c in tab10 if c not in SPLIT_COLORS.values()]
    taken: list[str] = []
    for name in names:
        color = SPLIT_COLORS.get(name)
        taken.append(color if color and color not in taken else (spare.pop(0) if spare else "#7f7f7f"))
    return taken


def split_plot(
    phases: Sequence[str],
    parts: dict[str, Sequence[int | None]],
    observed: Sequence[int | None],
    capacity: int | None,
    margin: int | None,
    title: str,
    observed_label: str = "observed peak (measured)",
) -> bytes:
    """Per phase, the calculated peak split into stacked parts, against the capacity.

    Args:
        phases: the phase names (x axis), in protocol order.
        parts: part name (``parameters``, ``gradients``, ``optimizer states``, ``activations``)
            -> bytes per phase (None: not known); stacked in the order given.
        observed: the measured peak of each phase (bytes, None where not measured), drawn as
            markers beside the calculated bars, never stacked with them.
        capacity, margin: bytes; the capacity line and the line ``capacity - margin``.
        title: the figure's title (it says what was calculated, and from what).
        observed_label: the legend's name of the observed markers.

    Returns:
        The figure as PNG bytes.
    """
    totals = [sum(v[i] or 0 for v in parts.values()) for i in range(len(phases))]
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    unit, unit_name = _unit(capacity, *totals, *observed)
    xs = list(range(len(phases)))
    drawn = [
        (name, [0.0 if v is None else v / unit for v in vals], color)
        for (name, vals), color in zip(parts.items(), split_colors(list(parts)))
    ]
    drawn = [(name, heights, color) for name, heights, color in drawn if any(heights)]
    names, heights, colors = zip(*drawn) if drawn else ((), (), ())
    bars = _stacked_bars(ax, xs, list(heights), 0.6, list(colors), [f"{n} (calculated)" for n in names])
    _observed_markers(ax, [x + 0.38 for x in xs], observed, unit, observed_label)
    if capacity:
        ax.axhline(capacity / unit, color="#d62728", linewidth=1.5, label="capacity")
        if margin and margin < capacity:  # a margin not below the capacity leaves no level to draw
            ax.axhline((capacity - margin) / unit, color="#ff7f0e", linestyle=":", label="capacity - margin")
    ax.set_xticks(xs)
    ax.set_xticklabels(list(phases), rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(unit_name)
    ax.set_title(title, fontsize=9, y=_TITLE_Y)
    ax.grid(True, axis="y", alpha=0.3)
    legend = [*ax.get_lines(), *bars.handles]  # the lines first, as with Axes.bar's containers
    ax.legend(handles=legend, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)
    return _png(fig)


def _observed_markers(ax: Any, xs: Sequence[float], observed: Sequence[int | None], unit: float, label: str) -> None:
    """Black diamonds at the measured peaks (``observed``, bytes; None: none drawn) beside the bars."""
    if any(v is not None for v in observed):
        ax.plot(
            [x for x, v in zip(xs, observed) if v is not None],
            [v / unit for v in observed if v is not None],
            "D",
            color="black",
            markersize=5,
            linestyle="none",
            label=label,
        )


CARD_STATUS = {
    "fits": ("#2ca02c", "holds it with the margin"),
    "tight": ("#ffbf00", "holds the peak, not the margin"),
    "no": ("#d62728", "does not hold the peak"),
}
"""Cell status of ``cards_plot`` -> (colour, legend text)."""


def cards_plot(cards: Sequence[str], values: Sequence, status: list[list[str]], axis: str, title: str) -> bytes:
    """Which card would hold which measured value: a grid, one row per card, one column per value.

    Args:
        cards: the card names (rows, smallest first).
        values: the measured values of the axis that ran ok (columns).
        status: ``status[i][j]`` is a key of ``CARD_STATUS`` for card i and value j.
        axis: the swept variable's name.
        title: the figure's title (it says the grid is calculated).

    Returns:
        The figure as PNG bytes.
    """
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    keys = list(CARD_STATUS)
    grid = np.array([[keys.index(s) for s in row] for row in status], dtype=float)
    fig, ax = plt.subplots(figsize=(min(2.5 + 0.55 * len(values), 11), 0.9 + 0.32 * len(cards)))
    ax.imshow(grid, cmap=ListedColormap([CARD_STATUS[k][0] for k in keys]), vmin=0, vmax=len(keys) - 1, aspect="auto")
    ax.set_xticks(range(len(values)))
    ax.set_xticklabels([str(v) for v in values], fontsize=7)
    ax.set_yticks(range(len(cards)))
    ax.set_yticklabels(list(cards), fontsize=7)
    ax.set_xlabel(axis)
    # white lines between the cells: two line collections (minor ticks' grid lines: a Tick, its lines and labels, each)
    cell: dict[str, Any] = {"color": "white", "linewidth": 1.5, "zorder": 1.5}
    ax.vlines(np.arange(0.5, len(values) - 1), -0.5, len(cards) - 0.5, **cell)
    ax.hlines(np.arange(0.5, len(cards) - 1), -0.5, len(values) - 0.5, **cell)
    ax.set_title(title, fontsize=9, y=_TITLE_Y)
    ax.legend(
        handles=[Patch(color=CARD_STATUS[k][0], label=CARD_STATUS[k][1]) for k in keys],
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        frameon=False,
    )
    return _png(fig)


def throughput_plot(
    axis: str,
    values: Sequence,
    used: Sequence[int | None],
    samples_per_s: Sequence[float | None],
    capacity: int | None,
    margin: int | None,
    recommended=None,
    fastest=None,
    title: str = "",
    rate_unit: str = "samples/s",
) -> bytes:
    """Peak memory and throughput against the swept variable, side by side (one x axis each).

    Args:
        axis: the swept variable's name (the x label).
        values: the swept values, in order.
        used: the peak compared with the capacity at each value (bytes; None where no run was ok).
        samples_per_s: the measured rate at each value, in ``rate_unit`` (None where not timed).
        capacity, margin: bytes; the capacity line and the line ``capacity - margin`` (None: none).
        recommended: the value inside the margin, marked on both panels (None: none).
        fastest: the fastest value, marked on both panels (None: none).
        title: the figure's title.
        rate_unit: the rate's unit, ``samples/s`` or ``tokens/s`` (along context).

    Returns:
        The figure as PNG bytes.
    """
    xs, numeric = _positions(values)
    fig, (mem, rate) = plt.subplots(1, 2, figsize=(9.0, 3.8))
    unit, unit_name = _unit(capacity, *used)
    mem.plot(xs, _scaled(list(used), unit), "o-", color="#1f77b4", label="peak (observed)")
    if capacity:
        mem.axhline(capacity / unit, color="#d62728", linewidth=1.2, label="capacity")
        if margin is not None:
            mem.axhline(
                (capacity - margin) / unit, color="#ff7f0e", linestyle="--", linewidth=1, label="capacity - margin"
            )
    rate.plot(
        xs,
        [math.nan if r is None else r for r in samples_per_s],
        "s-",
        color="#2ca02c",
        label=f"{rate_unit} (measured)",
    )
    pos = dict(zip(values, xs))
    for ax in (mem, rate):
        if recommended in pos:
            ax.axvline(pos[recommended], color="#2ca02c", alpha=0.3, linewidth=5, label=f"recommended = {recommended}")
        if fastest in pos and fastest != recommended:
            ax.axvline(pos[fastest], color="#9467bd", alpha=0.3, linewidth=5, label=f"fastest = {fastest}")
    _label_axes(mem, axis, list(values), xs, numeric, unit_name, "peak memory")
    per = RATE_WORDS.get(rate_unit, rate_unit)
    _label_axes(rate, axis, list(values), xs, numeric, per, "throughput")
    for ax in (mem, rate):
        _legend_below(ax, ncol=2)
    fig.subplots_adjust(wspace=0.32)  # room for the right panel's y label
    fig.suptitle(title, fontsize=10)
    return _png(fig)
