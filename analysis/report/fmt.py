"""Formatting for the report's text: bytes stay integers until printed (raw bytes, then GiB)."""

from __future__ import annotations

import json
import math
from fractions import Fraction


def workload_params(run: dict) -> dict:
    """A runs-table row's workload parameters (its ``workload_params`` JSON text) as a dict.

    Args:
        run: a row of the runs table.

    Returns:
        The parameters; {} when the column is empty, not readable JSON, or not a JSON object.
    """
    try:
        params = json.loads(run.get("workload_params") or "{}")
    except ValueError:
        return {}
    return params if isinstance(params, dict) else {}


def pct(part: int | None, whole: int | None, down: bool = False) -> str:
    """``part`` as a percentage of ``whole``, for printing.

    Args:
        part, whole: bytes (or any two numbers in one unit); None where unknown.
        down: rounded toward zero, not to the nearest (a margin beside a threshold: 9.9975 % of
            the capacity is ``"9.9 %"``, never ``"10.0 %"`` beside a 10 % margin it does not leave).

    Returns:
        ``"12.3 %"`` (one decimal); ``"-"`` when ``part`` is None or ``whole`` is None or 0.
    """
    if part is None or not whole:
        return "-"
    if down:  # in exact arithmetic: 12.3 % stays 12.3 % (a float's 122.999... tenths would not)
        return f"{math.trunc(1000 * Fraction(part) / Fraction(whole)) / 10:.1f} %"
    return f"{100 * part / whole:.1f} %"


def nbytes(value: int | None) -> str:
    """A byte count for printing: the raw integer number of bytes, ``"-"`` when None."""
    return "-" if value is None else str(int(value))


def axis_label(axis: str, value) -> str:
    """``"batch=16"``: a value of a swept axis (batch, context, width, dtype) as the report names it."""
    return f"{axis}={value}"


def dry_runs_text(n: int) -> str:
    """``"3 dry runs (source `predicted`)"``: how the report names ``n`` dry runs (predictions)."""
    return f"{n} dry run{'s' if n != 1 else ''} (source `predicted`)"


def unread_text(n: int) -> str:
    """``"2 runs whose record could not be read"``: how the report names ``n`` runs whose record this
    memsweep could not read (``stats.record_unread``)."""
    return f"{n} run{'s' if n != 1 else ''} whose record could not be read"
