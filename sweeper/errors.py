"""Bad input carried from the library to the command line (``sweeper.cli``), which alone
prints and chooses the exit status."""

from __future__ import annotations

from typing import Any


class InputRefused(BaseException):
    """Bad input refused inside Hydra (a sweeper plugin, or the task of a run) before any worker
    started: ``sweeper.cli`` prints ``memsweep: error: <message>`` and exits 2
    (``conf.contract.EXIT_BAD_INPUT``).

    A ``BaseException`` (as ``SystemExit`` and ``KeyboardInterrupt`` are) because Hydra's job
    runner reports every ``Exception`` raised inside it itself and exits 1: this one passes
    through to the command line.

    Args:
        error: the refusal: a ``conf.contract.SpecError`` (a setting), or another error whose
            message is shown as is (``sweeper.process.RunDirError``: a run directory).
        note: words added to the message in parentheses (what to do about it), or None.

    Attributes:
        error: the refusal.
        note: the added words, or None.
        field: the input refused (e.g. ``hydra.sweeper.strategy``), None when ``error`` names none.
        value: the value given, None when ``error`` names none.
        accepted: what is accepted, None when ``error`` names none.
    """

    def __init__(self, error: Exception, note: str | None = None):
        super().__init__(f"{error} ({note})" if note else str(error))
        self.error = error
        self.note = note
        self.field: str | None = getattr(error, "field", None)
        self.value: Any = getattr(error, "value", None)
        self.accepted: str | None = getattr(error, "accepted", None)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as (class, (error, note)): a launcher that runs the task in another process
        (joblib, submitit) sends the refusal back to the sweep's process."""
        return (type(self), (self.error, self.note))
