"""Checks of single values, shared by the spec and the workload validators.

Each returns the value when it is accepted and raises ``SpecError`` naming the field, the
value and what is accepted otherwise.
"""

from __future__ import annotations

from typing import Any

from .errors import SpecError


def int_in_range(name: str, value: Any, minimum: int, maximum: int) -> int:
    """Check an integer in [minimum, maximum] (a bool is not an integer here).

    Args:
        name: the field, for the error.
        value: the value given.
        minimum: the smallest value accepted.
        maximum: the largest value accepted.

    Returns:
        ``value``.

    Raises:
        SpecError: not an integer in range ("an integer from <minimum> to <maximum>").
    """
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise SpecError(name, value, f"an integer from {minimum} to {maximum}")
    return value


def positive_int(name: str, value: Any, maximum: int = 2**40) -> int:
    """Check a count or size, at least 1 (``int_in_range`` from 1).

    Args:
        name: the field, for the error.
        value: the value given.
        maximum: the largest value accepted (2**40 unless the field has its own bound).

    Returns:
        ``value``; else SpecError "an integer from 1 to <maximum>".
    """
    return int_in_range(name, value, 1, maximum)


def optional_positive(name: str, value: Any, maximum: int = 2**40) -> int | None:
    """Check None or an integer in [1, maximum] (see ``positive_int``).

    Args:
        name: the field, for the error.
        value: the value given.
        maximum: the largest value accepted.

    Returns:
        ``value``.

    Raises:
        SpecError: neither None nor an integer in range.
    """
    return None if value is None else positive_int(name, value, maximum)


def choice(name: str, value: Any, accepted: tuple[str, ...]) -> str:
    """Check one of ``accepted`` (a vocabulary tuple).

    Args:
        name: the field, for the error.
        value: the value given.
        accepted: the names accepted.

    Returns:
        ``value``.

    Raises:
        SpecError: not one of ``accepted``.
    """
    if value not in accepted:
        raise SpecError(name, value, "one of " + ", ".join(accepted))
    return value


def check_process_capacity(capacity_mode: str, capacity_bytes: Any) -> None:
    """``capacity_mode=process`` limits the worker process to the capacity: it needs one.

    Args:
        capacity_mode: the spec's ``capacity_mode`` (one of ``CAPACITY_MODES``).
        capacity_bytes: the spec's emulated capacity in bytes, or None (the device's own memory).

    Raises:
        SpecError: ``capacity_mode=process`` without a capacity, naming ``capacity_mode``.
    """
    if capacity_mode == "process" and capacity_bytes is None:
        raise SpecError(
            "capacity_mode",
            capacity_mode,
            "allocator without a capacity; process (RLIMIT_DATA on the worker process) needs a size, "
            "e.g. capacity=1GiB",
        )
