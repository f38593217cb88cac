"""The report's figures, drawn with matplotlib (Agg backend, no display) and returned as PNG bytes.

Every figure plots bytes converted once, to GiB (2^30 B) or, when everything plotted is below
1 GiB, MiB (2^20 B), one unit per figure, named on its axis; the caller passes raw integer bytes. No torch import.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import matplotlib
import numpy as np

matplotlib.use("Agg")  # before pyplot: no display, same output everywhere
import matplotlib.pyplot as plt  # noqa: E402

GiB = 2**30
MiB = 2**20
_DPI = 100


def _unit(*byte_values) -> tuple[int, str]:
    """GiB (2^30 B) when the largest value plotted reaches 1 GiB, else MiB (2^20 B): one unit
    per figure, written on its axis."""
    vals = [abs(v) for v in byte_values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return (GiB, "GiB (2^30 bytes)") if vals and max(vals) >= GiB else (MiB, "MiB (2^20 bytes)")


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _positions(values: Sequence) -> tuple[list[float], bool]:
    """x positions for the swept values: the values themselves (log2 axis) when all are
    positive numbers, else 0..n-1 (categorical, e.g. dtype)."""
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values)
    return ([float(v) for v in values] if numeric else list(range(len(values)))), numeric


def _scaled(values: Sequence[int | None], unit: int) -> list[float]:
    return [math.nan if v is None else v / unit for v in values]


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
) -> bytes:
    """Peak memory against the swept variable.

    Args:
        points: one dict per swept value, in order: ``value``, ``outcome`` (ok | oom | mixed
            | error ...), ``used`` (the peak compared with the capacity, bytes) and ``other``
            (the other counter's peak, bytes); None where missing.
        capacity, margin: bytes; the capacity line, and the line ``capacity - margin``.
        max_ok, min_oom: the frontier, marked with vertical lines.

    Returns:
        The figure as PNG bytes.
    """
    values = [p["value"] for p in points]
    xs, numeric = _positions(values)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    unit, unit_name = _unit(capacity, *[p["used"] for p in points], *[p["other"] for p in points])
    short = unit_name.split()[0]
    used, other = _scaled([p["used"] for p in points], unit), _scaled([p["other"] for p in points], unit)
    ax.plot(xs, used, "-", color="#1f77b4", label=f"{used_label} (compared with capacity)")
    ax.plot(xs, other, "--", color="#2ca02c", label=other_label)
    for x, u, o, p in zip(xs, used, other, points):
        ok = p["outcome"] == "ok"
        style = dict(markersize=7, markeredgewidth=1.5)
        ax.plot([x], [u], "o" if ok else "x", color="#1f77b4" if ok else "#d62728", **style)
        ax.plot([x], [o], "s" if ok else "x", color="#2ca02c" if ok else "#d62728", fillstyle="none", **style)
    if capacity:
        ax.axhline(capacity / unit, color="#d62728", linewidth=1.5, label=f"capacity {capacity / unit:.3f} {short}")
        if margin:
            ax.axhline(
                (capacity - margin) / unit,
                color="#ff7f0e",
                linestyle=":",
                linewidth=1.5,
                label=f"capacity - margin {(capacity - margin) / unit:.3f} {short}",
            )
    pos = dict(zip(values, xs))
    if max_ok is not None and max_ok in pos:
        ax.axvline(pos[max_ok], color="#2ca02c", alpha=0.5, linewidth=6, label=f"max_ok = {max_ok}")
    if min_oom is not None and min_oom in pos:
        ax.axvline(pos[min_oom], color="#d62728", alpha=0.3, linewidth=6, label=f"min_oom = {min_oom}")
    if numeric:
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(v) for v in values])
    else:
        ax.set_xticks(xs)
        ax.set_xticklabels([str(v) for v in values])
    ax.set_xlabel(axis)
    ax.set_ylabel(unit_name)
    ax.set_title(title or f"peak memory vs {axis}  (x = run that did not complete: partial peak)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return _png(fig)


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
    bottom = [0.0] * len(values)
    cmap = plt.get_cmap("tab20" if len(phases) > 10 else "tab10")
    for j, phase in enumerate(phases):
        heights = [0.0 if inc[j] is None else inc[j] / unit for inc in increments]
        ax.bar(xs, heights, bottom=bottom, color=cmap(j % cmap.N), label=phase, edgecolor="white", linewidth=0.5)
        bottom = [b + h for b, h in zip(bottom, heights)]
    for x, top, outcome in zip(xs, bottom, outcomes):
        if outcome != "ok":
            ax.annotate(outcome, (x, top), ha="center", va="bottom", fontsize=8, color="#d62728")
    if capacity:
        ax.axhline(capacity / unit, color="#d62728", linewidth=1.2, label="capacity")
    ax.set_xticks(xs)
    ax.set_xticklabels([str(v) for v in values])
    ax.set_xlabel(axis)
    ax.set_ylabel(f"{counter}, {unit_name}")
    ax.set_title(f"rise of the peak {counter} by phase", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
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
) -> bytes:
    """Measured peaks (bytes) of successful runs against context with the fitted polynomial
    ``coeffs`` (numpy.polyfit order, bytes), extended to the predicted crossings.

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
        if margin:
            ax.axhline((capacity - margin) / unit, color="#ff7f0e", linestyle=":", label="capacity - margin")
    for name, x in crossings.items():
        if x:
            ax.axvline(x, color="#7f7f7f", linestyle="--", linewidth=0.8)
            ax.annotate(f"{name}: {x:.0f}", (x, 0), rotation=90, fontsize=7, va="bottom", ha="right")
    ax.set_xlabel(x_label)
    ax.set_ylabel(f"{y_label}, {unit_name}")
    ax.set_title(f"{y_label} vs {x_label}: quadratic fit", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return _png(fig)
