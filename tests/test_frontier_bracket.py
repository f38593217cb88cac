"""The model's probe among the candidates for the edge (sweeper/search/bracket.py
``next_offset``), against the exhaustive optimum of the expected runs and against walking
every possible edge."""

from functools import cache

import pytest

from memsweep.sweeper.search.bracket import next_offset

FLAGS = [(False, False), (False, True), (True, False), (True, True)]


@cache
def optimum(count: int, low_run: bool, high_run: bool) -> float:
    """The fewest expected runs until the edge and its upper neighbour have both run, every
    candidate equally likely, over every choice of probe (the reference, by exhaustion)."""
    if count == 1:
        return (not low_run) + (not high_run)
    return 1 + min(cost(count, j, low_run, high_run) for j in range(1, count))


def cost(count: int, j: int, low_run: bool, high_run: bool) -> float:
    """Expected runs after probing offset j, then probing optimally."""
    return ((count - j) * optimum(count - j, True, high_run) + j * optimum(j, low_run, True)) / count


def walk(count: int, edge: int, low_run: bool, high_run: bool) -> int:
    """Runs ``next_offset`` takes when the edge is candidate ``edge`` (0-based) of ``count``."""
    lo, hi, runs = 0, count - 1, 0  # the candidates still possible, as offsets
    ran = {0} if low_run else set()
    if high_run:
        ran.add(count)
    while not (lo == hi and lo in ran and lo + 1 in ran):
        offset = lo + next_offset(hi - lo + 1, lo in ran, hi + 1 in ran)
        assert lo <= offset <= hi + 1 and offset not in ran
        ran.add(offset)
        runs += 1
        if offset <= edge:  # fits: the edge is at or above it
            lo = offset
        else:
            hi = offset - 1
    return runs


def test_one_or_two_candidates_by_hand():
    assert next_offset(1, False, True) == 0 and next_offset(1, True, False) == 1
    # two candidates: the upper one (with the OOM above them known, it ends the search in one
    # run when it fits; 1.5 runs expected, where the lower one first takes 2)
    assert next_offset(2, False, True) == 1 and optimum(2, False, True) == 1.5
    with pytest.raises(ValueError):
        next_offset(1, True, True)
    with pytest.raises(ValueError):
        next_offset(0, False, False)


@pytest.mark.parametrize("low_run, high_run", FLAGS)
def test_no_probe_expects_fewer_runs_and_the_walk_takes_what_is_expected(low_run, high_run):
    for count in range(2, 130):
        j = next_offset(count, low_run, high_run)
        assert 1 <= j <= count - 1
        assert cost(count, j, low_run, high_run) == pytest.approx(optimum(count, low_run, high_run) - 1)
        # the highest such offset: the likelier OOM
        assert all(
            cost(count, k, low_run, high_run) > cost(count, j, low_run, high_run) + 1e-9 for k in range(j + 1, count)
        )
    for count in range(2, 40):
        runs = [walk(count, e, low_run, high_run) for e in range(count)]
        assert sum(runs) / count == pytest.approx(optimum(count, low_run, high_run))


def test_many_candidates_take_about_log2_runs():
    count = 70_000
    worst = max(walk(count, e, False, False) for e in (0, 1, count // 3, count // 2, count - 2, count - 1))
    assert worst <= count.bit_length() + 2
