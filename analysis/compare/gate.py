"""The regression gate of ``memsweep compare --fail-above``: did a peak grow beyond a threshold?

The gate reads, per value compared, the run's peak of the ``--counter`` (``match.GATE_COUNTERS``:
``max_memory_allocated`` by default, the steadiest on every device; ``max_memory_reserved`` by
name): other minus baseline, in bytes, against a percentage of the baseline's peak or a number of bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from memsweep.conf.contract import SpecError, parse_size

from .match import Comparison


@dataclass(frozen=True)
class Threshold:
    """How much a peak may grow before the gate fails: a fraction of the baseline or bytes.

    Attributes:
        text: as given (``5%``, ``64MiB``).
        fraction: growth allowed as a fraction of the baseline's peak; None for bytes.
        bytes: growth allowed in bytes; None for a fraction.
    """

    text: str
    fraction: Fraction | None = None
    bytes: int | None = None

    def allowed(self, base: int) -> float:
        """The growth allowed above a baseline peak of ``base`` bytes (bytes)."""
        if self.fraction is not None:
            return float(self.fraction * base)
        if self.bytes is None:
            raise ValueError(f"threshold {self.text!r} has neither a fraction nor bytes")
        return float(self.bytes)


def parse_threshold(text: str) -> Threshold:
    """Read ``--fail-above``: ``5%`` (of the baseline's peak) or a size (``64MiB``, ``1GB``, bytes);
    ``0`` (zero in any unit: ``0%``, ``0B``, ``0MiB``) allows no growth at all. A size needs its unit: ``5``
    is refused, not read as 5 B.

    Raises:
        SpecError: anything else, or a negative percentage; field ``--fail-above``.
    """
    text = str(text).strip()
    accepted = "a percentage of the baseline's peak (5%), 0, or a size with its unit (64MiB, 1GB, 0B)"
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*%", text)
    if m:
        return Threshold(text, fraction=Fraction(m.group(1)) / 100)
    if re.fullmatch(r"0+(?:\.0+)?", text):  # zero is zero in any unit: no growth allowed
        return Threshold(text, bytes=0)
    try:
        return Threshold(text, bytes=parse_size(text, "--fail-above", zero=True))
    except SpecError:
        raise SpecError("--fail-above", text, accepted) from None


@dataclass(frozen=True)
class Regression:
    """A peak that grew beyond the threshold.

    Attributes:
        title: the series (``batch sweep (...)``) and the two sweeps' labels.
        value: the axis's value.
        counter: the counter gated.
        base, other: the two peaks (bytes).
    """

    title: str
    value: object
    counter: str
    base: int
    other: int

    def text(self) -> str:
        """The regression in one line: bytes and percent of growth."""
        grew = self.other - self.base
        percent = f"{100 * grew / self.base:+.1f} %" if self.base else "from 0 B"
        return (
            f"{self.title} at {self.value}: peak {self.counter} grew {grew} B ({percent}), "
            f"{self.base} B -> {self.other} B"
        )


def regressions(comparisons: list[Comparison], threshold: Threshold) -> list[Regression]:
    """The values whose run peak (the gate's counter) grew beyond ``threshold``.

    Args:
        comparisons: every comparison made.
        threshold: the growth allowed.

    Returns:
        One regression per value whose growth (other - baseline, bytes) is strictly above the
        allowed growth.
    """
    out = []
    for c in comparisons:
        if c.other is None:  # nothing paired, no row
            continue
        for row in c.rows:
            if row.phase != "run peak":
                continue
            a, b = row.base.get(c.gate_counter), row.other.get(c.gate_counter)
            if a is None or b is None:
                continue
            if b - a > threshold.allowed(a):
                title = f"{c.title}: {c.base.sweep.label} -> {c.other.sweep.label}"
                out.append(Regression(title, f"{c.base.axis}={row.value}", c.gate_counter, a, b))
    return out
