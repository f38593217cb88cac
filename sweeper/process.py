"""One condition, one fresh worker process: start it, bound it in time, read what it left.

The result envelope (result.json, written atomically once the process has ended) holds
the outcome: ``ok``, ``oom``, ``error`` (from the worker's complete record), ``crash``
(died by a signal, or left no complete or readable record) or ``timeout`` (killed by us
at ``timeout_s``). A missing result.json means the orchestrator itself died.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from filelock import FileLock

from conf.contract import (
    DEFAULT_ISOLATION,
    FORK_SERVER_LOST,
    ISOLATION_ENV,
    ISOLATION_FORKSERVER,
    ISOLATIONS,
    LAUNCHER_WORKER_LOST,
    PARENT_ENV,
    RECORD_FILE,
    RESULT_FILE,
    SCHEMA_VERSION,
    SPEC_FILE,
    STDERR_FILE,
    STDOUT_FILE,
    RecordError,
    RunSpec,
    SpecError,
    classify_run,
    needs_dynamo,
    read_spec,
    try_read,
    write_json_atomic,
)

from .forkserver_wait import (
    ANSWER_S,
    KILLED_ANSWER_S,
    AnswerOverdue,
    PeerStopped,
    peer_pid,
    read_answer,
    wait_until_ready,
)
from .liveness import wait_for_old_worker

log = logging.getLogger("memsweep")
LOCK_FILE = ".run.lock"


class RunDirError(RuntimeError):
    """The run directory already holds a run: memsweep never overwrites one."""


def check_run_dir_free(run_dir: Path) -> None:
    """Raise RunDirError when ``run_dir`` already holds a spec, record or result."""
    for name in (RECORD_FILE, RESULT_FILE, SPEC_FILE):
        if (run_dir / name).exists():
            raise RunDirError(
                f"{run_dir / name} already exists: memsweep never overwrites a run; "
                f"choose another directory (hydra.run.dir=...)"
            )


def worker_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update(extra or {})
    # CPU capacity emulation (RLIMIT_DATA) should be about tensors, not the C allocator's
    # bookkeeping: few malloc arenas, and blocks from 128 KiB up served by mmap and returned
    # at free (mallopt(3) M_MMAP_THRESHOLD; a fixed threshold also turns off glibc's dynamic
    # one, whose heap growth made identical runs OOM at different sizes).
    env.setdefault("MALLOC_ARENA_MAX", "2")
    env.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _result(
    spec: RunSpec,
    run_dir: Path,
    returncode: int | None,
    timed_out: bool,
    wall_s: float | None,
    pid: int | None,
    lost: str | None = None,
) -> dict:
    """Classify what the worker left in ``run_dir`` and write result.json atomically.
    ``lost``: why the worker's exit status never came (ForkServerLost), for a crash's message."""
    record, problem = try_read(run_dir, RECORD_FILE)
    outcome = classify_run(record, returncode, timed_out)
    failed_phase = error_type = error_message = None
    if outcome in ("oom", "error"):
        failed_phase, error_type, error_message = (
            record.get("failed_phase"),
            record.get("error_type"),
            record.get("error_message"),
        )
    elif outcome in ("crash", "timeout"):
        done = [p.get("name") for p in (record or {}).get("phases") or [] if isinstance(p, dict)]
        todo = [p for p in spec.phases if p not in done]
        failed_phase = todo[0] if todo and record is not None else None
        if record is not None and isinstance(record.get("current_phase"), str):
            failed_phase = record["current_phase"]  # the worker names the phase it started
        if returncode is not None and returncode < 0:
            error_type = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else None
        error_message = (
            f"killed after timeout_s={spec.timeout_s}"
            if timed_out
            else f"worker exited with {returncode}" + (f"; {problem}" if problem else "")
        )
        if lost is not None:
            error_type, error_message = FORK_SERVER_LOST, lost + (f"; {problem}" if problem else "")
    result = {
        "schema_version": SCHEMA_VERSION,
        "outcome": outcome,
        "failed_phase": failed_phase,
        "error_type": error_type,
        "error_message": error_message,
        "returncode": returncode,
        "signal": -returncode if returncode is not None and returncode < 0 else None,
        "timed_out": timed_out,
        "wall_s": wall_s,
        "worker_pid": pid,
        "record_problem": problem,
    }
    write_json_atomic(run_dir / RESULT_FILE, result)
    return result


def stored_spec(run_dir: Path) -> RunSpec | None:
    """The spec ``run_dir`` holds (spec.json; from_dict fills the fields a spec written before
    them lacks: additive, defaults), or None when it holds none.

    Raises:
        RunDirError: an unreadable or invalid spec.json.
    """
    try:
        return read_spec(run_dir)
    except (RecordError, SpecError) as exc:
        raise RunDirError(f"{run_dir} holds an unreadable spec.json ({exc}); memsweep never overwrites a run") from None


def check_resumable(spec: RunSpec, run_dir: Path) -> None:
    """Raise RunDirError when ``run_dir`` holds another condition's spec (or an unreadable one):
    a sweep resumed in its directory must be the same sweep. Nothing is written."""
    old = stored_spec(run_dir)
    if old is not None and old != spec:
        raise RunDirError(
            f"{run_dir / SPEC_FILE} already exists for another condition: memsweep never "
            f"overwrites a run; choose another directory"
        )


def _resume(spec: RunSpec, run_dir: Path) -> dict | None:
    """A run directory left by an earlier attempt at the same spec.

    Returns the stored result when the run ended (it is not run twice); finalizes a run whose
    worker ended but whose orchestrator died before writing result.json; otherwise (the
    worker died mid-run, or the run was lost with the launcher's worker, result error_type
    ``LAUNCHER_WORKER_LOST``) moves the partial files into ``.attempts/N/`` (kept, and skipped by
    the analysis) and returns None so the run starts afresh. The earlier worker is waited for
    (at most ``timeout_s``) only while its pid still names that process (``sweeper.liveness``).

    Raises:
        RunDirError: the directory holds a different spec, or an unreadable one.
    """
    check_resumable(spec, run_dir)
    if (run_dir / RESULT_FILE).exists():
        result, _ = try_read(run_dir, RESULT_FILE)
        if result is not None and result.get("error_type") == LAUNCHER_WORKER_LOST:  # not the load's: again
            target = _set_attempt_aside(run_dir)
            log.warning("%s: lost with the launcher's worker; its files are kept in %s, running again", run_dir, target)
            return None
        if result is not None:
            return {**result, "resumed": True}
        # a torn result cannot exist (atomic writes); an unreadable one is re-derived below
    record, _ = try_read(run_dir, RECORD_FILE)
    pid = (record or {}).get("pid")
    if record is not None and wait_for_old_worker(record, spec.timeout_s, run_dir):  # not a reused pid
        record, _ = try_read(run_dir, RECORD_FILE)
    if record is not None and record.get("complete"):
        return {**_result(spec, run_dir, record.get("exit_code"), False, None, pid), "resumed": True}
    target = _set_attempt_aside(run_dir)
    log.warning("%s: an earlier attempt died mid-run; its files are kept in %s, running again", run_dir, target)
    return None


def _set_attempt_aside(run_dir: Path) -> Path:
    """Move an unfinished attempt's files (record, a lost run's result, stdout, stderr) into ``.attempts/N/`` (kept,
    and skipped by the analysis), so the run can start afresh; returns that directory."""
    attempts = run_dir / ".attempts"
    n = len(list(attempts.iterdir())) + 1 if attempts.is_dir() else 1
    target = attempts / str(n)
    target.mkdir(parents=True)
    for name in (RECORD_FILE, RESULT_FILE, STDOUT_FILE, STDERR_FILE):
        if (run_dir / name).exists():
            os.replace(run_dir / name, target / name)
    return target


def execute(
    spec: RunSpec, run_dir: Path, resume: bool = True, isolation: str = DEFAULT_ISOLATION, extra_env: dict | None = None
) -> dict:
    """Run ``spec`` in a fresh ``python -m worker`` process inside ``run_dir``.

    Returns the result envelope (also written to run_dir/result.json): ``outcome``,
    ``failed_phase``, ``error_type``, ``error_message``, ``returncode``, ``signal``,
    ``timed_out``, ``wall_s``, ``worker_pid``, ``record_problem`` (and ``resumed: True`` when
    it was found rather than run).

    With ``resume`` (a sweep started again on the same directory), a directory holding the
    same spec is resumed (see ``_resume``): a finished run is never run twice.

    ``isolation``: ``spawn`` starts a new interpreter per run; ``forkserver`` forks each run
    from a server process that imported torch but never touched a device (every run is
    still a new process with its own CUDA context and allocator; the worker checks that no
    CUDA context exists when it starts). ``extra_env``: variables for the worker only
    (a device lease's CUDA_VISIBLE_DEVICES, MEMSWEEP_CPU_CORES).

    Raises:
        RunDirError: run_dir already holds a run of another spec, or any run when not
            resuming (nothing is touched).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    # Two orchestrators on one directory (a sweep started twice, a requeued cluster job): the
    # second waits for the first's run to end, then finds its result instead of running it again.
    with FileLock(run_dir / LOCK_FILE):
        return _execute_locked(spec, run_dir, resume, isolation, extra_env)


def _execute_locked(spec: RunSpec, run_dir: Path, resume: bool, isolation: str, extra_env: dict | None) -> dict:
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation={isolation!r}: expected one of {', '.join(ISOLATIONS)}")
    if resume and (run_dir / SPEC_FILE).exists():
        found = _resume(spec, run_dir)
        if found is not None:
            return found
    else:
        check_run_dir_free(run_dir)
        write_json_atomic(run_dir / SPEC_FILE, spec.to_dict())
    env = worker_env({**(extra_env or {}), ISOLATION_ENV: isolation})
    start = _run_forkserver if isolation == ISOLATION_FORKSERVER else _run_spawn
    try:
        returncode, timed_out, pid, wall_s = start(run_dir, env, spec)
    except ForkServerLost as exc:  # not the load's doing: once more, from a fork server that lives
        target = _set_attempt_aside(run_dir)
        log.warning("%s: %s; its files are kept in %s, running again", run_dir, exc, target)
        try:
            returncode, timed_out, pid, wall_s = start(run_dir, env, spec)
        except ForkServerLost as again:
            return _result(
                spec, run_dir, None, False, None, again.pid, lost=f"{again} (twice; isolation=spawn needs no server)"
            )
    return _result(spec, run_dir, returncode, timed_out, wall_s, pid)


def _run_spawn(run_dir: Path, env: dict, spec: RunSpec) -> tuple[int, bool, int, float]:
    """A new interpreter: ``python -m worker spec.json`` in its own session. Returns (returncode,
    timed_out, pid, wall seconds since the process started)."""
    timed_out = False
    with open(run_dir / STDOUT_FILE, "wb") as out, open(run_dir / STDERR_FILE, "wb") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker", str(run_dir / SPEC_FILE)],
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            cwd=run_dir,
            env={**env, PARENT_ENV: str(os.getpid())},
            start_new_session=True,
        )
        try:
            returncode = proc.wait(timeout=spec.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _killpg(proc.pid)
            returncode = proc.wait()
    return returncode, timed_out, proc.pid, time.monotonic() - t0


class ForkServerLost(RuntimeError):
    """The fork server (or a run's handler) went away before the worker's exit status came: the
    run's outcome is unknown and not the load's doing. ``pid``: the worker's, when it had one."""

    def __init__(self, message: str, pid: int | None) -> None:
        super().__init__(message)
        self.pid = pid


SHARED_FORKSERVER_ENV = "MEMSWEEP_FORKSERVER"
SHARED_WAIT_S = 300.0  # how long a client waits for the shared server to finish starting


def _shared_name(path: str) -> str:
    """``MEMSWEEP_FORKSERVER``'s value for this process's server at ``path``: ``host:pid:path``."""
    import socket

    return f"{socket.gethostname()}:{os.getpid()}:{path}"


def _shared_server() -> str | None:
    """The socket path of the sweep's shared fork server, when this process may use it:
    ``MEMSWEEP_FORKSERVER`` = ``host:pid:path`` names this host and a live owner process."""
    import socket

    try:
        host, pid, path = os.environ.get(SHARED_FORKSERVER_ENV, "").split(":", 2)
        if host != socket.gethostname():
            return None
        os.kill(int(pid), 0)
    except (ValueError, OSError):
        return None
    return path


class ForkServer:
    """Client of ``worker/forkserver.py``: one server per orchestrator process, started lazily.

    A process whose environment names a live server (``MEMSWEEP_FORKSERVER``, set by
    ``share_fork_server`` in the sweep's main process before the launcher starts its worker
    processes) uses that server instead of starting its own, waiting while it starts; when
    its owner is gone, this process starts its own."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.path: str | None = None
        self.shared = False  # using another process's server (self.proc stays None)
        self._ready: threading.Event | None = None
        self._said: dict = {}
        self._gone: set[str] = set()  # shared servers that went away (never used again)
        # Runs started from several threads (a thread pool, joblib's threading backend) must
        # start one server, not one each with the socket path changing under them.
        self._lock = threading.Lock()
        atexit.register(self.close)  # once: close() stops whichever server is current

    def start(self) -> None:
        """Start this process's server if it has none; returns at once (it imports torch meanwhile)."""
        with self._lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start_locked()

    def _start_locked(self) -> None:
        import tempfile

        self.shared = False
        self.path = os.path.join(tempfile.mkdtemp(prefix="memsweep-fs-"), "sock")
        env = worker_env()
        # The server dies with its parent through PR_SET_PDEATHSIG, which fires when the *thread*
        # that started it exits: a server started from a pool thread was killed with that
        # thread. So it is started from a thread of its own that lives as long as the server.
        said: dict = {}
        launched, ready = threading.Event(), threading.Event()

        def keeper() -> None:
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "worker.forkserver", self.path, str(os.getpid())],
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
            said["line"] = proc.stdout.readline().strip()
            ready.set()
            proc.wait()

        threading.Thread(target=keeper, name="memsweep-forkserver", daemon=True).start()
        launched.wait()
        if "error" in said:
            raise said["error"]
        self.proc, self._ready, self._said = said["proc"], ready, said
        if os.environ.get(SHARED_FORKSERVER_ENV, "").startswith(_shared_name("")):
            # this process shares its server (share_fork_server): name the new one to processes started from now
            os.environ[SHARED_FORKSERVER_ENV] = _shared_name(self.path)

    def _ensure(self) -> None:
        with self._lock:
            self._ensure_locked()

    def _ensure_locked(self) -> None:
        if self.proc is None:
            shared = _shared_server()
            if shared is not None and shared not in self._gone:
                self.path, self.shared = shared, True
                return
        if self.proc is None or self.proc.poll() is not None:
            self._start_locked()
        try:
            wait_until_ready(self._ready, self.proc, SHARED_WAIT_S)
        except (PeerStopped, AnswerOverdue) as exc:
            self.proc.kill()
            self.proc.wait()
            raise ForkServerLost(f"{exc}; replaced by a new server", None) from None
        if self._said.get("line") != "ready":
            raise RuntimeError(
                f"memsweep fork server did not start (said {self._said.get('line')!r}, exit {self.proc.poll()})"
            )

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def _connect(self):
        import socket

        self._ensure()
        deadline = time.monotonic() + SHARED_WAIT_S
        while True:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(self.path)
                return conn
            except OSError as exc:
                conn.close()
                if not self.shared:
                    raise
                if isinstance(exc, ConnectionRefusedError):  # its socket exists, nobody listens: it died
                    break
            # the shared server may still be importing torch (no socket yet): wait while its owner lives
            if _shared_server() != self.path or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self._lost(self.path)  # the shared server is gone: start one of our own
        self._ensure()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        return conn

    def run(self, run_dir: Path, env: dict, timeout_s: float, dynamo: bool = True) -> tuple[int, bool, int, float]:
        """Fork one worker; returns (returncode, timed_out, pid, wall seconds since it was forked).
        ``timeout_s`` counts from the fork too: waiting for the server to start is not the run's.
        ``dynamo``: the run needs torch._dynamo (``conf.contract.needs_dynamo``), which the
        server then imports before it forks (once: every later fork has it).

        Every wait is bounded (``sweeper.forkserver_wait``): the server's pid answer by
        ``ANSWER_S``, the handler's exit status by ``timeout_s`` and then, once the run is killed,
        by ``KILLED_ANSWER_S`` (its returncode is then None, the run a timeout).

        Raises:
            ForkServerLost: the server (or the run's handler) went away, stopped (SIGSTOP) or
                did not answer before the worker's exit status came; the worker is killed (it
                dies with its handler anyway) and a stuck server of this process is killed, so
                that the next run starts a new one.
        """

        with self._connect() as conn:
            path = self.path
            request = {
                "spec": str(run_dir / SPEC_FILE),
                "stdout": str(run_dir / STDOUT_FILE),
                "stderr": str(run_dir / STDERR_FILE),
                "env": env,
                "dynamo": dynamo,
            }
            conn.sendall((json.dumps(request) + "\n").encode())
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
            t0 = time.monotonic()
            timed_out = False
            try:
                try:
                    line = read_answer(conn, buffer, handler, max(0.001, timeout_s), "the run's handler")
                except AnswerOverdue:  # the run's own time is up
                    timed_out = True
                    _killpg(pid)
                    line = read_answer(conn, buffer, handler, KILLED_ANSWER_S, "the run's handler")
            except PeerStopped as exc:
                _killpg(pid)
                self._lost(path, stuck=True)
                raise ForkServerLost(f"{exc}; the run is killed, the server replaced", pid) from None
            except AnswerOverdue as exc:  # killed at its timeout; its exit status never came
                log.warning("%s: %s after the run was killed at timeout_s=%s", run_dir, exc, timeout_s)
                self._lost(path, stuck=True)
                return None, True, pid, time.monotonic() - t0
            wall_s = time.monotonic() - t0
            if not line:
                _killpg(pid)
                self._lost(path)
                raise ForkServerLost(
                    "the fork server went away while the worker ran (killed, or out of host "
                    "memory?); the run's outcome is unknown",
                    pid,
                )
            returncode = json.loads(line)["returncode"]
        return returncode, timed_out, pid, wall_s

    def _lost(self, path: str | None, stuck: bool = False) -> None:
        """The server at ``path`` is gone: a shared one is never used again by this process (it
        starts its own); this process's own one is restarted by the next ``_ensure``, after
        being killed here when it is ``stuck`` (stopped or wedged, but alive)."""
        with self._lock:
            if self.shared and self.path == path:
                self._gone.add(path)
                self.shared, self.path = False, None
            elif stuck and self.proc is not None and self.path == path:
                log.warning("memsweep: killing the stuck fork server (pid %s); a new one starts", self.proc.pid)
                self.proc.kill()
                self.proc.wait()


_FORKSERVER = ForkServer()


def share_fork_server(isolation: str) -> None:
    """In a sweep's main process, before the launcher starts: start the fork server now and name
    its socket in the environment (``MEMSWEEP_FORKSERVER``), so that the launcher's worker
    processes (joblib's loky workers, submitit_local's jobs) fork their runs from this one
    server instead of each importing torch into a server of its own. No-op unless
    ``isolation == "forkserver"``. The server still dies with this process."""
    if isolation != ISOLATION_FORKSERVER:
        return
    _FORKSERVER.start()
    os.environ[SHARED_FORKSERVER_ENV] = _shared_name(_FORKSERVER.path)


def _run_forkserver(run_dir: Path, env: dict, spec: RunSpec) -> tuple[int, bool, int, float]:
    """A fresh process forked from a server that imported torch once (worker/forkserver.py)."""
    return _FORKSERVER.run(run_dir, env, spec.timeout_s, needs_dynamo(spec))


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
