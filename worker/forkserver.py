"""memsweep's fork server: ``python -m memsweep.worker.forkserver SOCKET [PARENT [--no-preload]]``.

The server imports torch (and what the worker needs) once, never touches a device, and serves
one request per connection on a Unix socket (``conf.contract.fork.ForkRequest``, one JSON line).
It imports ``torch._dynamo`` only when the first request whose run needs it comes. For each
request a handler process forks the worker (every run is still a new process, its CUDA context
created after the fork) or, for ``isolation=spawn``, starts ``python -m memsweep.worker SPEC``;
it answers ``ForkStarted`` at once and ``ForkEnded`` when the worker has ended.

Death propagates down (PR_SET_PDEATHSIG): orchestrator -> server -> handler -> worker. The server
is a child subreaper (``conf.contract.reaper``): on its owner's death (SIGTERM; SIGHUP alike) it kills
its handlers and every process re-parented to it, reaps them and exits (``_end_runs``). A run belongs
to the orchestrator: a handler whose client goes away keeps it, bounded by ``timeout_s``, and writes
its exit status into the run directory (``conf.contract.EXIT_STATUS_FILE``) for the next sweeper.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import sys
import threading
import time

from memsweep.conf.contract import (
    EXIT_STATUS_FILE,
    FORKSERVER_KILL_REQUEST,
    FORKSERVER_NO_PRELOAD,
    ISOLATION_SPAWN,
    LEASE_LOCKS_ENV,
    SCHEMA_VERSION,
    kill_orphans,
    kill_session,
    peer_pid,
    process_identity,
    set_subreaper,
    write_json_atomic,
)
from memsweep.conf.contract.fork import ForkEnded, ForkRequest, ForkStarted, KeptExit

from .launch import run, spawn
from .lifecycle import die_with_parent  # stdlib-only at import: torch is imported in serve()

KILL_REQUEST = FORKSERVER_KILL_REQUEST.encode()
REQUEST_TIMEOUT_S = 10.0  # a connected client that sends no request line is dropped

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""Signals that end the server, its runs killed first (``_end_runs``); SIGTERM is also what its
owner's death sends it (PR_SET_PDEATHSIG). Its handlers and their workers take them as before (the
default: they die)."""


class _Stopping(BaseException):
    """The server was told to stop (``STOP_SIGNALS``: its owner died, or it was sent one)."""


def _stop(signum: int, frame: object) -> None:
    raise _Stopping(signum)


LEASE_TAKEOVER_S = 5.0
"""How long a handler whose client went away tries to take the run's device lease over (seconds;
the dead client's locks are released as it exits, within milliseconds)."""


def _handle(conn: socket.socket, request: ForkRequest, server: int) -> None:
    """In the handler process: fork the worker (or, for ``"isolation": "spawn"``, start it as a new
    interpreter, ``worker.launch.spawn``), report its pid and then its exit status.
    ``server``: the server's pid, which this handler dies with.

    A client that goes away before the worker has ended (a launcher worker killed: loky kills
    the pool's surviving workers too) does not take the run with it: the handler takes the run's
    device lease over (``LEASE_LOCKS_ENV``), kills the run at ``timeout_s`` from its fork, as the
    client would have, and writes its exit status into the run directory (``EXIT_STATUS_FILE``)
    for the sweeper that takes the run over. The handler kills the run at its ``timeout_s`` in any
    case (``_Watch.deadline``): a stopped client enforces nothing. When the lease cannot be taken
    over within ``LEASE_TAKEOVER_S``, or the client asked for it (``KILL_REQUEST``), the run is
    killed with its client and no status is written.

    The handler is the run's child subreaper (``conf.contract.reaper``): once the worker has
    ended, whatever ended it, its session and then every process re-parented to the handler
    (children that left the worker's session: ``os.setsid()``, a double fork) are killed before
    the end is answered."""
    for signum in STOP_SIGNALS:  # the server's own way to end is not a handler's
        signal.signal(signum, signal.SIG_DFL)
    die_with_parent(server)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    set_subreaper()  # the run's orphans (a setsid child, a daemon) are re-parented to this handler
    t0 = time.monotonic()
    pid = _start_worker(conn, request)
    conn.sendall(ForkStarted(pid, os.getpid()).to_line())
    watch = _Watch(conn, request, pid, t0)
    threading.Thread(target=watch.client, daemon=True).start()
    threading.Thread(target=watch.deadline, daemon=True).start()
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # ended, not yet reaped
    with watch.lock:
        watch.ended.set()
    kill_session(pid)  # whatever ended it, what it started dies with it (its pid not yet reusable)
    _, status = os.waitpid(pid, 0)
    kill_orphans()  # and what escaped its session: every other child of this handler is the run's
    wall_s = time.monotonic() - t0
    returncode = os.waitstatus_to_exitcode(status)
    try:
        conn.sendall(ForkEnded(returncode, watch.timed_out.is_set()).to_line())
    except OSError:
        watch.gone.set()
    if watch.gone.is_set() and not watch.abandoned.is_set():
        _write_status(request, pid, watch.peer, KeptExit(returncode, watch.timed_out.is_set(), wall_s))


