"""The fork server's messages: a client's request and the handler's two answers, one JSON line
each on the run's connection (``worker.forkserver``; the client is ``sweeper.forkserver_client``),
and the exit status a handler that kept a run writes beside its spec.json.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any, NamedTuple


@dataclasses.dataclass(frozen=True)
class ForkRequest:
    """What a client asks of the fork server for one run.

    Attributes:
        spec: the run's spec.json path.
        stdout: the worker's stdout.log path.
        stderr: the worker's stderr.log path.
        env: the worker's whole environment.
        dynamo: the run needs ``torch._dynamo`` imported before the fork
            (``conf.contract.needs_dynamo``).
        timeout_s: the run's bound (seconds); the handler keeps the run to it if its client dies.
        isolation: ``forkserver`` (fork the worker) or ``spawn`` (start ``python -m memsweep.worker SPEC``).
    """

    spec: str
    stdout: str
    stderr: str
    env: dict[str, str]
    dynamo: bool
    timeout_s: float
    isolation: str

    def to_json(self) -> dict[str, Any]:
        """The request as the JSON object sent on the connection (fields in declaration order)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: object) -> ForkRequest:
        """The request of a decoded JSON line.

        Args:
            doc: the line, decoded (``json.loads``).

        Returns:
            The request.

        Raises:
            ValueError: ``doc`` is not an object with every field, of its type (a positive,
                finite ``timeout_s``).
        """
        if not isinstance(doc, Mapping):
            raise ValueError(f"a fork request is a JSON object, not {type(doc).__name__}")
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in doc]
        if missing:
            raise ValueError(f"a fork request without {', '.join(missing)}")
        timeout_s = doc["timeout_s"]
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < math.inf:
            raise ValueError(f"a fork request's timeout_s is a positive number of seconds, not {timeout_s!r}")
        texts = ("spec", "stdout", "stderr", "isolation")
        if not all(isinstance(doc[k], str) for k in texts) or not isinstance(doc["env"], Mapping):
            raise ValueError("a fork request's spec, stdout, stderr and isolation are texts and env an object")
        return cls(
            spec=doc["spec"],
            stdout=doc["stdout"],
            stderr=doc["stderr"],
            env=dict(doc["env"]),
            dynamo=bool(doc["dynamo"]),
            timeout_s=float(timeout_s),
            isolation=doc["isolation"],
        )


class ForkStarted(NamedTuple):
    """The handler's first answer: the worker has started.

    Attributes:
        pid: the worker's pid (the leader of its process group).
        handler: the handler's pid, which the client watches.
    """

    pid: int
    handler: int

    def to_line(self) -> bytes:
        """The answer as sent: one JSON line."""
        return (json.dumps({"pid": self.pid, "handler": self.handler}) + "\n").encode()


class ForkEnded(NamedTuple):
    """The handler's second answer: the worker has ended.

    Attributes:
        returncode: its exit status (negative: killed by that signal, as ``subprocess`` reports it).
        timed_out: the handler killed it at its ``timeout_s`` (its client may be stopped, SIGSTOP).
    """

    returncode: int
    timed_out: bool = False

    def to_line(self) -> bytes:
        """The answer as sent: one JSON line."""
        return (json.dumps({"returncode": self.returncode, "timed_out": self.timed_out}) + "\n").encode()


class KeptExit(NamedTuple):
    """How a run kept by its handler (its client gone) ended, for its exit status file.

    Attributes:
        returncode: the worker's exit status (negative: killed by that signal).
        timed_out: the handler killed it at its ``timeout_s``.
        wall_s: seconds from the fork to the worker's end.
    """

    returncode: int
    timed_out: bool
    wall_s: float
