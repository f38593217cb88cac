"""The frontier search against scripted oracles: no processes, no Hydra (sweeper/search/)."""

import math
import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from memsweep.conf.contract import SpecError
from memsweep.estimator.fit import crossing
from memsweep.sweeper.search import FrontierSearch, Lattice, Reading, fit_peak, peak_band, run_search
from memsweep.sweeper.search.peaks import MAX_GRANULARITY

MiB = 2**20
CAP = 1024 * MiB


def affine(a, b, cap=CAP, limit=None):
    """ok with peak a + b*x while that is <= limit (default: the capacity)."""
    limit = cap if limit is None else limit

    def oracle(x):
        p = int(a + b * x)
        return ("ok", p, cap) if p <= limit else ("oom", None, cap)

    return oracle


def scripted(outcomes: dict, default="ok", peak=lambda x: 1000 * x, cap=CAP):
    """Outcome by value from ``outcomes`` (value -> outcome, or a callable), else ``default``."""

    def oracle(x):
        o = outcomes(x) if callable(outcomes) else outcomes.get(x, default)
        return o, (peak(x) if o == "ok" else None), cap

    return oracle


def search(strategy="model", lower=1, upper=65536, multiple_of=1, axis="batch"):
    return FrontierSearch(axis, Lattice.make(lower, upper, multiple_of), strategy)


def tried(s, outcome):
    return {p.value for p in s.probes if p.outcome == outcome}


# ---- lattice and fit ----------------------------------------------------------------------


def test_lattice_rounds_bounds_inwards_and_refuses_empty_ranges():
    lat = Lattice.make(1, 1000, 8)
    assert (lat.lower, lat.upper, lat.step) == (8, 1000, 8)
    assert Lattice.make(10, 100, 16) == Lattice(16, 96, 16)
    assert lat.down(17) == 16 and lat.up(17) == 24
    with pytest.raises(SpecError, match="upper"):
        Lattice.make(9, 15, 16)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(SpecError):
            Lattice.make(bad, 100, 1)
    with pytest.raises(SpecError, match="multiple_of"):
        Lattice.make(1, 100, 0)


def test_lattice_split_gives_interior_points():
    lat = Lattice.make(1, 1000, 1)
    assert lat.split(10, 20, 2) == [15]
    assert lat.split(0, 100, 4) == [25, 50, 75]
    assert lat.split(10, 11, 2) == [] and lat.split(10, 12, 5) == [11]
    assert Lattice.make(8, 800, 8).split(8, 40, 2) == [24]


def test_fit_peak_affine_quadratic_and_too_few_points():
    assert fit_peak([(4, 100)]) is None
    f = fit_peak([(1, 110), (3, 130), (3, 130), (10, 200)])
    assert f.c == 0 and f.a == pytest.approx(100) and f.b == pytest.approx(10)
    q = fit_peak([(x, 5 + 2 * x + 3 * x * x) for x in (1, 4, 9, 20)], quadratic=True)
    assert (q.a, q.b, q.c) == pytest.approx((5, 2, 3))
    # no square term where the data has none
    assert fit_peak([(x, 7 + 2 * x) for x in (1, 4, 9)], quadratic=True).c == 0


def test_crossing_and_band():
    assert crossing(lambda x: 10 * x, 55, 0, 100) == pytest.approx(5.5)
    assert crossing(lambda x: 10 * x, 5000, 0, 100) == 100
    assert crossing(lambda x: 10 * x, 5, 1, 100) is None
    points = [(1, 4 * MiB), (100, 200 * MiB)]  # multiples of 2 MiB: resolution 2 MiB
    band = peak_band(points)
    assert band.noise == MAX_GRANULARITY and band.low(100) < band.fit(100) < band.high(100)
    assert band.high(1000) - band.fit(1000) > band.high(100) - band.fit(100)  # widens away from the data
    two = peak_band([(10, 1000 + 100), (20, 1000 + 400)], quadratic=True)  # secant .. pure square
    assert two.kind == "affine..square" and two.low(40) < two.high(40)


# ---- scripted oracles ---------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["model", "bisect"])
def test_all_probes_fit_reports_no_edge_below_the_upper_bound(strategy):
    s = search(strategy, 1, 4096)
    r = run_search(s, affine(0, 1))
    assert r.upper_reached and r.max_ok == 4096 and r.min_oom is None and not r.exact
    assert r.status.startswith("edge not found below the upper bound") and tried(s, "oom") == set()
    assert 4096 in tried(s, "ok")


