"""The moves a round is made of, shared by the strategies (``sweeper.search.strategies``) and
the model's bracket round (``sweeper.search.bracket``): geometric growth, the split points of
a bracket, fill values for spare slots, and the pair of values around a predicted edge.
Values are lattice values of the searched axis; bytes are the peaks' units.
"""

from __future__ import annotations

from collections.abc import Callable

from .lattice import Lattice, Pick
from .peaks import Band


def growth(lattice: Lattice, lo: int, count: int, start: int | None = None) -> list[Pick]:
    """Geometric growth (x2) above ``lo`` (no OOM yet).

    Args:
        lattice: the values allowed.
        lo: the largest success (named in the reason).
        count: at most this many values.
        start: grow from this value instead of ``lo``.

    Returns:
        Up to ``count`` values, each twice the last rounded up to the lattice, the last one
        ``upper`` when it is reached.
    """
    picks, x = [], start if start is not None else lo
    for _ in range(count):
        x = min(lattice.up(2 * x), lattice.upper)
        picks.append(Pick(x, f"growth x2 from {lo} (no OOM yet)", None, {}))
        if x >= lattice.upper:
            break
    return picks


def split(lattice: Lattice, lo: int, hi: int, slots: int, why: str) -> list[Pick]:
    """The values that split the bracket (lo, hi) into ``slots + 1`` parts.

    Args:
        lattice: the values allowed.
        lo: the largest success below ``hi``.
        hi: the smallest OOM.
        slots: how many values (one: the bisection midpoint).
        why: appended to their reason.

    Returns:
        Up to ``slots`` values strictly inside (lo, hi).
    """
    parts = slots + 1
    values = lattice.split(lo, hi, parts)
    label = "bisection" if parts == 2 else f"split ({lo}, {hi}) into {parts} parts"
    return [Pick(v, f"{label} of ({lo}, {hi}){why}", None, {}) for v in values]


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
