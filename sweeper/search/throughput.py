"""The fastest value inside the margin: a search of the lattice values up to the margin's edge
for the best measured throughput (samples per second), in few runs.

Pure logic, no processes: ``ThroughputSearch`` proposes values and is told each run's median
samples/s and its noise (MAD/median of the run's samples); ``search_throughput`` drives one with
a function value -> (samples_per_s, noise_rel). The hypothesis is a curve that is unimodal in
log(value): saturating (a plateau), rising then falling, or monotone. The search halves down from
the top until the best has a measured neighbour on each side, then fits a parabola of log(samples/s) in log(value)
through the best and its neighbours (successive parabolic interpolation, golden section when the
parabola says nothing new) and stops when that model says no untried value between the best's
neighbours beats the best by more than the best run's noise, or when none is left untried there.
The answer is always a value that was run. The reasoning and the benchmark: docs/tasks/fastest-setting.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from .lattice import Lattice

Measure = Callable[[int], tuple[float | None, float | None]]
"""value -> (median samples per second or None, noise_rel = MAD/median of the run's samples or None)."""

GOLDEN = (3 - math.sqrt(5)) / 2  # 0.382: the golden section's share of the larger side
SETTLED = 0.15
"""How near (in log(value)) the model's peak must be to the best before its gain is trusted."""
WIDE = math.log(2) + 1e-9
"""How far (in log(value)) the best's neighbours may be for the model's stop to be trusted."""
UNMEASURED = 2
"""Runs without a throughput (a failed run, a record without one) after which a search that has
measured nothing stops."""
MAX_RUNS = 24
"""The most runs one throughput search makes (known measurements not counted)."""


@dataclass(frozen=True)
class Timing:
    """One measured value: its median samples/s (None: the run measured none) and noise
    (MAD/median of its samples, a fraction; None: not measured), why it was chosen, and whether
    it was known before the search (a run of the memory search)."""

    value: int
    samples_per_s: float | None
    noise_rel: float | None
    reason: str
    known: bool = False

    def to_dict(self) -> dict:
        """The fields as a dict (search.jsonl's ``throughput_probe`` event)."""
        return {
            "value": self.value,
            "samples_per_s": self.samples_per_s,
            "noise_rel": self.noise_rel,
            "reason": self.reason,
            "known": self.known,
        }


@dataclass(frozen=True)
class ThroughputAnswer:
    """The fastest value found.

    Attributes:
        best: the value with the highest measured median samples/s (a value that was run), or None
            when no run measured a throughput.
        samples_per_s: its median samples per second, or None.
        noise_rel: its run's noise (MAD/median, a fraction): how sure the answer is, or None.
        runs: the runs the search made (known measurements, made before it, not counted).
        known: the measurements it started from.
        upper: the largest value searched (the margin's edge).
        status: one line for people.
        timings: every measurement, in order.
    """

    best: int | None
    samples_per_s: float | None
    noise_rel: float | None
    runs: int
    known: int
    upper: int
    status: str
    timings: tuple[Timing, ...] = field(default=())

    def to_dict(self) -> dict:
        """The answer as a dict (search.jsonl's ``result`` event, field ``throughput``), without
        the timings (each has its own ``throughput_probe`` line)."""
        return {
            "best": self.best,
            "samples_per_s": self.samples_per_s,
            "noise_rel": self.noise_rel,
            "runs": self.runs,
            "known": self.known,
            "upper": self.upper,
            "status": self.status,
        }


def parabola_peak(points: list[tuple[float, float]], lo: float, hi: float) -> tuple[float, float]:
    """The highest point over [lo, hi] of the parabola through three points.

    Args:
        points: three (x, y) with distinct x.
        lo, hi: the interval (lo <= hi).

    Returns:
        (x, y) of the parabola's highest point in [lo, hi]: its vertex when concave and inside,
        else the higher end. Three collinear points give the line's higher end.
    """
    (x1, y1), (x2, y2), (x3, y3) = points
    d = (x1 - x2) * (x1 - x3) * (x2 - x3)
    a = (x3 * (y2 - y1) + x2 * (y1 - y3) + x1 * (y3 - y2)) / d
    b = (x3 * x3 * (y1 - y2) + x2 * x2 * (y3 - y1) + x1 * x1 * (y2 - y3)) / d
    c = y1 - a * x1 * x1 - b * x1

    def at(x: float) -> float:
        return a * x * x + b * x + c

    candidates = [lo, hi] + ([-b / (2 * a)] if a < 0 and lo <= -b / (2 * a) <= hi else [])
    x = max(candidates, key=at)
    return x, at(x)


class ThroughputSearch:
    """The search for the fastest value of ``lattice`` up to ``upper``. Call ``propose``, run
    the value, ``observe`` its throughput, until ``propose`` gives None; then ``answer()``.

    Args:
        lattice: the axis' values.
        upper: the largest value to search (the margin's edge; a lattice value).
        known: value -> (samples_per_s, noise_rel) measured before the search (the memory
            search's runs); values above ``upper`` are ignored.
        max_runs: the most runs to make.
    """

    def __init__(
        self,
        lattice: Lattice,
        upper: int,
        known: dict[int, tuple[float | None, float | None]] | None = None,
        max_runs: int = MAX_RUNS,
    ):
        self.lattice, self.upper, self.max_runs = lattice, upper, max_runs
        self.n = (upper - lattice.lower) // lattice.step + 1  # candidates: lower, lower+step, ..., upper
        self.timings: list[Timing] = [
            Timing(v, f, e, "measured before the search", known=True)
            for v, (f, e) in sorted((known or {}).items())
            if lattice.lower <= v <= upper
        ]
        self.reason = ""
        self.stop_reason = ""

    # ---- state -------------------------------------------------------------------------
    def value(self, i: int) -> int:
        """The ``i``-th candidate (0: ``lattice.lower``)."""
        return self.lattice.lower + i * self.lattice.step

    def index(self, x: float) -> int:
        """The candidate nearest to the value ``x`` in log(value), clamped to the range."""
        lo = min(max(math.floor((x - self.lattice.lower) / self.lattice.step), 0), self.n - 1)
        return min((lo, min(lo + 1, self.n - 1)), key=lambda i: abs(math.log(self.value(i)) - math.log(max(x, 1e-9))))

    def tried(self) -> set[int]:
        """The values measured (or run without a measurement)."""
        return {t.value for t in self.timings}

    def measured(self) -> dict[int, Timing]:
        """value -> its timing, for the values with a measured throughput (the last run of each)."""
        return {t.value: t for t in self.timings if t.samples_per_s is not None}

    def runs(self) -> int:
        """The runs this search made (known measurements not counted)."""
        return sum(not t.known for t in self.timings)

    def best(self) -> Timing | None:
        """The measured value with the highest samples/s (the smallest of equal ones), or None."""
        m = self.measured()
        return max(m.values(), key=lambda t: (t.samples_per_s, -t.value)) if m else None

    def nearest_untried(self, x: float, lo: int, hi: int) -> int | None:
        """The untried candidate strictly between the values ``lo`` and ``hi`` nearest to ``x`` in
        log(value), or None when every one is tried."""
        tried, start = self.tried(), self.index(min(max(x, lo), hi))
        for k in range(self.n):
            for i in (start - k, start + k):
                if 0 <= i < self.n and lo < self.value(i) < hi and self.value(i) not in tried:
                    return self.value(i)
            if start - k < 0 and start + k >= self.n:
                break
        return None

    # ---- proposing ---------------------------------------------------------------------
    def propose(self) -> int | None:
        """The next value to run (the reason in ``self.reason``), or None when done."""
        return self.next_value()

    def next_value(self) -> int | None:
        """The next value: the top first, halving down (or doubling up) until the best has a
        measured neighbour on each side (or is an end of the range) and three values are
        measured, then the model's value between the neighbours; None when the model says none
        can beat the best by more than its noise, none is left untried there, or runs are spent."""
        if self.runs() >= self.max_runs:
            return self._stop(f"run budget spent ({self.max_runs} runs)")
        top, bottom = self.upper, self.lattice.lower
        best, tried = self.best(), self.tried()
        if best is None and self.runs() >= UNMEASURED:
            return self._stop(f"{self.runs()} run(s) measured no throughput")
        if best is None:  # nothing measured yet: the top, then down the untried values
            v = next((self.value(i) for i in range(self.n - 1, -1, -1) if self.value(i) not in tried), None)
            self.reason = "the top of the range (the margin's edge)" if v == top else "no throughput measured yet"
            return v if v is not None else self._stop("no value measured a throughput")
        m = sorted(self.measured())
        below = [v for v in m if v < best.value]
        above = [v for v in m if v > best.value]
        if not below and best.value > bottom:
            return self._scan(best.value / 2, bottom - 1, min(m), "halving down: the best is the lowest measured")
        if not above and best.value < top:
            return self._scan(best.value * 2, max(m), top + 1, "doubling up: the best is the highest measured")
        if len(m) < 3 and len(m) < self.n:
            low = min(m)
            return self._scan(low / 2, bottom - 1, low, "halving down: three values for the model")
        return self._refine(best, below, above, m)

    def _scan(self, x: float, lo: int, hi: int, why: str) -> int | None:
        """The untried value nearest to ``x`` strictly inside (lo, hi), or a stop."""
        v = self.nearest_untried(x, lo, hi)
        self.reason = f"{why} (aim {x:.1f})"
        return v if v is not None else self._refine_or_stop()

    def _refine_or_stop(self) -> int | None:
        best = self.best()
        if best is None:
            return self._stop("no value measured a throughput")
        m = sorted(self.measured())
        return self._refine(best, [v for v in m if v < best.value], [v for v in m if v > best.value], m)

    def _refine(self, best: Timing, below: list[int], above: list[int], m: list[int]) -> int | None:
        """The model's next value between the best's measured neighbours, or a stop."""
        lo = below[-1] if below else self.lattice.lower - self.lattice.step
        hi = above[0] if above else self.upper + self.lattice.step
        a, b = max(lo, self.lattice.lower), min(hi, self.upper)
        if self.nearest_untried(best.value, lo, hi) is None:
            return self._stop(f"every value between {a} and {b} was run")
        if below and above:  # the best and its neighbours, else the best and the two nearest on its side
            three = [below[-1], best.value, above[0]]
        else:
            three = sorted([best.value, *(below[-2:] if below else above[:2])])
        if len(three) < 3:
            self.reason = "between the best's neighbours (fewer than three values measured)"
            return self.nearest_untried(math.sqrt(a * b), lo, hi)
        x, gain = self._model(three, best, a, b)
        noise, through = best.noise_rel or 0.0, ", ".join(map(str, three))
        model = f"the parabola of log(samples/s) in log(value) through {through}"
        settled = abs(x - math.log(best.value)) <= SETTLED or self.nearest_untried(math.exp(x), lo, hi) is None
        if gain <= noise and settled:
            wide = self._wide_side(best.value, lo, hi)
            if wide is None:
                return self._stop(
                    f"{model} gains {gain:+.1%} at most between {a} and {b}, within the best run's noise {noise:.1%}"
                )
            self.reason = f"{model} gains {gain:+.1%}; checking it halfway (in log) to {wide[1]}, over twice away"
            return wide[0]
        v = self.nearest_untried(math.exp(x), lo, hi)
        if v is not None and v != best.value and not self._stalled(v, best.value):
            self.reason = f"{model} peaks at {math.exp(x):.1f} (+{gain:.1%})"
            return v
        left = math.log(best.value) - math.log(a) >= math.log(b) - math.log(best.value)
        end = a if left else b
        self.reason = (
            f"golden section of {min(end, best.value)}..{max(end, best.value)} (the parabola says nothing new)"
        )
        aim = math.exp(math.log(best.value) + GOLDEN * (math.log(end) - math.log(best.value)))
        return self.nearest_untried(aim, lo, hi)

    def _model(self, three: list[int], best: Timing, a: int, b: int) -> tuple[float, float]:
        """(log of the value where the parabola of log(samples/s) in log(value) through ``three``
        peaks within [a, b], its gain over the best as a fraction)."""
        f = self.measured()
        points = [(math.log(v), math.log(max(f[v].samples_per_s or 0.0, 1e-300))) for v in three]
        x, y = parabola_peak(points, math.log(a), math.log(b))
        return x, math.exp(y - points[three.index(best.value)][1]) - 1

    def _wide_side(self, best: int, lo: int, hi: int) -> tuple[int, int] | None:
        """(an untried value halfway in log, the neighbour) on a side of ``best`` whose measured
        neighbour is more than twice (or under half) the best away, or None when neither is."""
        for end in (hi, lo):
            if self.lattice.lower <= end <= self.upper and abs(math.log(end) - math.log(best)) > WIDE:
                v = self.nearest_untried(math.sqrt(end * best), lo, hi)
                if v is not None:
                    return v, end
        return None

    def _stalled(self, v: int, best: int) -> bool:
        """Whether ``v`` is the best's neighbour on the lattice and a refinement already probed one
        (parabolic steps crawling by one value)."""
        near = abs(v - best) <= self.lattice.step
        crawled = sum(1 for t in self.timings[-2:] if not t.known and abs(t.value - best) <= self.lattice.step)
        return near and crawled >= 1

    def _stop(self, why: str) -> int | None:
        """No next value: record why (``stop_reason``) and give None."""
        self.stop_reason = why
        return None

    # ---- observing ---------------------------------------------------------------------
    def observe(self, value: int, samples_per_s: float | None, noise_rel: float | None, reason: str = "") -> Timing:
        """Record one run of ``value``: its median samples/s and noise (None: not measured)."""
        t = Timing(value, samples_per_s, noise_rel, reason or self.reason)
        self.timings.append(t)
        return t

    def answer(self) -> ThroughputAnswer:
        """The fastest measured value so far, with the runs and the noise."""
        best = self.best()
        known = sum(t.known for t in self.timings)
        if best is None:
            status = f"no run measured a throughput; stopped: {self.stop_reason or 'not finished'}"
        else:
            noise = best.noise_rel
            spread = "not measured" if noise is None or noise != noise else f"{noise:.1%}"  # (a NaN: none)
            status = (
                f"fastest measured: {best.value} at {best.samples_per_s:.4g} samples/s (noise {spread}) after "
                f"{self.runs()} run(s) and {known} known; stopped: {self.stop_reason or 'not finished'}"
            )
        return ThroughputAnswer(
            best=None if best is None else best.value,
            samples_per_s=None if best is None else best.samples_per_s,
            noise_rel=None if best is None else best.noise_rel,
            runs=self.runs(),
            known=known,
            upper=self.upper,
            status=status,
            timings=tuple(self.timings),
        )


def search_throughput(
    lattice: Lattice,
    upper: int,
    measure: Measure,
    known: dict[int, tuple[float | None, float | None]] | None = None,
    max_runs: int = MAX_RUNS,
) -> ThroughputAnswer:
    """Find the fastest value of ``lattice`` up to ``upper``, each value run by ``measure``.

    Args:
        lattice: the axis' values.
        upper: the largest value to search (the margin's edge; a lattice value).
        measure: value -> (median samples/s or None, noise_rel or None): one run.
        known: measurements made before (not counted as runs).
        max_runs: the most runs.

    Returns:
        The ``ThroughputAnswer``.
    """
    search = ThroughputSearch(lattice, upper, known, max_runs)
    while (value := search.propose()) is not None:
        search.observe(value, *measure(value))
    return search.answer()
