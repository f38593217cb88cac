"""Bounded waits on the fork server's answers (``sweeper.process.ForkServer``).

Every answer the client waits for has a bound and a watch on who owes it: the fork server
owes the worker's pid, the run's handler (a process the server forked) owes its exit status.
A stopped (SIGSTOP, a tracer) or vanished peer is seen within ``POLL_S``; a peer that runs but
does not answer within the bound is wedged. Either way the caller gets a typed error with a
message, and replaces the server as for a lost one.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time

from memsweep.conf.contract import STOPPED_STATES, process_state

POLL_S = 0.25
"""How often a waiting client looks at the peer it waits for (seconds)."""

ANSWER_S = 120.0
"""The bound on the fork server's first answer (the worker's pid), in seconds. It forks at once,
but first imports ``torch._dynamo`` on the first run that needs it (seconds; tens on a loaded
machine): a server silent for longer is wedged."""

KILLED_ANSWER_S = 30.0
"""After the client killed a run at its timeout: the bound on its handler's exit status (seconds)."""


class PeerStopped(RuntimeError):
    """The process that owes the answer is stopped (``T``/``t`` in /proc): it never answers by itself."""


class AnswerOverdue(RuntimeError):
    """No answer within the bound, though the peer runs (or cannot be watched)."""


def read_answer(conn: socket.socket, buffer: bytearray, peer: int | None, bound_s: float, who: str) -> bytes:
    """Read one newline-terminated message from ``conn``, waiting at most ``bound_s`` seconds.

    Args:
        conn: the connected socket (its timeout is changed).
        buffer: bytes read and not yet consumed (kept across calls).
        peer: the pid of the process that owes the answer (watched for a stop), or None.
        bound_s: the bound, in seconds.
        who: the peer in words, for the messages (``the fork server``...).

    Returns:
        The message without its newline; ``b""`` when the peer closed the connection first (it died).

    Raises:
        PeerStopped: ``peer`` is stopped.
        AnswerOverdue: no message within ``bound_s``.
    """
    deadline = time.monotonic() + bound_s
    while b"\n" not in buffer:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AnswerOverdue(f"{who} (pid {peer}) did not answer within {bound_s:.0f} s (wedged?)")
        if peer is not None and process_state(peer) in STOPPED_STATES:
            raise PeerStopped(f"{who} (pid {peer}) is stopped (SIGSTOP, or a debugger) and cannot answer")
        conn.settimeout(min(POLL_S, left))
        try:
            chunk = conn.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            return b""
        if not chunk:
            return b""
        buffer.extend(chunk)
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line


def wait_until_ready(ready: threading.Event, proc: subprocess.Popen, bound_s: float) -> None:
    """Wait for a starting fork server to say whether it is ready (``ready`` is set once it spoke
    or ended), at most ``bound_s`` seconds, watching it for a stop.

    Args:
        ready: set by the server's keeper thread once the server printed its first line or ended.
        proc: the server's process.
        bound_s: the bound, in seconds (it imports torch meanwhile).

    Raises:
        PeerStopped: the server is stopped.
        AnswerOverdue: it said nothing within ``bound_s``.
    """
    deadline = time.monotonic() + bound_s
    while not ready.wait(POLL_S):
        if process_state(proc.pid) in STOPPED_STATES:
            raise PeerStopped(f"the fork server (pid {proc.pid}) is stopped (SIGSTOP, or a debugger) while starting")
        if time.monotonic() >= deadline:
            raise AnswerOverdue(f"the fork server (pid {proc.pid}) did not start within {bound_s:.0f} s (wedged?)")
