"""Formatting for the report's text: bytes stay integers until printed (raw bytes, then GiB)."""

from __future__ import annotations


def pct(part: int | None, whole: int | None) -> str:
    if part is None or not whole:
        return "-"
    return f"{100 * part / whole:.1f} %"


def nbytes(value: int | None) -> str:
    return "-" if value is None else str(int(value))


def axis_label(axis: str, value) -> str:
    return f"{axis}={value}"


def dry_runs_text(n: int) -> str:
    return f"{n} dry run{'s' if n != 1 else ''} (source `predicted`)"
