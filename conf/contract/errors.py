"""The contract's typed errors: bad input (SpecError) and an unreadable file (RecordError).

Library code raises these; only the command-line layer turns them into a message and an exit
status (``conf.contract.exits``).
"""

from __future__ import annotations

from typing import Any


class SpecError(ValueError):
    """Bad input: names the field, the value given and what is accepted.

    Attributes:
        field: the setting's name as the user writes it (``batch``, ``workload.heads``,
            ``hydra.sweeper.axes``).
        value: the value given.
        accepted: what would have been accepted, in words.
    """

    def __init__(self, field: str, value: Any, accepted: str):
        """Build the error; its message reads ``invalid FIELD=VALUE: expected ACCEPTED``."""
        self.field, self.value, self.accepted = field, value, accepted
        super().__init__(f"invalid {field}={value!r}: expected {accepted}")

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as (class, (field, value, accepted)), so that the error crosses a process
        boundary (a launcher's worker process) whole."""
        return (type(self), (self.field, self.value, self.accepted))


class RecordError(ValueError):
    """A spec, record or result file that cannot be read: missing, corrupt, truncated or of an
    unknown version. The message names the file and why."""


class NewerSchemaError(RecordError):
    """A file written by a newer memsweep (its ``schema_version`` is above
    ``conf.contract.record.SCHEMA_VERSION``): not damage, but unreadable here."""
