"""The strategies: which values a round of the search proposes (one small function each), as
``Pick`` lists that ``FrontierSearch.propose`` turns into probes.

``seed_round`` (a dry run's predicted edge), ``first_round``, ``bisect_round`` (strategy
``bisect``: x2 growth, then bisection), ``model_round`` (strategy ``model``: ``one_success_round``,
then the bounds of the measured peaks on linear axes, ``sweeper.search.ramp``, the band of the
fitted peak on quadratic ones, ``sweeper.search.band``, or the bracket of the usable capacity,
``sweeper.search.bracket``; ``moves.gallop_down``/``gallop_up`` when the probes contradict the
peaks) and ``forced_round`` after two wrong predictions in a row.

To add a strategy: write its round as ``(search, slots) -> list[Pick]`` here, add its name
to ``STRATEGIES`` and dispatch to it in ``FrontierSearch.propose``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .band import GALLOP_FIRST, band_round
from .bracket import bracket_round
from .lattice import QUADRATIC_AXES, Pick
from .moves import gallop_down, gallop_up, growth, split
from .peaks import peak_band, rising
from .ramp import ramp_bounds, ramp_round

if TYPE_CHECKING:
    from .state import FrontierSearch

STRATEGIES = ("model", "bisect")
# A round after the first needs a success below the smallest OOM (``first_round`` or
# ``seed_round`` run until there is one, or the search is done).
NO_SUCCESS = "frontier search on {} without a success below the smallest OOM"


def seed_round(search: FrontierSearch) -> list[Pick]:
    """The predicted edge and its neighbour on the side its outcome points to.

    Args:
        search: the search, with a ``seed`` (a predicted max_ok).

    Returns:
        The seed and the value above it first; then the value above (the seed fits) or
        below it (it does not), or ``lower'`` when nothing at or below the seed fit;
        nothing once both sides of the seed are known (the strategy goes on from the
        bracket).
    """
    s, m = search.seed, search.lattice.step
    if s is None:
        return []
    done = {p.value: p.outcome for p in search.probes}
    if s not in done:
        return [
            Pick(s, "predicted max_ok (dry run)", "ok", {}),
            Pick(s + m, "just above the predicted max_ok (dry run)", "oom", {}),
        ]
    if done[s] == "ok":
        return [Pick(s + m, "just above the predicted max_ok (dry run)", "oom", {})]
    if done[s] == "oom":
        if s - m in done and not any(o == "ok" for o in done.values()):
            return [Pick(search.lattice.lower, "lower bound (nothing at or below the predicted edge fit)", None, {})]
        return [Pick(s - m, "below the predicted max_ok, which did not fit (dry run)", "ok", {})]
    return []


def first_round(search: FrontierSearch, slots: int) -> list[Pick]:
    """The first round, nothing known yet.

    Args:
        search: the search.
        slots: how many values.

    Returns:
        ``lower'`` and ``slots - 1`` growth values above it.
    """
    lower = search.lattice.lower
    return [Pick(lower, "start at lower", None, {})] + growth(search.lattice, lower, slots - 1)


def bisect_round(search: FrontierSearch, slots: int) -> list[Pick]:
    """A round of strategy ``bisect`` (also the fallback of a model round with nothing new).

    Args:
        search: the search.
        slots: how many values.

    Returns:
        Growth above the largest success until the first OOM, then the values that split
        the bracket.

    Raises:
        RuntimeError: no success below the smallest OOM (``propose`` does not call it then).
    """
    lo, hi = search.bracket()
    if lo is None:
        raise RuntimeError(NO_SUCCESS.format(search.axis))
    if hi is None:
        return growth(search.lattice, lo, slots)
    return split(search.lattice, lo, hi, slots, "")


def forced_round(search: FrontierSearch, slots: int) -> list[Pick]:
    """The model's round after two wrong predictions in a row.

    Args:
        search: the search.
        slots: how many values.

    Returns:
        Growth (no OOM yet) or the values that split the bracket, their reason saying why.

    Raises:
        RuntimeError: no success below the smallest OOM (``propose`` does not call it then).
    """
    lo, hi = search.bracket()
    if lo is None:
        raise RuntimeError(NO_SUCCESS.format(search.axis))
    if hi is None:
        return growth(search.lattice, lo, slots)
    return split(search.lattice, lo, hi, slots, ": two wrong predictions in a row")


def model_round(search: FrontierSearch, slots: int) -> list[Pick]:
    """Strategy ``model``: probe where the measured peaks put the edge.

    With one success (or no capacity known yet): ``one_success_round``. With two or more:
    ``bracket_round`` once an OOM held and asked at most the capacity; else on the quadratic
    axes ``band.band_round`` (the band of the fitted peak), on the others ``ramp.ramp_round``
    (the bounds the peaks give, a prediction tried once); ``gallop_up`` after a success measured
    above the capacity, ``gallop_down`` after an OOM at a value the peaks promised to fit.

    Args:
        search: the search; its successes' peaks (bytes) and ``capacity`` (bytes) make the
            model.
        slots: how many values.

    Returns:
        Up to ``slots`` values (the search takes ``slots``), the model in their ``detail``.

    Raises:
        RuntimeError: no success below the smallest OOM (``propose`` does not call it then).
    """
    lo, hi = search.bracket()
    raw = [
        (p.value, p.peak)
        for p in search.probes
        if p.outcome == "ok" and p.peak is not None and (hi is None or p.value < hi)
    ]
    points = rising(raw)
    quadratic = search.axis in QUADRATIC_AXES
    cap = search.capacity
    band = peak_band(points, quadratic) if len({x for x, _ in points}) >= 2 else None
    if lo is None:
        raise RuntimeError(NO_SUCCESS.format(search.axis))
    flat = len({p for _, p in raw}) == 1  # one success, or identical peaks (an exact plateau)
    if cap is None or (band is None if quadratic else flat):
        plateau = len({x for x, _ in points}) < len({x for x, _ in raw})
        return one_success_round(search, slots, lo, hi, points, plateau)
    top = hi if hi is not None else search.lattice.upper + search.lattice.step
    lo_peak = max(p for _, p in raw)
    if lo_peak > cap:
        return gallop_up(
            search, lo, hi, slots, f"a success at {lo} measured {lo_peak} B, more than the capacity {cap} B"
        )
    floor, ceiling = search.usable()
    if band is not None and ceiling is not None and floor is not None and floor < ceiling <= cap:
        # an OOM held and asked at most the capacity: memory the counter does not see takes
        # some; the edge is where the fitted load meets the usable capacity, not the nominal one
        return bracket_round(search, band, lo, top, slots, floor, ceiling)
    if band is not None and quadratic:
        return band_round(search, slots, band, cap, lo, hi, top)
    bounds = ramp_bounds(search, raw, cap, top)
    if hi is not None and bounds.promised >= hi:  # the measured peaks promised hi would fit
        gx, gp = bounds.guarantor
        cause = (
            f"OOM at {hi}, though peak({gx})={gp} B promises every value up to {bounds.promised} fits under the "
            f"capacity {cap} B when the peak grows at most proportionally: memory the peak counter does not see is "
            "taken, or the load grows faster"
        )
        first = GALLOP_FIRST * cap / bounds.slope if bounds.slope else 0.0
        return gallop_down(search, lo, hi, slots, max(search.lattice.down(first), search.lattice.step), cause)
    return ramp_round(search, slots, band, cap, lo, top, bounds)


def one_success_round(
    search: FrontierSearch, slots: int, lo: int, hi: int | None, points: list[tuple[int, int]], plateau: bool
) -> list[Pick]:
    """The model's round with one success (or no capacity known yet): a value that must still
    fit if the peak is at most proportional to the axis (to its square on ``QUADRATIC_AXES``),
    else growth or bisection.

    Args:
        search: the search.
        slots: how many values.
        lo: the largest success below the smallest OOM.
        hi: the smallest OOM, or None.
        points: the successes' (value, peak bytes), rising.
        plateau: whether the peak did not grow with the axis yet (equal peaks at distinct values).

    Returns:
        The bound's value and growth, or the split points of (lo, hi).
    """
    lattice, cap = search.lattice, search.capacity
    quadratic = search.axis in QUADRATIC_AXES
    power = 2 if quadratic else 1
    shape = "quadratic" if quadratic else "proportional"
    p_lo = max((p for x, p in points if x == lo), default=None)
    if hi is None and plateau:
        return growth(lattice, lo, slots)
    if hi is None and p_lo and cap:
        # peak(x) <= peak(lo) * (x/lo)^d for x >= lo when the load is a + b x (+ c x^2)
        # with a, b, c >= 0 (d = 1 for batch, 2 for context/width): x2 must still fit.
        guess = lattice.down(lo * (cap / p_lo) ** (1 / power))
        x2 = min(max(guess, lo + lattice.step), lattice.upper)
        why = (
            f"model: one success; peak({lo})={p_lo} B at most {shape}"
            f" in {search.axis} puts capacity {cap} B at >= {guess}"
        )
        return [Pick(x2, why, None, {"bound": guess})] + growth(lattice, lo, slots - 1, start=x2)
    if hi is None:
        return growth(lattice, lo, slots)
    floor, ceiling = search.usable()
    if p_lo and floor is not None and ceiling is not None and floor > p_lo:
        # an OOM held `floor` bytes, so at least that much is usable; the peak being at most
        # proportional to the axis (as above), floor / peak(lo) times lo still fits
        safe = lattice.down(lo * (floor / p_lo) ** (1 / power))
        if lo < safe < hi:
            why = (
                f"model: one success; an OOM held {floor} B, so that much is usable; peak({lo})={p_lo} B at "
                f"most {shape} in {search.axis} fits it at {safe}"
            )
            return [Pick(safe, why, None, {"usable_bytes": [floor, ceiling]})] + split(lattice, safe, hi, slots - 1, "")
    return split(lattice, lo, hi, slots, ": one success is not enough to fit")
