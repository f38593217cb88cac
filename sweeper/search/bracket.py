"""The model strategy once an OOM said what it held and asked: solve for the value
against the bracket of the usable capacity and the fitted load (``bracket_round``), and the
candidate to probe among the values the edge may be (``next_offset``).

Units: peaks, capacities and the bracket are bytes; values are lattice values of the axis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memsweep.estimator.fit import crossing

from .lattice import Pick
from .moves import pair, split
from .peaks import Band, Crossings

if TYPE_CHECKING:
    from .state import FrontierSearch


def bracket_round(
    search: FrontierSearch, band: Band, lo: int, top: int, slots: int, floor: int, ceiling: int
) -> list[Pick]:
    """Strategy ``model`` once an OOM said what it held and asked: the fitted load against the
    bracket of the usable capacity.

    The usable capacity C is in [floor, ceiling) (``FrontierSearch.usable``). The edge lies
    between where the pessimistic fit (``band.high``) reaches ``floor`` and where the optimistic
    fit (``band.low``) reaches ``ceiling``; the lattice values in between, clipped to (lo, top),
    are the candidates. One probe bisects them, leaning to the OOM side (``next_offset``); more
    go to ``several_picks``. Two rounds that halved neither (lo, hi) nor the candidates, or a
    fit that disagrees with the bracket, force a bisection of (lo, top).

    Args:
        search: the search.
        band: the fitted peak (``peak_band``), bytes against the axis.
        lo: the largest success below the smallest OOM.
        top: the smallest OOM.
        slots: how many values.
        floor, ceiling: the usable capacity is in [floor, ceiling) (bytes).

    Returns:
        Up to ``slots`` values strictly inside (lo, top), the model and the candidates in their
        ``detail``; ``expected`` only where the model is certain (under the floor by the
        pessimistic fit: ``ok``; at or over the ceiling by the optimistic fit: ``oom``).
    """
    lattice, m = search.lattice, search.lattice.step
    x_opt = crossing(band.low, ceiling, lo, top)
    if x_opt is None:  # the fit puts lo above the ceiling: it does not describe these runs
        return split(lattice, lo, top, slots, f": the fit disagrees with the usable capacity < {ceiling} B")
    x_pess, middle = min(crossing(band.high, floor, lo, top) or float(lo), x_opt), (floor + ceiling) / 2
    x_star = min(max(crossing(band.fit, middle, lo, top) or float(lo), x_pess), x_opt)
    first, last = max(lattice.down(x_pess), lo), min(lattice.down(x_opt), top - m)
    bracket = usable_text(floor, ceiling)
    if last < first:  # cannot happen with a consistent model; bisect rather than trust it
        return split(lattice, lo, top, slots, f": {bracket}, but the fit puts the edge outside ({lo}, {top})")
    count = (last - first) // m + 1
    real = Crossings(band, middle, lo, top, f"beyond the smallest OOM {top}")  # for the log: not stopped at top
    detail = {
        "model": band.kind,
        "fit": band.coefficients,
        "noise_bytes": band.noise,
        "capacity_bytes": search.capacity,
        "usable_bytes": [floor, ceiling],
        "predicted_crossing": real.central,
        "predicted_range": [x_pess, x_opt],
        "past_bound": real.past,
        "candidates": [first, last],
    }
    if search.stalled() and not halved(search, count):
        return split(lattice, lo, top, slots, f": {bracket}, but two rounds did not halve the range")
    if slots == 1:  # bisect the candidates, leaning to the likelier OOM (next_offset)
        v = first + next_offset(count, first == lo, last + m == top) * m
        expected = "ok" if band.high(v) <= floor else "oom" if band.low(v) >= ceiling else None
        why = (
            f"model: {bracket}; {band.kind} fit (+- {band.noise:.0f} B) puts the edge in [{first}, {last}] "
            f"({count} values); bisect them, leaning to the OOM side"
        )
        return [Pick(v, why, expected, detail)]
    return several_picks(search, band, (lo, first, last, top), (x_pess, x_star, x_opt), slots, (floor, ceiling), detail)


def several_picks(
    search: FrontierSearch,
    band: Band,
    span: tuple[int, int, int, int],
    crossings: tuple[float, float, float],
    slots: int,
    usable: tuple[int, int],
    detail: dict,
) -> list[Pick]:
    """``bracket_round`` with ``slots`` > 1: the split points of the candidates, or with one or
    two candidates the pair around where the central fit reaches the bracket's middle.

    Args:
        search: the search.
        band: the fitted peak (``peak_band``), bytes against the axis.
        span: (lo, first, last, top): the runs' bracket and the candidates' ends (lattice values).
        crossings: where the pessimistic, central and optimistic fits reach the bracket (values).
        slots: how many values.
        usable: (floor, ceiling) of the usable capacity (bytes).
        detail: the model, logged with each value.

    Returns:
        Values strictly inside (lo, top).
    """
    lattice, m = search.lattice, search.lattice.step
    lo, first, last, top = span
    x_pess, x_star, x_opt = crossings
    floor, ceiling = usable
    middle = (floor + ceiling) / 2
    bracket = usable_text(floor, ceiling)
    if last - first > m:  # too wide for a pair: split the predicted range
        why = (
            f"model: {bracket}; edge predicted in [{x_pess:.1f}, {x_opt:.1f}] ({band.kind} fit +- "
            f"{band.noise:.0f} B); split it"
        )
        values = lattice.split(first, last + m, slots + 1)
        return [Pick(v, why, None, detail) for v in values if lo < v < top]
    real = Crossings(band, middle, lo, top, f"beyond the smallest OOM {top}")

    def why_pair(side: str) -> str:
        return (
            f"model: {bracket}; {band.kind} fit reaches its middle at {search.axis}={real.central_text()}"
            f"{real.past_text()}; probe just {side}"
        )

    return pair(lattice, band, x_star, (lo, top, top), middle, why_pair, detail, slots)


def usable_text(floor: int, ceiling: int) -> str:
    """The bracket of the usable capacity (bytes), for a probe's reason."""
    return f"usable capacity in [{floor}, {ceiling}) B (peaks of the successes, what the OOMs held and asked)"


