"""The comparison's figure: each of the four counters against the axis, one line per sweep.

matplotlib (Agg), PNG bytes; bytes converted once, to MiB or GiB, named on the axis.
"""

from __future__ import annotations

from ..plots import GiB, MiB, doubling, png_bytes, pyplot
from .match import COUNTERS, Series

_STYLES = ("o-", "s--", "^-.", "D:", "v-", "P--")


_NAME_CHARS = 40
"""The most characters of a sweep directory's name in the legend (the page lists the whole paths)."""


def _short(name: str) -> str:
    """``name``, its middle replaced by an ellipsis when longer than ``_NAME_CHARS``: a long name
    would widen the legend and so shrink the whole figure."""
    if len(name) <= _NAME_CHARS:
        return name
    half = (_NAME_CHARS - 1) // 2
    return name[:half] + "…" + name[-half:]


def _value(sweep, run: dict, counter: str) -> int | None:
    """A run's value of ``counter``: its peak for ``max_*``; for a current counter the largest
    value at a phase's end."""
    if counter.startswith("max_"):
        return run.get(counter)
    vals = [p.get(counter) for p in sweep.phases_of(run)]
    vals = [v for v in vals if v is not None]
    return max(vals) if vals else None


def _points(series: list[Series]) -> dict[tuple, tuple[int | None, bool]]:
    """(sweep label, value, counter) -> (the largest value of the counter over the value's ok runs, or
    over all its runs when none ran ok; whether one ran ok)."""
    data = {}
    for s in series:
        for v, runs in s.by_value.items():
            ok = [r for r in runs if r.get("outcome") == "ok"]
            pick = ok or runs
            for c in COUNTERS:
                vals = [x for x in (_value(s.sweep, r, c) for r in pick) if x is not None]
                data[(s.sweep.label, v, c)] = (max(vals) if vals else None, bool(ok))
    return data


def _panel(ax, series: list[Series], data: dict, c: str, unit: int, unit_name: str, colors) -> None:
    """One counter's panel: a line per sweep through its ok runs, crosses where a run did not complete;
    values in ``unit`` bytes (named ``unit_name``)."""
    for i, s in enumerate(series):
        xs = sorted(s.by_value)
        pts = [(x, *data[(s.sweep.label, x, c)]) for x in xs]
        ok = [(x, y / unit) for x, y, good in pts if good and y is not None]
        bad = [(x, y / unit) for x, y, good in pts if not good and y is not None]
        label = f"{s.sweep.label}: {_short(s.sweep.path.name)}"
        ax.plot([p[0] for p in ok], [p[1] for p in ok], _STYLES[i % len(_STYLES)], color=colors(i), label=label)
        if bad:
            ax.plot(
                [p[0] for p in bad],
                [p[1] for p in bad],
                "x",
                color=colors(i),
                markersize=9,
                markeredgewidth=2,
                linestyle="none",
                label=f"{s.sweep.label}: did not complete (partial)",
            )
    values = sorted({v for s in series for v in s.by_value})
    if doubling(values):
        ax.set_xscale("log", base=2)
    ax.set_xticks(values)
    ax.set_xticklabels([str(v) for v in values], fontsize=7)
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.set_title(c + (" (run peak)" if c.startswith("max_") else " (largest at a phase end)"), fontsize=9)
    ax.set_ylabel(unit_name, fontsize=8)
    ax.grid(True, alpha=0.3)


def counters_plot(series: list[Series], title: str) -> bytes:
    """Four panels (the four counters) against the axis, one line per sweep through its ok
    runs; a run that did not complete is a cross of its sweep's colour, never joined.

    Args:
        series: the series compared (the same axis), baseline first.
        title: the figure's title.

    Returns:
        The figure as PNG bytes.
    """
    plt = pyplot()
    axis = series[0].axis
    data = _points(series)
    every = [d[0] for d in data.values() if d[0] is not None]
    unit, unit_name = (GiB, "GiB (2^30 B)") if every and max(every) >= GiB else (MiB, "MiB (2^20 B)")
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    colors = plt.get_cmap("tab10")
    for ax, c in zip(axes.flat, COUNTERS):
        _panel(ax, series, data, c, unit, unit_name, colors)
    for ax in axes[1]:
        ax.set_xlabel(axis + (" (log2 axis)" if doubling(sorted({v for s in series for v in s.by_value})) else ""))
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 0.96))
    return png_bytes(fig)  # x tick labels thinned where they would overlap, cropped to what is drawn
