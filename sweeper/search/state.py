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

from . import strategies
from .lattice import OUTCOMES, STOP_OUTCOMES, Lattice, Pick, Probe, Reading, check_search_axis
from .strategies import STRATEGIES


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
        stop_value: the value that stopped it, or None.
        stop_message: what the stopping run said, or None.
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

    Raises:
        SpecError: an unknown axis (field ``hydra.sweeper.axis``) or strategy (field
            ``hydra.sweeper.strategy``), with the accepted values.
    """

    def __init__(
        self, axis: str, lattice: Lattice, strategy: str = "model", capacity: int | None = None, seed: int | None = None
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

    @property
    def done(self) -> bool:
        """Whether the search is over: stopped by an error, crash or timeout; the lower bound
        out of memory; the upper bound fits; or a success next to an OOM on the lattice."""
        if self.stopped is not None:
            return True
        if not self.probes:
            return False
        L, U, m = self.lattice.lower, self.lattice.upper, self.lattice.step
        lo, hi = self.bracket()
        if hi is not None and hi <= L:
            return True  # the lower bound does not fit
        if hi is None and lo is not None and lo >= U:
            return True  # the upper bound fits: the edge lies above it
        return lo is not None and hi is not None and hi - lo <= m

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

    # ---- observing ---------------------------------------------------------------------
    def observe(self, value: int, reading: Reading) -> Probe:
        """Record what the run of a proposed value said. An error, crash or timeout stops the search.

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
        if outcome == "oom" and reading.oom_held is not None and reading.oom_request is not None:
            probe.oom_held, probe.oom_request = int(reading.oom_held), int(reading.oom_request)
        if reading.capacity is not None and self.capacity is None:
            self.capacity = reading.capacity
        if probe.expected is not None and outcome in ("ok", "oom"):
            self.wrong_streak = self.wrong_streak + 1 if outcome != probe.expected else 0
        self.probes.append(probe)
        if outcome in STOP_OUTCOMES and self.stopped is None:
            self.stopped = probe
        return probe

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
        if stop is not None and stop.outcome == "oom_elsewhere":
            status = f"frontier not reached: at {self.axis}={stop.value} {stop.message}"
        elif stop is not None:
            status = f"stopped by {stop.outcome} at {self.axis}={stop.value}"
        elif upper_reached:
            status = f"edge not found below the upper bound: {self.axis}={U} fits"
        elif min_oom is not None and min_oom <= L and max_ok is None:
            status = f"lower bound does not fit: {self.axis}={L} is out of memory"
        elif exact:
            status = f"exact edge: {self.axis}={max_ok} fits, {min_oom} does not"
        elif not monotonic:
            status = f"not monotonic: {self.axis}={max_ok} fits above {min_oom}, which does not"
        else:
            status = "not finished"
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
            runs_used=len(self.probes),
            runs_reused=sum(p.reused for p in self.probes),
            rounds=self.rounds,
            status=status,
        )


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
