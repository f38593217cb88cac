"""The model strategy's round on the quadratic axes (``QUADRATIC_AXES``) with two successes or
more (``band_round``): probe where the band of the fitted peak (``peaks.peak_band``) crosses the
capacity; after an OOM the fit did not expect, step down from it (``moves.gallop_down``).

Units: peaks and capacities are bytes; values are lattice values of the axis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memsweep.estimator.fit import crossing

from .lattice import Pick
from .moves import gallop_down, gallop_up, pair
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