@pytest.mark.parametrize("strategy", ["model", "bisect"])
def test_first_probe_out_of_memory_ends_at_once(strategy):
    s = search(strategy, 16, 4096)
    r = run_search(s, scripted({}, default="oom"))
    assert r.runs_used == 1 and r.max_ok is None and r.min_oom == 16 and r.lower_fits is False
    assert r.status.startswith("lower bound does not fit") and not r.upper_reached


@pytest.mark.parametrize("strategy", ["model", "bisect"])
@pytest.mark.parametrize("failure", ["error", "crash", "timeout"])
def test_failure_mid_way_stops_the_axis_and_is_never_an_oom(strategy, failure):
    # fits up to 300, out of memory above; but 8 and above fail otherwise
    s = search(strategy, 1, 4096)
    r = run_search(s, scripted(lambda x: "ok" if x < 8 else failure if x <= 300 else "oom", peak=lambda x: x))
    assert r.stopped_by == failure and r.stop_value >= 8
    assert r.min_oom is None or r.min_oom > 300  # the failure is not an OOM
    assert r.max_ok is not None and r.max_ok < 8  # nor a success
    assert not r.exact and r.status.startswith(f"stopped by {failure}")
    assert s.probes[-1].outcome == failure  # nothing ran after it
    assert s.propose() == []


def test_failure_in_a_parallel_round_keeps_the_other_outcomes():
    s = search("bisect", 1, 4096)
    r = run_search(s, scripted(lambda x: "error" if x == 8 else "ok" if x < 100 else "oom"), slots=4)
    assert r.stopped_by == "error" and r.stop_value == 8 and s.propose(4) == []


@pytest.mark.parametrize("strategy", ["model", "bisect"])
def test_non_monotonic_oracle_is_flagged_not_smoothed(strategy):
    # fits up to 5000; but in the first round with two values below that, the smaller one
    # runs out of memory while the larger one fits: a success above an OOM
    s = search(strategy, 1, 65536)
    hole = None
    while not s.done:
        probes = s.propose(3)
        below = sorted(p.value for p in probes if p.value <= 5000)
        if hole is None and s.rounds > 1 and len(below) >= 2:
            hole = below[0]
        for p in probes:
            fits = p.value <= 5000 and p.value != hole
            s.observe(p.value, Reading("ok" if fits else "oom", 100 * p.value if fits else None, 10**9))
    r = s.result()
    assert hole is not None and any(v > hole for v in tried(s, "ok"))
    assert r.max_ok in tried(s, "ok") and r.min_oom == hole
    assert r.monotonic is False and r.exact is False and r.status.startswith("not monotonic")
    lo, hi = s.bracket()
    assert (lo, hi) == (hole - 1, hole)  # the lowest edge is still pinned down exactly


@pytest.mark.parametrize("strategy", ["model", "bisect"])
@pytest.mark.parametrize("slots", [1, 3])
def test_multiple_of_is_honoured(strategy, slots):
    s = search(strategy, 1, 10_000, multiple_of=8)
    r = run_search(s, affine(1000, 1000, cap=10**9, limit=1000 + 1000 * 4321), slots=slots)
    assert all(p.value % 8 == 0 for p in s.probes)
    assert (r.max_ok, r.min_oom, r.exact) == (4320, 4328, True)


@pytest.mark.parametrize("slots", [1, 2, 4])
def test_parallel_rounds_split_the_bracket(slots):
    s = search("bisect", 1, 1024)
    r = run_search(s, affine(0, 1, cap=10**9, limit=700), slots=slots)
    assert r.exact and r.max_ok == 700
    rounds = {}
    for p in s.probes:
        rounds.setdefault(p.round, []).append(p.value)
    assert all(len(v) <= slots for v in rounds.values())
    if slots > 1:
        assert r.rounds < run_search(search("bisect", 1, 1024), affine(0, 1, 10**9, 700)).rounds


def test_model_reaches_an_affine_edge_in_four_runs_and_says_why():
    s = search("model", 1, 65536)
    r = run_search(s, affine(300 * MiB, 37_000))
    edge = (CAP - 300 * MiB) // 37_000
    assert (r.max_ok, r.min_oom, r.exact) == (edge, edge + 1, True)
    assert r.runs_used <= 4
    assert all(p.reason for p in s.probes) and s.probes[-1].reason.startswith("model:")
    assert s.probes[-1].detail["capacity_bytes"] == CAP


