"""The model strategy's round with two successes or more on the axes outside ``QUADRATIC_AXES``
(``ramp_round``): bounds of the edge from the measured peaks, a prediction tried once, a guarded
step between the bounds.

A training step's peak is flat at small values (weights, optimizer state), then rises steeply
(activations): the largest of parts that each grow as a + b*x, a, b >= 0. Such a peak over x does
not grow, so a success at x with peak p fits every value up to x * C / p (C: the capacity, bytes;
the lower bound); and it is convex, so past two successes it lies above the line through them
(the upper bound: where that line reaches C). The line through the largest successes on one line
is the prediction, probed once; where the peaks bend upwards the lower bound is probed, else the
bounds' geometric midpoint. Only an OOM at or below the lower bound contradicts the peaks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .lattice import Pick
from .peaks import Band, average_peaks, resolution

if TYPE_CHECKING:
    from .state import FrontierSearch

# Two slopes agree (the peaks lie on one line) when they differ by at most this fraction.
STRAIGHT = 0.02
# A rise of the peak is measured when it exceeds this many times the peaks' resolution.
MEASURABLE = 4
# Bounds this close (upper < NARROW * lower) are narrowed from the lower bound, a success unless
# the peaks are contradicted; wider ones from their geometric midpoint.
NARROW = 2
# An OOM contradicts a success's promise only below what a peak this fraction higher promises
# (a wobble of the counter is not memory it does not see).
PROMISE_SLACK = 1 / 64


@dataclass(frozen=True)
class Bounds:
    """What the measured peaks say about the edge (lattice values of the axis).

    Attributes:
        lower: the largest value every load of the kind above fits: the largest success's
            value or more (``fits_below``), below ``top``.
        upper: the largest value that may still fit: one step below ``top``, or the convexity
            bound when lower.
        predicted: the value where the line from ``straight_tail`` to the largest success
            reaches the capacity; None when the peaks do not rise measurably (a plateau, or a
            rise within the peaks' resolution).
        guarantor: the success whose peak gives ``lower`` (value, peak bytes).
        promised: the lattice value its peak (raised by PROMISE_SLACK) promises to fit,
            before ``lower`` stops below ``top``: an OOM at or below it contradicts the peaks.
        noise: the peaks' resolution (bytes).
        straight: two successes, the three largest on one line (within ``STRAIGHT`` and the
            noise), or the three below the largest bending upwards at the second largest (both
            largest past the bend): the prediction is worth a probe.
        kinked: the three largest bend upwards (the largest past the plateau's end): the line
            through the two largest overshoots, the lower bound is the better guess.
        confirmed: the prediction's line passes near a third success (``straight_tail``).
        slope: the prediction's line's bytes per unit of the axis, or None without a prediction.
    """

    lower: int
    upper: int
    predicted: float | None
    guarantor: tuple[int, int]
    promised: int
    noise: int
    straight: bool
    kinked: bool
    confirmed: bool
    slope: float | None


def fits_below(x: int, peak: float, cap: int) -> float:
    """The value up to which every load whose peak over the value does not grow fits, given
    that ``x`` fitted with ``peak`` bytes under the capacity ``cap`` (bytes): ``x * cap / peak``."""
    return x * cap / max(peak, 1.0)


def ramp_bounds(search: FrontierSearch, points: list[tuple[int, int]], cap: int, top: int) -> Bounds:
    """The ``Bounds`` of the successes ``points`` (value, peak bytes; below ``top``, at most ``cap``).

    Args:
        search: the search (its lattice and axis).
        points: the successes below the smallest OOM, two distinct values or more.
        cap: the capacity (bytes).
        top: the smallest OOM, or one step past the upper bound.

    Returns:
        The bounds; ``lower`` <= ``upper`` always (``upper`` is raised to ``lower``).
    """
    lattice, m = search.lattice, search.lattice.step
    xs, ps = average_peaks(points)
    noise = resolution([p for _, p in points])
    guarantor = max(zip(xs, ps), key=lambda xp: fits_below(xp[0], xp[1], cap))
    promised = lattice.down(fits_below(guarantor[0], guarantor[1] * (1 + PROMISE_SLACK), cap))
    exact = lattice.down(fits_below(guarantor[0], guarantor[1], cap))
    lower = min(max(exact, xs[-1]), top - m) if exact < top else xs[-1]  # an OOM at or below it: not a bound
    upper = top - m
    for (xa, pa), (xb, pb) in zip(zip(xs, ps), zip(xs[1:], ps[1:])):
        steepest = (pb - pa - 2 * noise) / (xb - xa)  # the least slope the two peaks allow
        if steepest > 0:
            upper = min(upper, lattice.down(xb + (cap - pb) / steepest))
    xb, pb = xs[-1], ps[-1]
    ta, tp = straight_tail(xs, ps, noise)
    predicted = None if ta is None or tp is None else xb + (cap - pb) * (xb - ta) / (pb - tp)
    straight, kinked = shape(xs[-3:], ps[-3:], noise)
    # the three before bent upwards at the second largest: it is past the bend, as the largest is
    straight = straight or shape(xs[-4:-1], ps[-4:-1], noise)[1]
    return Bounds(
        lower,
        max(upper, lower),
        predicted,
        (int(guarantor[0]), int(guarantor[1])),
        promised,
        noise,
        straight,
        kinked,
        ta is not None and ta < xs[-2],
        None if ta is None or tp is None else (pb - tp) / (xb - ta),
    )


def straight_tail(xs: list[int], ps: list[float], noise: int) -> tuple[int | None, float | None]:
    """The farthest success below the largest from which the line to the largest passes within
    ``STRAIGHT`` of its rise (plus ``noise`` bytes) of every success between, with a rise above
    MEASURABLE times ``noise``; (None, None) when none has (values ascending, peaks in bytes)."""
    xb, pb = xs[-1], ps[-1]
    best: tuple[int | None, float | None] = (None, None)
    for i in range(len(xs) - 2, -1, -1):
        xa, pa = xs[i], ps[i]
        rise = pb - pa
        if rise <= MEASURABLE * noise:
            continue
        slack = STRAIGHT * rise + 2 * noise
        if any(abs(ps[j] - pa - rise * (xs[j] - xa) / (xb - xa)) > slack for j in range(i + 1, len(xs) - 1)):
            break
        best = (xa, pa)
    return best


def shape(xs: list[int], ps: list[float], noise: int) -> tuple[bool, bool]:
    """(straight, kinked) of up to three successes (values ascending, peaks in bytes): two are
    straight; three are straight when their two slopes agree within ``STRAIGHT`` of the larger
    (plus what ``noise`` bytes move them), kinked when the second is steeper by more."""
    if len(xs) < 3:
        return len(xs) == 2, False
    s1, s2 = (ps[1] - ps[0]) / (xs[1] - xs[0]), (ps[2] - ps[1]) / (xs[2] - xs[1])
    slack = STRAIGHT * max(abs(s1), abs(s2)) + 2 * noise / (xs[1] - xs[0]) + 2 * noise / (xs[2] - xs[1])
    return abs(s2 - s1) <= slack, s2 - s1 > slack


def worth_trying(search: FrontierSearch, predicted: float | None, lo: int, top: int) -> bool:
    """Whether to probe the prediction (a value of the axis): not made from the largest success
    ``lo`` before, and not past ``top`` (the smallest OOM refutes a prediction past it; with no
    OOM yet, one past the upper bound: a prediction past it rests on a rise too small to tell a
    plateau from a slope, and the bounds' midpoint is probed instead)."""
    if predicted is None or any(p.detail.get("predicted_from") == lo for p in search.probes):
        return False
    return search.lattice.down(predicted) <= top


def ramp_round(
    search: FrontierSearch, slots: int, band: Band | None, cap: int, lo: int, top: int, b: Bounds
) -> list[Pick]:
    """The probes between the bounds of the edge (``ramp_bounds``).

    Args:
        search: the search.
        slots: how many values.
        band: the fitted peak, for the log (None: not fitted).
        cap: the capacity (bytes).
        lo: the largest success below the smallest OOM.
        top: the smallest OOM, or one step past the upper bound.
        b: ``ramp_bounds`` of the successes below the smallest OOM.

    Returns:
        The value next to a predicted edge just run (above it when it fitted; below it when a
        confirmed prediction did not); else the pair around the prediction (once per largest
        success, when the peaks are straight and it is not past the smallest OOM); else the lower
        bound when the peaks bend upwards; else the bounds' geometric midpoint. Spare slots get
        the values splitting the bounds geometrically; the bounds are in each ``detail``.
    """
    m = search.lattice.step
    detail = {"bounds": [b.lower, b.upper], "noise_bytes": b.noise, "capacity_bytes": cap}
    detail |= {"predicted_crossing": b.predicted}
    if band is not None:
        detail |= {"model": band.kind, "fit": band.coefficients}
    gx, gp = b.guarantor
    bounds = (
        f"peak({gx})={gp} B fits every value up to {b.lower} (a peak at most proportional), "
        f"convexity puts the edge at most at {b.upper}"
    )
    if b.predicted is not None and search.lattice.down(b.predicted) > top:
        _, hi = search.bracket()
        past = f"beyond the smallest OOM {hi}" if hi is not None else f"beyond the upper bound {top - m}"
        bounds += f"; the peaks' line reaches the capacity at {search.axis}={b.predicted:.2f}, {past}"
    last = search.probes[-1] if search.probes else None
    if last is not None and last.detail.get("predicted_edge") == last.value:  # the pair it began
        v = last.value + m if last.outcome == "ok" else last.value - m
        if lo < v < top and (last.outcome == "ok" or last.detail.get("confirmed")):
            why = f"model: the predicted edge {last.value} ran {last.outcome}: probe next to it"
            return [Pick(v, why, None, detail)] + lattice_fill(search, b, slots - 1, detail, bounds)
    if b.predicted is not None and b.straight and worth_trying(search, b.predicted, lo, top):
        return prediction_pair(search, b, (lo, top), slots, detail, bounds)
    if b.kinked and b.lower > lo:
        why = (
            f"model: {bounds}; the peaks bend upwards at {lo}, so the line through the largest two overshoots: "
            "probe the lower bound"
        )
        return [Pick(b.lower, why, None, detail)] + lattice_fill(search, b, slots - 1, detail, bounds)
    return lattice_fill(search, b, slots, detail, bounds)


def prediction_pair(
    search: FrontierSearch, b: Bounds, runs: tuple[int, int], slots: int, detail: dict, bounds: str
) -> list[Pick]:
    """The lattice values just below and just above the prediction (clipped to the bounds), then
    ``lattice_fill`` for the spare slots; ``runs`` is (lo, top) of ``ramp_round``."""
    lattice, m = search.lattice, search.lattice.step
    lo, top = runs
    predicted = float(b.predicted or 0.0)
    v = min(max(lattice.down(predicted), b.lower), b.upper)
    why = f"model: {bounds}; the peaks' line reaches the capacity at {search.axis}={predicted:.1f}; probe "
    d = detail | {"predicted_from": lo, "predicted_edge": v, "confirmed": b.confirmed}
    picks = [Pick(v, why + "just below", "ok", d), Pick(v + m, why + "just above", "oom", d)]
    return [p for p in picks if lo < p.value < top] + lattice_fill(search, b, slots - 2, detail, bounds)


def lattice_fill(search: FrontierSearch, b: Bounds, slots: int, detail: dict, bounds: str) -> list[Pick]:
    """``slots`` values splitting [lower, upper] geometrically (one: the geometric midpoint);
    with ``lower`` not yet run, it first."""
    if slots <= 0:
        return []
    lattice, m = search.lattice, search.lattice.step
    lo_run = b.lower in {p.value for p in search.probes}
    a, z = (b.lower, b.upper + m) if lo_run else (b.lower - m, b.upper + m)
    if not lo_run and b.upper < NARROW * b.lower:  # near the edge, the lower bound tells the most
        return [Pick(b.lower, f"model: {bounds}; probe the lower bound", "ok", detail)] + lattice_fill(
            search, dataclasses.replace(b, lower=b.lower + m), slots - 1, detail, bounds
        )
    if b.upper - b.lower <= m:  # the bounds meet at a success: the value above it
        return [Pick(b.upper + m, f"model: {bounds}; probe the value above", None, detail)]
    values = sorted(
        {
            min(max(lattice.down(max(a, 1) * (z / max(a, 1)) ** (j / (slots + 1))), a + m), z - m)
            for j in range(1, slots + 1)
        }
    )
    return [Pick(v, f"model: {bounds}; geometric split of the bounds", None, detail) for v in values]
