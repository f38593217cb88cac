"""The margin's edge: once the capacity's edge is found, the largest value that ran ok whose
measured peak leaves the margin (``peak <= capacity - margin``), found among real runs.

The report recommends the largest value whose every run ran ok and whose peak leaves the margin
(``analysis.report.stats``); the search measures the values around where the peaks cross the
capacity minus the margin, so that this value is a run next to the margin's edge on the lattice,
not a value far below it that happened to be measured on the way to the capacity's edge.

The margin bracket is ``(a, b)``: ``a`` the largest success whose peak leaves the margin, ``b`` the
smallest success (below the smallest OOM) whose peak does not. Each round aims at where the line
through the two peaks reaches the level (a secant), and bisects when two rounds did not halve the
bracket (the peaks are not straight in the value: attention grows with the square of the context).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lattice import Pick
from .moves import split

if TYPE_CHECKING:
    from .state import FrontierSearch


def margin_level(search: FrontierSearch) -> int | None:
    """The capacity minus the margin, in bytes.

    Args:
        search: the search, with its ``capacity`` (bytes) and ``margin_of`` (capacity -> margin bytes).

    Returns:
        capacity - margin; None without a margin, a capacity, or with a margin that leaves nothing.
    """
    if search.margin_of is None or search.capacity is None:
        return None
    margin = search.margin_of(search.capacity)
    if margin is None or margin >= search.capacity:
        return None
    return search.capacity - margin


def measured(search: FrontierSearch) -> list[tuple[int, int]]:
    """The successes below the smallest OOM with a measured peak (``Probe.run_peak``, bytes), by value."""
    _, hi = search.bracket()
    return sorted(
        (p.value, p.run_peak)
        for p in search.probes
        if p.outcome == "ok" and p.run_peak is not None and (hi is None or p.value < hi)
    )


def margin_bracket(search: FrontierSearch) -> tuple[int | None, int | None] | None:
    """The bracket of the margin's edge among the measured successes.

    Args:
        search: the search.

    Returns:
        (a, b): ``b`` the smallest success whose peak is above the level (None: none is), ``a`` the
        largest success below ``b`` whose peak is at most the level (None: none is); None when no
        margin is searched (``margin_level``).
    """
    level = margin_level(search)
    if level is None:
        return None
    points = measured(search)
    over = [v for v, p in points if p > level]
    b = over[0] if over else None
    under = [v for v, p in points if p <= level and (b is None or v < b)]
    return (under[-1] if under else None), b


def margin_done(search: FrontierSearch) -> bool:
    """Whether the margin's edge is found: no margin searched; no success above the level (the
    largest success leaves the margin: the next value up is the capacity's edge); or no untried
    lattice value between the bracket's ends (below ``b`` down to the lower bound when none
    leaves the margin)."""
    bracket = margin_bracket(search)
    if bracket is None or bracket[1] is None:
        return True
    a, b, m = bracket[0], bracket[1], search.lattice.step
    return not search.untried(search.lattice.lower if a is None else a + m, b - m)


def margin_round(search: FrontierSearch, slots: int) -> list[Pick]:
    """The values that narrow the margin bracket: the secant's value and the one above it, or the
    bracket's split points when two rounds did not halve it.

    Args:
        search: the search, its capacity's edge found and its margin bracket open (``margin_done`` false).
        slots: how many values.

    Returns:
        Up to ``slots`` values strictly inside the bracket (``expected`` None: a success or an OOM
        both fit the model), their reason naming the level and the peaks aimed from.
    """
    bracket, level = margin_bracket(search), margin_level(search)
    if bracket is None or bracket[1] is None or level is None:
        return []
    a, b = bracket[0], bracket[1]
    lattice, m = search.lattice, search.lattice.step
    peaks = dict(measured(search))
    low = lattice.lower - m if a is None else a  # exclusive lower end of the bracket
    search.margin_gaps.append(b - low)
    stalled = len(search.margin_gaps) >= 3 and b - low > search.margin_gaps[-3] / 2
    over = [v for v in sorted(peaks) if v >= b]
    start = (a, peaks[a]) if a is not None else (over[1], peaks[over[1]]) if len(over) > 1 else None
    if stalled or start is None or peaks[b] == start[1]:
        why = f": margin edge, peak({b})={peaks[b]} B above capacity - margin = {level} B"
        return split(lattice, low, b, slots, why + (" (two rounds did not halve it)" if stalled else ""))
    x0, p0 = start
    guess = x0 + (level - p0) * (b - x0) / (peaks[b] - p0)
    v = min(max(lattice.down(guess), low + m), b - m)
    why = (
        f"margin edge: the line through peak({x0})={p0} B and peak({b})={peaks[b]} B reaches capacity - margin "
        f"= {level} B at {search.axis}={guess:.1f}; probe "
    )
    sides = ((v, "just below"), (v + m, "just above")) if lattice.down(guess) == v else ((v, f"next to {low}"),)
    picks = [Pick(x, why + side, None, {"margin_level_bytes": level}) for x, side in sides if low < x < b]
    return picks + split(lattice, low, b, max(0, slots - len(picks)), ": margin edge")