def test_model_learns_a_capacity_the_probes_contradict():
    # out of memory at 90 % of the recorded capacity: the model's first prediction is wrong
    s = search("model", 1, 65536)
    r = run_search(s, affine(100 * MiB, 50_000, limit=int(0.9 * CAP)))
    edge = (int(0.9 * CAP) - 100 * MiB) // 50_000
    assert (r.max_ok, r.min_oom) == (edge, edge + 1) and r.exact
    assert any(p.expected == "ok" and p.outcome == "oom" for p in s.probes)
    bisect = run_search(search("bisect", 1, 65536), affine(100 * MiB, 50_000, limit=int(0.9 * CAP)))
    assert r.runs_used < bisect.runs_used


def pieces(a, b, limit, n=16, cap=CAP):
    """Affine peak a + b*x: the weights in one request, the growth in ``n`` equal requests; out
    of memory at the first request that takes the counted bytes past ``limit``, saying what it
    held (A) and asked (R), as an allocator's message does."""

    def oracle(x):
        p = int(a + b * x)
        if p <= limit:
            return "ok", p, cap
        piece = (p - a) / n
        k = int((limit - a) // piece)
        return "oom", None, cap, (int(a + k * piece), int(piece))

    return oracle


def test_usable_capacity_is_bracketed_by_peaks_and_what_the_ooms_said():
    s = search("model", 1, 1000)
    assert s.usable() == (None, None)
    for value, outcome, peak, said in [(1, "ok", 100, None), (10, "ok", 400, None), (50, "oom", None, (700, 90))]:
        s.propose()
        s.pending[value] = s.pending.pop(next(iter(s.pending)))  # run this value instead of the proposal
        s.pending[value].value = value
        held, asked = said or (None, None)
        s.observe(value, Reading(outcome, peak, CAP, oom_held=held, oom_request=asked))
    assert s.usable() == (700, 790)  # held 700 B, so at least that; 700 + 90 did not fit
    assert s.probes[-1].to_dict()["oom_held_bytes"] == 700 and s.probes[-1].to_dict()["oom_request_bytes"] == 90
    assert "oom_held_bytes" not in s.probes[0].to_dict()


def test_an_oom_that_said_nothing_leaves_the_search_as_it_was():
    # the same hidden-memory load, its OOMs silent (a 3-tuple, or a 4th item None): same probes
    limit = int(0.9 * CAP)
    silent = run_search(s1 := search(), affine(100 * MiB, 50_000, limit=limit))
    none = run_search(s2 := search(), lambda x: (*affine(100 * MiB, 50_000, limit=limit)(x), None))
    assert [p.value for p in s1.probes] == [p.value for p in s2.probes] and silent == none


def test_an_oom_within_the_capacity_teaches_the_usable_capacity():
    # 10 % of the capacity taken by memory the counter does not see: the first OOM says it held
    # and asked less than the capacity, and the model solves for the edge against what it said
    limit, a, b = int(0.9 * CAP), 100 * MiB, 50_000
    edge = (limit - a) // b
    s = search()
    r = run_search(s, pieces(a, b, limit, n=64))
    assert (r.max_ok, r.min_oom, r.exact) == (edge, edge + 1, True)
    unread = run_search(search(), affine(a, b, limit=limit))
    assert r.runs_used < unread.runs_used
    bracketed = [p for p in s.probes if "usable_bytes" in p.detail]
    assert bracketed and all(p.reason.startswith("model: usable capacity in [") for p in bracketed)
    floor, ceiling = bracketed[-1].detail["usable_bytes"]
    assert floor <= limit < ceiling <= CAP  # the true usable capacity is inside the last bracket


def test_far_first_oom_the_model_narrows_its_candidates_without_a_far_bisection():
    # 20 % of the capacity hidden, the weights 74 % of it: the first OOM, at the nominal
    # crossing, is far above the edge; its bracket of the usable capacity leaves the edge among
    # a few dozen values, which the model narrows itself: every probe is one of its candidates
    # (or the value just above them), the candidates always hold the true edge and halve at
    # least every two rounds, so no bisection of the far bracket (lo, hi) is forced
    limit, a, b = int(0.8 * CAP), int(0.74 * CAP), 2_000
    edge = (limit - a) // b
    s = search()
    r = run_search(s, pieces(a, b, limit, n=254))
    assert (r.max_ok, r.min_oom, r.exact) == (edge, edge + 1, True)
    narrowed = [p for p in s.probes if "candidates" in p.detail]
    assert len(narrowed) >= 3 and not any("did not halve" in p.reason for p in s.probes)
    counts = {}
    for p in narrowed:
        first, last = p.detail["candidates"]
        assert first <= edge <= last and first <= p.value <= last + 1
        counts[p.round] = last - first + 1
    rounds = sorted(counts)
    assert all(counts[r2] <= counts[r0] / 2 for r0, r2 in zip(rounds, rounds[2:]))
    assert r.runs_used < run_search(search(), affine(a, b, limit=limit)).runs_used


def test_an_oom_past_the_capacity_changes_nothing():
    # no hidden memory: every OOM held and asked more than the capacity, which explains it; the
    # probes are those of a search that never read an OOM
    a, b = 300 * MiB, 37_000
    s1, s2 = search(), search()
    run_search(s1, pieces(a, b, CAP))
    run_search(s2, affine(a, b))
    assert [p.value for p in s1.probes] == [p.value for p in s2.probes]


def test_quadratic_axis_uses_the_square():
    def oracle(x):
        p = 50 * MiB + 3000 * x + 40 * x * x
        return ("ok", p, CAP) if p <= CAP else ("oom", None, CAP)

    s = search("model", 1, 65536, axis="context")
    r = run_search(s, oracle)
    assert r.exact and r.runs_used <= 6
    assert any(p.detail.get("model") == "quadratic" for p in s.probes)


def test_observe_refuses_unknown_values_and_outcomes():
    s = search()
    (p,) = s.propose()
    with pytest.raises(KeyError):
        s.observe(p.value + 1, Reading("ok", 1))
    with pytest.raises(ValueError):
        s.observe(p.value, Reading("maybe"))
    with pytest.raises(SpecError):
        FrontierSearch("dtype", Lattice.make(1, 2), "model")
    with pytest.raises(SpecError):
        FrontierSearch("batch", Lattice.make(1, 2), "random")


# ---- properties over random oracles ---------------------------------------------------------

lattices = st.tuples(st.integers(1, 300), st.integers(0, 5000), st.sampled_from([1, 1, 2, 8, 16])).filter(
    lambda t: (t[0] + t[1]) // t[2] * t[2] >= -(-t[0] // t[2]) * t[2]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lat=lattices,
    edge=st.integers(0, 6000),
    strategy=st.sampled_from(["model", "bisect"]),
    slots=st.integers(1, 4),
    a=st.integers(0, 10**9),
    b=st.integers(1, 10**6),
    c=st.integers(0, 1000),
    cap=st.integers(1, 10**10),
    axis=st.sampled_from(["batch", "context"]),
)
def test_monotone_oracles_end_exact_on_a_tried_pair(lat, edge, strategy, slots, a, b, c, cap, axis):
    """Any monotone oracle, whatever the peaks and the capacity say: the answer is a tried
    success, min_oom a tried OOM, and the search ends on the true edge of the lattice."""
    lower, width, step = lat
    L = Lattice.make(lower, lower + width, step)
    s = FrontierSearch(axis, L, strategy)
    r = run_search(s, lambda x: ("ok", a + b * x + c * x * x, cap) if x <= edge else ("oom", None, cap), slots)
    oks, ooms = tried(s, "ok"), tried(s, "oom")
    values = range(L.lower, L.upper + 1, L.step)
    true_ok = [v for v in values if v <= edge]
    assert r.max_ok == (max(true_ok) if true_ok else None)
    assert r.max_ok is None or r.max_ok in oks
    assert r.min_oom is None or r.min_oom in ooms
    if not true_ok:
        assert r.status.startswith("lower bound does not fit") and r.runs_used <= slots
    elif max(true_ok) == L.upper:
        assert r.upper_reached and r.min_oom is None
    else:
        assert r.exact and r.min_oom == r.max_ok + L.step
    assert r.monotonic and r.stopped_by is None
    n = len(values)
    assert r.runs_used <= slots * (3 * math.log2(n + 1) + 8)


# derandomized: the same 300 examples on every machine and run; the known counterexample of the
# ramp search is the xfail example below (it must go on failing until the search is mended)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(
    lat=lattices,
    edge=st.integers(0, 6000),
    slots=st.integers(1, 4),
    a=st.integers(0, 10**9),
    b=st.integers(1, 10**6),
    hidden=st.integers(0, 10**9),
    n=st.integers(1, 300),
    lie=st.integers(-(10**9), 10**9),
    seed=st.integers(0, 2**32 - 1),
)
@example(lat=(1, 57, 1), edge=57, slots=1, a=463, b=1, hidden=7, n=1, lie=0, seed=0).xfail(
    raises=AssertionError, reason="known: flat peaks and 7 hidden bytes take 26 runs, over the bound of 25.6"
)
def test_what_ooms_say_never_costs_exactness(lat, edge, slots, a, b, hidden, n, lie, seed):
    """A monotone oracle, ``hidden`` bytes of its capacity taken by memory the counter does not
    see, whose OOMs say what they held and asked: truthfully (the first of ``n`` requests past the
    edge's peak), shifted by ``lie`` bytes, or at random. The search still ends on the true edge,
    on tried values, within the same bound of runs."""
    import random

    rng = random.Random(seed)
    lower, width, step = lat
    L = Lattice.make(lower, lower + width, step)
    usable = a + b * edge
    cap = usable + hidden
    mode = seed % 3

    def oracle(x):
        if x <= edge:
            return "ok", a + b * x, cap
        piece = max(1, b * x // n)
        held = a + (usable - a) // piece * piece
        said = {0: (held, piece), 1: (max(0, held + lie), piece), 2: (rng.randrange(10**10), rng.randrange(1, 10**9))}
        return "oom", None, cap, said[mode]

    s = FrontierSearch("batch", L, "model")
    r = run_search(s, oracle, slots)
    values = range(L.lower, L.upper + 1, L.step)
    true_ok = [v for v in values if v <= edge]
    assert r.max_ok == (max(true_ok) if true_ok else None)
    assert r.max_ok is None or r.max_ok in tried(s, "ok")
    assert r.min_oom is None or r.min_oom in tried(s, "oom")
    if true_ok and max(true_ok) < L.upper:
        assert r.exact and r.min_oom == r.max_ok + L.step
    assert r.runs_used <= slots * (3 * math.log2(len(values) + 1) + 8)


@settings(max_examples=200, deadline=None)
@given(
    lat=lattices,
    strategy=st.sampled_from(["model", "bisect"]),
    slots=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
    p_oom=st.floats(0.05, 0.95),
)
def test_any_oracle_answers_with_tried_values(lat, strategy, slots, seed, p_oom):
    """Random, non-monotonic outcomes: still a tried success and a tried OOM, and it ends."""
    import random

    rng = random.Random(seed)
    lower, width, step = lat
    table = {}

    def oracle(x):
        if x not in table:
            table[x] = "oom" if rng.random() < p_oom else "ok"
        return table[x], (1000 + 10 * x if table[x] == "ok" else None), 10**6

    s = FrontierSearch("batch", Lattice.make(lower, lower + width, step), strategy)
    r = run_search(s, oracle, slots)
    assert s.done
    assert r.max_ok is None or table[r.max_ok] == "ok"
    assert r.min_oom is None or table[r.min_oom] == "oom"
    if r.exact:
        assert r.min_oom - r.max_ok == step and r.monotonic
    assert r.monotonic == (r.max_ok is None or r.min_oom is None or r.max_ok < r.min_oom)


# ----- what the search's log says: true reasons, the fit's real crossing ----------------------
def test_the_fit_crossing_logged_is_the_fits_not_the_clamped_upper_bound():
    a, b, cap = 529408, 81920, 16 * 2**20
    search = FrontierSearch("batch", Lattice.make(1, 64), "model")
    result = run_search(search, affine(a, b, cap))
    assert result.upper_reached
    aimed = [p for p in search.probes if "line reaches the capacity" in p.reason]
    assert aimed and all(p.detail["predicted_crossing"] == pytest.approx((cap - a) / b, rel=1e-4) for p in aimed)
    assert all("beyond the upper bound 64" in p.reason and f"batch={(cap - a) / b:.2f}" in p.reason for p in aimed)


def test_probe_reasons_of_parallel_rounds_are_true():
    search = FrontierSearch("batch", Lattice.make(1, 65536), "bisect")
    result = run_search(search, affine(529408, 81920, 16 * 2**20), slots=3)
    assert result.exact
    growth = [p for p in search.probes if p.reason.startswith("growth")]
    assert len(growth) >= 4
    for p in growth:  # "growth xF from B": the value is F times B
        factor, base = re.match(r"growth x(\d+) from (\d+)", p.reason).groups()
        assert p.value == int(factor) * int(base), p.reason
    for p in search.probes:  # "split of (lo, hi) into N parts": N - 1 values of that round
        m = re.match(r"split of \((\d+), (\d+)\) into (\d+) parts", p.reason)
        if m:
            same = [q for q in search.probes if q.round == p.round and q.reason == p.reason]
            assert len(same) == int(m.group(3)) - 1, p.reason
            assert all(int(m.group(1)) < q.value < int(m.group(2)) for q in same)
    assert any(p.reason.startswith("the only value inside") for p in search.probes)
