"""memsweep's fork server (``isolation=forkserver``): ``python -m worker.forkserver SOCKET``.

The server imports torch (and what the worker needs) once, never touches a device, and
serves one request per connection on a Unix socket: a JSON line ``{"spec", "stdout",
"stderr", "env", "dynamo"}``. It imports ``torch._dynamo`` (as long again as torch itself)
only when the first request whose run needs it comes (``dynamo``: the client's
``conf.contract.needs_dynamo``), so that it is ready sooner and a CPU inference sweep never
pays that import. For each request, a handler
process forks the worker (so every run is still a new process, with its own CUDA context
and caching allocator, created after the fork), answers ``{"pid": ..., "handler": ...}`` (the
worker's pid and its own, which the client watches) at once and ``{"returncode": ...}`` when
the worker has ended (negative: killed by that signal, as subprocess reports it).

Why not ``multiprocessing``'s forkserver: it re-imports the caller's ``__main__`` and start
method in every child, which breaks under launchers that have their own (joblib's loky).

Death propagates down (Linux PR_SET_PDEATHSIG): orchestrator -> server -> handler -> worker.
One server may serve several client processes (the joblib/loky workers of one sweep, see
``sweeper.process.share_fork_server``): a handler whose client goes away before the worker
has ended (the client was killed) kills the worker's process group.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading

from .launch import run
from .lifecycle import die_with_parent  # stdlib-only at import: torch is imported in serve()

REQUEST_TIMEOUT_S = 10.0  # a connected client that sends no request line is dropped


def _handle(conn: socket.socket, request: dict, server: int) -> None:
    """In the handler process: fork the worker, report its pid and then its exit status.
    ``server``: the server's pid, which this handler dies with."""
    die_with_parent(server)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    handler = os.getpid()
    pid = os.fork()
    if pid == 0:
        conn.close()
        run(request["spec"], request["stdout"], request["stderr"], request["env"], parent=handler)
        os._exit(70)  # run() never returns
    conn.sendall((json.dumps({"pid": pid, "handler": os.getpid()}) + "\n").encode())
    ended = threading.Event()
    lock = threading.Lock()

    def kill_on_hangup() -> None:
        # The client sends nothing more: end of file before the worker has ended = the client
        # died. The worker is not reaped before `ended` is set, so its pid cannot be reused here.
        try:
            while conn.recv(4096):
                pass
        except OSError:
            pass
        with lock:
            if not ended.is_set():
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    threading.Thread(target=kill_on_hangup, daemon=True).start()
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # ended, not yet reaped
    with lock:
        ended.set()
    _, status = os.waitpid(pid, 0)
    try:
        conn.sendall((json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n").encode())
    except OSError:
        pass


def serve(path: str, parent: int | None = None) -> None:
    """Serve worker forks on the Unix socket ``path`` until killed (never returns).

    Imports torch and the worker's modules once, binds ``path + ".new"`` and renames it to
    ``path`` once it listens, prints ``ready``, then forks one handler process per connection
    (see the module docstring for the protocol).

    Args:
        path: the socket's path.
        parent: the pid of the client that started the server, which it dies with.

    Raises:
        OSError: the socket cannot be bound or renamed.
    """
    die_with_parent(parent)  # before the long import: a client killed meanwhile leaves no server
    import torch  # noqa: F401  - the point of the server: imported once, for every fork

    from . import counters, main, workloads  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    # Ctrl-C reaches the whole foreground process group: the orchestrator says what happened and
    # exits, and the server and its handlers die with it (PR_SET_PDEATHSIG), without tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path + ".new")
    server.listen(64)
    os.replace(path + ".new", path)  # clients see the socket only once it listens (refused = dead)
    print("ready", flush=True)
    server_pid = os.getpid()
    while True:
        conn, _ = server.accept()
        try:  # a client sends its request as soon as it connects
            conn.settimeout(REQUEST_TIMEOUT_S)
            with conn.makefile("r") as reader:  # closed, so that conn.close() below frees the socket
                request = json.loads(reader.readline())
            conn.settimeout(None)
            if request.get("dynamo", True):  # once, for this fork and every later one
                import torch._dynamo  # noqa: F401
        except (OSError, ValueError):  # a client that hung up or sent garbage: not a run
            conn.close()
            continue
        if os.fork() == 0:
            server.close()
            try:
                _handle(conn, request, server_pid)
            finally:
                os._exit(0)
        conn.close()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
