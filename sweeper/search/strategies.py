"""The strategies: which values a round of the search proposes (one small function each), as
``Pick`` lists that ``FrontierSearch.propose`` turns into probes.

``seed_round`` (a dry run's predicted edge), ``first_round``, ``bisect_round`` (strategy
``bisect``: x2 growth, then bisection), ``model_round`` (strategy ``model``: where the band of
the fitted peak crosses the capacity, ``one_success_round`` and ``band_round``, or the bracket
of the usable capacity, ``sweeper.search.bracket``; ``refit_round`` after an OOM the capacity
explains but the fit did not expect, ``gallop_down``/``gallop_up`` when the probes contradict
the fit otherwise) and ``forced_round`` after two wrong predictions in a row.

To add a strategy: write its round as ``(search, slots) -> list[Pick]`` here, add its name
to ``STRATEGIES`` and dispatch to it in ``FrontierSearch.propose``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memsweep.estimator.fit import crossing

from .bracket import bracket_round
from .lattice import QUADRATIC_AXES, Pick
from .moves import fill, growth, pair, split
from .peaks import Band, Crossings, peak_band, rising

if TYPE_CHECKING:
    from .state import FrontierSearch

STRATEGIES = ("model", "bisect")
# Away from an OOM the model did not expect, each step is this many times the last one.
GALLOP = 4
# First step down from an OOM the model did not expect: what this fraction of the capacity
# is worth on the axis (unseen overheads are a few percent of the capacity).
GALLOP_FIRST = 1 / 128
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
    """Strategy ``model``: probe where the band of the fitted peak crosses the capacity.

    With one success (or no capacity known yet): ``one_success_round``. With two or more:
    ``band_round``, or ``bracket_round`` once an OOM held and asked at most the capacity, or
    ``refit_round`` after an OOM the fit did not expect that held and asked more than it.

    Args:
        search: the search; its successes' peaks (bytes) and ``capacity`` (bytes) make the
            model.
        slots: how many values.

    Returns:
        Up to ``slots`` values (more when the fill adds some; the search takes ``slots``),
        with the model's prediction (``expected``) for the pair at the edge and the model
        in their ``detail`` (fit coefficients and noise in bytes, predicted crossing and
        range).

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
    distinct = sorted({x for x, _ in points})
    quadratic = search.axis in QUADRATIC_AXES
    cap = search.capacity
    band = peak_band(points, quadratic) if len(distinct) >= 2 else None
    if lo is None:
        raise RuntimeError(NO_SUCCESS.format(search.axis))
    if band is None or cap is None:
        plateau = len(distinct) < len({x for x, _ in raw})
        return one_success_round(search, slots, lo, hi, points, plateau)
    top = hi if hi is not None else search.lattice.upper + search.lattice.step
    lo_peak = max(p for _, p in points)
    if lo_peak > cap:
        return gallop_up(
            search, lo, hi, slots, f"a success at {lo} measured {lo_peak} B, more than the capacity {cap} B"
        )
    floor, ceiling = search.usable()
    if ceiling is not None and floor is not None and floor < ceiling <= cap:
        # an OOM held and asked at most the capacity: memory the counter does not see takes
        # some; the edge is where the fitted load meets the usable capacity, not the nominal one
        return bracket_round(search, band, lo, top, slots, floor, ceiling)
    said = oom_said_over(search, hi, cap) if hi is not None and band.high(hi) <= cap else None
    if hi is not None and said is not None:  # the capacity explains the OOM: the fit, not hidden memory, is wrong
        return refit_round(search, lo, hi, slots, said)
    return band_round(search, slots, band, cap, lo, hi, top)


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
        return gallop_down(search, lo, hi, slots, max(first, m))
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


def gallop_down(search: FrontierSearch, lo: int, hi: int, slots: int, first: int) -> list[Pick]:
    """Step down from an OOM the model did not expect.

    The capacity is too high for the probes: the edge is below the smallest OOM ``hi``, by
    an unknown overhead. Step down from it by ``first`` (what GALLOP_FIRST of the capacity
    is worth on the axis), then GALLOP times the last gap between OOMs, never below the
    bracket's midpoint (so never much slower than bisection).

    Args:
        search: the search.
        lo: the largest success below ``hi``.
        hi: the smallest OOM.
        slots: how many values.
        first: the first step down (lattice units of the axis).

    Returns:
        The value below ``hi`` and fill values; nothing when (lo, hi) holds no value.
    """
    lattice = search.lattice
    ooms = [v for v in search.values("oom") if v >= hi]
    step = GALLOP * (ooms[1] - ooms[0]) if len(ooms) > 1 else first
    mids = lattice.split(lo, hi, 2)
    if not mids:
        return []
    v = max(lattice.down(hi - step), mids[0])
    why = (
        f"model: OOM at {hi} where even the pessimistic fit stays under the capacity {search.capacity} B, "
        "and the OOM did not say what it held and asked: the peak grows faster than the fit, or memory the "
        "peak counter does not see is taken; "
        + (f"bisection of ({lo}, {hi})" if v == mids[0] else f"step down {hi - v} from it")
    )
    return [Pick(v, why, None, {})] + fill(lattice, lo, hi, slots - 1, v)


def gallop_up(search: FrontierSearch, lo: int, hi: int | None, slots: int, cause: str) -> list[Pick]:
    """Step up from a success the model did not expect.

    A success measured more than the capacity: the edge is above the largest success
    ``lo`` by an unknown amount. Step up by one lattice step, then GALLOP times the last gap
    between successes, never past the bracket's midpoint.

    Args:
        search: the search.
        lo: the largest success.
        hi: the smallest OOM, or None.
        slots: how many values.
        cause: what the model did not expect, for the reason.

    Returns:
        The value above ``lo`` and fill values; nothing when (lo, hi) holds no value.
    """
    lattice = search.lattice
    oks = [v for v in search.values("ok") if v <= lo]
    step = GALLOP * (oks[-1] - oks[-2]) if len(oks) > 1 else lattice.step
    v = min(lo + step, lattice.upper)
    if hi is not None:
        mids = lattice.split(lo, hi, 2)
        if not mids:
            return []
        v = min(v, mids[0])
    why = f"model: {cause}; " + (
        f"bisection of ({lo}, {hi})" if hi is not None and v == mids[0] else f"step up {v - lo} from it"
    )
    return [Pick(v, why, None, {})] + fill(lattice, lo, hi, slots - 1, v)
