"""The model strategy's model of the peak against the axis: a least-squares fit of the
successes' peaks (``fit_peak``) and the band the true peak lies in (``peak_band``).

The fit itself is ``analysis.fit.fit_polynomial`` (shared with the report's context fit);
this module chooses the degree, averages repeated values and sizes the band from the peaks'
resolution and the fit's residual. Peaks are bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from analysis.fit import Polynomial, fit_polynomial

# Peaks may move in steps: the CUDA caching allocator reserves segments in multiples of
# 2 MiB. The largest power of two dividing every measured peak, when at least
# MIN_GRANULARITY (a smaller one is chance), at most MAX_GRANULARITY, is their resolution.
MIN_GRANULARITY = 64 * 2**10
MAX_GRANULARITY = 2 * 2**20


def average_peaks(points: Iterable[tuple[int, int]]) -> tuple[list[int], list[float]]:
    """The distinct values of ``points`` and the mean peak at each.

    Args:
        points: (value, peak bytes) pairs; a value may repeat.

    Returns:
        (values ascending, mean peak in bytes at each value).
    """
    by_x: dict[int, list[int]] = {}
    for x, p in points:
        by_x.setdefault(int(x), []).append(int(p))
    xs = sorted(by_x)
    return xs, [sum(by_x[x]) / len(by_x[x]) for x in xs]


def fit_peak(points: Iterable[tuple[int, int]], quadratic: bool = False) -> Polynomial | None:
    """Least-squares fit of peak bytes against the axis value.

    Affine with two or more distinct values; with ``quadratic`` and three or more, a
    quadratic term is added when its fitted coefficient is positive (else affine).

    Args:
        points: (value, peak bytes) of successful runs; repeated values are averaged.
        quadratic: allow a square term (the axes of ``QUADRATIC_AXES``).

    Returns:
        peak(x) = a + b*x + c*x**2 in bytes (c = 0: affine), or None with fewer than two
        distinct values.
    """
    xs, ps = average_peaks(points)
    if len(xs) < 2:
        return None
    if quadratic and len(xs) >= 3:
        fit = fit_polynomial(xs, ps, 2)
        if fit is not None and fit.c > 0:
            return fit
    return fit_polynomial(xs, ps, 1)


@dataclass(frozen=True)
class Band:
    """The model of the peak: a central curve and the curves the true peak lies between.

    ``high`` (pessimistic) and ``low`` (optimistic) are the central fit plus and minus the
    measurement noise (the peaks' resolution, or the fit's largest residual when larger),
    widened beyond the largest success by the slope error that noise allows over the span
    of the successes. With two successes on a quadratic axis, the band spans the secant
    (no square term) and the pure square through them (no linear term): every load
    a + b*x + c*x^2 with a, b, c >= 0 through those two points lies between them beyond
    the larger one.

    Attributes:
        fit: the central curve, value -> bytes.
        high: the pessimistic curve, value -> bytes.
        low: the optimistic curve, value -> bytes.
        noise: the band's half-width at the successes (bytes).
        kind: ``affine``, ``quadratic`` or ``affine..square``.
        coefficients: the central curve's {"a", "b", "c"} (bytes), for the log.
    """

    fit: Callable[[float], float]
    high: Callable[[float], float]
    low: Callable[[float], float]
    noise: float
    kind: str
    coefficients: dict


def peak_band(points: list[tuple[int, int]], quadratic: bool = False) -> Band | None:
    """The ``Band`` of the successes ``points``.

    Args:
        points: (value, peak bytes) of successful runs; repeated values are averaged.
        quadratic: allow a square term (the axes of ``QUADRATIC_AXES``).

    Returns:
        The band, or None with fewer than two distinct values.
    """
    xs, ps = average_peaks(points)
    fit = fit_peak(points, quadratic)
    if fit is None:
        return None
    x0, x1 = xs[0], xs[-1]
    span = float(x1 - x0)
    divisor = 0
    for _, p in points:
        divisor = math.gcd(divisor, int(p))
    resolution = divisor & -divisor  # its largest power-of-two factor
    resolution = min(resolution, MAX_GRANULARITY) if resolution >= MIN_GRANULARITY else 1
    residual = max(abs(p - fit(x)) for x, p in zip(xs, ps))
    noise = max(1.0, resolution, residual)

    def widen(x: float) -> float:
        return noise * (1 + 2 * max(0.0, x - x1) / span)

    coefficients = {"a": fit.a, "b": fit.b, "c": fit.c}
    if quadratic and len(xs) == 2 and ps[1] > ps[0]:
        c = (ps[1] - ps[0]) / (x1 * x1 - x0 * x0)
        square = Polynomial(ps[0] - c * x0 * x0, 0.0, c)
        central = Polynomial((fit.a + square.a) / 2, fit.b / 2, c / 2)
        return Band(
            central,
            lambda x: max(fit(x), square(x)) + widen(x),
            lambda x: min(fit(x), square(x)) - widen(x),
            noise,
            "affine..square",
            {"a": central.a, "b": central.b, "c": central.c},
        )
    return Band(
        fit,
        lambda x: fit(x) + widen(x),
        lambda x: fit(x) - widen(x),
        noise,
        "quadratic" if fit.c else "affine",
        coefficients,
    )
