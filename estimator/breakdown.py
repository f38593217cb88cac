"""The estimate's shape: a ``Breakdown`` of bytes by component, and its runs.parquet columns.

``COMPONENTS`` and ``Breakdown`` are what every other module of the estimator returns;
``ESTIMATE_COLUMNS`` / ``estimate_columns`` put a run's estimate next to its observed peak.
``check_int`` and ``ceil_div`` are the integer helpers the topic modules share.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from memsweep.conf.contract import ESTIMATE_KEYS, GB, GiB

COMPONENTS = ("weights", "gradients", "optimizer_states", "activations", "kv_cache", "temporaries")
"""The estimated components, in print order. ``temporaries`` are short-lived buffers at the
peak: activation gradients in backward, optimizer scratch, dtype-conversion copies."""

COMPONENT_LABELS = {
    "weights": "weights",
    "gradients": "gradients",
    "optimizer_states": "optimizer states",
    "activations": "activations",
    "kv_cache": "KV cache",
    "temporaries": "temporaries",
}
"""The printed name of each component (``Breakdown.format``)."""


def check_int(name: str, value: Any, minimum: int = 0) -> int:
    """``value`` itself when it is an integer >= ``minimum`` (``bool`` is not an integer here).

    Args:
        name: what the value is, for the error message.
        value: the value to check.
        minimum: the smallest value accepted.

    Returns:
        ``value``, unchanged.

    Raises:
        ValueError: ``value`` is not an ``int``, is a ``bool``, or is below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` in exact integer arithmetic (no float rounding on large byte counts).

    Args:
        a: dividend.
        b: divisor, non-zero.

    Returns:
        the smallest integer >= a / b.

    Raises:
        ZeroDivisionError: ``b`` is 0.
    """
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class Breakdown:
    """Estimated memory by component, in bytes; ``None`` = not estimated (not asked for).

    Attributes:
        weights: the model's parameters as stored (after quantization, if any).
        gradients: parameter gradients.
        optimizer_states: optimizer state, including mixed precision's fp32 master copy of
            the weights (the ZeRO paper's convention: K = 12 bytes/param for Adam).
        activations: model inputs, tensors kept for backward, layer outputs, loss buffers.
        kv_cache: keys and values kept for generation.
        temporaries: short-lived buffers live at the peak (activation gradients in
            backward, optimizer scratch, dtype-conversion copies).
        reserve: a planning margin, an assumption; never part of ``peak``.
        notes: what the figures assume, in words.

    ``peak`` is the sum of the estimated components (the number to compare with
    ``max_memory_allocated``); ``total`` is ``peak + reserve``.

    Raises:
        ValueError: a component or the reserve that is not an integer >= 0 (``None`` is
            accepted for the components).
    """

    weights: int | None = None
    gradients: int | None = None
    optimizer_states: int | None = None
    activations: int | None = None
    kv_cache: int | None = None
    temporaries: int | None = None
    reserve: int = 0
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in COMPONENTS:
            value = getattr(self, name)
            if value is not None:
                check_int(name, value)
        check_int("reserve", self.reserve)
        object.__setattr__(self, "notes", tuple(self.notes))

    @property
    def peak(self) -> int:
        """Sum of the estimated components, bytes (reserve excluded)."""
        return sum(getattr(self, n) or 0 for n in COMPONENTS)

    @property
    def total(self) -> int:
        """``peak + reserve``, bytes."""
        return self.peak + self.reserve

    @property
    def not_included(self) -> tuple[str, ...]:
        """Components that were not estimated (``None``)."""
        return tuple(n for n in COMPONENTS if getattr(self, n) is None)

    def replace(self, **changes: Any) -> Breakdown:
        """A copy with the given fields changed (``dataclasses.replace``).

        Args:
            **changes: field name -> new value (components and ``reserve`` in bytes).

        Returns:
            a new Breakdown.

        Raises:
            TypeError: an unknown field name.
            ValueError: a value that is not an integer >= 0 (or ``None`` for a component).
        """
        return dataclasses.replace(self, **changes)

    def with_note(self, *notes: str) -> Breakdown:
        """A copy with ``notes`` appended to the existing notes (figures unchanged).

        Args:
            *notes: sentences saying what the figures assume.

        Returns:
            a new Breakdown.
        """
        return dataclasses.replace(self, notes=self.notes + tuple(notes))

    def __add__(self, other: Breakdown) -> Breakdown:
        """Component-wise sum; ``None + x = x``; reserves add; notes concatenate.

        Args:
            other: another Breakdown.

        Returns:
            a new Breakdown, bytes; a component is ``None`` only when it is ``None`` in both.
        """
        values = {}
        for n in COMPONENTS:
            a, b = getattr(self, n), getattr(other, n)
            values[n] = None if a is None and b is None else (a or 0) + (b or 0)
        return Breakdown(**values, reserve=self.reserve + other.reserve, notes=self.notes + other.notes)

    def to_dict(self) -> dict:
        """Plain JSON-able dict in bytes: the components, ``reserve``, ``peak``, ``total``.

        This is the ``estimate`` field of a RunSpec (keys: ``conf.contract.ESTIMATE_KEYS``).

        Returns:
            ``{component: bytes or None, "reserve": bytes, "peak": bytes, "total": bytes}``;
            the notes are not part of it.
        """
        out = {n: getattr(self, n) for n in COMPONENTS}
        out.update(reserve=self.reserve, peak=self.peak, total=self.total)
        assert set(out) == set(ESTIMATE_KEYS)
        return out

    @classmethod
    def from_dict(cls, data: Mapping) -> Breakdown:
        """The Breakdown of a ``to_dict`` (a spec's ``estimate``); ``peak`` and ``total`` are
        recomputed, not read.

        Args:
            data: ``{component: bytes or None, "reserve": bytes}``; missing keys are ``None``
                (a missing or null reserve is 0).

        Returns:
            a Breakdown without notes.

        Raises:
            ValueError: a value that is not an integer >= 0 (or ``None`` for a component).
        """
        components: dict[str, Any] = {n: data.get(n) for n in COMPONENTS}
        return cls(**components, reserve=data.get("reserve") or 0)

    def format(self, title: str | None = None, decimals: int = 2) -> str:
        """A text table: one row per estimated component, bytes, GB and GiB in separate columns.

        Ends with the peak, the reserve, the total with reserve, and a sentence naming the
        components that are not included.

        Args:
            title: a first line, if any.
            decimals: decimals of the GB (10^9 B) and GiB (2^30 B) columns.

        Returns:
            the table, lines joined by newlines (no trailing newline).
        """
        rows = [(COMPONENT_LABELS[n], getattr(self, n)) for n in COMPONENTS if getattr(self, n) is not None]
        rows.append(("sum (without reserve)", self.peak))
        if self.reserve:
            rows += [("reserve (assumed)", self.reserve), ("total with reserve", self.total)]
        width = max(12, max(len(str(v)) for _, v in rows))
        gw = max(8, max(len(f"{v / GB:.{decimals}f}") for _, v in rows))
        iw = max(8, max(len(f"{v / GiB:.{decimals}f}") for _, v in rows))
        lines = [title] if title else []
        lines.append(f"{'component':<24} {'bytes (B)':>{width}} {'GB':>{gw}} {'GiB':>{iw}}")
        for label, value in rows:
            if label == "sum (without reserve)":
                lines.append("-" * (24 + width + gw + iw + 3))
            lines.append(
                f"{label:<24} {value:>{width}d} {value / GB:>{gw}.{decimals}f} {value / GiB:>{iw}.{decimals}f}"
            )
        lines.append("GB = 10^9 B, GiB = 2^30 B.")
        missing = [COMPONENT_LABELS[n] for n in self.not_included]
        if missing:
            lines.append("Not included (not asked for): " + ", ".join(missing) + ".")
        for note in self.notes:
            lines.append("Note: " + note)
        return "\n".join(lines)


# --------------------------------------------------------------------------------------
# runs.parquet: calculated columns next to the observed ones
# --------------------------------------------------------------------------------------

ESTIMATE_COLUMNS = tuple(f"est_{n}_bytes" for n in COMPONENTS) + ("est_peak_bytes", "estimate_error")
"""Columns of runs.parquet filled from the spec's ``estimate`` (calculated before the run):
``est_<component>_bytes`` and ``est_peak_bytes`` (int64 bytes, null when not estimated),
``estimate_error`` = (est_peak_bytes - max_memory_allocated) / max_memory_allocated (float,
null unless the run is ``ok``, measured (``source`` measured: a dry run's peak is predicted, not
observed) and both sides are known). For a DDP/FSDP run they are filled from
one rank's estimate (``parallel.rank_estimate``), as its ``max_memory_allocated`` is the fullest
rank's."""


def estimate_columns(
    estimate: Mapping | None, max_memory_allocated: int | None, outcome: str | None, source: str = "measured"
) -> dict:
    """The ``ESTIMATE_COLUMNS`` of one run, from its spec's estimate and its observed peak.

    A run that did not finish (``oom``, ``crash``, ...) has only a partial observed peak,
    so its ``estimate_error`` is null; so does a dry run (``source`` predicted), whose peak is
    a prediction on fake tensors, nothing observed to check the estimate against.

    Args:
        estimate: the spec's ``estimate`` (``Breakdown.to_dict``), or ``None``; anything
            that is not a mapping counts as no estimate.
        max_memory_allocated: the run's observed peak, bytes, or ``None``.
        outcome: the run's outcome (``ok``, ``oom``, ...).
        source: the runs table's ``source``: ``measured``, or ``predicted`` (a dry run).

    Returns:
        ``{column: value}`` for every name of ``ESTIMATE_COLUMNS``: the byte counts as int
        (``None`` when missing, not an int, negative or beyond int64: a corrupt spec never
        raises), ``estimate_error`` as a float ratio or ``None``.
    """
    est = estimate if isinstance(estimate, Mapping) else {}

    def as_int(v: Any) -> int | None:  # a byte count that fits int64, else null (a corrupt spec)
        return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63 else None

    row: dict[str, int | float | None] = {f"est_{n}_bytes": as_int(est.get(n)) for n in COMPONENTS}
    row["est_peak_bytes"] = as_int(est.get("peak"))
    measured = as_int(max_memory_allocated)
    row["estimate_error"] = (
        (row["est_peak_bytes"] - measured) / measured
        if outcome == "ok" and source == "measured" and row["est_peak_bytes"] is not None and measured
        else None
    )
    return row
