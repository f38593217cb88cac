"""memsweep's fork server (``isolation=forkserver``): ``python -m worker.forkserver SOCKET``.

The server imports torch (and what the worker needs) once, never touches a device, and
serves one request per connection on a Unix socket: a JSON line ``{"spec", "stdout",
"stderr", "env"}``. For each, a handler process forks the worker (so every run is still a
new process, with its own CUDA context and caching allocator, created after the fork),
answers ``{"pid": ...}`` at once and ``{"returncode": ...}`` when the worker has ended
(negative: killed by that signal, as subprocess reports it).

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

from .main import _die_with_parent  # stdlib-only at import: torch is imported in serve()


def _handle(conn: socket.socket) -> None:
    """In the handler process: fork the worker, report its pid and then its exit status."""
    _die_with_parent()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    request = json.loads(conn.makefile("r").readline())
    pid = os.fork()
    if pid == 0:
        conn.close()
        from .launch import run

        run(request["spec"], request["stdout"], request["stderr"], request["env"])
        os._exit(70)  # run() never returns
    conn.sendall((json.dumps({"pid": pid}) + "\n").encode())
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


def serve(path: str) -> None:
    import torch  # noqa: F401  - the point of the server: imported once, for every fork
    import torch._dynamo  # noqa: F401  - imported by the first dispatch through a Python mode

    from . import counters, main, workloads  # noqa: F401

    _die_with_parent()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        if os.fork() == 0:
            server.close()
            try:
                _handle(conn)
            finally:
                os._exit(0)
        conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
