"""The values a search may probe (``Lattice``), one probe and what it gave (``Probe``), what a
run said about its value (``Reading``), a strategy's proposal (``Pick``), and the names of axes
and outcomes the search knows."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from memsweep.conf.contract import AXIS_DIRECTIONS, NUMERIC_AXES, SpecError
from memsweep.conf.contract import OUTCOMES as RUN_OUTCOMES

SEARCH_AXES = NUMERIC_AXES  # the axes a search can walk: the numeric ones (conf.contract)
# Outcomes that stop the search: never read as an OOM nor as a success. Every run outcome
# (conf.contract.OUTCOMES) but ok and oom (error, crash, timeout), and two the search reads from a
# record: ``oom_elsewhere``, an OOM in a phase that does not scale with the searched axis, before
# one that does (conf.contract.oom_attribution): another variable does not fit, the axis' edge is
# not reached; ``memory_suspect``, an error that probably means memory but does not say so
# (worker.classify), unless the sweeper was told to read it as an OOM (hydra.sweeper.suspect=oom).
STOP_OUTCOMES = tuple(o for o in RUN_OUTCOMES if o not in ("ok", "oom")) + ("oom_elsewhere", "memory_suspect")
OUTCOMES = ("ok", "oom") + STOP_OUTCOMES
# Axes whose peak may grow with the square of the value (attention scores grow with the square
# of the context, the mlp's weights with the square of its width).
QUADRATIC_AXES = ("context", "width")


def check_search_axis(axis: str | None, field: str) -> str:
    """``axis`` when a search can walk it (``SEARCH_AXES``).

    Raises:
        SpecError: another axis, named as ``field`` (the setting or argument it came from); for an
            axis whose load does not grow with its value under some ``parallel``
            (``conf.contract.AXIS_DIRECTIONS``: world_size), saying to sweep it instead.
    """
    if axis not in SEARCH_AXES:
        accepted = "one of " + ", ".join(SEARCH_AXES)
        turns = sorted(p for p, d in AXIS_DIRECTIONS.get(str(axis), {}).items() if d != "increasing")
        if turns:  # a search walks up from success to OOM: it cannot walk an axis that turns
            accepted += (
                f" ({axis} is swept, not searched: under parallel={'/'.join(turns)} its load per rank does not "
                f"grow with it; sweep its values instead, e.g. {axis}=1,2,4)"
            )
        raise SpecError(field, axis, accepted)
    return axis


@dataclass(frozen=True)
class Lattice:
    """The values an axis may take: multiples of ``step`` from ``lower`` to ``upper``.

    Built by ``Lattice.make`` from the user's bounds, rounded inwards.

    Attributes:
        lower: the smallest value (a multiple of ``step``).
        upper: the largest value (a multiple of ``step``).
        step: the distance between neighbouring values (``multiple_of``).
    """

    lower: int
    upper: int
    step: int

    @classmethod
    def make(cls, lower: int, upper: int, multiple_of: int = 1, axis: str = "axis") -> Lattice:
        """Round ``lower`` up and ``upper`` down to multiples of ``multiple_of``.

        Args:
            lower: the smallest value wanted (positive integer).
            upper: the largest value wanted (positive integer, at least ``lower``).
            multiple_of: the values' common divisor (positive integer).
            axis: the axis's name, for the messages.

        Returns:
            The lattice of multiples of ``multiple_of`` in [lower, upper].

        Raises:
            SpecError: a bound or step that is not a positive integer (field
                ``hydra.sweeper.lower``, ``upper`` or ``multiple_of``), ``upper`` below
                ``lower``, or no multiple of ``multiple_of`` between them (field
                ``hydra.sweeper.upper``).
        """
        for name, value in (("lower", lower), ("upper", upper), ("multiple_of", multiple_of)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"hydra.sweeper.{name}", value, f"a positive integer (axis {axis})")
        lo = -(-lower // multiple_of) * multiple_of
        hi = upper // multiple_of * multiple_of
        if lower > upper:
            raise SpecError("hydra.sweeper.upper", upper, f"at least lower={lower} (axis {axis})")
        if lo > hi:
            raise SpecError(
                "hydra.sweeper.upper",
                upper,
                f"a value leaving a multiple of multiple_of={multiple_of} in [lower={lower}, upper] (axis {axis})",
            )
        return cls(lo, hi, multiple_of)

    def down(self, x: float) -> int:
        """The largest multiple of ``step`` <= the value ``x`` (may fall below ``lower``)."""
        return math.floor(x / self.step) * self.step

    def up(self, x: float) -> int:
        """The smallest multiple of ``step`` >= the value ``x`` (may exceed ``upper``)."""
        return math.ceil(x / self.step) * self.step

    def split(self, lo: int, hi: int, parts: int) -> list[int]:
        """Lattice values strictly inside (lo, hi) that split it into ``parts`` near-equal parts.

        Args:
            lo: the lower end (a lattice value).
            hi: the upper end (a lattice value).
            parts: how many parts (2: the bisection midpoint).

        Returns:
            Up to ``parts - 1`` distinct values, ascending; empty when no lattice value lies
            strictly inside.
        """
        n = (hi - lo) // self.step
        if n < 2:
            return []
        offsets = sorted({min(n - 1, max(1, round(n * j / parts))) for j in range(1, parts)})
        return [lo + k * self.step for k in offsets]


class Pick(NamedTuple):
    """A value a strategy proposes, before it is a ``Probe``.

    Attributes:
        value: the value of the axis (may be off the lattice's range or tried already: the
            search skips those).
        reason: why it was chosen, for people and search.jsonl.
        expected: the model's prediction (``ok`` or ``oom``), or None.
        detail: extra fields logged with the probe (the fit, the predicted range...).
    """

    value: int
    reason: str
    expected: str | None
    detail: dict


@dataclass(frozen=True)
class Reading:
    """What one run said about a proposed value, as ``FrontierSearch.observe`` records it.

    Attributes:
        outcome: one of ``OUTCOMES`` (ok, oom, or one of ``STOP_OUTCOMES``).
        peak: the run's peak in bytes (used for successes only: an OOM's peak is censored).
        capacity: the capacity the run was measured against (bytes); the first one a search is
            given is the search's.
        message: the run's error message, if any.
        reused: the run was found in the sweep directory, not run again.
        run_dir: the run's directory, when it has one.
        oom_held: an OOM's bytes already held when it failed, in the peak counter's units
            (``sweeper.frontier_runs.oom_said``); kept only for an ``oom`` with ``oom_request``.
        oom_request: an OOM's bytes asked for.
        run_peak: the run's peak over every phase in bytes (the peak the report compares with
            the capacity minus its margin); None: ``peak`` stands for it.
    """

    outcome: str
    peak: int | None = None
    capacity: int | None = None
    message: str | None = None
    reused: bool = False
    run_dir: str | None = None
    oom_held: int | None = None
    oom_request: int | None = None
    run_peak: int | None = None


@dataclass
class Probe:
    """One run of the search: value, why it was chosen, what it gave.

    Attributes:
        value: the value of the axis.
        reason: why it was chosen.
        round: the round that proposed it (1, 2...).
        expected: the model's prediction (``ok``/``oom``), or None for growth and bisection
            probes.
        outcome: ok, oom, error, crash or timeout; None until observed.
        peak: the peak the model reads (bytes), only for ``ok`` runs.
        message: the run's error message, if any.
        reused: the run was found in the sweep directory, not run again.
        run_dir: the run's directory, when it has one.
        detail: extra fields logged with the probe.
        oom_held: for an OOM that said what it asked with what already held, the bytes held
            when it failed, in the peak counter's units (allocated on the CPU; allocated plus
            reserved-unallocated on CUDA): the usable capacity is at least this.
        oom_request: the bytes that OOM asked for: the usable capacity is below
            ``oom_held + oom_request``.
        run_peak: for an ``ok`` run, its peak over every phase (bytes), compared with the
            capacity minus the margin (the margin edge); None when not recorded.
    """

    value: int
    reason: str
    round: int
    expected: str | None = None
    outcome: str | None = None
    peak: int | None = None
    message: str | None = None
    reused: bool = False
    run_dir: str | None = None
    detail: dict = field(default_factory=dict)
    oom_held: int | None = None
    oom_request: int | None = None
    run_peak: int | None = None

    def to_dict(self) -> dict:
        """The probe as a JSON object for search.jsonl (``peak`` as ``peak_bytes``, the
        ``detail`` fields at the top level; an OOM's ``oom_held``/``oom_request`` as
        ``oom_held_bytes``/``oom_request_bytes`` when it said them)."""
        said = {}
        if self.oom_held is not None and self.oom_request is not None:
            said = {"oom_held_bytes": self.oom_held, "oom_request_bytes": self.oom_request}
        return {
            "value": self.value,
            "reason": self.reason,
            "round": self.round,
            "expected": self.expected,
            "outcome": self.outcome,
            "peak_bytes": self.peak,
            "run_peak_bytes": self.run_peak,
            "message": self.message,
            "reused": self.reused,
            "run_dir": self.run_dir,
            **said,
            **self.detail,
        }
