"""The model strategy on peaks that are flat at small values and then rise steeply (a training
step: the optimizer's state first, the activations later), on scripted oracles: the runs to the
exact edge, the bounds the peaks give, and when the search says memory is unseen."""

import math
import statistics

import pytest

from memsweep.sweeper.search import FrontierSearch, Lattice, run_search
from memsweep.sweeper.search.ramp import ramp_bounds

CAP = 256 * 2**20
UNSEEN = "does not see"  # the words of the search's claim that memory unseen by the counter is taken


def flat_then_steep(plateau: float, ramp_at_zero: float, edge: float, jitter: float = 0.0):
    """peak(x) = max(plateau + b/32 * x, ramp_at_zero + b * x) bytes, b such that the ramp meets
    the capacity at ``edge``, plus a deterministic wobble of ``jitter`` times b."""
    b = (CAP - ramp_at_zero) / edge

    def peak(x: int) -> int:
        return int(max(plateau + b / 32 * x, ramp_at_zero + b * x) + jitter * b * math.sin(7.3 * x))

    return peak


def oracle_of(peak, said: bool = True):
    """ok with the peak while it is at most the capacity; else an OOM that held and asked more
    than the capacity together (the capacity explains it), or says nothing."""

    def oracle(x: int):
        p = peak(x)
        if p <= CAP:
            return "ok", p, CAP
        return "oom", None, CAP, ((CAP - 4096, 2**20) if said else None)

    return oracle


def search_on(peak, said: bool = True, slots: int = 1):
    search = FrontierSearch("batch", Lattice.make(1, 65536), "model")
    result = run_search(search, oracle_of(peak, said), slots=slots)
    return search, result


TRAIN_SHAPES = [
    (plateau, share, edge, jitter)
    for plateau in (0.03, 0.1, 0.3)
    for share in (0.6, 0.75, 0.9)
    for edge in (1000, 5000, 12000, 40000)
    for jitter in (0.0, 0.1)
]


def test_flat_then_steep_peaks_reach_the_exact_edge_within_eight_runs_mostly():
    runs = []
    for plateau, share, edge, jitter in TRAIN_SHAPES:
        search, result = search_on(flat_then_steep(plateau * CAP, share * plateau * CAP, edge, jitter))
        assert result.exact, (plateau, share, edge, jitter, result.status)
        assert result.runs_used <= 9, (plateau, share, edge, jitter, [(p.value, p.outcome) for p in search.probes])
        assert not any(UNSEEN in p.reason for p in search.probes)
        runs.append(result.runs_used)
    assert statistics.median(runs) <= 7
    assert sum(r <= 8 for r in runs) >= 0.9 * len(runs)


@pytest.mark.parametrize("fixed", [0.05, 0.3, 0.8])
@pytest.mark.parametrize("edge", [37, 900, 20000])
@pytest.mark.parametrize("said", [True, False])
def test_exactly_fixed_plus_linear_never_claims_unseen_memory(fixed, edge, said):
    b = (CAP - fixed * CAP) / (edge + 0.5)
    search, result = search_on(lambda x: int(fixed * CAP + b * x), said)
    assert result.exact and result.max_ok == edge
    assert result.runs_used <= 6
    assert not any(UNSEEN in p.reason for p in search.probes)


def test_parallel_rounds_stay_exact_on_flat_then_steep_peaks():
    for plateau, share, edge, jitter in TRAIN_SHAPES[::5]:
        _, result = search_on(flat_then_steep(plateau * CAP, share * plateau * CAP, edge, jitter), slots=3)
        assert result.exact, result.status


def test_an_oom_below_what_the_peaks_promise_is_said_to_be_unseen_memory():
    """A load at 10 % of the capacity (and a byte per value) fits any value up to about 10 times
    one it ran at; an OOM from 200 on (memory the counter does not see) contradicts that, and only
    then is it said."""

    def oracle(x: int):
        return ("ok", CAP // 10 + x, CAP) if x < 200 else ("oom", None, CAP)

    search = FrontierSearch("batch", Lattice.make(1, 65536), "model")
    result = run_search(search, oracle)
    assert result.exact and result.max_ok == 199
    claims = [p for p in search.probes if UNSEEN in p.reason]
    assert claims and all("promises" in p.reason for p in claims)


def test_the_bounds_are_the_proportional_promise_and_the_convex_secant():
    search = FrontierSearch("batch", Lattice.make(1, 65536), "model")
    mib = 2**20
    # peaks 64 MiB at 10 and 20 (a plateau), 128 MiB at 100 (the ramp has begun); one byte more
    # each, so that they move by single bytes (no allocator granularity)
    points = [(10, 64 * mib + 1), (20, 64 * mib + 1), (100, 128 * mib + 1)]
    bounds = ramp_bounds(search, points, CAP, 65537)
    assert bounds.lower == 199  # just under 100 * 256 / 128: every load whose peak/x does not grow fits there
    assert bounds.upper == 260  # where the line through (20, 64) and (100, 128) MiB reaches 256 MiB
    assert bounds.kinked and not bounds.straight  # the line overshoots: the lower bound is probed next
    assert bounds.predicted == pytest.approx(260, abs=1e-3)
    assert bounds.promised < bounds.lower  # an OOM must fall clearly below the promise to contradict it