def halved(search: FrontierSearch, count: int) -> bool:
    """Whether the model's candidates for the edge are at most half of what they were two
    rounds ago (``bracket_round``: the model is narrowing the edge as fast as bisection,
    though the bracket of runs (lo, hi) may not have halved: its ends lie far apart).

    Args:
        search: the search; its probes' ``candidates`` detail ([first, last] lattice values).
        count: the number of candidates now.

    Returns:
        True when a probe of the round two before this one logged candidates and ``count``
        is at most half of theirs.
    """
    m = search.lattice.step
    before = [
        p.detail["candidates"] for p in search.probes if p.round == search.rounds - 2 and "candidates" in p.detail
    ]
    return any(count <= ((last - first) // m + 1) / 2 for first, last in before)


def next_offset(count: int, low_run: bool, high_run: bool) -> int:
    """Which of ``count`` candidates for the edge to probe next (``bracket_round``).

    The candidates are ``first + k * multiple_of``, k = 0 .. count - 1; the search ends when the
    edge and the value above it have both run, so a single candidate still costs a run for
    each of the two not yet run. With more, probing offset j leaves count - j candidates (a
    success: the edge is at or above it) or j (an OOM). With every candidate as likely, the
    expected runs are those of a binary search tree over them, the fewest when every leaf is
    at depth floor(log2 count) or the next one: when each side keeps at most the largest power
    of two below ``count`` (h) and at least h / 2. The OOM side j is given the most it can take
    in that range, min(h, count - h / 2): an OOM tells more than a success (its A + R).
    tests/test_frontier_bracket.py checks against the exhaustive optimum that no offset
    expects fewer runs.

    Args:
        count: the number of candidates (at least 1).
        low_run: the lowest candidate has run (a success: it is the bracket's lo).
        high_run: the value above the highest has run (an OOM: it is the bracket's hi).

    Returns:
        The offset to probe: with one candidate 0 (it has not run) or 1 (the value above it);
        with more, an offset in [1, count - 1].

    Raises:
        ValueError: ``count`` below 1, or one candidate whose value and upper neighbour have
            both run (nothing is left to probe).
    """
    if count < 1:
        raise ValueError(f"count {count!r}: expected at least one candidate")
    if count == 1:
        if low_run and high_run:
            raise ValueError("one candidate whose value and upper neighbour have both run: nothing to probe")
        return 1 if low_run else 0
    h = 1 << ((count - 1).bit_length() - 1)  # the largest power of two below count
    return min(h, count - h // 2)