_KEEP: list[object] = []  # a spawned worker's Popen, referenced until the handler reaps it


def _start_worker(conn: socket.socket, request: ForkRequest) -> int:
    """Fork the worker (``worker.launch.run`` in the child) or spawn it (``"isolation": "spawn"``);
    returns its pid."""
    handler = os.getpid()
    spec, stdout, stderr, env = request.spec, request.stdout, request.stderr, request.env
    if request.isolation == ISOLATION_SPAWN:  # a new interpreter, as the client would start it
        spawned = spawn(spec, stdout, stderr, env, parent=handler)
        _KEEP.append(spawned)
        return spawned.pid
    pid = os.fork()
    if pid == 0:
        conn.close()
        run(spec, stdout, stderr, env, parent=handler)
        os._exit(70)  # run() never returns
    return pid


class _Watch:
    """The handler's watch on its client while the worker runs (``client`` runs in a thread).

    Args:
        conn: the client's connection.
        request: the run's request.
        pid: the worker's pid (its process group's).
        t0: ``time.monotonic()`` at the fork (seconds).
    """

    def __init__(self, conn: socket.socket, request: ForkRequest, pid: int, t0: float) -> None:
        self.conn, self.request, self.pid, self.t0 = conn, request, pid, t0
        self.peer = peer_pid(conn)
        self.ended, self.gone, self.lock = threading.Event(), threading.Event(), threading.Lock()
        self.timed_out, self.abandoned = threading.Event(), threading.Event()
        self.held: list[int] = []  # the lease's lock files, open and locked until this handler exits

    def kill(self) -> None:
        """Kill the worker's group and session; call with ``lock`` held and the worker not yet reaped."""
        kill_session(self.pid)

    def client(self) -> None:
        """End of file before the worker has ended = the client died (the run is kept); a
        KILL_REQUEST line first = the client was interrupted and asks for the run to die with it."""
        said = bytearray()
        try:
            while chunk := self.conn.recv(4096):
                said.extend(chunk)
        except OSError:
            pass
        with self.lock:
            if self.ended.is_set():
                return
            self.gone.set()
            if KILL_REQUEST in said.splitlines():
                self.abandoned.set()
                self.kill()
                return
            if not _take_lease(self.request.env.get(LEASE_LOCKS_ENV), self.held):
                self.abandoned.set()
                self.kill()
                return
            _write_status(self.request, self.pid, self.peer, None)  # said at once: not to be run again

    def deadline(self) -> None:
        """Kill the worker at ``timeout_s`` from its fork, whatever its client does: a client that
        is stopped (SIGSTOP) or gone cannot; one that runs kills it at the same time."""
        if not self.ended.wait(max(0.0, self.t0 + self.request.timeout_s - time.monotonic())):
            with self.lock:
                if not self.ended.is_set():
                    self.timed_out.set()
                    self.kill()


def _write_status(request: ForkRequest, pid: int, client: int | None, kept: KeptExit | None) -> None:
    """Write a kept run's ``EXIT_STATUS_FILE`` (EXIT_STATUS_FIELDS) beside its spec.json.

    Args:
        request: the run's request (its ``spec`` path names the run directory).
        pid: the worker's pid.
        client: the pid of the process that asked for the run and went away, or None (unknown).
        kept: how the worker ended; None while it runs (``ended`` false, its fields null: not
            known yet).
    """
    doc = {
        "schema_version": SCHEMA_VERSION,
        "ended": kept is not None,
        "returncode": None if kept is None else kept.returncode,
        "timed_out": None if kept is None else kept.timed_out,  # null until the worker has ended
        "wall_s": None if kept is None else kept.wall_s,
        "worker_pid": pid,
        "handler_pid": os.getpid(),
        "handler_identity": process_identity(),
        "note": f"the process that asked for this run (pid {client}: a launcher's worker, or the sweep's "
        "orchestrator) went away before the run ended; its fork-server handler kept the run to its end or its "
        "timeout_s, or until the handler itself died with the sweep's fork server",
    }
    write_json_atomic(os.path.join(os.path.dirname(request.spec), EXIT_STATUS_FILE), doc)


