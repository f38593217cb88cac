"""Least-squares polynomial fit of peak bytes against an axis, and where a curve reaches a level.

The one implementation of both, used by the frontier search (``sweeper.search.peaks``) and by
the report (``analysis.report``). Pure Python, no numpy.

* ``fit_polynomial``: least squares of degree 1 or 2 through the normal equations, solved by
  Gaussian elimination with partial pivoting (``solve_least_squares``), on values mapped to
  [-1, 1] so that the equations stay well conditioned.
* ``crossing``: where an increasing curve reaches a threshold inside an interval, by
  bisection; ``first_crossing``: the smallest positive value where a polynomial rises through
  a positive level, one monotone piece at a time.

Units: axis values are what the axis counts (batch items, tokens, features); peaks, levels
and thresholds are bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Polynomial:
    """p(x) = a + b*x + c*x**2 (c = 0: affine); in bytes when fitted to peaks.

    Attributes:
        a: the constant term (bytes).
        b: the linear coefficient (bytes per unit of the axis).
        c: the square coefficient (bytes per unit squared); 0 for an affine fit.
    """

    a: float
    b: float
    c: float = 0.0

    def __call__(self, x: float) -> float:
        """The polynomial's value at ``x`` (bytes when fitted to peaks)."""
        return self.a + self.b * x + self.c * x * x


def solve_least_squares(rows: list[list[float]], ys: Sequence[float]) -> list[float] | None:
    """The coefficients c minimising |A c - y|, from the normal equations (A^T A) c = A^T y.

    Solved by Gaussian elimination with partial pivoting.

    Args:
        rows: the rows of A, one per observation, all of the same length n.
        ys: the observations y, one per row.

    Returns:
        The n coefficients, or None when A^T A is singular (a pivot below 1e-12 times its
        largest entry), e.g. fewer distinct observations than coefficients.
    """
    n = len(rows[0])
    m = [
        [sum(r[i] * r[j] for r in rows) for j in range(n)] + [sum(r[i] * y for r, y in zip(rows, ys))] for i in range(n)
    ]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12 * max(1.0, max(abs(v) for row in m for v in row[:n])):
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [a - f * b for a, b in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]


def fit_polynomial(xs: Sequence[float], ys: Sequence[float], degree: int, centre: bool = False) -> Polynomial | None:
    """Least-squares polynomial of ``ys`` against ``xs``.

    The values are mapped to u = (x - o) / s before solving: by default o = 0 and s = the
    largest |x| (u in (0, 1] for positive values: the frontier search's fit); with
    ``centre``, o = the middle of the range of ``xs`` and s = half its width (u in [-1, 1],
    which keeps values that lie close together relative to their size, such as contexts
    8190, 8191, 8192, well conditioned). The coefficients are returned for x.

    Args:
        xs: the values of the axis, at least two distinct ones (a repeated value counts once
            per observation).
        ys: the observation at each value (bytes for peaks).
        degree: 1 (affine) or 2 (quadratic).
        centre: map the range of ``xs`` to [-1, 1] instead of dividing by the largest value.

    Returns:
        The fitted ``Polynomial`` (bytes), or None when the normal equations are singular
        (fewer distinct values than coefficients, or values too close together).

    Raises:
        ValueError: a degree other than 1 or 2.
    """
    if degree not in (1, 2):
        raise ValueError(f"degree {degree!r}: expected 1 or 2")
    if centre:
        origin = (min(xs) + max(xs)) / 2
        scale = (max(xs) - min(xs)) / 2
        if scale <= 0:
            return None
        us = [(x - origin) / scale for x in xs]
    else:
        origin, scale = 0, float(max(abs(x) for x in xs))
        if scale <= 0:
            return None
        us = [x / scale for x in xs]
    if degree == 2:
        coef = solve_least_squares([[1.0, u, u * u] for u in us], ys)
    else:
        coef = solve_least_squares([[1.0, u] for u in us], ys)
    if coef is None:
        return None
    if degree == 1:
        a, b, c = coef[0], coef[1] / scale, 0.0
    else:
        a, b, c = coef[0], coef[1] / scale, coef[2] / scale**2
    if origin:  # p(x) = a + b (x - o) + c (x - o)^2, expanded in powers of x
        a, b = a - b * origin + c * origin * origin, b - 2 * c * origin
    return Polynomial(a, b, c)


def crossing(
    f: Callable[[float], float], threshold: float, lo: float, hi: float, tolerance: float = 1e-6
) -> float | None:
    """Where the increasing curve ``f`` reaches ``threshold`` in [lo, hi], by bisection.

    Args:
        f: an increasing function of the axis (bytes).
        threshold: the level to reach (bytes).
        lo: the lower end of the interval.
        hi: the upper end of the interval.
        tolerance: the bisection stops when the interval left is at most ``tolerance`` times
            max(1, its upper end); 0 goes on until its ends are neighbouring floats.

    Returns:
        The largest value found with f(x) <= threshold (within the tolerance of the
        crossing); ``hi`` when f stays at or below the threshold; None when f is above it
        already at ``lo``.
    """
    if f(lo) > threshold:
        return None
    if f(hi) <= threshold:
        return float(hi)
    a, b = float(lo), float(hi)
    while b - a > tolerance * max(1.0, b):
        mid = (a + b) / 2
        if not a < mid < b:  # neighbouring floats: as close as the bisection can get
            break
        if f(mid) <= threshold:
            a = mid
        else:
            b = mid
    return a


def first_crossing(p: Polynomial, level: float) -> float | None:
    """The smallest x > 0 where the polynomial ``p`` rises through ``level``: where a fitted peak
    reaches a capacity as the axis grows.

    ``p`` is monotone on each side of its vertex; only a piece of (0, R] (R: twice Cauchy's bound on
    the roots' size) on which ``p`` rises from below ``level`` to at least it is searched, with
    ``crossing``, down to neighbouring floats. A piece on which ``p`` falls through ``level`` (a
    peak that would shrink as the axis grows: a fit extrapolated past its vertex) gives no
    crossing: a peak reaches a capacity by growing.

    Args:
        p: the polynomial (bytes).
        level: the level to reach (bytes), positive.

    Returns:
        That x, or None when p never rises through ``level`` for a positive x (including a
        constant p, and a p that lies above ``level`` until it falls below it).

    Raises:
        ValueError: ``level`` not positive (a capacity minus a margin larger than it): no peak
            of bytes "reaches" it.
    """
    if not level > 0:
        raise ValueError(f"level {level!r}: a positive number of bytes expected")
    d = p.a - level  # g(x) = c x^2 + b x + d
    if p.c:
        bound = 2 * (1 + max(abs(p.b), abs(d)) / abs(p.c))  # twice Cauchy's bound: g's sign is clear there
    elif p.b:
        bound = 2 * (1 + abs(d) / abs(p.b))
    else:
        return None
    ends = [0.0]
    if p.c and 0 < -p.b / (2 * p.c) < bound:
        ends.append(-p.b / (2 * p.c))
    ends.append(bound)

    def g(x: float) -> float:
        return p(x) - level

    for start, end in zip(ends, ends[1:]):
        g_start, g_end = g(start), g(end)
        if g_start == 0 < g_end and start > 0:  # touches the level at the vertex, then rises
            return start
        if not g_start < 0 <= g_end:  # falls through the level, or stays on one side of it
            continue
        x = end if g_end == 0 else crossing(g, 0.0, start, end, tolerance=0.0)
        if x is not None and x > 0:
            return x
    return None
