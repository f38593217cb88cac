"""Units of memory: bytes are integers everywhere; GB and GiB appear only when printing.

1 GB = 10^9 B (SI), 1 GiB = 2^30 B (IEC 80000-13 binary prefix). A figure is converted once,
where it is printed, and the text says which unit.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

from .errors import SpecError

GB = 10**9
"""One gigabyte (SI), in bytes."""

GiB = 2**30
"""One gibibyte (IEC), in bytes."""

SIZE_UNITS = {
    "B": 1,
    "kB": 10**3,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}
"""Bytes per unit of the size texts ``parse_size`` accepts."""


def gib(value: int | float | None) -> str:
    """Format a byte count as GiB (2^30 B) text for printing.

    Args:
        value: bytes, or None / NaN for a missing figure.

    Returns:
        3 decimals from 1 GiB up, 6 below; ``"-"`` for a missing figure. Bytes stay integers
        everywhere else; this is the one conversion.
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    x = value / GiB
    return f"{x:.3f}" if abs(x) >= 1 else f"{x:.6f}"


def bytes_text(value: int | None) -> str:
    """Format a byte count with both units named, for printing.

    Args:
        value: bytes, or None.

    Returns:
        ``"N B = x GB = y GiB"``; ``"null"`` for None.
    """
    return "null" if value is None else f"{value} B = {value / GB:.3f} GB = {value / GiB:.3f} GiB"


SIZE_FORMS = (
    "with its unit, such as 256MiB, 2GiB, 1500MB, 24GB or 4096B "
    "(units B, kB, MB, GB, TB = 10^3n; KiB, MiB, GiB, TiB = 2^10n)"
)
"""The size texts ``parse_size`` accepts, in words, for error messages (after "a size")."""


def parse_size(text: Any, field: str = "capacity", zero: bool = False) -> int:
    """Parse a memory size into an exact integer number of bytes.

    Accepts a text ``<number><unit>`` with unit one of B, kB/KB, MB, GB, TB (powers of 1000,
    SI) or KiB, MiB, GiB, TiB (powers of 1024, IEC 80000-13 / NIST binary prefixes). ``"24GB"``
    is 24 * 10**9 bytes, ``"2GiB"`` is 2 * 2**30 bytes; a decimal number is allowed when the
    result is a whole number of bytes (``"1.5GiB"`` = 1610612736). The unit is required: a bare
    number (``256``, or the integer Hydra makes of ``capacity=256``) is refused, since it would
    silently mean bytes; write ``256B`` for bytes.

    Args:
        text: the size, with its unit.
        field: the setting's name, for the error message.
        zero: accept a size of zero (``0B``, ``0MiB``); else the size must be > 0.

    Returns:
        The size in bytes (> 0, or >= 0 with ``zero``).

    Raises:
        SpecError: no unit, an unknown unit, not a whole number of bytes, or not above zero
            (without ``zero``); its ``accepted`` names the forms above.
    """
    accepted = ("a size of 0 or more " if zero else "a positive size ") + SIZE_FORMS
    if isinstance(text, bool) or not isinstance(text, str):
        raise SpecError(field, text, accepted)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*", text)
    if not m or m.group(2) not in SIZE_UNITS:
        raise SpecError(field, text, accepted)
    exact = Fraction(m.group(1)) * SIZE_UNITS[m.group(2)]
    if exact.denominator != 1:
        raise SpecError(field, text, accepted + " (a whole number of bytes)")
    if exact < 0 or (exact == 0 and not zero):
        raise SpecError(field, text, accepted)
    return int(exact)


def check_bytes(value: Any, field: str = "capacity_bytes") -> int:
    """Check a byte count already in bytes (a spec's ``capacity_bytes``).

    Args:
        value: the count (an int, bytes).
        field: the setting's name, for the error message.

    Returns:
        ``value``, > 0.

    Raises:
        SpecError: not an integer above zero.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(field, value, "a positive whole number of bytes (on the command line: a size and unit, 2GiB)")
    return value
