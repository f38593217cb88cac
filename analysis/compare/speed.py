"""The throughput gate of ``memsweep compare --fail-slower``: did a value's samples per second fall?

Per value compared (a value that ran ok in both sweeps, on the same kind of device), the median
``samples_per_s`` of its ok runs (analysis.throughput.value_rates) in the baseline and in the other
sweep: the gate fails when it fell by more than a percentage of the baseline's rate. A value
without a measured rate in either sweep is not gated, and said so.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from fractions import Fraction

from memsweep.conf.contract import SpecError, timed_on

from ..doc import Doc
from ..throughput import value_rates
from .match import Comparison
from .scale import NAMED


@dataclass(frozen=True)
class Slowdown:
    """A value whose samples per second fell, or the rates of one value compared.

    Attributes:
        title: the series and the two sweeps' labels.
        value: ``axis=value``.
        base, other: samples per second in the baseline and the other sweep (medians).
        base_noise, other_noise: their ``throughput_noise_rel`` (None when unknown).
        timed: where they were timed (``analysis.throughput.timed_on`` of the baseline's runs).
    """

    title: str
    value: str
    base: float
    other: float
    base_noise: float | None
    other_noise: float | None
    timed: str

    @property
    def change(self) -> float:
        """other / base - 1: the relative change of samples per second (negative: slower)."""
        return self.other / self.base - 1

    def text(self) -> str:
        """The value in one line: both rates, the change and the noise."""
        noise = ", ".join(f"{n * 100:.1f} %" if n is not None else "-" for n in (self.base_noise, self.other_noise))
        return (
            f"{self.title} at {self.value}: {self.base:.4g} -> {self.other:.4g} samples/s "
            f"({100 * self.change:+.1f} %; noise {noise}; {self.timed})"
        )


def parse_slower(text: str) -> Fraction:
    """Read ``--fail-slower``: a percentage of the baseline's samples per second (``5%``, ``0%``).

    Returns:
        The fall allowed, as a fraction of the baseline's rate.

    Raises:
        SpecError: anything else; field ``--fail-slower``.
    """
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*%", str(text).strip())
    if not m:
        raise SpecError("--fail-slower", text, "a percentage of the baseline's samples per second (5%)")
    return Fraction(m.group(1)) / 100


def rate_changes(comparisons: list[Comparison]) -> list[Slowdown]:
    """The samples per second of every value compared in both sweeps, where both were measured.

    Args:
        comparisons: every comparison made (``match.compare_series``).

    Returns:
        One entry per value with a measured rate in both sweeps, in the comparisons' order.
    """
    out = []
    for c in comparisons:
        if c.other is None or not c.comparable:
            continue
        title = None  # the pair's title, made once (load_words per value would dominate)
        for value in dict.fromkeys(row.value for row in c.rows):
            a = value_rates(c.base.by_value.get(value, []), c.base.axis).get(value)
            b = value_rates(c.other.by_value.get(value, []), c.other.axis).get(value)
            if a is None or b is None:
                continue
            runs = c.base.by_value[value]
            where = timed_on(runs[0].get("device_kind"), runs[0].get("device_name"))
            title = title or f"{c.title}: {c.base.sweep.label} -> {c.other.sweep.label}"
            out.append(Slowdown(title, f"{c.base.axis}={value}", a[0], b[0], a[1], b[1], where))
    return out


def slowdowns(comparisons: list[Comparison], allowed: Fraction) -> list[Slowdown]:
    """The values whose samples per second fell by strictly more than ``allowed`` of the baseline's.

    Args:
        comparisons: every comparison made.
        allowed: the fall allowed, a fraction of the baseline's rate (``parse_slower``).

    Returns:
        The slowdowns, in the comparisons' order.
    """
    return [s for s in rate_changes(comparisons) if s.base - s.other > float(allowed) * s.base]


def _named(rates: list[Slowdown]) -> list[Slowdown]:
    """The rates named one by one: all, in the comparisons' order, when at most ``NAMED``; else the
    ``NAMED`` that fell most (relative change, the largest fall first)."""
    if len(rates) <= NAMED:
        return list(rates)
    return sorted(rates, key=lambda s: s.change)[:NAMED]


def _summary(rates: list[Slowdown]) -> str:
    """How many values, the median change and the extremes (for a list too long to name)."""
    changes = [s.change for s in rates]
    return (
        f"{len(rates)} values with a measured rate in both sweeps: median change "
        f"{100 * statistics.median(changes):+.1f} %, from {100 * min(changes):+.1f} % to "
        f"{100 * max(changes):+.1f} %; the {NAMED} that fell most are named (runs.parquet holds every rate)"
    )


def _gate(rates: list[Slowdown], slower: str | None, failed: list[Slowdown]) -> str:
    """The throughput gate's verdict in one line."""
    if slower is None:
        return "gate --fail-slower: none (not given)"
    if not rates:
        return f"gate --fail-slower {slower}: NOTHING COMPARABLE, no rate was checked"
    if failed:
        return f"gate --fail-slower {slower}: FAILED, {len(failed)} value(s) slower beyond it:"
    return f"gate --fail-slower {slower}: passed ({len(rates)} value(s) compared, none slower beyond it)"


def speed_lines(rates: list[Slowdown], slower: str | None, failed: list[Slowdown]) -> list[str]:
    """The throughput part of the comparison, for a terminal: each value's rates (past ``NAMED``,
    a summary and those that fell most), then the verdict and the values slower beyond the gate
    (past ``NAMED``, those that fell most, then how many more).

    Args:
        rates: every value's rates (``rate_changes``).
        slower: ``--fail-slower`` as given; None: no throughput gate.
        failed: the values that fell beyond it.

    Returns:
        The lines.
    """
    out = ["throughput (samples/s, medians over the warm iterations; measured):"]
    if len(rates) > NAMED:
        out.append(f"  {_summary(rates)}:")
    out += [f"  {s.text()}" for s in _named(rates)] or ["  no value has a measured rate in both sweeps"]
    out.append(_gate(rates, slower, failed))
    if slower is not None and failed:
        out += [f"  {s.text()}" for s in _named(failed)]
        if len(failed) > NAMED:
            out.append(f"  ... and {len(failed) - NAMED} more")
    return out


def speed_section(doc: Doc, rates: list[Slowdown], slower: str | None, failed: list[Slowdown]) -> None:
    """Append "Throughput" to the comparison's document: each value's rates (past ``NAMED``, a
    summary and those that fell most) and the gate's verdict.

    Args:
        doc: the comparison's document.
        rates: every value's rates (``rate_changes``).
        slower: ``--fail-slower`` as given; None: no throughput gate.
        failed: the values that fell beyond it.
    """
    doc.h(2, "Throughput")
    doc.p(
        "Samples per second of each value compared, the median over the warm iterations of its ok runs "
        "(measured; noise: median absolute deviation / median), and where they were timed."
        + (f" {_summary(rates)}." if len(rates) > NAMED else "")
    )
    rows = [
        [s.title, s.value, f"{s.base:.4g}", f"{s.other:.4g}", f"{100 * s.change:+.1f} %", s.timed]
        for s in _named(rates)
    ]
    doc.table(["series", "value", "baseline samples/s", "other samples/s", "change", "timed"], rows)
    doc.p(_gate(rates, slower, failed))
