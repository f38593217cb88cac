"""Bad input carried from the library to the command line (``sweeper.cli``), which alone
prints and chooses the exit status."""

from __future__ import annotations

from typing import Any

from conf.contract import SpecError


class InputRefused(BaseException):
    """Bad input a Hydra plugin refused before any run: ``sweeper.cli`` prints
    ``memsweep: error: <the SpecError>`` and exits 2.

    A ``BaseException`` (as ``SystemExit`` and ``KeyboardInterrupt`` are) because Hydra's job
    runner reports every ``Exception`` raised inside it itself and exits 1: this one passes
    through to the command line.

    Args:
        error: the refusal.

    Attributes:
        error: the ``SpecError``.
        field: the input refused (e.g. ``hydra.sweeper.strategy``).
        value: the value given.
        accepted: what is accepted.
    """

    def __init__(self, error: SpecError):
        super().__init__(str(error))
        self.error = error
        self.field: str = error.field
        self.value: Any = error.value
        self.accepted: str = error.accepted