def _take_lease(paths: str | None, held: list[int]) -> bool:
    """Lock the lease's lock files (``paths``: joined by ``os.pathsep``; None or empty: no
    lease), retrying for at most ``LEASE_TAKEOVER_S`` while the dead client's locks are released
    (flock(2): released when its last descriptor closes, as the process exits). The locked
    descriptors are appended to ``held`` (closed when this process exits); returns whether every
    lock was taken (False: another process took the device first, and none is held)."""
    deadline = time.monotonic() + LEASE_TAKEOVER_S
    for path in (paths or "").split(os.pathsep):
        if not path:
            continue
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(fd)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    for other in held:
                        os.close(other)
                    held.clear()
                    return False
                time.sleep(0.05)
    return True


def _preload(dynamo: bool) -> None:
    """Import torch and the worker's modules (and ``torch._dynamo`` when ``dynamo``) into the
    server, once: every later fork has them (a second call only looks them up)."""
    import torch  # noqa: F401  - the point of the server: imported once, for every fork

    from . import counters, main, workloads  # noqa: F401

    if dynamo:
        import torch._dynamo  # noqa: F401


def serve(path: str, parent: int | None = None, preload: bool = True) -> None:
    """Serve worker forks (and spawns) on the Unix socket ``path`` until told to stop (its owner's
    death, SIGTERM, SIGHUP: every process of its runs killed first, ``_end_runs``) or killed.

    Imports torch and the worker's modules once (``preload``; else at the first request to fork),
    binds ``path + ".new"`` and renames it to ``path`` once it listens, prints ``ready``, then
    forks one handler process per connection (see the module docstring for the protocol). A
    request with ``"isolation": "spawn"`` has its handler start a new interpreter instead of
    forking the worker (``worker.launch.spawn``): the server imports nothing for it.

    Args:
        path: the socket's path.
        parent: the pid of the client that started the server, which it dies with.
        preload: import torch before serving (``isolation=forkserver``); False for a server that
            starts spawned runs (``isolation=spawn``), which never need it.

    Raises:
        OSError: the socket cannot be bound or renamed.
    """
    for signum in STOP_SIGNALS:
        signal.signal(signum, _stop)
    set_subreaper()  # a run's processes whose handler died are re-parented here, not to init
    try:  # before the long import: a client killed meanwhile leaves no server
        die_with_parent(parent, signal.SIGTERM)
        _serve(path, preload)
    except _Stopping:
        _end_runs()
        os._exit(0)  # (no interpreter clean-up: torch's exit hooks have nothing to do here)
    except BaseException:
        _end_runs()
        raise


def _end_runs() -> None:
    """The server's end: SIGKILL every child (its handlers) and, round after round, every process
    re-parented to it as its parent dies (a handler's worker, which dies with it, and the worker's
    own children, of its session or not), each reaped here (``conf.contract.kill_orphans``:
    children only, so nothing that is not the server's descendant is signalled). SIGCHLD is no
    longer ignored from here on: a child that ends stays a zombie until reaped here, so its pid
    names it while it is signalled."""
    for signum in STOP_SIGNALS:  # a second signal does not cut the killing short
        signal.signal(signum, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    kill_orphans()


def _serve(path: str, preload: bool) -> None:
    """``serve``'s work once it is bound to its owner: import, bind, answer (never returns)."""
    if preload:
        _preload(dynamo=False)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    # Ctrl-C reaches the whole foreground process group: the orchestrator says what happened and
    # exits, and the server ends its runs and itself after it (PR_SET_PDEATHSIG), without tracebacks.
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
                request = ForkRequest.from_json(json.loads(reader.readline()))
            conn.settimeout(None)
            if request.isolation != ISOLATION_SPAWN:  # once, for this fork and every later one
                _preload(dynamo=request.dynamo)
        except (OSError, ValueError):  # a client that hung up or sent garbage (ValueError): not a run
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
    serve(
        sys.argv[1],
        int(sys.argv[2]) if len(sys.argv) > 2 else None,
        preload=sys.argv[3:4] != [FORKSERVER_NO_PRELOAD],
    )
