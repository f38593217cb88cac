"""Checks of single values, shared by the spec and the workload validators.

Each returns the value when it is accepted and raises ``SpecError`` naming the field, the
value and what is accepted otherwise.
"""

from __future__ import annotations

from typing import Any

from .errors import SpecError


def positive_int(name: str, value: Any, maximum: int = 2**40) -> int:
    """Check an integer in [1, maximum] (a bool is not an integer here).

    Args:
        name: the field, for the error.
        value: the value given.
        maximum: the largest value accepted.

    Returns:
        ``value``.

    Raises:
        SpecError: not an integer in range.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise SpecError(name, value, f"an integer from 1 to {maximum}")
    return value


def nonneg_int(name: str, value: Any, maximum: int = 10**6) -> int:
    """Check an integer in [0, maximum] (a bool is not an integer here).

    Args:
        name: the field, for the error.
        value: the value given.
        maximum: the largest value accepted.

    Returns:
        ``value``.

    Raises:
        SpecError: not an integer in range.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise SpecError(name, value, f"an integer from 0 to {maximum}")
    return value


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
