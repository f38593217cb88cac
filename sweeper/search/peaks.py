"""The model strategy's model of the peak against the axis: a least-squares fit of the
successes' peaks (``fit_peak``) and the band the true peak lies in (``peak_band``).

The fit itself is ``estimator.fit.fit_polynomial`` (shared with the report's context fit);
this module chooses the degree, averages repeated values, leaves out a plateau (``rising``),
sizes the band from the peaks' resolution and the fit's residual, and says where the band's
curves really reach a level (``Crossings``, for the search's log). Peaks are bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from memsweep.estimator.fit import Polynomial, crossing, fit_polynomial

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


def resolution(peaks: Iterable[int]) -> int:
    """The step the measured ``peaks`` (bytes) move by: the largest power of two dividing every
    one, when in [MIN_GRANULARITY, MAX_GRANULARITY] (capped at the latter), else 1 (bytes)."""
    divisor = 0
    for p in peaks:
        divisor = math.gcd(divisor, int(p))
    step = divisor & -divisor  # its largest power-of-two factor
    return min(step, MAX_GRANULARITY) if step >= MIN_GRANULARITY else 1


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
    residual = max(abs(p - fit(x)) for x, p in zip(xs, ps))
    noise = max(1.0, resolution([p for _, p in points]), residual)

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


def rising(points: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The successes that tell how the peak grows with the axis: ``points`` without a plateau,
    the values whose (mean) peak is not below that of the next larger value or not above that of
    the next smaller one.

    A load whose largest phase does not depend on the axis at small values (a training step
    larger than the eval at a small ``eval_batch``) has a plateau there: equal peaks fit a slope
    of 0 and put the edge anywhere, and the plateau's last value lies above the line of the
    values past it. ``model_round`` grows past a plateau (x2) until two values rise.

    Args:
        points: (value, peak bytes) of successes; a value may repeat.

    Returns:
        The points kept, in their order.
    """
    xs, ps = average_peaks(points)
    n = len(xs)
    keep = {xs[i] for i in range(n) if (i == n - 1 or ps[i] < ps[i + 1]) and (i == 0 or ps[i] > ps[i - 1])}
    return [(x, p) for x, p in points if x in keep]


class Crossings:
    """Where the band's curves really reach a level, for the log (``model_round``,
    ``bracket_round``): unlike the values the round aims with, not stopped at the end of the
    runs' bracket.

    Args:
        band: the fitted peak (bytes against the axis).
        level: the bytes reached (the capacity, or the middle of the usable bracket).
        lo: the largest success below the smallest OOM.
        top: where the round stops (the smallest OOM, or one step past the upper bound).
        beyond: what a crossing at or past ``top`` is, in words ("beyond the upper bound 64
            (probes stop there)"), added to the reason when it is.

    Attributes:
        central, pessimistic, optimistic: where ``band.fit``, ``band.high``, ``band.low`` reach
            ``level`` (values of the axis, searched up to ``FAR`` times ``top``; ``lo`` for a
            curve above it there already); None when the curve never does.
        past: whether the central crossing (or, without one, the optimistic) is at or past ``top``.
        beyond: as given.
    """

    FAR = 2**20

    def __init__(self, band: Band, level: float, lo: int, top: int, beyond: str):
        far = float(top) * self.FAR

        def reach(f: Callable[[float], float]) -> float | None:
            x = crossing(f, level, lo, far)
            return float(lo) if x is None else None if x >= far else x

        self.central, self.pessimistic, self.optimistic = reach(band.fit), reach(band.high), reach(band.low)
        self.beyond = beyond
        edge = self.central if self.central is not None else self.optimistic
        self.past = edge is None or edge >= top

    def central_text(self) -> str:
        """The central crossing as text (two decimals), or "never" within ``FAR`` times the end."""
        return "never" if self.central is None else f"{self.central:.2f}"

    def range_text(self) -> str:
        """[pessimistic, optimistic] as text (one decimal; "never" for a curve that does not reach)."""
        lo = f"{self.pessimistic:.1f}" if self.pessimistic is not None else "never"
        hi = f"{self.optimistic:.1f}" if self.optimistic is not None else "never"
        return f"[{lo}, {hi}]"

    def past_text(self) -> str:
        """ ", <beyond>" when the crossing is at or past the runs' end, else ""."""
        return f", {self.beyond}" if self.past else ""
