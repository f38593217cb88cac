"""The client of the fork server (``worker/forkserver.py``): a server process that imported torch
once and never touched a device forks one fresh worker per run (``isolation=forkserver``), or,
without torch, has its handlers start each run's new interpreter (``isolation=spawn``).

One server per orchestrator process, started lazily; a sweep's main process shares its server
with the launcher's worker processes through ``MEMSWEEP_FORKSERVER``
(``sweeper.process.share_fork_server``). One connection per run, newline-terminated JSON
(``run_request``); every read is bounded (``sweeper.forkserver_wait``): a server or handler
that stopped or wedged is a ``ForkServerLost``, never a hang.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from memsweep.conf.contract import (
    FORKSERVER_KILL_REQUEST,
    FORKSERVER_NO_PRELOAD,
    ISOLATION_FORKSERVER,
    ISOLATION_SPAWN,
    SPEC_FILE,
    STDERR_FILE,
    STDOUT_FILE,
    child_identity,
    peer_pid,
    pid_exists,
    process_identity,
)
from memsweep.conf.contract.fork import ForkRequest
from memsweep.conf.contract.reaper import ORPHAN_REAP_S

from .forkserver_wait import (
    ANSWER_S,
    KILLED_ANSWER_S,
    AnswerOverdue,
    PeerStopped,
    read_answer,
    wait_until_ready,
)
from .launch import WorkerExit, kill_process_group, worker_env

log = logging.getLogger("memsweep")


class ForkServerLost(RuntimeError):
    """The fork server (or a run's handler) went away before the worker's exit status came: the
    run's outcome is unknown and not the load's doing. ``pid``: the worker's, when it had one."""

    def __init__(self, message: str, pid: int | None) -> None:
        super().__init__(message)
        self.pid = pid


SOCKET_DIR_PREFIX = "memsweep-fs-"
SUN_PATH_MAX = 107
"""The longest path of a Unix socket, in bytes (``sun_path`` holds 108 with its NUL: unix(7))."""
"""A server's socket directory in the temporary directory (``tempfile.gettempdir()``, TMPDIR):
``memsweep-fs-<owner pid>-<random>``, holding ``sock``; removed when its owner stops the server
(``ForkServer.close``), or by a later start once the owner is gone (``remove_stale_socket_dirs``)."""
_STALE_DIR = re.compile(re.escape(SOCKET_DIR_PREFIX) + r"(\d{1,7})-[^/]+$")  # Linux pids: at most 4194304


def remove_stale_socket_dirs(tmp: str | None = None) -> list[str]:
    """Remove the socket directories (``SOCKET_DIR_PREFIX``) of fork servers whose owner process is
    gone (killed, so that it never removed its own): a server dies with its owner (PR_SET_PDEATHSIG),
    so nothing listens there any more. Only this user's directories named with an owner pid that no
    process has now (``os.kill(pid, 0)``: no such process) are removed; a live owner, another user's,
    or a directory not named so is left alone.

    Args:
        tmp: the temporary directory (None: ``tempfile.gettempdir()``).

    Returns:
        The paths removed.
    """
    tmp = tmp or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = os.listdir(tmp)
    except OSError:
        return removed
    for name in names:
        found = _STALE_DIR.match(name)
        path = os.path.join(tmp, name)
        if found is None or int(found.group(1)) == os.getpid():
            continue
        try:
            if os.lstat(path).st_uid != os.getuid() or not os.path.isdir(path) or os.path.islink(path):
                continue
        except OSError:
            continue
        if not pid_exists(int(found.group(1))):  # a live owner (or the pid another's now): left alone
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


STOP_WAIT_S = ORPHAN_REAP_S + 1.0
"""How long ``ForkServer.close`` waits for its server to end after SIGTERM (seconds): its runs'
processes killed and reaped (at most ``conf.contract.reaper.ORPHAN_REAP_S``), then its own exit."""

SHARED_FORKSERVER_ENV = "MEMSWEEP_FORKSERVER"
SHARED_WAIT_S = 300.0  # how long a client waits for the shared server to finish starting


def this_place() -> str:
    """Where this process runs, as ``MEMSWEEP_FORKSERVER`` names it: the host, and the SLURM job
    when it runs in one (``host/slurm-job-ID``), so that a SLURM job never hands its runs to a
    server outside the job (its time limit, ``scancel`` and resource limits would not hold them)."""
    job = os.environ.get("SLURM_JOB_ID")
    return socket.gethostname() + (f"/slurm-job-{job}" if job else "")


def shared_name(path: str) -> str:
    """``MEMSWEEP_FORKSERVER``'s value for this process's server at ``path``: ``place:pid:path``
    (``this_place``)."""
    return f"{this_place()}:{os.getpid()}:{path}"


def shared_server() -> str | None:
    """The socket path of the sweep's shared fork server, when this process may use it:
    ``MEMSWEEP_FORKSERVER`` = ``place:pid:path`` names this host (and SLURM job, ``this_place``)
    and a live owner process."""
    try:
        place, pid, path = os.environ.get(SHARED_FORKSERVER_ENV, "").split(":", 2)
        if place != this_place():
            return None
        os.kill(int(pid), 0)
    except (ValueError, OSError):
        return None
    return path


def run_request(run_dir: Path, env: dict, timeout_s: float, dynamo: bool, isolation: str) -> dict:
    """The request a fork server's handler answers (one JSON line, ``worker.forkserver``) for one run.

    Args:
        run_dir: the run directory (its spec.json; the worker's stdout.log and stderr.log go there).
        env: the worker's whole environment.
        timeout_s: the run's bound (seconds); the handler keeps the run to it if its client dies.
        dynamo: the run needs torch._dynamo imported before the fork.
        isolation: ``forkserver`` (fork) or ``spawn`` (the handler starts ``python -m memsweep.worker SPEC``).

    Returns:
        The request, JSON-able.
    """
    return ForkRequest(
        spec=str(run_dir / SPEC_FILE),
        stdout=str(run_dir / STDOUT_FILE),
        stderr=str(run_dir / STDERR_FILE),
        env=env,
        dynamo=dynamo,
        timeout_s=timeout_s,
        isolation=isolation,
    ).to_json()


class ForkServer:
    """Client of ``worker/forkserver.py``: one server per orchestrator process, started lazily.

    A process whose environment names a live server (``MEMSWEEP_FORKSERVER``, set by
    ``share_fork_server`` in the sweep's main process before the launcher starts its worker
    processes) uses that server instead of starting its own, waiting while it starts; when
    its owner is gone, this process starts its own."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.path: str | None = None
        self._dir: str | None = None  # this process's own server's socket directory, removed with it
        self.shared = False  # using another process's server (self.proc stays None)
        self._ready = threading.Event()  # replaced by each server started: set once it said ready
        self._said: dict = {}
        self._gone: set[str] = set()  # shared servers that went away (never used again)
        # Runs started from several threads (a thread pool, joblib's threading backend) must
        # start one server, not one each with the socket path changing under them.
        self._lock = threading.Lock()
        atexit.register(self.close)  # once: close() stops whichever server is current

    def start(self, preload: bool = True) -> str:
        """Start this process's server if it has none; returns its socket path at once (it
        imports torch meanwhile). ``preload``: False for a server that starts spawned runs
        (``isolation=spawn``), which imports torch only if asked to fork a run
        (``conf.contract.FORKSERVER_NO_PRELOAD``)."""
        with self._lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start_locked(preload)
            return self._socket_path()

    def _socket_path(self) -> str:
        """The socket path of the server in use.

        Raises:
            RuntimeError: no server was started nor shared (``_start_locked`` sets it).
        """
        if self.path is None:
            raise RuntimeError("memsweep fork server: no server started")
        return self.path

    def _start_locked(self, preload: bool = True) -> subprocess.Popen:
        self.shared = False
        if self._dir is None:  # the first server of this process: clear what killed owners left
            remove_stale_socket_dirs()
        self._remove_dir()  # a previous server of this process, gone or killed as stuck
        self._dir = tempfile.mkdtemp(prefix=f"{SOCKET_DIR_PREFIX}{os.getpid()}-")
        if len(os.fsencode(os.path.join(self._dir, "sock"))) > SUN_PATH_MAX:  # a long TMPDIR: /tmp instead
            os.rmdir(self._dir)
            self._dir = tempfile.mkdtemp(prefix=f"{SOCKET_DIR_PREFIX}{os.getpid()}-", dir="/tmp")
        path = self.path = os.path.join(self._dir, "sock")
        env = worker_env()
        # The server dies with its parent through PR_SET_PDEATHSIG, which fires when the *thread*
        # that started it exits: a server started from a pool thread was killed with that
        # thread. So it is started from a thread of its own that lives as long as the server.
        said: dict = {}
        launched, ready = threading.Event(), threading.Event()

        def keeper() -> None:
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "memsweep.worker.forkserver", path, str(os.getpid())]
                    + ([] if preload else [FORKSERVER_NO_PRELOAD]),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            except BaseException as exc:  # noqa: BLE001 - reported by the caller
                said["error"] = exc
                launched.set()
                ready.set()
                return
            said["proc"] = proc
            launched.set()
            said["line"] = proc.stdout.readline().strip() if proc.stdout is not None else ""  # a pipe: never None
            ready.set()
            proc.wait()

        threading.Thread(target=keeper, name="memsweep-forkserver", daemon=True).start()
        launched.wait()
        if "error" in said:
            raise said["error"]
        proc: subprocess.Popen = said["proc"]
        self.proc, self._ready, self._said = proc, ready, said
        if os.environ.get(SHARED_FORKSERVER_ENV, "").startswith(shared_name("")):
            # this process shares its server (share_fork_server): name the new one to processes started from now
            os.environ[SHARED_FORKSERVER_ENV] = shared_name(path)
        return proc

    def _ensure(self, preload: bool) -> str:
        """A server ready to fork (a shared one, or this process's own); returns its socket path."""
        with self._lock:
            return self._ensure_locked(preload)

    def _ensure_locked(self, preload: bool) -> str:
        if self.proc is None:
            shared = shared_server()
            if shared is not None and shared not in self._gone:
                self.path, self.shared = shared, True
                return shared
        proc = self.proc
        if proc is None or proc.poll() is not None:
            proc = self._start_locked(preload)
        try:
            wait_until_ready(self._ready, proc, SHARED_WAIT_S)
        except (PeerStopped, AnswerOverdue) as exc:
            proc.kill()
            proc.wait()
            raise ForkServerLost(f"{exc}; replaced by a new server", None) from None
        if self._said.get("line") != "ready":
            raise RuntimeError(
                f"memsweep fork server did not start (said {self._said.get('line')!r}, exit {proc.poll()})"
            )
        return self._socket_path()

    def close(self) -> None:
        """Stop this process's own server, if it runs, and remove its socket directory (registered
        with atexit, so also on Ctrl-C; a shared server belongs to its owner and is left alone):
        SIGTERM, on which it kills and reaps every process of its runs (``worker.forkserver``),
        then SIGKILL if it has not ended within ``STOP_WAIT_S``."""
        # not under self._lock: at exit a pool thread may hold it, waiting for a server to start
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:  # stopped (SIGSTOP) or wedged: killed, its runs with it
                self.proc.kill()
                self.proc.wait()
        if self.path is not None and os.environ.get(SHARED_FORKSERVER_ENV) == shared_name(self.path):
            del os.environ[SHARED_FORKSERVER_ENV]  # shared no more: processes started from now start their own
        self._remove_dir()

    def _remove_dir(self) -> None:
        """Remove this process's own server's socket directory (its server is gone), if any."""
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _connect(self, preload: bool) -> socket.socket:
        path = self._ensure(preload)
        deadline = time.monotonic() + SHARED_WAIT_S
        while True:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(path)
                return conn
            except OSError as exc:
                conn.close()
                if not self.shared:
                    raise
                if isinstance(exc, ConnectionRefusedError):  # its socket exists, nobody listens: it died
                    break
                if not os.path.isdir(os.path.dirname(path)):  # its owner removed it with the server
                    break
            # the shared server may still be importing torch (no socket yet): wait while its owner lives
            if shared_server() != path or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self._lost(path)  # the shared server is gone: start one of our own
        path = self._ensure(preload)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        return conn

    def run(
        self, run_dir: Path, env: dict, timeout_s: float, dynamo: bool = True, isolation: str = ISOLATION_FORKSERVER
    ) -> WorkerExit:
        """Fork one worker; returns its ``WorkerExit`` (wall seconds since it was forked).
        ``timeout_s`` counts from the fork too: waiting for the server to start is not the run's.
        ``dynamo``: the run needs torch._dynamo (``conf.contract.needs_dynamo``), which the
        server then imports before it forks (once: every later fork has it). ``isolation``:
        ``spawn`` has the server's handler start a new interpreter (``python -m memsweep.worker SPEC``)
        instead of forking, so that the run, too, outlives a killed client; a server this
        process starts for it imports no torch.

        Every wait is bounded (``sweeper.forkserver_wait``): the server's pid answer by
        ``ANSWER_S``, the handler's exit status by ``timeout_s`` and then, once the run is killed,
        by ``KILLED_ANSWER_S`` (its returncode is then None, the run a timeout).

        Raises:
            ForkServerLost: the server (or the run's handler) went away, stopped (SIGSTOP) or
                did not answer before the worker's exit status came; the worker is killed (it
                dies with its handler anyway) and a stuck server of this process is killed, so
                that the next run starts a new one.
        """

        with self._connect(preload=isolation != ISOLATION_SPAWN) as conn:
            path = self.path
            conn.sendall((json.dumps(run_request(run_dir, env, timeout_s, dynamo, isolation)) + "\n").encode())
            try:
                return self._wait(conn, path, run_dir, timeout_s)
            except BaseException:  # interrupted (SIGINT), or not waiting any more: the run dies with this client
                _ask_kill(conn)
                raise

    def _wait(self, conn: socket.socket, path: str | None, run_dir: Path, timeout_s: float) -> WorkerExit:
        """``run``'s wait on the server's answers, once the request is sent (the same returns and
        errors).

        The worker is the handler's child, not this process's: once the handler has reaped it, its
        pid may name another process. So at the run's timeout the handler is asked to kill it
        (``_ask_kill``: the parent kills before it reaps); only a handler gone or stopped, which
        cannot, has the worker killed from here, and only while its pid still names the process
        the handler forked (``_kill_if_worker``).
        """
        buffer = bytearray()
        try:
            line = read_answer(conn, buffer, peer_pid(conn), ANSWER_S, "the fork server")
        except (PeerStopped, AnswerOverdue) as exc:
            self._lost(path, stuck=True)
            raise ForkServerLost(f"{exc}; replaced by a new server", None) from None
        if not line:
            self._lost(path)
            raise ForkServerLost("the fork server went away before the worker started", None)
        answer = json.loads(line)
        pid, handler = answer["pid"], answer.get("handler")
        worker = child_identity(pid, handler)  # None: already reaped (or no handler named)
        t0 = time.monotonic()
        timed_out = False
        try:
            try:
                line = read_answer(conn, buffer, handler, max(0.001, timeout_s), "the run's handler")
            except AnswerOverdue:  # the run's own time is up
                timed_out = True
                _ask_kill(conn)
                line = read_answer(conn, buffer, handler, KILLED_ANSWER_S, "the run's handler")
        except PeerStopped as exc:
            _kill_if_worker(pid, worker)
            self._lost(path, stuck=True)
            raise ForkServerLost(f"{exc}; the run is killed, the server replaced", pid) from None
        except AnswerOverdue as exc:  # killed at its timeout; its exit status never came
            log.warning("%s: %s after the run was killed at timeout_s=%s", run_dir, exc, timeout_s)
            self._lost(path, stuck=True)
            return WorkerExit(None, True, pid, time.monotonic() - t0)
        wall_s = time.monotonic() - t0
        if not line:
            _kill_if_worker(pid, worker)
            self._lost(path)
            raise ForkServerLost(
                "the fork server went away while the worker ran (killed, or out of host "
                "memory?); the run's outcome is unknown",
                pid,
            )
        ended = json.loads(line)  # the handler kills the run at its timeout_s too (this process may be stopped)
        return WorkerExit(ended["returncode"], timed_out or bool(ended.get("timed_out")), pid, wall_s)

    def _lost(self, path: str | None, stuck: bool = False) -> None:
        """The server at ``path`` is gone: a shared one is never used again by this process (it
        starts its own); this process's own one is restarted by the next ``_ensure``, after
        being killed here when it is ``stuck`` (stopped or wedged, but alive)."""
        with self._lock:
            if self.shared and path is not None and self.path == path:
                self._gone.add(path)
                self.shared, self.path = False, None
            elif stuck and self.proc is not None and self.path == path:
                log.warning("memsweep: killing the stuck fork server (pid %s); a new one starts", self.proc.pid)
                self.proc.kill()
                self.proc.wait()


def _ask_kill(conn: socket.socket) -> None:
    """Ask the run's handler to kill the run (``conf.contract.FORKSERVER_KILL_REQUEST``), and say
    no more (the handler acts on the end of what its client says; its answers can still be read):
    an interrupted orchestrator takes its run with it, a run past its timeout is killed by the
    process that can (the worker's parent); only a client that dies without a word (a launcher
    worker killed) leaves its run kept. Best effort: a handler already gone needs no telling."""
    try:
        conn.sendall((FORKSERVER_KILL_REQUEST + "\n").encode())
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _kill_if_worker(pid: int, identity: str | None) -> None:
    """Kill the worker ``pid`` (its group and session, ``kill_process_group``) when its handler, gone
    or stopped, cannot: only while the pid still names the process the handler forked (its
    ``identity``, read while it was the handler's child); a pid that names another process now, or
    a worker whose identity is unknown, is left alone."""
    if identity is not None and process_identity(pid) == identity:
        kill_process_group(pid)
