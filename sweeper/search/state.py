"""The search along one axis: what has been probed, the bracket it gives, when it is done,
and its answer (``FrontierSearch``); ``run_search`` drives one against an oracle.

``FrontierSearch.propose`` asks the strategy (``sweeper.search.strategies``) for the next
values; ``observe`` records what each run said (``Reading``: outcome, peak...); ``result`` is the answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from memsweep.conf.contract import SpecError

from . import margin, strategies
from .lattice import OUTCOMES, STOP_OUTCOMES, Lattice, Pick, Probe, Reading, check_search_axis
from .strategies import STRATEGIES

ERRORS_IN_A_ROW = 3
"""How many ``error`` runs in a row (no ok nor oom between them) the frontier sweeper steps past
before the search stops: an error at a value that another value runs past depends on the value's
shape (a layer that refuses a batch of 1, a kernel without that size), not on memory."""


@dataclass
class SearchResult:
    """The answer of a search along one axis (values are lattice values that were run).

    Attributes:
        axis: batch, context or width.
        strategy: model or bisect.
        lower, upper, multiple_of: the lattice.
        max_ok: the largest success, or None.
        min_oom: the smallest OOM, or None.
        exact: whether max_ok and min_oom are neighbours on the lattice (and monotonic).
        monotonic: False when a success lies above an OOM.
        upper_reached: no OOM and ``upper`` fits.
        lower_fits: whether ``lower`` fits; None when it did not run.
        stopped_by: None, or the error, crash or timeout that stopped the search.
        stop_value: the value that stopped it (the first of the errors in a row that stopped
            it), or None.
        stop_message: what the stopping run said, or None.
        error_values: the values whose run raised an error (neither ok nor oom), ascending:
            stepped past when ``errors_in_a_row`` allows, else the one that stopped the search.
        margin_edge: the largest value that ran ok, below the smallest OOM, whose measured peak
            (``Probe.run_peak``) is at most the capacity minus the margin; None without a margin,
            or when none qualifies.
        margin_bytes: the margin at the search's capacity (bytes), or None without one.
        runs_used: the probes run by the search, reused ones included.
        runs_reused: the probes answered by a run already on disk.
        rounds: the rounds proposed.
        status: one line for people.
    """

    axis: str
    strategy: str
    lower: int
    upper: int
    multiple_of: int
    max_ok: int | None
    min_oom: int | None
    exact: bool
    monotonic: bool
    upper_reached: bool
    lower_fits: bool | None
    stopped_by: str | None
    stop_value: int | None
    stop_message: str | None
    error_values: list[int]
    margin_edge: int | None
    margin_bytes: int | None
    runs_used: int
    runs_reused: int
    rounds: int
    status: str

    def to_dict(self) -> dict:
        """The fields as a dict, in the order above (search.jsonl's ``result`` event)."""
        return dataclasses.asdict(self)


class FrontierSearch:
    """The search along one axis. Call ``propose``, run the values, ``observe`` each outcome,
    until ``done``; then ``result()``.

    Args:
        axis: batch, context or width.
        lattice: the values allowed (``Lattice.make``).
        strategy: ``model`` or ``bisect``.
        capacity: the capacity the peaks are compared with (bytes); None until a probe
            reports one (``observe``, ``Reading.capacity``).
        seed: a predicted max_ok (a dry run, ``memsweep predict``): probed first, with its
            upper neighbour, before the strategy takes over; rounded down to the lattice and
            clamped to its range.
        errors_in_a_row: how many ``error`` runs in a row the search steps past (probing the
            next untried value past each) before it stops; 0: the first error stops it.
        margin_of: capacity in bytes -> the margin in bytes (``MarginPolicy.bytes_for``): once
            the capacity's edge is found, the search goes on to the margin's edge
            (``sweeper.search.margin``); None: no margin edge is searched.

    Raises:
        SpecError: an unknown axis (field ``hydra.sweeper.axis``) or strategy (field
            ``hydra.sweeper.strategy``), with the accepted values.
    """

    def __init__(
        self,
        axis: str,
        lattice: Lattice,
        strategy: str = "model",
        capacity: int | None = None,
        seed: int | None = None,
        errors_in_a_row: int = 0,
        margin_of: Callable[[int], int | None] | None = None,
    ):
        check_search_axis(axis, "hydra.sweeper.axis")
        if strategy not in STRATEGIES:
            raise SpecError("hydra.sweeper.strategy", strategy, "one of " + ", ".join(STRATEGIES))
        self.axis, self.lattice, self.strategy, self.capacity = axis, lattice, strategy, capacity
        self.probes: list[Probe] = []
        self.pending: dict[int, Probe] = {}
        self.rounds = 0
        self.wrong_streak = 0
        self.gaps: list[int | None] = []  # hi - lo at the start of each round (None: not bracketed yet)
        self.stopped: Probe | None = None
        self.seed = None if seed is None else min(max(lattice.down(seed), lattice.lower), lattice.upper)
        self.errors_in_a_row, self.margin_of = errors_in_a_row, margin_of
        self.margin_gaps: list[int] = []  # the margin bracket's width at the start of each margin round

    # ---- state -------------------------------------------------------------------------
    def values(self, outcome: str) -> list[int]:
        """The values observed with ``outcome``.

        Args:
            outcome: ok, oom, error, crash or timeout.

        Returns:
            The distinct values, ascending.
        """
        return sorted({p.value for p in self.probes if p.outcome == outcome})

    def bracket(self) -> tuple[int | None, int | None]:
        """The bracket the probes give.

        Returns:
            (lo, hi): hi = the smallest OOM (None: none yet), lo = the largest success below
            hi (None: none).
        """
        ooms = self.values("oom")
        hi = ooms[0] if ooms else None
        oks = [v for v in self.values("ok") if hi is None or v < hi]
        return (oks[-1] if oks else None), hi

    def usable(self) -> tuple[int | None, int | None]:
        """The usable capacity the probes bracket, in the peak counter's bytes.

        A success bounds it from below by its peak; an OOM that said what it asked (R) with
        what was already held (A) bounds it from below by A (held, so it fitted) and from
        above by A + R (it did not fit). The nominal capacity is not used here: hidden
        memory (allocator overhead, library workspaces, the CUDA context) makes the usable
        capacity lower than it.

        Returns:
            (floor, ceiling): the usable capacity C satisfies floor <= C < ceiling; floor is
            None without a success below the smallest OOM nor an OOM that said A, ceiling
            None without an OOM that said A and R. Successes above the smallest OOM (a
            non-monotonic load) are left out.
        """
        _, hi = self.bracket()
        floors = [
            p.peak for p in self.probes if p.outcome == "ok" and p.peak is not None and (hi is None or p.value < hi)
        ]
        said = [
            (p.oom_held, p.oom_request)
            for p in self.probes
            if p.outcome == "oom" and p.oom_held is not None and p.oom_request is not None
        ]
        floors += [held for held, _ in said]
        ceiling = min((held + request for held, request in said), default=None)
        return max(floors, default=None), ceiling

    def stalled(self) -> bool:
        """Whether the last two rounds left more than half of the bracket (lo, hi) they started
        from: the model's guesses are not narrowing it as fast as bisection would."""
        last, before = (self.gaps[-1], self.gaps[-3]) if len(self.gaps) >= 3 else (None, None)
        if last is None or before is None or self.gaps[-2] is None:
            return False
        return last > before / 2

    def tried(self) -> set[int]:
        """The values observed or pending (a set)."""
        return {p.value for p in self.probes} | set(self.pending)

    def untried(self, low: int, high: int) -> bool:
        """Whether a lattice value in [low, high] (lattice values) has not been observed."""
        if low > high:
            return False
        n = (high - low) // self.lattice.step + 1
        return n > len({p.value for p in self.probes if low <= p.value <= high})

    def edge_found(self) -> bool:
        """Whether the capacity's edge is found: the lower bound out of memory (or every value
        below the smallest OOM raised an error); the upper bound fits (or every value above the
        largest success did); a success next to an OOM on the lattice, or only errors between."""
        L, U, m = self.lattice.lower, self.lattice.upper, self.lattice.step
        lo, hi = self.bracket()
        if hi is not None:
            return not self.untried(L if lo is None else lo + m, hi - m)
        return not self.untried(L if lo is None else lo + m, U)

    @property
    def done(self) -> bool:
        """Whether the search is over: stopped by an error, crash or timeout; or the capacity's
        edge found (``edge_found``) and, with a margin, the margin's (``margin.margin_done``)."""
        if self.stopped is not None:
            return True
        if not self.probes:
            return False
        return self.edge_found() and margin.margin_done(self)

    # ---- proposing ---------------------------------------------------------------------
    def propose(self, slots: int = 1) -> list[Probe]:
        """The next values to run, each with its reason; empty when done.

        Values are untried lattice values; they are remembered as pending until observed.

        Args:
            slots: at most this many values (the probes a launcher runs at once).

        Returns:
            The new probes (pending).

        Raises:
            RuntimeError: no untried value left while not done (cannot happen on a lattice).
        """
        if self.done:
            return []
        slots = max(1, int(slots))
        self.rounds += 1
        if self.edge_found():  # the capacity's edge is found: the margin's
            out = self._take(margin.margin_round(self, slots), slots)
            if not out:
                raise RuntimeError(
                    f"frontier search on {self.axis} stalled at margin bracket {margin.margin_bracket(self)}"
                )
            return out
        lo, hi = self.bracket()
        self.gaps.append(hi - lo if lo is not None and hi is not None else None)
        out = self._take(strategies.seed_round(self), slots) if self.seed is not None else []
        if out:
            return out
        if not any(p.outcome == "ok" for p in self.probes) and not self.values("oom"):
            picks = strategies.first_round(self, slots)
        elif self.strategy == "bisect":
            picks = strategies.bisect_round(self, slots)
        elif self.wrong_streak >= 2:
            self.wrong_streak = 0
            picks = strategies.forced_round(self, slots)
        else:
            picks = strategies.model_round(self, slots)
        out = self._take(picks, slots)
        if not out:  # a model round with nothing new to try: plain bisection or growth
            out = self._take(strategies.bisect_round(self, slots), slots)
        if not out:  # cannot happen on the lattice while not done
            raise RuntimeError(f"frontier search on {self.axis} stalled at bracket {self.bracket()}")
        return out

    def _take(self, picks: list[Pick], slots: int) -> list[Probe]:
        """The first ``slots`` untried lattice values of ``picks``, now pending."""
        out, seen, errors = [], self.tried(), set(self.values("error"))
        for picked, reason, expected, detail in picks:
            value: int | None = picked
            if picked in errors:  # an error there, not memory: the next value past it
                value, reason = self._past_error(picked, seen), f"{reason}; {picked} raised an error, so the next value"
            if value is None or value in seen or not self.lattice.lower <= value <= self.lattice.upper:
                continue
            seen.add(value)
            probe = Probe(value, reason, self.rounds, expected, detail=detail)
            self.pending[value] = probe
            out.append(probe)
            if len(out) == slots:
                break
        return out

    def _past_error(self, value: int, seen: set[int]) -> int | None:
        """The untried lattice value nearest above ``value`` (an error's), inside the bracket
        (below the smallest OOM when ``value`` is; up to the upper bound), else nearest below it
        (above the largest success below it); None when there is none."""
        lo, hi = self.bracket()
        top = hi if hi is not None and value < hi else self.lattice.upper + self.lattice.step
        bottom = lo if lo is not None and lo < value else self.lattice.lower - self.lattice.step
        for step in (self.lattice.step, -self.lattice.step):
            v = value + step
            while bottom < v < top:
                if v not in seen:
                    return v
                v += step
        return None

    # ---- observing ---------------------------------------------------------------------
    def observe(self, value: int, reading: Reading) -> Probe:
        """Record what the run of a proposed value said. A crash or timeout stops the search; so
        does an error, unless ``errors_in_a_row`` allows stepping past it (then the first of that
        many errors in a row, with no ok nor oom between, stops it).

        Args:
            value: a pending value (from ``propose``).
            reading: the run's outcome, peak, capacity... (``Reading``).

        Returns:
            The probe, now observed.

        Raises:
            KeyError: ``value`` was not proposed (or was observed already).
            ValueError: an unknown outcome.
        """
        outcome = reading.outcome
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}")
        probe = self.pending.pop(value)
        probe.outcome, probe.message, probe.reused, probe.run_dir = (
            outcome,
            reading.message,
            reading.reused,
            reading.run_dir,
        )
        probe.peak = reading.peak if outcome == "ok" else None
        probe.run_peak = (reading.peak if reading.run_peak is None else reading.run_peak) if outcome == "ok" else None
        if outcome == "oom" and reading.oom_held is not None and reading.oom_request is not None:
            probe.oom_held, probe.oom_request = int(reading.oom_held), int(reading.oom_request)
        if reading.capacity is not None and self.capacity is None:
            self.capacity = reading.capacity
        if probe.expected is not None and outcome in ("ok", "oom"):
            self.wrong_streak = self.wrong_streak + 1 if outcome != probe.expected else 0
        self.probes.append(probe)
        if self.stopped is None and outcome == "error" and self.errors_in_a_row > 0:
            streak = self.error_streak()
            if len(streak) >= self.errors_in_a_row:
                self.stopped = streak[0]
        elif outcome in STOP_OUTCOMES and self.stopped is None:
            self.stopped = probe
        return probe

    def error_streak(self) -> list[Probe]:
        """The last probes observed, in order, as long as each raised an error (no ok nor oom between)."""
        streak: list[Probe] = []
        for p in reversed(self.probes):
            if p.outcome != "error":
                break
            streak.insert(0, p)
        return streak

    # ---- result ------------------------------------------------------------------------
    def result(self) -> SearchResult:
        """The search's answer.

        Returns:
            The ``SearchResult`` of the probes observed so far.
        """
        L, U, m = self.lattice.lower, self.lattice.upper, self.lattice.step
        oks, ooms = self.values("ok"), self.values("oom")
        max_ok = oks[-1] if oks else None
        min_oom = ooms[0] if ooms else None
        monotonic = not (max_ok is not None and min_oom is not None and max_ok > min_oom)
        exact = bool(monotonic and max_ok is not None and min_oom is not None and min_oom - max_ok == m)
        upper_reached = bool(not ooms and max_ok == U)
        lower_fits = True if L in oks else False if L in ooms else None
        stop = self.stopped
        status = self._status(max_ok, min_oom, exact, monotonic, upper_reached)
        bracket = margin.margin_bracket(self)
        margin_bytes = None if self.margin_of is None or self.capacity is None else self.margin_of(self.capacity)
        return SearchResult(
            axis=self.axis,
            strategy=self.strategy,
            lower=L,
            upper=U,
            multiple_of=m,
            max_ok=max_ok,
            min_oom=min_oom,
            exact=exact,
            monotonic=bool(monotonic),
            upper_reached=upper_reached,
            lower_fits=lower_fits,
            stopped_by=stop.outcome if stop else None,
            stop_value=stop.value if stop else None,
            stop_message=stop.message if stop else None,
            error_values=self.values("error"),
            margin_edge=None if bracket is None else bracket[0],
            margin_bytes=margin_bytes,
            runs_used=len(self.probes),
            runs_reused=sum(p.reused for p in self.probes),
            rounds=self.rounds,
            status=status,
        )

    def _status(
        self, max_ok: int | None, min_oom: int | None, exact: bool, monotonic: bool, upper_reached: bool
    ) -> str:
        """The search's answer in one line for people (``SearchResult.status``), naming the values
        whose errors it stepped past."""
        L, U, axis, stop = self.lattice.lower, self.lattice.upper, self.axis, self.stopped
        errors = self.values("error")
        if stop is not None and stop.outcome == "oom_elsewhere":
            return f"frontier not reached: at {axis}={stop.value} {stop.message}"
        if stop is not None:
            streak = len(self.error_streak()) if stop.outcome == "error" and self.errors_in_a_row else 0
            if streak > 1:
                values = ", ".join(str(p.value) for p in self.error_streak())
                return f"stopped by error at {axis}={stop.value}: {streak} values in a row raised errors ({values})"
            return f"stopped by {stop.outcome} at {axis}={stop.value}"
        if upper_reached:
            status = f"edge not found below the upper bound: {axis}={U} fits"
        elif min_oom is not None and max_ok is None and not self.untried(L, min_oom - self.lattice.step):
            status = f"lower bound does not fit: {axis}={min_oom} is out of memory"
            if min_oom > L:
                status += " and every value below it raised an error"
        elif exact:
            status = f"exact edge: {axis}={max_ok} fits, {min_oom} does not"
        elif not monotonic:
            status = f"not monotonic: {axis}={max_ok} fits above {min_oom}, which does not"
        elif max_ok is not None and min_oom is not None and self.edge_found():
            status = f"edge: {axis}={max_ok} fits, {min_oom} does not; every value between raised an error"
        elif max_ok is None and min_oom is None and errors and self.edge_found():
            status = f"every value of {axis} raised an error"
        else:
            status = "not finished"
        if errors:
            status += f"; stepped past errors (the value's shape, not memory) at {axis}={', '.join(map(str, errors))}"
        return status


Oracle = Callable[[int], tuple]
"""value -> (outcome, peak bytes or None, capacity bytes or None), optionally with a fourth
item for an OOM, (bytes held, bytes asked) or None: a scripted stand-in for running the worker
(tests, bench)."""


def run_search(search: FrontierSearch, oracle: Oracle, slots: int = 1, max_rounds: int = 10_000) -> SearchResult:
    """Drive ``search`` to the end against ``oracle``.

    Args:
        search: a search, usually fresh.
        oracle: value -> (outcome, peak bytes or None, capacity bytes or None[, (bytes
            held, bytes asked) of an OOM or None]).
        slots: values proposed per round.
        max_rounds: stop after this many rounds even if not done.

    Returns:
        ``search.result()``.
    """
    for _ in range(max_rounds):
        if search.done:
            break
        for probe in search.propose(slots):
            outcome, peak, capacity, *said = oracle(probe.value)
            held, request = said[0] if said and said[0] is not None else (None, None)
            search.observe(probe.value, Reading(outcome, peak, capacity, oom_held=held, oom_request=request))
    return search.result()
