"""The model strategy's round on the quadratic axes (``QUADRATIC_AXES``) with two successes or
more (``band_round``): probe where the band of the fitted peak (``peaks.peak_band``) crosses the
capacity; after an OOM the fit did not expect, measure a far success (``refit_round``, the OOM held
and asked more than the capacity) or step down from it (``moves.gallop_down``).

Units: peaks and capacities are bytes; values are lattice values of the axis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memsweep.estimator.fit import crossing

from .lattice import Pick
from .moves import fill, gallop_down, gallop_up, pair
from .peaks import Band, Crossings

if TYPE_CHECKING:
    from .state import FrontierSearch

# First step down from an OOM the model did not expect: what this fraction of the capacity
# is worth on the axis (unseen overheads are a few percent of the capacity).
GALLOP_FIRST = 1 / 128
# Why the band's round steps down from an OOM (its value, the capacity in bytes).
FASTER = "OOM at {} where even the pessimistic fit stays under the capacity {} B: the peak grows faster than the fit"


def band_round(
    search: FrontierSearch, slots: int, band: Band, cap: int, lo: int, hi: int | None, top: int
) -> list[Pick]:
    """The model's round with two or more successes: the pair around where the band crosses
    the capacity, or its geometric split points; ``gallop_down`` or ``gallop_up`` when the
    probes contradict the fit.

    Args:
        search: the search.
        slots: how many values.
        band: the fitted peak (``peak_band``), bytes against the axis.
        cap: the capacity (bytes).
        lo, hi: the largest success below the smallest OOM; the smallest OOM, or None.
        top: ``hi``, or one step above the upper bound.

    Returns:
        The values to probe, the model in their ``detail``.
    """
    lattice, m = search.lattice, search.lattice.step
    if hi is not None and band.high(hi) <= cap:
        slope = (band.fit(hi) - band.fit(lo)) / (hi - lo)
        first = lattice.down(GALLOP_FIRST * cap / slope) if slope > 0 else m
        return gallop_down(search, lo, hi, slots, max(first, m), FASTER.format(hi, cap))
    x_opt = crossing(band.low, cap, lo, top)
    if x_opt is None:
        return gallop_up(
            search, lo, hi, slots, f"{lo} fitted although even the optimistic fit puts it above the capacity {cap} B"
        )
    x_pess = crossing(band.high, cap, lo, top) or float(lo)
    x_star = min(max(crossing(band.fit, cap, lo, top) or float(lo), x_pess), x_opt)
    first, last = max(lattice.down(x_pess), lo), min(lattice.down(x_opt), top - m)
    # where the curves really cross (the ones above stop at `top`): logged, and said when past it
    past = (
        f"beyond the upper bound {lattice.upper} (probes stop there)" if hi is None else f"beyond the smallest OOM {hi}"
    )
    real = Crossings(band, cap, lo, top, past)
    detail = {
        "model": band.kind,
        "fit": band.coefficients,
        "noise_bytes": band.noise,
        "capacity_bytes": cap,
        "predicted_crossing": real.central,
        "predicted_range": [real.pessimistic, real.optimistic],
        "past_bound": real.past,
    }
    if last - first > m:  # too uncertain for a pair: narrow it with its geometric midpoint(s)
        a = max(first, lo + m)
        values = sorted(
            {min(max(lattice.down(a * (last / a) ** (j / (slots + 1))), lo + m), top - m) for j in range(1, slots + 1)}
        )
        why = (
            f"model: edge predicted in {real.range_text()} ({band.kind} fit "
            f"+- {band.noise:.0f} B){real.past_text()}; probe inside it (geometric split)"
        )
        return [Pick(v, why, None, detail) for v in values if lo < v < top]
    why = (
        f"model: {band.kind} fit crosses the capacity {cap} B at {search.axis}={real.central_text()}"
        f"{real.past_text()}; probe just "
    )
    return pair(lattice, band, x_star, (lo, top, hi), cap, lambda side: why + side, detail, slots)


def oom_said_over(search: FrontierSearch, value: int, cap: int) -> tuple[int, int] | None:
    """What the OOM at ``value`` said it held (A) and asked (R), when A + R is above the capacity
    ``cap`` (bytes): the capacity alone explains that OOM, no memory unseen by the peak counter is
    needed; None when it did not say, or said less (``bracket_round`` reads that)."""
    said = next(
        ((p.oom_held, p.oom_request) for p in search.probes if p.value == value and p.outcome == "oom"),
        None,
    )
    if said is None or said[0] is None or said[1] is None or said[0] + said[1] <= cap:
        return None
    return said[0], said[1]


def refit_round(search: FrontierSearch, lo: int, hi: int, slots: int, said: tuple[int, int]) -> list[Pick]:
    """After an OOM that the fit did not expect but the capacity explains (it held and asked more
    than the capacity together): the successes do not show how fast the peak grows (flat peaks at
    small values, then a steep rise), so measure a far success or halve the bracket: the geometric
    midpoint of (lo, hi), then the split points for the spare slots.

    Args:
        search: the search.
        lo: the largest success below ``hi``.
        hi: the smallest OOM.
        slots: how many values.
        said: (bytes held, bytes asked) of the OOM at ``hi``.

    Returns:
        The midpoint and fill values strictly inside (lo, hi); nothing when it holds no value.
    """
    lattice, (held, asked) = search.lattice, said
    mids = lattice.split(lo, hi, 2)
    if not mids:
        return []
    v = min(max(lattice.down((max(lo, 1) * hi) ** 0.5), lo + lattice.step), hi - lattice.step)
    why = (
        f"model: OOM at {hi} where even the pessimistic fit stays under the capacity {search.capacity} B; it held "
        f"{held} B and asked {asked} B, more than the capacity together, so the capacity explains it and the "
        f"peak grows faster than the successes up to {lo} show; geometric midpoint of ({lo}, {hi})"
    )
    return [Pick(v, why, None, {"explained_oom": {"value": hi, "held_bytes": held, "request_bytes": asked}})] + fill(
        lattice, lo, hi, slots - 1, v
    )
