"""The peak as a polynomial of the context (calculated), and where it reaches a level: the
report's use of ``analysis.fit``, the one least-squares fit and root finder that the frontier
search uses too.
"""

from __future__ import annotations

import math

from memsweep.estimator.fit import Polynomial, first_crossing, fit_polynomial

QUADRATIC_AXES = ("context", "width")
"""Axes whose peak grows with the square of the value (attention scores with the context,
parameters with the width): fitted with a quadratic from three distinct values on; the
others (batch) with a line."""


def fit_axis(axis: str, xs: list, ys: list) -> dict | None:
    """Least-squares polynomial of the peak (bytes) against a swept axis (``analysis.fit``).

    Args:
        axis: ``batch`` (affine), ``context`` or ``width`` (quadratic with three or more
            distinct values, affine with two); ``dtype`` and other non-numeric axes: None.
        xs: the values of the axis; pairs with a None on either side are skipped.
        ys: the peaks at those values (bytes).

    Returns:
        None with fewer than two distinct values (or a non-numeric axis); else as ``fit_context``.
    """
    if axis not in QUADRATIC_AXES:
        if axis != "batch":
            return None
        pts = sorted({(x, y) for x, y in zip(xs, ys) if x is not None and y is not None})
        if len({x for x, _ in pts}) < 2:
            return None
        x = [float(p[0]) for p in pts]
        y = [float(p[1]) for p in pts]
        fit = fit_polynomial(x, y, 1, centre=True)
        if fit is None:
            return None
        rel = max(abs(fit(u) - v) / max(v, 1.0) for u, v in zip(x, y))
        return {
            "coeffs": [float(fit.b), float(fit.a)],
            "degree": 1,
            "max_rel_residual": float(rel),
            "xs": [int(v) for v in x],
            "ys": [int(v) for v in y],
        }
    return fit_context(xs, ys)


def evaluate(coeffs: list[float], x: float) -> float:
    """The fitted polynomial (``coeffs``, highest power first) at ``x`` (bytes)."""
    a, b, c = (list(reversed(coeffs)) + [0.0, 0.0])[:3]
    return Polynomial(a, b, c)(x)


def fit_context(xs: list[int], ys: list[int]) -> dict | None:
    """Least-squares polynomial of the peak (bytes) in context: quadratic with three or more
    distinct contexts (attention scores grow with its square), affine with two.

    Args:
        xs: contexts (tokens); pairs with a None on either side are skipped.
        ys: the peaks at those contexts (bytes).

    Returns:
        None with fewer than two distinct contexts; else ``coeffs`` (highest power first, as
        numpy.polyfit; bytes per token^k), ``degree`` (1 or 2), ``max_rel_residual`` (largest
        |fit - peak| / peak over the points, a fraction), and ``xs``/``ys``, the distinct points
        fitted (sorted, ints).
    """
    pts = sorted({(x, y) for x, y in zip(xs, ys) if x is not None and y is not None})
    if len({x for x, _ in pts}) < 2:
        return None
    degree = 2 if len({x for x, _ in pts}) >= 3 else 1
    x = [float(p[0]) for p in pts]
    y = [float(p[1]) for p in pts]
    fit = fit_polynomial(x, y, degree, centre=True)
    if fit is None:
        return None
    rel = max(abs(fit(u) - v) / max(v, 1.0) for u, v in zip(x, y))
    coeffs = [fit.c, fit.b, fit.a] if degree == 2 else [fit.b, fit.a]
    return {
        "coeffs": [float(c) for c in coeffs],
        "degree": degree,
        "max_rel_residual": float(rel),
        "xs": [int(v) for v in x],
        "ys": [int(v) for v in y],
    }


def crossing(coeffs: list[float], level: float) -> float | None:
    """The smallest positive context where the fitted polynomial reaches ``level`` bytes.

    Args:
        coeffs: a polynomial, highest power first (``fit_context``'s ``coeffs``).
        level: bytes (the capacity, or the capacity minus the margin).

    Returns:
        The context (tokens, a float: an extrapolation, not a value run); None when the
        polynomial never reaches ``level`` at a positive context.
    """
    a, b, c = (list(reversed(coeffs)) + [0.0, 0.0])[:3]
    return first_crossing(Polynomial(a, b, c), level)


def capacity_crossings(coeffs: list[float], capacity: int | None, margin_bytes: int | None) -> dict[str, float | None]:
    """Where the fitted peak reaches the capacity and the capacity minus the margin (``crossing``).

    Args:
        coeffs: the fitted polynomial, highest power first (``fit_axis``'s ``coeffs``).
        capacity: the capacity compared with the peak (bytes); None or 0: no crossing.
        margin_bytes: the margin policy's bytes at that capacity; None or 0: no second level.

    Returns:
        ``{"capacity": x, "capacity - margin": x}``, x the axis value (a float, extrapolated) or
        None when the fit never rises to that level; ``capacity - margin`` is left out when the
        margin is missing, 0, or not below the capacity (no positive level to reach: the report
        says so with the margin, ``margin.margin_leaves_nothing``); empty without a capacity.
    """
    out: dict[str, float | None] = {}
    if capacity:
        out["capacity"] = crossing(coeffs, capacity)
        if margin_bytes and capacity - margin_bytes > 0:
            out["capacity - margin"] = crossing(coeffs, capacity - margin_bytes)
    return out


def largest_under(coeffs: list[float], level: float, step: int = 1) -> int | None:
    """The largest value of the axis's lattice (multiples of ``step``) whose fitted peak is at most
    ``level``, below where the fit first rises through it: the fitted crossing (``crossing``)
    floored to the lattice, never rounded up past the level.

    Args:
        coeffs: the fitted polynomial, highest power first (``fit_axis``'s ``coeffs``).
        level: bytes (the capacity, or the capacity minus the margin), positive.
        step: the distance between the axis's values (the frontier sweeper's
            ``hydra.sweeper.multiple_of``; 1 for values given by hand).

    Returns:
        That value (a calculated, not a measured, value of the axis); 0 when even ``step`` has a
        fitted peak above ``level``; None when the fit never rises through ``level`` at a
        positive value (no limit from the fit).
    """
    x = crossing(coeffs, level)
    if x is None:
        return None
    value = math.floor(x / step) * step
    while value > 0 and evaluate(coeffs, value) > level:  # a float crossing a hair above a lattice value
        value -= step
    return max(value, 0)


def capacity_limits(
    coeffs: list[float], capacity: int | None, margin_bytes: int | None, step: int = 1
) -> dict[str, int | None]:
    """The largest lattice values whose fitted peak stays within the capacity and within the
    capacity minus the margin (``largest_under``): the one definition the report prints.

    Args:
        coeffs: the fitted polynomial, highest power first (``fit_axis``'s ``coeffs``).
        capacity: the capacity compared with the peak (bytes); None or 0: no level.
        margin_bytes: the margin policy's bytes at that capacity; None or 0: no second level.
        step: the distance between the axis's values (``largest_under``).

    Returns:
        ``{"capacity": v, "capacity - margin": v}`` with the keys of ``capacity_crossings`` (the
        same levels, the same keys left out), v as ``largest_under`` gives it.
    """
    levels = {"capacity": capacity or 0, "capacity - margin": (capacity or 0) - (margin_bytes or 0)}
    return {k: largest_under(coeffs, levels[k], step) for k in capacity_crossings(coeffs, capacity, margin_bytes)}
