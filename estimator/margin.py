"""The margin policy (assumed) and what is compared with the capacity, per device kind.

The margin is the headroom a setting must leave below the capacity: capacity - peak >= margin,
all in bytes. Which peak (counter) is compared depends on the device: see ``basis`` and the
package docstring.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from memsweep.conf.contract import SpecError, device_kind_of, gib, parse_size, peak_counters

DEFAULT_MARGIN = "10%"
"""The margin when none is given (``--margin``, ``hydra.callbacks.analyze.margin``): 10 % of the capacity."""


@dataclass(frozen=True)
class MarginPolicy:
    """Headroom kept free below the capacity: a fraction of it, or a fixed number of bytes.

    Built by ``parse_margin``; exactly one of ``fraction`` and ``fixed_bytes`` is set.

    Attributes:
        text: the policy as given (``"10%"``, ``"0.1"``, ``"2GiB"``), for the report's text.
        fraction: the share of the capacity kept free, in [0, 1); None for a fixed margin.
        fixed_bytes: the bytes kept free whatever the capacity; None for a fractional margin.
        default: True when no margin was given (memsweep's default, DEFAULT_MARGIN).
    """

    text: str
    fraction: Fraction | None = None
    fixed_bytes: int | None = None
    default: bool = False

    def bytes_for(self, capacity: int | None) -> int | None:
        """The margin in bytes for a device of ``capacity`` bytes.

        Args:
            capacity: the capacity compared with the peak (bytes); None when not recorded.

        Returns:
            ``fixed_bytes``, or ``ceil(fraction * capacity)`` bytes; None for a fractional
            policy when ``capacity`` is None.
        """
        if self.fixed_bytes is not None:
            return self.fixed_bytes
        if capacity is None or self.fraction is None:
            return None
        return int(math.ceil(self.fraction * capacity))

    def short(self) -> str:
        """The policy in a few words for a sentence beside its bytes: ``"10 % of the capacity"`` or
        ``"2.000 GiB"`` (a fixed margin in GiB, 2^30 B: its bytes are printed beside it)."""
        return (
            f"{float(self.fraction) * 100:g} % of the capacity"
            if self.fraction is not None
            else f"{gib(self.fixed_bytes)} GiB"
        )

    def describe(self) -> str:
        """The policy in full for the report: its size (bytes and GiB for a fixed one) and where it came
        from (memsweep's default, or the text given: ``memsweep report --margin`` or a sweep's
        ``hydra.callbacks.analyze.margin``)."""
        what = (
            f"{float(self.fraction) * 100:g} % of the capacity"
            if self.fraction is not None
            else f"{self.fixed_bytes} B ({gib(self.fixed_bytes)} GiB) below the capacity"
        )
        return what + (
            " (memsweep's default; set another with `memsweep report --margin` or, in a sweep, "
            "`hydra.callbacks.analyze.margin`)"
            if self.default
            else f" (given as {self.text})"
        )


def parse_margin(text: Any = None) -> MarginPolicy:
    """Read a margin policy.

    Args:
        text: ``None`` -> the default (DEFAULT_MARGIN, 10 % of the capacity); ``"0.1"`` or
            ``"10%"`` -> a fraction of the capacity in [0, 1); ``"0"`` -> no margin (zero in any
            unit); ``"2GiB"``, ``"1500MB"``, ``"0B"`` -> a fixed number of bytes (the unit is
            required, as in conf.contract.parse_size: ``"10"`` is refused, not read as 10 B).

    Returns:
        The policy.

    Raises:
        SpecError: anything else, or a fraction outside [0, 1); its ``field`` is ``"margin"``,
            ``value`` the text given and ``accepted`` the forms above.
    """
    default = text is None
    text = DEFAULT_MARGIN if default else str(text).strip()
    accepted = "a fraction of the capacity in [0, 1) (10% or 0.1), 0, or a size with its unit (256MiB, 2GB, 0B)"
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*%", text)
    if m:
        frac = Fraction(m.group(1)) / 100
    elif re.fullmatch(r"\d*\.\d+|0", text):
        frac = Fraction(text)
    else:
        try:
            return MarginPolicy(text, fixed_bytes=parse_size(text, "margin", zero=True), default=default)
        except SpecError:
            raise SpecError("margin", text, accepted) from None
    if not 0 <= frac < 1:
        raise SpecError("margin", text, accepted)
    return MarginPolicy(text, fraction=frac, default=default)


def margin_leaves_nothing(capacity: int | None, margin_bytes: int | None) -> bool:
    """Whether a margin keeps the whole capacity free (a fixed margin at least the capacity): no
    peak can leave it, and capacity - margin is no level a fit can reach.

    Args:
        capacity: the capacity compared with the peak (bytes); None when not recorded.
        margin_bytes: the margin policy's bytes at that capacity (``MarginPolicy.bytes_for``).

    Returns:
        True when both are known and ``margin_bytes >= capacity``.
    """
    return capacity is not None and margin_bytes is not None and margin_bytes >= capacity


def refuse_margin_at_capacity(policy: MarginPolicy, capacity: int | None, field: str, of: str = "") -> None:
    """Refuse a margin that keeps the whole capacity free (``margin_leaves_nothing``): bad input,
    since no load can fit under it.

    Args:
        policy: the margin policy (``parse_margin``).
        capacity: the capacity compared with the peak (bytes); None when not known (nothing checked).
        field: the setting's name for the error (``margin``, ``hydra.callbacks.analyze.margin``).
        of: what the capacity is, for the message (``" of /path/to/sweep"``); may be empty.

    Raises:
        SpecError: field ``field``, the margin as given, expecting a margin below the capacity
            (bytes and GiB).
    """
    if margin_leaves_nothing(capacity, policy.bytes_for(capacity)):
        assert capacity is not None  # margin_leaves_nothing: known
        raise SpecError(
            field,
            policy.text,
            f"a margin below the capacity {capacity} B ({gib(capacity)} GiB){of}: one of at least the "
            "capacity leaves no room for any peak, so nothing could fit",
        )


def device_kind(run: dict) -> str:
    """The kind of device a run measured on: ``cpu``, ``cuda`` (ROCm included) or ``unknown``.

    Args:
        run: a row of the runs table (RUNS_SCHEMA); its ``device_kind``, else its ``device``.

    Returns:
        The kind, the key of ``basis`` and BASIS_TEXT (``conf.contract.device_kind_of``).
    """
    return device_kind_of(run.get("device_kind"), run.get("device"))


def basis(kind: str) -> tuple[str, str]:
    """Which peak counter is compared with the capacity on a kind of device (see BASIS_TEXT).

    Args:
        kind: ``cpu``, ``cuda`` or any other (treated as ``cuda``), as ``device_kind`` returns it.

    Returns:
        (the counter compared with the capacity, the other counter): ``max_memory_allocated``
        first on the CPU, ``max_memory_reserved`` first elsewhere (``conf.contract.peak_counters``,
        the run's peak everywhere else). Both count bytes.
    """
    return peak_counters(kind)


BASIS_TEXT = {
    "cpu": (
        "On the CPU the peak compared with the capacity is `max_memory_allocated`, the live "
        "tensor bytes the worker tracks. The CPU's `max_memory_reserved` is the process resident "
        "set (interpreter and PyTorch libraries included, about 0.3 GiB), so capacity minus it "
        "would be negative for every run. With `capacity_mode=allocator` (the default) the emulated "
        "capacity caps exactly these tracked bytes, as a GPU capacity caps the caching allocator, "
        "so the margin and the runs agree. With `capacity_mode=process` it limits the growth of the "
        "worker's data segment above its size at start (RLIMIT_DATA), which holds the tensors plus "
        "the heap's own overhead: that margin is optimistic, and where it and the runs disagree, "
        "trust the first value that ran out of memory. `reserved above start` is the "
        "resident set's peak minus its value when the first phase began, shown for information."
    ),
    "cuda": (
        "On CUDA/ROCm the peak compared with the capacity is `max_memory_reserved`, the bytes the "
        "caching allocator held from the device at its peak. The CUDA context, cuBLAS/cuDNN "
        "workspaces allocated outside the caching allocator and other processes are not in it."
    ),
}
"""Per device kind, the report's explanation of the counter ``basis`` compares with the capacity."""
