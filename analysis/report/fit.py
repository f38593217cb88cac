"""The peak as a polynomial of the context (calculated), and where it reaches a level.

numpy is imported at the top: pandas (analysis.frontier) loads it anyway.
"""

from __future__ import annotations

import numpy as np


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
    x = np.array([p[0] for p in pts], dtype=float)
    y = np.array([p[1] for p in pts], dtype=float)
    coeffs = np.polyfit(x, y, degree)
    pred = np.polyval(coeffs, x)
    rel = float(np.max(np.abs(pred - y) / np.maximum(y, 1)))
    return {"coeffs": [float(c) for c in coeffs], "degree": degree, "max_rel_residual": rel,
            "xs": [int(v) for v in x], "ys": [int(v) for v in y]}


def crossing(coeffs: list[float], level: float) -> float | None:
    """The smallest positive context where the fitted polynomial reaches ``level`` bytes.

    Args:
        coeffs: a polynomial, highest power first (``fit_context``'s ``coeffs``).
        level: bytes (the capacity, or the capacity minus the margin).

    Returns:
        The context (tokens, a float: an extrapolation, not a value run); None when the
        polynomial never reaches ``level`` at a positive context.
    """
    c = list(coeffs)
    c[-1] -= level
    roots = [r.real for r in np.roots(c) if abs(r.imag) < 1e-9 and r.real > 0]
    return min(roots) if roots else None
