"""The adaptive frontier search: which values to probe next, and what the probes say.

Pure logic, no processes, no Hydra, no torch: ``FrontierSearch`` proposes values of one
axis (batch, context or width) and is told each probe's outcome and peak; the Hydra
sweeper (``sweeper.frontier_sweeper``) runs the probes as fresh worker processes, the
tests and ``make bench`` answer them from scripted or synthetic oracles (``run_search``).

Vocabulary (design.md): on the lattice of values ``lower' <= v <= upper'`` that are
multiples of ``multiple_of`` (``lower'``/``upper'`` are lower/upper rounded inwards),
``max_ok`` is the largest value that ran ok, ``min_oom`` the smallest that ran out of
memory; the edge is exact when they are neighbours on the lattice
(``min_oom - max_ok == multiple_of``). The search keeps a bracket ``(lo, hi)``:
``hi`` = the smallest OOM so far, ``lo`` = the largest success below it.

Strategies (one small function each, in the spirit of Lightning's tuner):

* ``bisect``: grow geometrically (x2) from ``lower'`` until the first OOM or ``upper'``,
  then bisect between the last success (lo) and the first OOM (hi).
* ``model`` (default): after the first success, jump to a value that must still fit if
  the peak is at most proportional to the axis (to its square for context and width),
  which gives a second, well-separated point. With two or more successes, fit the peak
  against the axis by least squares (affine; for context and width a quadratic term is
  allowed, since attention scores grow with the square of the context and the mlp's
  weights with the square of its width) and bound it by a band (the peaks' resolution,
  e.g. 2 MiB segments of the CUDA caching allocator, or the fit's residual, widened by the
  slope error over the span of the successes; ``peak_band``). Where the band crosses the
  capacity recorded by the worker is where the edge must be: when that range holds one or
  two lattice values, probe just below and just above the central prediction; when it is
  wider, probe its geometric midpoint, which either fits (a far success: a much better
  fit) or halves the range. When the probes contradict the capacity (an OOM where even
  the pessimistic fit stays under it: something the counter does not see takes memory),
  step down from that OOM by growing steps (``GALLOP``), never below the bracket's
  midpoint. Two wrong predictions in a row force one bisection step. The search never
  ends on a prediction: only on a success next to an OOM.

With a ``seed`` (the edge a dry run predicts, ``memsweep predict``), the first probes are the
seed and its upper neighbour; when the prediction is right the exact edge takes two real
runs, otherwise the strategy goes on from the bracket they give.

With ``slots`` probes per round (a launcher running k jobs at once) a round proposes up
to k values: growth points, or the k points that split the bracket into k+1 parts, or
the model's pair plus split points.

Invariants (tested on random monotone oracles with hypothesis): ``max_ok`` is always a
value that ran ok, ``min_oom`` always a value that ran out of memory, and on a monotone
oracle the search ends exact, or with "upper bound not reached" (``upper'`` fits), or
with "lower bound does not fit". An ``error``, ``crash`` or ``timeout`` stops the search
(``stopped_by``); it is never read as an OOM nor as a success. A success above an OOM is
flagged (``monotonic`` false), never smoothed away.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from conf.contract import NUMERIC_AXES as SEARCH_AXES
from conf.contract import SpecError

STRATEGIES = ("model", "bisect")
STOP_OUTCOMES = ("error", "crash", "timeout")
# Axes whose peak may grow with the square of the value (see the module docstring).
QUADRATIC_AXES = ("context", "width")
# Away from an OOM the model did not expect, each step is this many times the last one.
GALLOP = 4
# First step down from an OOM the model did not expect: what this fraction of the capacity
# is worth on the axis (unseen overheads are a few percent of the capacity).
GALLOP_FIRST = 1 / 128


@dataclass(frozen=True)
class Lattice:
    """The values an axis may take: multiples of ``step`` from ``lower`` to ``upper``.

    Built by ``Lattice.make`` from the user's bounds, rounded inwards.
    """

    lower: int
    upper: int
    step: int

    @classmethod
    def make(cls, lower: int, upper: int, multiple_of: int = 1, axis: str = "axis") -> "Lattice":
        """Round ``lower`` up and ``upper`` down to multiples of ``multiple_of``.

        Raises:
            SpecError: a bound or step that is not a positive integer, or no multiple of
                ``multiple_of`` between ``lower`` and ``upper``.
        """
        for name, value in (("lower", lower), ("upper", upper), ("multiple_of", multiple_of)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"hydra.sweeper.{name}", value, f"a positive integer (axis {axis})")
        lo = -(-lower // multiple_of) * multiple_of
        hi = upper // multiple_of * multiple_of
        if lower > upper:
            raise SpecError("hydra.sweeper.upper", upper, f"at least lower={lower} (axis {axis})")
        if lo > hi:
            raise SpecError("hydra.sweeper.upper", upper,
                            f"a value leaving a multiple of multiple_of={multiple_of} in [lower={lower}, upper] "
                            f"(axis {axis})")
        return cls(lo, hi, multiple_of)

    def down(self, x: float) -> int:
        """The largest lattice value <= x (may fall below ``lower``)."""
        return math.floor(x / self.step) * self.step

    def up(self, x: float) -> int:
        """The smallest lattice value >= x (may exceed ``upper``)."""
        return math.ceil(x / self.step) * self.step

    def split(self, lo: int, hi: int, parts: int) -> list[int]:
        """Up to ``parts - 1`` distinct lattice values strictly inside (lo, hi), splitting it
        into ``parts`` near-equal parts (parts=2: the bisection midpoint)."""
        n = (hi - lo) // self.step
        if n < 2:
            return []
        offsets = sorted({min(n - 1, max(1, round(n * j / parts))) for j in range(1, parts)})
        return [lo + k * self.step for k in offsets]


@dataclass
class Probe:
    """One run of the search: value, why it was chosen, what it gave.

    ``peak`` (bytes) is the peak the model reads, only for ``ok`` runs; ``expected`` is the
    model's prediction (``ok``/``oom``) or None for growth and bisection probes.
    """

    value: int
    reason: str
    round: int
    expected: Optional[str] = None
    outcome: Optional[str] = None
    peak: Optional[int] = None
    message: Optional[str] = None
    reused: bool = False
    run_dir: Optional[str] = None
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"value": self.value, "reason": self.reason, "round": self.round, "expected": self.expected,
                "outcome": self.outcome, "peak_bytes": self.peak, "message": self.message,
                "reused": self.reused, "run_dir": self.run_dir, **self.detail}


@dataclass(frozen=True)
class Fit:
    """peak(x) = a + b*x + c*x**2 in bytes, fitted on the successes (c = 0: affine)."""

    a: float
    b: float
    c: float = 0.0

    def __call__(self, x: float) -> float:
        return self.a + self.b * x + self.c * x * x


def crossing(f: Callable[[float], float], threshold: float, lo: float, hi: float) -> Optional[float]:
    """Where the increasing curve ``f`` reaches ``threshold`` in [lo, hi] (by bisection):
    ``hi`` when it stays at or below it, None when it is above it already at ``lo``."""
    if f(lo) > threshold:
        return None
    if f(hi) <= threshold:
        return float(hi)
    a, b = float(lo), float(hi)
    while b - a > 1e-6 * max(1.0, b):
        mid = (a + b) / 2
        if f(mid) <= threshold:
            a = mid
        else:
            b = mid
    return a


def fit_peak(points: Iterable[tuple[int, int]], quadratic: bool = False) -> Optional[Fit]:
    """Least-squares fit of peak bytes against the axis value.

    ``points``: (value, peak bytes) of successful runs; repeated values are averaged.
    Affine with two or more distinct values; with ``quadratic`` and three or more, a
    quadratic term is added when its fitted coefficient is positive (else affine).
    Returns None with fewer than two distinct values.
    """
    xs, ps = _average(points)
    if len(xs) < 2:
        return None
    scale = float(xs[-1])  # x / scale in (0, 1]: keeps the normal equations well conditioned
    us = [x / scale for x in xs]
    if quadratic and len(xs) >= 3:
        coef = _lstsq([[1.0, u, u * u] for u in us], ps)
        if coef is not None and coef[2] > 0:
            return Fit(coef[0], coef[1] / scale, coef[2] / scale ** 2)
    coef = _lstsq([[1.0, u] for u in us], ps)
    if coef is None:
        return None
    return Fit(coef[0], coef[1] / scale)


def _average(points: Iterable[tuple[int, int]]) -> tuple[list[int], list[float]]:
    by_x: dict[int, list[int]] = {}
    for x, p in points:
        by_x.setdefault(int(x), []).append(int(p))
    xs = sorted(by_x)
    return xs, [sum(by_x[x]) / len(by_x[x]) for x in xs]


def _lstsq(rows: list[list[float]], ys: list[float]) -> Optional[list[float]]:
    """Solve the normal equations (A^T A) c = A^T y by Gaussian elimination with pivoting."""
    n = len(rows[0])
    m = [[sum(r[i] * r[j] for r in rows) for j in range(n)] + [sum(r[i] * y for r, y in zip(rows, ys))]
         for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12 * max(1.0, max(abs(v) for row in m for v in row[:n])):
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [a - f * b for a, b in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]


# Peaks may move in steps: the CUDA caching allocator reserves segments in multiples of
# 2 MiB. The largest power of two dividing every measured peak, when at least
# MIN_GRANULARITY (a smaller one is chance), at most MAX_GRANULARITY, is their resolution.
MIN_GRANULARITY = 64 * 2**10
MAX_GRANULARITY = 2 * 2**20


@dataclass(frozen=True)
class Band:
    """The model of the peak: a central curve and the curves the true peak lies between.

    ``high`` (pessimistic) and ``low`` (optimistic) are the central fit plus and minus the
    measurement noise (the peaks' resolution, or the fit's largest residual when larger),
    widened beyond the largest success by the slope error that noise allows over the span
    of the successes. With two successes on a quadratic axis, the band spans the secant
    (no square term) and the pure square through them (no linear term): every load
    a + b*x + c*x^2 with a, b, c >= 0 through those two points lies between them beyond
    the larger one.
    """

    fit: Callable[[float], float]
    high: Callable[[float], float]
    low: Callable[[float], float]
    noise: float
    kind: str
    coefficients: dict


def peak_band(points: list[tuple[int, int]], quadratic: bool = False) -> Optional[Band]:
    """The ``Band`` of the successes ``points`` (value, peak bytes); None with fewer than
    two distinct values."""
    xs, ps = _average(points)
    fit = fit_peak(points, quadratic)
    if fit is None:
        return None
    x0, x1 = xs[0], xs[-1]
    span = float(x1 - x0)
    divisor = 0
    for _, p in points:
        divisor = math.gcd(divisor, int(p))
    resolution = divisor & -divisor  # its largest power-of-two factor
    resolution = min(resolution, MAX_GRANULARITY) if resolution >= MIN_GRANULARITY else 1
    residual = max(abs(p - fit(x)) for x, p in zip(xs, ps))
    noise = max(1.0, resolution, residual)

    def widen(x: float) -> float:
        return noise * (1 + 2 * max(0.0, x - x1) / span)

    coefficients = {"a": fit.a, "b": fit.b, "c": fit.c}
    if quadratic and len(xs) == 2 and ps[1] > ps[0]:
        c = (ps[1] - ps[0]) / (x1 * x1 - x0 * x0)
        square = Fit(ps[0] - c * x0 * x0, 0.0, c)
        central = Fit((fit.a + square.a) / 2, fit.b / 2, c / 2)
        return Band(central, lambda x: max(fit(x), square(x)) + widen(x),
                    lambda x: min(fit(x), square(x)) - widen(x), noise, "affine..square",
                    {"a": central.a, "b": central.b, "c": central.c})
    return Band(fit, lambda x: fit(x) + widen(x), lambda x: fit(x) - widen(x), noise,
                "quadratic" if fit.c else "affine", coefficients)


class FrontierSearch:
    """The search along one axis. Call ``propose``, run the values, ``observe`` each outcome,
    until ``done``; then ``result()``.

    Args:
        axis: batch, context or width.
        lattice: the values allowed (``Lattice.make``).
        strategy: ``model`` or ``bisect``.
        capacity: the capacity the peaks are compared with (bytes); None until a probe
            reports one (``observe(..., capacity=...)``).
    """

    def __init__(self, axis: str, lattice: Lattice, strategy: str = "model", capacity: Optional[int] = None,
                 seed: Optional[int] = None):
        if axis not in SEARCH_AXES:
            raise SpecError("hydra.sweeper.axis", axis, "one of " + ", ".join(SEARCH_AXES))
        if strategy not in STRATEGIES:
            raise SpecError("hydra.sweeper.strategy", strategy, "one of " + ", ".join(STRATEGIES))
        self.axis, self.lattice, self.strategy, self.capacity = axis, lattice, strategy, capacity
        self.probes: list[Probe] = []
        self.pending: dict[int, Probe] = {}
        self.rounds = 0
        self.wrong_streak = 0
        self.stopped: Optional[Probe] = None
        # seed: a predicted max_ok (a dry run, ``memsweep predict``): probed first, with its upper
        # neighbour, before the strategy takes over.
        self.seed = None if seed is None else min(max(lattice.down(seed), lattice.lower), lattice.upper)

    # ---- state -------------------------------------------------------------------------
    def _values(self, outcome: str) -> list[int]:
        return sorted({p.value for p in self.probes if p.outcome == outcome})

    def bracket(self) -> tuple[Optional[int], Optional[int]]:
        """(lo, hi): hi = smallest OOM (None: none yet), lo = largest success below hi."""
        ooms = self._values("oom")
        hi = ooms[0] if ooms else None
        oks = [v for v in self._values("ok") if hi is None or v < hi]
        return (oks[-1] if oks else None), hi

    def tried(self) -> set[int]:
        return {p.value for p in self.probes} | set(self.pending)

    @property
    def done(self) -> bool:
        if self.stopped is not None:
            return True
        if not self.probes:
            return False
        L, U, m = self.lattice.lower, self.lattice.upper, self.lattice.step
        lo, hi = self.bracket()
        if hi is not None and hi <= L:
            return True  # the lower bound does not fit
        if hi is None and lo is not None and lo >= U:
            return True  # upper bound not reached
        return lo is not None and hi is not None and hi - lo <= m

    # ---- proposing ---------------------------------------------------------------------
    def propose(self, slots: int = 1) -> list[Probe]:
        """Up to ``slots`` new values to run now (empty when done), each with its reason.

        Values are untried lattice values; they are remembered as pending until observed.
        """
        if self.done:
            return []
        slots = max(1, int(slots))
        self.rounds += 1
        out = self._take(self._seed_round(), slots) if self.seed is not None else []
        if out:
            return out
        if not any(p.outcome == "ok" for p in self.probes) and not self._values("oom"):
            picks = self._first_round(slots)
        elif self.strategy == "bisect":
            picks = self._bisect_round(slots)
        else:
            picks = self._model_round(slots)
        out = self._take(picks, slots)
        if not out:  # a model round with nothing new to try: plain bisection or growth
            out = self._take(self._bisect_round(slots), slots)
        if not out:  # cannot happen on the lattice while not done
            raise RuntimeError(f"frontier search on {self.axis} stalled at bracket {self.bracket()}")
        return out

    def _take(self, picks: list, slots: int) -> list[Probe]:
        """The first ``slots`` untried lattice values of ``picks``, now pending."""
        out, seen = [], self.tried()
        for value, reason, expected, detail in picks:
            if value in seen or not self.lattice.lower <= value <= self.lattice.upper:
                continue
            seen.add(value)
            probe = Probe(value, reason, self.rounds, expected, detail=detail)
            self.pending[value] = probe
            out.append(probe)
            if len(out) == slots:
                break
        return out

    def _seed_round(self) -> list:
        """The predicted edge and its neighbour on the side its outcome points to; nothing once
        both sides of the seed are known (the strategy goes on from the bracket)."""
        s, m = self.seed, self.lattice.step
        done = {p.value: p.outcome for p in self.probes}
        if s not in done:
            return [(s, "predicted max_ok (dry run)", "ok", {}),
                    (s + m, "just above the predicted max_ok (dry run)", "oom", {})]
        if done[s] == "ok":
            return [(s + m, "just above the predicted max_ok (dry run)", "oom", {})]
        if done[s] == "oom":
            if s - m in done and not any(o == "ok" for o in done.values()):
                return [(self.lattice.lower, "lower bound (nothing at or below the predicted edge fit)", None, {})]
            return [(s - m, "below the predicted max_ok, which did not fit (dry run)", "ok", {})]
        return []

    def _first_round(self, slots: int) -> list:
        L = self.lattice.lower
        picks = [(L, "start at lower", None, {})]
        picks += self._growth(L, slots - 1)
        return picks

    def _growth(self, lo: int, count: int, start: Optional[int] = None) -> list:
        """Geometric growth (x2) above ``lo``: up to ``count`` values, the last one upper."""
        picks, x = [], start if start is not None else lo
        for _ in range(count):
            x = min(self.lattice.up(2 * x), self.lattice.upper)
            picks.append((x, f"growth x2 from {lo} (no OOM yet)", None, {}))
            if x >= self.lattice.upper:
                break
        return picks

    def _split(self, lo: int, hi: int, slots: int, why: str) -> list:
        parts = slots + 1
        values = self.lattice.split(lo, hi, parts)
        label = "bisection" if parts == 2 else f"split ({lo}, {hi}) into {parts} parts"
        return [(v, f"{label} of ({lo}, {hi}){why}", None, {}) for v in values]

    def _bisect_round(self, slots: int) -> list:
        lo, hi = self.bracket()
        if hi is None:
            return self._growth(lo, slots)
        return self._split(lo, hi, slots, "")

    def _model_round(self, slots: int) -> list:
        U, m = self.lattice.upper, self.lattice.step
        lo, hi = self.bracket()
        points = [(p.value, p.peak) for p in self.probes
                  if p.outcome == "ok" and p.peak is not None and (hi is None or p.value < hi)]
        distinct = sorted({x for x, _ in points})
        quadratic = self.axis in QUADRATIC_AXES
        cap = self.capacity
        if self.wrong_streak >= 2:
            self.wrong_streak = 0
            if hi is None:
                return self._growth(lo, slots)
            return self._split(lo, hi, slots, ": two wrong predictions in a row")
        band = peak_band(points, quadratic) if len(distinct) >= 2 else None
        if band is None or cap is None:
            p_lo = max((p for x, p in points if x == lo), default=None)
            if hi is None and p_lo and cap:
                # peak(x) <= peak(lo) * (x/lo)^d for x >= lo when the load is a + b x (+ c x^2)
                # with a, b, c >= 0 (d = 1 for batch, 2 for context/width): x2 must still fit.
                power = 2 if quadratic else 1
                guess = self.lattice.down(lo * (cap / p_lo) ** (1 / power))
                x2 = min(max(guess, lo + m), U)
                why = (f"model: one success; peak({lo})={p_lo} B at most {'quadratic' if quadratic else 'proportional'}"
                       f" in {self.axis} puts capacity {cap} B at >= {guess}")
                return [(x2, why, None, {"bound": guess})] + self._growth(lo, slots - 1, start=x2)
            if hi is None:
                return self._growth(lo, slots)
            return self._split(lo, hi, slots, ": one success is not enough to fit")
        top = hi if hi is not None else U + m
        lo_peak = max(p for _, p in points)
        if lo_peak > cap:
            return self._gallop_up(lo, hi, slots, f"a success at {lo} measured {lo_peak} B, more than the "
                                                  f"capacity {cap} B")
        if hi is not None and band.high(hi) <= cap:
            slope = (band.fit(hi) - band.fit(lo)) / (hi - lo)
            first = self.lattice.down(GALLOP_FIRST * cap / slope) if slope > 0 else m
            return self._gallop_down(lo, hi, slots, max(first, m))
        x_opt = crossing(band.low, cap, lo, top)
        if x_opt is None:
            return self._gallop_up(lo, hi, slots, f"{lo} fitted although even the optimistic fit puts it "
                                                  f"above the capacity {cap} B")
        x_pess = crossing(band.high, cap, lo, top) or float(lo)
        x_star = min(max(crossing(band.fit, cap, lo, top) or float(lo), x_pess), x_opt)
        first = max(self.lattice.down(x_pess), lo)
        last = min(self.lattice.down(x_opt), top - m)
        detail = {"model": band.kind, "fit": band.coefficients, "noise_bytes": band.noise,
                  "capacity_bytes": cap, "predicted_crossing": x_star, "predicted_range": [x_pess, x_opt]}
        if last - first > m:  # too uncertain for a pair: narrow it with its geometric midpoint(s)
            a = max(first, lo + m)
            values = sorted({min(max(self.lattice.down(a * (last / a) ** (j / (slots + 1))), lo + m), top - m)
                             for j in range(1, slots + 1)})
            why = (f"model: edge predicted in [{x_pess:.1f}, {x_opt:.1f}] ({band.kind} fit "
                   f"+- {band.noise:.0f} B); probe inside it (geometric split)")
            return [(v, why, None, detail) for v in values if lo < v < top]
        below = min(max(self.lattice.down(x_star), lo), top - m)
        picks = []
        for v, side in ((below, "below"), (below + m, "above")):
            if lo < v < top:
                expected = "ok" if band.fit(v) <= cap else "oom"
                picks.append((v, f"model: {band.kind} fit crosses the capacity {cap} B at "
                                 f"{self.axis}={x_star:.2f}; probe just {side}", expected, detail))
        return picks + self._fill(lo, hi, slots - len(picks), below + m)

    def _fill(self, lo: int, hi: Optional[int], count: int, above: int) -> list:
        """Extra values for a round with spare slots: split the bracket, or grow above ``above``."""
        if count <= 0:
            return []
        if hi is not None:
            return self._split(lo, hi, count, "")
        return self._growth(lo, count, start=above)

    def _gallop_down(self, lo: int, hi: int, slots: int, first: int) -> list:
        """The capacity is too high for the probes: the edge is below the smallest OOM, by an
        unknown overhead. Step down from it by ``first`` (what GALLOP_FIRST of the capacity
        is worth on the axis), then GALLOP times the last gap between OOMs, never below the
        bracket's midpoint (so never much slower than bisection)."""
        ooms = [v for v in self._values("oom") if v >= hi]
        step = GALLOP * (ooms[1] - ooms[0]) if len(ooms) > 1 else first
        mids = self.lattice.split(lo, hi, 2)
        if not mids:
            return []
        v = max(self.lattice.down(hi - step), mids[0])
        why = (f"model: OOM at {hi} where even the pessimistic fit stays under the capacity {self.capacity} B "
               f"(something uncounted takes memory); " + (f"bisection of ({lo}, {hi})" if v == mids[0] else
                                                          f"step down {hi - v} from it"))
        return [(v, why, None, {})] + self._fill(lo, hi, slots - 1, v)

    def _gallop_up(self, lo: int, hi: Optional[int], slots: int, cause: str) -> list:
        """A success measured more than the capacity: the edge is above the largest success by
        an unknown amount. Step up by 1, 2, 4... lattice steps (doubling the last gap between
        successes), never past the bracket's midpoint."""
        oks = [v for v in self._values("ok") if v <= lo]
        step = GALLOP * (oks[-1] - oks[-2]) if len(oks) > 1 else self.lattice.step
        v = min(lo + step, self.lattice.upper)
        if hi is not None:
            mids = self.lattice.split(lo, hi, 2)
            if not mids:
                return []
            v = min(v, mids[0])
        why = f"model: {cause}; " + (f"bisection of ({lo}, {hi})" if hi is not None and v == mids[0]
                                      else f"step up {v - lo} from it")
        return [(v, why, None, {})] + self._fill(lo, hi, slots - 1, v)

    # ---- observing ---------------------------------------------------------------------
    def observe(self, value: int, outcome: str, peak: Optional[int] = None, capacity: Optional[int] = None,
                message: Optional[str] = None, reused: bool = False, run_dir: Optional[str] = None) -> Probe:
        """Record the outcome (ok, oom, error, crash, timeout) of a proposed value.

        ``peak``: the run's peak in bytes (used for successes only: an OOM's peak is
        censored). ``capacity``: the capacity the run was measured against, bytes.
        An error, crash or timeout stops the search.

        Raises:
            KeyError: ``value`` was not proposed (or was observed already).
            ValueError: an unknown outcome.
        """
        if outcome not in ("ok", "oom") + STOP_OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}")
        probe = self.pending.pop(value)
        probe.outcome, probe.message, probe.reused, probe.run_dir = outcome, message, reused, run_dir
        probe.peak = peak if outcome == "ok" else None
        if capacity is not None and self.capacity is None:
            self.capacity = capacity
        if probe.expected is not None and outcome in ("ok", "oom"):
            self.wrong_streak = self.wrong_streak + 1 if outcome != probe.expected else 0
        self.probes.append(probe)
        if outcome in STOP_OUTCOMES and self.stopped is None:
            self.stopped = probe
        return probe

    # ---- result ------------------------------------------------------------------------
    def result(self) -> dict:
        """The search's answer (values are lattice values that were run).

        Keys: axis, strategy, lower, upper, multiple_of (the lattice), max_ok (largest
        success, or None), min_oom (smallest OOM, or None), exact, monotonic,
        upper_reached, lower_fits, stopped_by (None or error|crash|timeout), stop_value,
        stop_message, runs_used (probes run by the search, reused ones included),
        runs_reused, status (one line for people).
        """
        L, U, m = self.lattice.lower, self.lattice.upper, self.lattice.step
        oks, ooms = self._values("ok"), self._values("oom")
        max_ok = oks[-1] if oks else None
        min_oom = ooms[0] if ooms else None
        monotonic = not (oks and ooms and max_ok > min_oom)
        exact = bool(monotonic and max_ok is not None and min_oom is not None and min_oom - max_ok == m)
        upper_reached = bool(not ooms and max_ok == U)
        lower_fits = True if L in oks else False if L in ooms else None
        stop = self.stopped
        if stop is not None:
            status = f"stopped by {stop.outcome} at {self.axis}={stop.value}"
        elif upper_reached:
            status = f"upper bound not reached: {self.axis}={U} fits"
        elif min_oom is not None and min_oom <= L and max_ok is None:
            status = f"lower bound does not fit: {self.axis}={L} is out of memory"
        elif exact:
            status = f"exact edge: {self.axis}={max_ok} fits, {min_oom} does not"
        elif not monotonic:
            status = f"not monotonic: {self.axis}={max_ok} fits above {min_oom}, which does not"
        else:
            status = "not finished"
        return {
            "axis": self.axis, "strategy": self.strategy, "lower": L, "upper": U, "multiple_of": m,
            "max_ok": max_ok, "min_oom": min_oom, "exact": exact, "monotonic": bool(monotonic),
            "upper_reached": upper_reached, "lower_fits": lower_fits,
            "stopped_by": stop.outcome if stop else None, "stop_value": stop.value if stop else None,
            "stop_message": stop.message if stop else None,
            "runs_used": len(self.probes), "runs_reused": sum(p.reused for p in self.probes),
            "rounds": self.rounds, "status": status,
        }


Oracle = Callable[[int], tuple]
"""value -> (outcome, peak bytes or None, capacity bytes or None): a scripted stand-in for
running the worker (tests, bench)."""


def run_search(search: FrontierSearch, oracle: Oracle, slots: int = 1, max_rounds: int = 10_000) -> dict:
    """Drive ``search`` to the end against ``oracle``; returns ``search.result()``."""
    for _ in range(max_rounds):
        if search.done:
            break
        for probe in search.propose(slots):
            outcome, peak, capacity = oracle(probe.value)
            search.observe(probe.value, outcome, peak, capacity)
    return search.result()
