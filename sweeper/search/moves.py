"""The moves a round is made of, shared by the strategies (``sweeper.search.strategies``) and
the model's bracket round (``sweeper.search.bracket``): geometric growth, the split points of
a bracket, fill values for spare slots, and the pair of values around a predicted edge.
Values are lattice values of the searched axis; bytes are the peaks' units.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .lattice import Lattice, Pick
from .peaks import Band

if TYPE_CHECKING:
    from .state import FrontierSearch

# Away from an OOM (a success) the model did not expect, each step is this many times the last one.
GALLOP = 4


def growth(lattice: Lattice, lo: int, count: int, start: int | None = None) -> list[Pick]:
    """Geometric growth (x2) above ``lo`` (no OOM yet).

    Args:
        lattice: the values allowed.
        lo: the largest success (named in the reason).
        count: at most this many values.
        start: grow from this value instead of ``lo``.

    Returns:
        Up to ``count`` values, each twice the last rounded up to the lattice, the last one
        ``upper`` when it is reached; each reason names its true factor from the value grown
        from (``start``, or ``lo``), e.g. x4 for the second value of one round.
    """
    base = start if start is not None else lo
    origin = f"{base}" if base == lo else f"{base}, proposed this round"
    picks, x = [], base
    for _ in range(count):
        doubled = lattice.up(2 * x)
        x = min(doubled, lattice.upper)
        factor = f"x{x // base}" if x % base == 0 else f"x{x / base:.3g}"
        clamp = f", clamped to the upper bound {lattice.upper}" if x < doubled else ""
        picks.append(Pick(x, f"growth {factor} from {origin}{clamp} (no OOM yet)", None, {}))
        if x >= lattice.upper:
            break
    return picks


def split(lattice: Lattice, lo: int, hi: int, slots: int, why: str) -> list[Pick]:
    """The values that split the bracket (lo, hi) into ``slots + 1`` parts.

    Each reason says what the values are: the bisection midpoint, a split into as many parts as
    values were found (``slots`` + 1 when the bracket holds enough), or every value inside.

    Args:
        lattice: the values allowed.
        lo: the largest success below ``hi``.
        hi: the smallest OOM.
        slots: how many values (one: the bisection midpoint).
        why: appended to their reason.

    Returns:
        Up to ``slots`` values strictly inside (lo, hi).
    """
    values = lattice.split(lo, hi, slots + 1)
    inside = (hi - lo) // lattice.step - 1  # lattice values strictly inside (lo, hi)
    if len(values) == inside:
        label = f"the only value inside ({lo}, {hi})" if inside == 1 else f"all {inside} values inside ({lo}, {hi})"
    elif len(values) == 1:
        label = f"bisection of ({lo}, {hi})"
    else:
        label = f"split of ({lo}, {hi}) into {len(values) + 1} parts"
    return [Pick(v, f"{label}{why}", None, {}) for v in values]


def fill(lattice: Lattice, lo: int, hi: int | None, count: int, above: int) -> list[Pick]:
    """Extra values for a round with spare slots.

    Args:
        lattice: the values allowed.
        lo: the largest success.
        hi: the smallest OOM, or None when there is none yet.
        count: the spare slots.
        above: with no OOM yet, grow from this value.

    Returns:
        Up to ``count`` values: the split points of (lo, hi), or growth above ``above``.
    """
    if count <= 0:
        return []
    if hi is not None:
        return split(lattice, lo, hi, count, "")
    return growth(lattice, lo, count, start=above)


def pair(
    lattice: Lattice,
    band: Band,
    x_star: float,
    bounds: tuple[int, int, int | None],
    level: float,
    why: Callable[[str], str],
    detail: dict,
    slots: int,
) -> list[Pick]:
    """The lattice values just below and just above ``x_star``, where the central fit reaches
    ``level`` bytes (``model_round``: the capacity; ``bracket_round``: the usable bracket's middle),
    then ``fill`` for the slots the pair leaves.

    Args:
        lattice: the values allowed.
        band: the fitted peak.
        x_star: where the central fit reaches ``level``.
        bounds: (lo, top, hi): the largest success below the smallest OOM; the smallest OOM (or
            one step past the upper bound); what ``fill`` splits up to (None: grow instead).
        level: the bytes the fit is held against for each value's ``expected``.
        why: the reason of a pick, given its side ("below" or "above").
        detail: the model's detail, shared by both picks.
        slots: the values the round may propose.

    Returns:
        The picks of the pair strictly inside (lo, top), "ok" expected where the fit is at most
        ``level``, "oom" elsewhere; then ``fill``'s values above the lower one of the pair.
    """
    lo, top, hi = bounds
    below = min(max(lattice.down(x_star), lo), top - lattice.step)
    picks = [
        Pick(v, why(side), "ok" if band.fit(v) <= level else "oom", detail)
        for v, side in ((below, "below"), (below + lattice.step, "above"))
        if lo < v < top
    ]
    return picks + fill(lattice, lo, hi, slots - len(picks), below + lattice.step)


def gallop_down(search: FrontierSearch, lo: int, hi: int, slots: int, first: int, cause: str) -> list[Pick]:
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
        cause: what the OOM contradicts, for the reason.

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
    why = f"model: {cause}; " + (f"bisection of ({lo}, {hi})" if v == mids[0] else f"step down {hi - v} from it")
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
