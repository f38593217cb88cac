"""Process faults of the orchestrator, the launcher's workers and the fork server (#24): nothing
left running, nothing waiting for ever, one lost launcher worker costs only its runs, files read
back are validated, concurrent sessions are told apart. Real processes, tiny loads."""

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from memsweep.conf.contract import (
    EXIT_ERROR,
    FORKSERVER_KILL_REQUEST,
    FORKSERVER_NO_PRELOAD,
    LAUNCHER_WORKER_LOST,
    LEASE_LOCKS_ENV,
    RunSpec,
    process_identity,
    process_state,
    read_run,
    remove_stale_temps,
    write_json_atomic,
)
from memsweep.sweeper.forkserver_client import SOCKET_DIR_PREFIX, run_request
from memsweep.sweeper.forkserver_wait import AnswerOverdue, PeerStopped, read_answer
from memsweep.sweeper.kept_runs import HANDOVER_S, wait_for_kept_run
from memsweep.sweeper.liveness import POLL_S, is_process, wait_for_old_worker
from memsweep.sweeper.owner import OWNER_ENV, owner_gone, session_id
from memsweep.sweeper.process import SHARED_FORKSERVER_ENV, ForkServer, ForkServerLost, execute, worker_env
from tests.data.loads import MEMSWEEP, SMALLEST_CPU

HANG = "fault={phase:warm_forward,kind:hang}"
TAG = "MEMSWEEP_TEST_TAG"


@pytest.fixture(autouse=True)
def _own_fork_server(monkeypatch):
    """Each test here starts and stops its own fork server: a shared one named in this process's
    environment by an earlier in-process sweep (MEMSWEEP_FORKSERVER) must not be used."""
    monkeypatch.delenv(SHARED_FORKSERVER_ENV, raising=False)


def _tagged(tag: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose environment holds TAG=tag."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{name}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] == "Z":
                    continue  # a zombie runs nothing
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"{TAG}={tag}".encode() in env:
            out.append((int(name), cmd))
    return out


def _wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _start_sweep(tmp_path: Path, tag: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, TAG: tag, "MEMSWEEP_PROGRESS": "0"}
    cmd = [MEMSWEEP, "sweep", "sweep=none", f"hydra.sweep.dir={tmp_path / 's'}", *SMALLEST_CPU, *args]
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# ---- 1. every process memsweep starts dies with its owner ---------------------------------


@pytest.mark.parametrize("isolation", ["forkserver", "spawn"])
@pytest.mark.parametrize(
    "launcher",
    [
        [],
        ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "pool=cores", "cores_per_run=1"],
    ],
    ids=["basic", "joblib"],
)
def test_killing_only_the_orchestrator_leaves_no_process_within_5_s(tmp_path, launcher, isolation):
    tag = uuid.uuid4().hex
    proc = _start_sweep(tmp_path, tag, "batch=1,2,3", HANG, f"isolation={isolation}", *launcher)
    try:
        running = 2 if launcher else 1
        _wait(lambda: len(list((tmp_path / "s").glob("*/record.json"))) >= running, 180, "runs in flight")
        assert any("worker" in cmd for _, cmd in _tagged(tag) if _ != proc.pid)
        proc.kill()  # only the orchestrator, as the OOM killer or `kill -9 PID` does
        proc.wait()
        # the README's bound (PR_SET_PDEATHSIG, a 0.5 s watchdog): _wait fails past it
        _wait(lambda: not _tagged(tag), 5.0, f"no process of the sweep left (left: {_tagged(tag)})")
    finally:
        for pid, _ in _tagged(tag):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("isolation", ["forkserver", "spawn"])
def test_a_crashed_workers_children_die_with_it(tmp_path, tiny, isolation):
    """A worker that forked a child and started two programs, one in a session of its own, then died
    (SIGKILL): none is left, whatever the isolation (its group and session are killed before it is
    reaped, then what left its session, re-parented to the subreaper that waited for it)."""
    tag = uuid.uuid4().hex
    spec = RunSpec.from_dict(dict(tiny, fault={"phase": "warm_forward", "kind": "orphans"}))
    try:
        result = execute(spec, tmp_path / "r", isolation=isolation, extra_env={TAG: tag})
        assert result["outcome"] == "crash" and result["error_type"] == "SIGKILL", result
        _wait(lambda: not _tagged(tag), 5.0, f"no child of the worker left (left: {_tagged(tag)})")
    finally:
        for pid, _ in _tagged(tag):
            os.kill(pid, signal.SIGKILL)


ESCAPING_LOAD = """
import os, subprocess, time
import torch
from torch import nn


class Escaping(nn.Module):
    \"\"\"A forward that, once, starts a child in a session of its own and a daemon (a shell's
    background child, setsid, the shell gone), writes their pids, then goes on or kills itself.\"\"\"

    def __init__(self, width, pids, crash):
        super().__init__()
        self.linear, self.pids, self.crash, self.started = nn.Linear(width, width), pids, crash, False

    def forward(self, x):
        if not self.started:
            self.started = True
            child = subprocess.Popen(["sleep", "3600"], start_new_session=True, stdin=subprocess.DEVNULL)
            with open(self.pids, "a") as f:
                f.write(f"{child.pid}\\n")
            daemon = f'setsid sh -c "echo \\$\\$ >> {self.pids}; exec sleep 3600" </dev/null >/dev/null 2>&1 &'
            subprocess.run(["sh", "-c", daemon], check=True)
            while len(open(self.pids).read().split()) < 2:
                time.sleep(0.01)
            if self.crash:
                os.kill(os.getpid(), 9)
        return self.linear(x)


def build(load, pids, crash=False):
    return Escaping(load.width, pids, crash)


def inputs(load):
    return torch.randn(load.batch, load.width), None
"""


@pytest.mark.parametrize(
    "isolation, crash", [("forkserver", True), ("spawn", True), ("forkserver", False)], ids=["fork", "spawn", "fork-ok"]
)
def test_children_that_left_the_workers_session_die_with_the_run(tmp_path, tiny, isolation, crash):
    """A forward starts a child with os.setsid() and a daemon (double fork): whatever ended the
    worker (SIGKILL, or its end), both are killed when the run ends, in both isolations (the
    handler, or this process for a direct spawn, is their subreaper)."""
    (tmp_path / "escaping_load.py").write_text(ESCAPING_LOAD)
    pids = tmp_path / "pids"
    model = {"_target_": "escaping_load.build", "pids": str(pids), "crash": crash}
    workload = {"name": "user", "model": model, "inputs": {"_target_": "escaping_load.inputs"}, "path": [str(tmp_path)]}
    tag = uuid.uuid4().hex
    try:
        result = execute(
            RunSpec.from_dict(dict(tiny, workload=workload)), tmp_path / "r", isolation=isolation, extra_env={TAG: tag}
        )
        assert result["outcome"] == ("crash" if crash else "ok"), result
        started = [int(p) for p in pids.read_text().split()]
        assert len(started) == 2, started
        assert not _tagged(tag), f"left running: {_tagged(tag)}"  # reaped before the run's end was said
        assert all(_state(p) is None for p in started), [(p, _state(p)) for p in started]
    finally:
        for pid, _ in _tagged(tag):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("isolation", ["forkserver", "spawn"])
def test_killing_the_orchestrator_mid_run_kills_what_the_run_started_outside_its_session(tmp_path, isolation):
    """``kill -9`` of the orchestrator while a run's forward has started a child in a session of
    its own and a daemon, and then hangs: the fork server (a subreaper, told of its owner's death by
    SIGTERM) kills its handler, whose worker dies with it, and then those children, re-parented to
    it; nothing is left within 5 s, with either isolation (a spawned run is its handler's too)."""
    (tmp_path / "escaping_load.py").write_text(ESCAPING_LOAD)
    pids, tag = tmp_path / "pids", uuid.uuid4().hex
    load = [
        "workload=user",
        f"workload.model={{_target_:escaping_load.build,pids:'{pids}',crash:false}}",
        "workload.inputs={_target_:escaping_load.inputs}",
        *(o for o in SMALLEST_CPU if not o.startswith("workload.")),
    ]
    cmd = [MEMSWEEP, "sweep", "sweep=none", f"hydra.sweep.dir={tmp_path / 's'}", "batch=1,2", HANG, *load]
    env = {**os.environ, TAG: tag, "MEMSWEEP_PROGRESS": "0"}
    proc = subprocess.Popen(
        [*cmd, f"isolation={isolation}"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        _wait(lambda: pids.exists() and len(pids.read_text().split()) >= 2, 180, "the forward's children")
        started = [int(p) for p in pids.read_text().split()]
        assert all(_state(p) not in (None, "Z") for p in started), "both run, beyond the worker's session"
        proc.kill()  # only the orchestrator, as `kill -9 PID` does
        proc.wait()
        _wait(lambda: not _tagged(tag), 5.0, f"no process of the sweep left (left: {_tagged(tag)})")
        assert all(_state(p) is None for p in started), [(p, _state(p)) for p in started]
    finally:
        for pid, _ in _tagged(tag):
            os.kill(pid, signal.SIGKILL)


IDLE_POOL = """
import os, sys, time
from joblib import Parallel, delayed
from memsweep.sweeper.launcher_bounds import bound_launcher
from memsweep.sweeper.owner import claim_sweep

class Launcher:  # as Hydra's joblib launcher keeps its Parallel arguments
    joblib = {"n_jobs": 2, "backend": "loky"}

claim_sweep()
launcher = Launcher()
bound_launcher(launcher, 2)
print(Parallel(**launcher.joblib)(delayed(os.getpid)() for _ in range(2)), flush=True)
time.sleep(600)  # the pool's workers now idle, as between two launches
"""


def test_idle_launcher_workers_die_with_the_orchestrator(tmp_path):
    """loky workers that hold no job (idle between launches) run the owner watchdog from their
    start (loky's initializer): none outlives a killed orchestrator."""
    tag = uuid.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, "-c", IDLE_POOL], env={**os.environ, TAG: tag}, stdout=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("["), line
        assert [pid for pid, _ in _tagged(tag) if pid != proc.pid], "the pool's workers run"
        proc.kill()
        proc.wait()
        _wait(lambda: not _tagged(tag), 5.0, f"no launcher worker left (left: {_tagged(tag)})")
    finally:
        for pid, _ in _tagged(tag):
            os.kill(pid, signal.SIGKILL)


def test_a_joblib_pool_is_bounded_by_its_jobs_and_cores():
    """n_jobs=100000 for two jobs starts at most two workers; the asked count is kept for the next
    launch; every worker runs the owner guard from its start."""
    from memsweep.sweeper.launcher_bounds import bound_launcher
    from memsweep.sweeper.owner import guard_launcher_worker

    launcher = types.SimpleNamespace(joblib={"n_jobs": 100000})
    bound_launcher(launcher, 2)
    assert 1 <= launcher.joblib["n_jobs"] <= 2 and launcher.joblib["initializer"] is guard_launcher_worker
    bound_launcher(launcher, 1)
    assert launcher.joblib["n_jobs"] == 1
    bound_launcher(launcher, 5)
    assert launcher.joblib["n_jobs"] <= min(5, len(os.sched_getaffinity(0)))
    other = types.SimpleNamespace()  # not joblib: left alone
    bound_launcher(other, 3)
    assert vars(other) == {}


# ---- 2. every wait has a bound and a message -------------------------------------------------


def test_read_answer_is_bounded_and_sees_a_stopped_peer():
    a, b = socket.socketpair()
    with a, b:
        t0 = time.monotonic()
        with pytest.raises(AnswerOverdue, match="did not answer within"):
            read_answer(a, bytearray(), None, 0.5, "the fork server")
        assert time.monotonic() - t0 < 10
        sleeper = subprocess.Popen(["sleep", "60"])
        try:
            os.kill(sleeper.pid, signal.SIGSTOP)
            _wait(lambda: open(f"/proc/{sleeper.pid}/stat").read().rpartition(")")[2].split()[0] == "T", 10, "stop")
            with pytest.raises(PeerStopped, match="is stopped"):
                read_answer(a, bytearray(), sleeper.pid, 600, "the fork server")
        finally:
            sleeper.kill()
            sleeper.wait()
        b.sendall(b'{"pid": 1}\nrest')
        buffer = bytearray()
        assert read_answer(a, buffer, None, 5, "x") == b'{"pid": 1}' and buffer == b"rest"
        b.close()
        assert read_answer(a, buffer, None, 5, "x") == b""  # the peer closed first: it died


def _spec_dir(tmp_path: Path, name: str, tiny: dict, **extra) -> Path:
    run_dir = tmp_path / name
    run_dir.mkdir()
    write_json_atomic(run_dir / "spec.json", RunSpec.from_dict(dict(tiny, **extra)).to_dict())
    return run_dir


def test_a_stopped_fork_server_is_replaced_and_the_run_retried(tmp_path, tiny, caplog):
    server = ForkServer()
    try:
        first = _spec_dir(tmp_path, "a", tiny)
        returncode, timed_out, _, _ = server.run(first, worker_env(), 120, dynamo=False)
        assert (returncode, timed_out) == (0, False)
        stopped = server.proc
        os.kill(stopped.pid, signal.SIGSTOP)
        second = _spec_dir(tmp_path, "b", tiny)
        t0 = time.monotonic()
        with pytest.raises(ForkServerLost, match="is stopped"):
            server.run(second, worker_env(), 120, dynamo=False)
        assert time.monotonic() - t0 < 30, "seen within the poll, not at the answer's bound"
        assert stopped.poll() is not None, "the stopped server was killed"
        # the run is retried from a new server (what execute does on ForkServerLost)
        (second / "stdout.log").unlink(missing_ok=True)
        returncode, timed_out, _, _ = server.run(second, worker_env(), 120, dynamo=False)
        assert (returncode, timed_out) == (0, False) and server.proc.pid != stopped.pid
    finally:
        server.close()


def test_a_stopped_handler_ends_the_wait_and_kills_the_run(tmp_path, tiny):
    server = ForkServer()
    try:
        run_dir = _spec_dir(tmp_path, "h", tiny, fault={"phase": "warm_forward", "kind": "hang"})
        got: dict = {}

        def run():
            try:
                got["result"] = server.run(run_dir, worker_env(), 600, dynamo=False)
            except ForkServerLost as exc:
                got["lost"] = exc

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        record = _wait(
            lambda: (run_dir / "record.json").exists() and json.loads((run_dir / "record.json").read_text()),
            120,
            "record",
        )
        worker = record["pid"]
        handler = int(open(f"/proc/{worker}/stat").read().rpartition(")")[2].split()[1])
        os.kill(handler, signal.SIGSTOP)
        thread.join(60)
        assert not thread.is_alive(), "the wait on a stopped handler is bounded"
        assert "is stopped" in str(got.get("lost")), got
        _wait(lambda: not is_process(worker, record["pid_identity"]), 30, "the run killed")
        _wait(lambda: _state(handler) in (None, "Z"), 30, "the handler gone with its server")
    finally:
        server.close()


def _fake_handler(worker: int, handler: int, answer: bytes | None) -> tuple[socket.socket, threading.Thread, list]:
    """A client's end of a connection whose other end plays a run's handler: it says the run
    started (``worker``, ``handler``), reads what the client says until it stops saying, then
    answers ``answer`` (None: hangs up at once, as a handler that died)."""
    from memsweep.conf.contract.fork import ForkStarted

    client, peer = socket.socketpair()
    peer.sendall(ForkStarted(worker, handler).to_line())
    said: list = []

    def play() -> None:
        with peer:
            if answer is None:
                return
            while chunk := peer.recv(4096):
                said.append(chunk)
            peer.sendall(answer)

    thread = threading.Thread(target=play, daemon=True)
    thread.start()
    return client, thread, said


def test_at_its_timeout_a_run_is_killed_by_its_handler_not_by_pid(tmp_path):
    """The worker is the handler's child: at the run's timeout the client asks the handler to kill
    it (the kill request, then it says no more) and never signals the pid itself, which the handler
    may have reaped and the system given to another process (here a live process of this test)."""
    from memsweep.conf.contract.fork import ForkEnded

    other = subprocess.Popen(["sleep", "60"])  # the pid's new owner, as far as the client can tell
    try:
        conn, thread, said = _fake_handler(other.pid, os.getpid(), ForkEnded(-9, True).to_line())
        with conn:
            ended = ForkServer()._wait(conn, None, tmp_path, 0.2)
        thread.join(10)
        assert (ended.returncode, ended.timed_out) == (-9, True)
        assert FORKSERVER_KILL_REQUEST.encode() in b"".join(said).splitlines(), said
        assert other.poll() is None, "a process the run's pid may name now was not signalled"
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("still_the_worker", [True, False], ids=["its-child", "not-its-child"])
def test_a_gone_handlers_run_is_killed_only_while_its_pid_is_the_worker(tmp_path, still_the_worker):
    """A handler that died cannot kill its run: the client kills the pid only while it still names
    the process the handler forked (its identity, read while it was the handler's child)."""
    target = subprocess.Popen(["sleep", "60"])  # a child of this process: this process plays the handler
    try:
        handler = os.getpid() if still_the_worker else os.getppid()  # not target's parent: not the worker
        conn, thread, _ = _fake_handler(target.pid, handler, None)
        with conn, pytest.raises(ForkServerLost, match="went away while the worker ran"):
            ForkServer()._wait(conn, None, tmp_path, 30)
        thread.join(10)
        if still_the_worker:
            assert target.wait(10) == -signal.SIGKILL
        else:
            time.sleep(0.2)
            assert target.poll() is None, "a pid the handler never forked is left alone"
    finally:
        target.kill()
        target.wait()


def test_the_fork_server_stopped_mid_sweep_costs_no_more_than_the_poll(tmp_path, tiny):
    """execute() with isolation=forkserver: a stopped module server is replaced, the run retried: ok."""
    first = tmp_path / "r1"
    assert execute(RunSpec.from_dict(tiny), first)["outcome"] == "ok"
    servers = [p for p in _children(os.getpid()) if "memsweep.worker.forkserver" in _cmdline(p)]
    assert servers
    for pid in servers:
        os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    result = execute(RunSpec.from_dict(tiny), tmp_path / "r2")
    assert result["outcome"] == "ok" and time.monotonic() - t0 < 120
    assert list((tmp_path / "r2" / ".attempts").iterdir()), "the lost attempt is kept"
    for pid in servers:
        assert not is_process(pid, None) or _state(pid) == "Z"


def _children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if int(open(f"/proc/{name}/stat").read().rpartition(")")[2].split()[1]) == pid:
                    out.append(int(name))
            except (OSError, ValueError):
                pass
    return out


def _cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _state(pid: int) -> str | None:
    try:
        return open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0]
    except OSError:
        return None


def test_a_reused_pid_is_not_the_old_worker():
    me = os.getpid()  # alive, but not the process the record names
    t0 = time.monotonic()
    assert wait_for_old_worker({"pid": me, "pid_identity": "another-boot:1"}, 600, "run") is True
    assert wait_for_old_worker({"pid": me, "started_at": "2000-01-01T00:00:00+00:00"}, 600, "run") is True
    # the bound given is 600 s: well under a tenth of it is "no wait", even on a loaded machine
    assert time.monotonic() - t0 < 60, "no wait on a stranger"
    assert is_process(me, process_identity(me))
    sleeper = subprocess.Popen(["sleep", "60"])
    try:  # the real old worker, still alive: waited for, up to the bound
        t0 = time.monotonic()
        assert (
            wait_for_old_worker({"pid": sleeper.pid, "pid_identity": process_identity(sleeper.pid)}, 0.5, "r") is False
        )
        assert time.monotonic() - t0 >= 0.5
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_resume_does_not_wait_on_a_reused_pid(tmp_path, tiny):
    spec = RunSpec.from_dict(dict(tiny, timeout_s=600))
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    write_json_atomic(run_dir / "spec.json", spec.to_dict())
    # an attempt cut short, whose record names a pid that now belongs to a live stranger (this process)
    stale = {"schema_version": 1, "pid": os.getpid(), "pid_identity": "old-boot:42", "complete": False, "phases": []}
    write_json_atomic(run_dir / "record.json", stale)
    t0 = time.monotonic()
    result = execute(spec, run_dir, resume=True, isolation="spawn")
    assert result["outcome"] == "ok"
    assert time.monotonic() - t0 < 120, "not timeout_s=600"
    assert json.loads((run_dir / ".attempts" / "1" / "record.json").read_text())["pid_identity"] == "old-boot:42"


# ---- 3. one lost launcher worker costs only its own run ---------------------------------------

JOBLIB_2 = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "pool=cores", "cores_per_run=1"]


def _kill_one_loky_worker_mid_run(
    tmp_path: Path, *args: str
) -> tuple[subprocess.Popen, str, dict[str, int], dict[int, dict]]:
    """Start a 2-run joblib sweep whose runs hang until their timeout_s=8, SIGKILL one loky worker
    while both runs are in flight; returns the sweep's process, its output, each run's worker
    pid at the kill (run directory name -> pid), and what /proc said of each worker then
    (``_lineage``)."""
    tag, sweep = uuid.uuid4().hex, tmp_path / "s"
    proc = _start_sweep(tmp_path, tag, "batch=1,2", HANG, "timeout_s=8", *JOBLIB_2, *args)
    try:
        records = _wait(
            lambda: (lambda found: found if len(found) >= 2 else [])(list(sweep.glob("*/record.json"))),
            180,
            "runs in flight",
        )
        before = {r.parent.name: json.loads(r.read_text())["pid"] for r in records}
        for pid in before.values():  # a spawned worker writes its record before it imports torch
            _wait(lambda pid=pid: _maps_torch(pid), 120, "the worker's torch import")
        seen = {pid: _lineage(pid) for pid in before.values()}
        loky = _wait(lambda: [p for p, cmd in _tagged(tag) if "LokyProcess" in cmd], 30, "a loky worker")
        os.kill(loky[0], signal.SIGKILL)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc, out, before, seen


def _lineage(pid: int) -> dict:
    """A live worker as /proc shows it: its command line, its parent (the fork server's handler)
    and grandparent (the server) with their command lines, the parent it was told to die with
    (MEMSWEEP_PARENT_PID), and whether each process has libtorch mapped."""
    handler = _ppid(pid)
    server = _ppid(handler)
    environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    told = [v.split(b"=", 1)[1].decode() for v in environ if v.startswith(b"MEMSWEEP_PARENT_PID=")]
    return {
        "cmd": _cmdline(pid),
        "handler": handler,
        "handler_cmd": _cmdline(handler),
        "server_cmd": _cmdline(server),
        "told_parent": int(told[0]) if told else None,
        "torch": {who: _maps_torch(p) for who, p in (("worker", pid), ("server", server))},
    }


def _ppid(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[1])


def _maps_torch(pid: int) -> bool:
    return "libtorch" in open(f"/proc/{pid}/maps").read()


@pytest.mark.parametrize("isolation", ["forkserver", "spawn"])
def test_killing_one_joblib_worker_loses_no_run(tmp_path, isolation):
    """Both runs in flight (the killed worker's and the one loky kills with the pool) go on
    under the sweep's fork server, are taken over, and run once. isolation=forkserver (the
    default): forked from the server, which imported torch. isolation=spawn: a new interpreter
    (``python -m memsweep.worker SPEC``) started by the server's handler: it imports torch itself, the
    server never does."""
    proc, out, before, seen = _kill_one_loky_worker_mid_run(tmp_path, f"isolation={isolation}")
    # both runs hang by design (a timeout each): the sweep ran, and measured nothing that answers (exit 4)
    assert proc.returncode == EXIT_ERROR and "none of the 2 run(s) of this sweep ended ok or oom" in out, out[-3000:]
    assert "TerminatedWorkerError" not in out.split("a launcher worker process died")[0], "no traceback"
    assert "a launcher worker process died" in out
    assert "taken over, not run again" in out
    runs = pq.read_table(tmp_path / "s" / "runs.parquet").to_pylist()
    assert sorted(r["batch"] for r in runs) == [1, 2]
    assert all(r["outcome"] == "timeout" for r in runs), "each run ended at its own timeout_s"
    assert not list((tmp_path / "s").glob("*/.attempts")), "no run was set aside and run again"
    for name, pid in before.items():
        run_dir = tmp_path / "s" / name
        result = json.loads((run_dir / "result.json").read_text())
        record = json.loads((run_dir / "record.json").read_text())
        assert result["worker_pid"] == record["pid"] == pid, "the process in flight at the kill is the one recorded"
        status = json.loads((run_dir / "exit_status.json").read_text())
        assert status["worker_pid"] == pid and status["timed_out"] is True
        assert result["timed_out"] is True and result["error_type"] == "SIGKILL"
    assert (tmp_path / "s" / "report.html").exists()
    for lineage in seen.values():
        assert "memsweep.worker.forkserver" in lineage["server_cmd"], lineage
        assert lineage["torch"]["worker"], lineage
        if isolation == "spawn":  # exec'd: a new interpreter, nothing of the server's image
            # (/proc/PID/environ is the environment given to execve: a forked worker shows the server's)
            assert lineage["told_parent"] == lineage["handler"], "it dies with its handler, not a launcher worker"
            assert "-m memsweep.worker " in lineage["cmd"] and "forkserver" not in lineage["cmd"], lineage
            assert not lineage["torch"]["server"], "the server imported no torch: the worker did, itself"
        else:  # forked: the server's image, torch imported once by the server
            assert "memsweep.worker.forkserver" in lineage["cmd"] and lineage["torch"]["server"], lineage


CLIENT = """
import fcntl, os, socket, sys, time
path, request, lock = sys.argv[1:4]
fd = os.open(lock, os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the run's lease, as sweeper.pool holds it
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.connect(path)
conn.sendall((request + "\\n").encode())
print(conn.makefile().readline(), flush=True)
time.sleep(600)
"""


def _locked(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


@contextlib.contextmanager
def _started_server(sock: str, *options: str):
    """A fork server (``python -m memsweep.worker.forkserver SOCK [OWNER --no-preload]``) that said ready;
    killed and reaped on the way out."""
    server = subprocess.Popen(
        [sys.executable, "-m", "memsweep.worker.forkserver", sock, *options],
        env=worker_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout.readline().strip() == "ready"
        yield server
    finally:
        server.kill()
        server.wait()


@pytest.mark.parametrize("isolation", ["forkserver", "spawn"])
def test_the_handler_enforces_timeout_s_while_its_client_is_stopped(tmp_path, tiny, isolation):
    """A client that stays silent (an orchestrator stopped by SIGSTOP enforces nothing): the run's
    handler kills the run at its timeout_s itself and says so (ForkEnded timed_out), group and all."""
    run_dir = _spec_dir(tmp_path, "r", tiny, fault={"phase": "warm_forward", "kind": "hang"})
    sock, tag = str(tmp_path / "sock"), uuid.uuid4().hex
    options = (str(os.getpid()), FORKSERVER_NO_PRELOAD) if isolation == "spawn" else ()
    with _started_server(sock, *options):
        request = run_request(run_dir, worker_env({TAG: tag}), 3, False, isolation)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(sock)
            conn.settimeout(120)  # far past timeout_s: a handler that waits on its client fails here
            conn.sendall((json.dumps(request) + "\n").encode())
            reader = conn.makefile()
            pid = json.loads(reader.readline())["pid"]
            ended = json.loads(reader.readline())
    assert ended == {"returncode": -signal.SIGKILL, "timed_out": True}, ended
    assert pid and not _tagged(tag), "the run and its group are gone"


def test_a_forked_run_outlives_its_killed_client_with_its_lease(tmp_path, tiny):
    """The handler keeps a run whose client died: it holds the run's lease, says so at once
    (exit_status.json, ended false), and writes the worker's exit status when it ends."""
    run_dir = _spec_dir(tmp_path, "r", tiny, fault={"phase": "warm_forward", "kind": "hang"})
    sock, lock = str(tmp_path / "sock"), tmp_path / "cores-0.lock"
    client = None
    with _started_server(sock):
        try:
            request = run_request(run_dir, worker_env({LEASE_LOCKS_ENV: str(lock)}), 600, False, "forkserver")
            cmd = [sys.executable, "-c", CLIENT, sock, json.dumps(request), str(lock)]
            client = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            pid = json.loads(client.stdout.readline())["pid"]
            record = _wait(lambda: _read(run_dir / "record.json"), 120, "the run's record")
            client.kill()
            client.wait()
            status = _wait(lambda: _read(run_dir / "exit_status.json"), 30, "the handler's word that it kept the run")
            assert status["ended"] is False and status["worker_pid"] == pid == record["pid"]
            # not known while the run goes on: null, never a "false" that reads as "did not time out"
            assert (status["returncode"], status["timed_out"], status["wall_s"]) == (None, None, None)
            assert is_process(pid, record["pid_identity"]), "the run goes on (it hangs until timeout_s=600)"
            assert _locked(lock), "its lease is held for it"
            os.kill(pid, signal.SIGKILL)  # the run ends (here by a signal)
            status = _wait(
                lambda: (
                    (_read(run_dir / "exit_status.json") or {}).get("ended") and _read(run_dir / "exit_status.json")
                ),
                30,
                "its exit status",
            )
            assert (status["returncode"], status["timed_out"], status["worker_pid"]) == (-signal.SIGKILL, False, pid)
            _wait(lambda: not _locked(lock), 30, "the lease released once the run ended")
        finally:
            if client is not None and client.poll() is None:
                client.kill()


def test_a_spawned_run_from_the_server_is_a_new_interpreter_that_inherits_nothing(tmp_path, tiny):
    """isolation=spawn through a server started without torch (--no-preload): the handler execs
    ``python -m memsweep.worker SPEC`` in the run directory with exactly the request's environment (plus
    the handler as the parent to die with), no descriptor of the server's (its sockets), SIGINT
    not ignored (the server ignores it; the worker's Python installs its own handler only when it
    is not), and the worker imports torch itself; the server never does."""
    run_dir = _spec_dir(tmp_path, "r", tiny, fault={"phase": "warm_forward", "kind": "hang"})
    sock = str(tmp_path / "sock")
    with _started_server(sock, str(os.getpid()), FORKSERVER_NO_PRELOAD) as server:
        env = worker_env({TAG: uuid.uuid4().hex})
        request = run_request(run_dir, env, 600, False, "spawn")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(sock)
            conn.sendall((json.dumps(request) + "\n").encode())
            reader = conn.makefile()
            answer = json.loads(reader.readline())
            pid, handler = answer["pid"], answer["handler"]
            record = _wait(lambda: _read(run_dir / "record.json"), 120, "the run's record")
            _wait(lambda: _maps_torch(pid), 120, "the worker's own import of torch")
            assert record["pid"] == pid and _ppid(pid) == handler and _ppid(handler) == server.pid
            assert _cmdline(pid).split() == [sys.executable, "-m", "memsweep.worker", str(run_dir / "spec.json")]
            assert os.readlink(f"/proc/{pid}/cwd") == str(run_dir)
            environ = dict(v.split("=", 1) for v in open(f"/proc/{pid}/environ").read().split("\0") if v)
            assert environ == {**env, "MEMSWEEP_PARENT_PID": str(handler)}
            fds = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
            assert not [fd for fd in fds if fd.startswith("socket:")], fds
            status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines())
            sigint = 1 << (signal.SIGINT - 1)
            assert not int(status["SigIgn"], 16) & sigint and int(status["SigCgt"], 16) & sigint
            assert not _maps_torch(server.pid), "the server imported no torch"
            os.kill(pid, signal.SIGKILL)
            assert json.loads(reader.readline()) == {"returncode": -signal.SIGKILL, "timed_out": False}


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def test_a_run_stopped_with_its_launcher_worker_is_recorded_lost_and_run_again(tmp_path, tiny):
    """A run left in flight that no handler kept (its worker died with a launcher worker that was
    its parent: a launcher worker's own fork server, or a spawn without the sweep's server) is a
    crash of the launcher's worker, not of the load; the next launch sets it aside and runs it."""
    from memsweep.sweeper.lost_workers import mark_lost

    spec = RunSpec.from_dict(tiny)
    run_dir = _spec_dir(tmp_path, "r", tiny)
    gone = subprocess.Popen(["true"])
    gone.wait()
    record = {"schema_version": 1, "pid": gone.pid, "pid_identity": "gone:1", "complete": False, "phases": []}
    record["current_phase"] = "cold_forward"
    write_json_atomic(run_dir / "record.json", record)
    lost, kept = mark_lost(tmp_path, "TerminatedWorkerError: test")
    assert (lost, kept) == ([run_dir], [])
    envelope = json.loads((run_dir / "result.json").read_text())
    assert (envelope["outcome"], envelope["error_type"]) == ("crash", LAUNCHER_WORKER_LOST)
    assert envelope["failed_phase"] == "cold_forward" and envelope["worker_pid"] == gone.pid
    result = execute(spec, run_dir, resume=True, isolation="spawn")
    assert result["outcome"] == "ok" and not result.get("resumed")
    kept_aside = json.loads((run_dir / ".attempts" / "1" / "result.json").read_text())
    assert kept_aside["error_type"] == LAUNCHER_WORKER_LOST


def test_runs_left_in_flight_are_watched_together_not_one_after_another(tmp_path, tiny, monkeypatch):
    """Three runs whose workers died and whose handlers wrote nothing, one whose handler kept it
    and one whose worker outlived its launcher worker: the wait for them all is bounded once
    (DYING_S + HANDOVER_S), not once per run. Time is a fake clock that only sleep() advances."""
    from memsweep.sweeper import lost_workers

    clock = {"now": 0.0}
    fake_time = types.SimpleNamespace(
        monotonic=lambda: clock["now"], sleep=lambda s: clock.__setitem__("now", clock["now"] + s)
    )
    monkeypatch.setattr(lost_workers, "time", fake_time)
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = {"schema_version": 1, "pid": gone.pid, "pid_identity": "gone:1", "complete": False, "phases": []}
    runs = [_spec_dir(tmp_path, name, tiny) for name in ("a", "b", "c", "kept", "alive")]
    for run_dir in runs[:4]:
        write_json_atomic(run_dir / "record.json", dead)
    status = {"schema_version": 1, "ended": False, "worker_pid": gone.pid, "handler_pid": None}
    write_json_atomic(runs[3] / "exit_status.json", status)
    live = subprocess.Popen(["sleep", "60"])
    try:
        alive = {**dead, "pid": live.pid, "pid_identity": process_identity(live.pid)}
        write_json_atomic(runs[4] / "record.json", alive)
        lost, kept = lost_workers.mark_lost(tmp_path, "TerminatedWorkerError: test")
    finally:
        live.kill()
        live.wait()
    assert (lost, kept) == (runs[:3], runs[3:])
    assert [(r / "result.json").exists() for r in runs] == [True, True, True, False, False]
    bound = max(lost_workers.DYING_S, HANDOVER_S) + POLL_S
    assert HANDOVER_S <= clock["now"] <= bound < 3 * HANDOVER_S, clock["now"]


# ---- 4. files read back are validated ---------------------------------------------------------


def test_a_spec_without_a_load_is_a_crash_and_the_report_renders(tmp_path, tiny):
    sweep = tmp_path / "s"
    good = sweep / "0"
    assert execute(RunSpec.from_dict(tiny), good)["outcome"] == "ok"
    bad = sweep / "1"
    bad.mkdir()
    for name in ("record.json", "result.json"):
        (bad / name).write_text((good / name).read_text())
    write_json_atomic(bad / "spec.json", {"schema_version": 1})
    run = read_run(bad)
    assert run.spec_problem and "batch" in run.spec_problem
    analyze = subprocess.run([MEMSWEEP, "analyze", str(sweep)], capture_output=True, text=True, timeout=300)
    assert analyze.returncode == 0, analyze.stderr[-3000:]
    rows = {r["run_id"]: r for r in pq.read_table(sweep / "runs.parquet").to_pylist()}
    assert rows["1"]["outcome"] == "crash" and "not a valid spec" in rows["1"]["record_problem"]
    assert rows["0"]["outcome"] == "ok"
    report = subprocess.run(
        [MEMSWEEP, "report", str(sweep), "--out", str(tmp_path / "rep")], capture_output=True, text=True, timeout=300
    )
    assert report.returncode == 0, report.stderr[-3000:]
    assert "Traceback" not in report.stderr


def test_a_result_of_an_unknown_outcome_is_not_read_as_one(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    write_json_atomic(run_dir / "spec.json", {"schema_version": 1, "batch": 1, "context": 8, "width": 16})
    write_json_atomic(run_dir / "result.json", {"schema_version": 1, "outcome": "fits", "wall_s": "fast"})
    run = read_run(run_dir)
    assert run.result is None and "outcome='fits'" in run.unreadable["result.json"]
    assert "wall_s" in run.unreadable["result.json"]


# ---- 5. concurrent sessions are told apart ----------------------------------------------------


def test_session_ids_differ_even_within_one_second_and_one_process():
    ids = {session_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(f":{os.getpid()}/" in s for s in ids)


def test_an_interrupted_client_asks_the_handler_to_kill_its_run(tmp_path, tiny):
    """A client that says FORKSERVER_KILL_REQUEST before it hangs up (an orchestrator interrupted by
    SIGINT) takes its run with it: the handler kills the run and keeps nothing (no exit_status.json),
    so a resume has nothing to wait for."""
    run_dir = _spec_dir(tmp_path, "r", tiny, fault={"phase": "warm_forward", "kind": "hang"})
    sock = str(tmp_path / "sock")
    with _started_server(sock, str(os.getpid()), FORKSERVER_NO_PRELOAD) as server:
        request = run_request(run_dir, worker_env(), 600, False, "spawn")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(sock)
            conn.sendall((json.dumps(request) + "\n").encode())
            pid = json.loads(conn.makefile().readline())["pid"]
            record = _wait(lambda: _read(run_dir / "record.json"), 120, "the run's record")
            conn.sendall((FORKSERVER_KILL_REQUEST + "\n").encode())
        _wait(lambda: not is_process(pid, record["pid_identity"]), 30, "the run killed by its handler")
        # the handler (the server's child) has ended: a handler that had kept the run would have
        # written its status before then
        children = Path(f"/proc/{server.pid}/task/{server.pid}/children")
        _wait(lambda: not children.read_text().split(), 30, "the run's handler to end")
        assert not (run_dir / "exit_status.json").exists()


def test_a_shared_server_whose_directory_is_gone_is_not_waited_for(tmp_path, monkeypatch):
    """MEMSWEEP_FORKSERVER names a live owner (this process) but a socket directory its owner
    removed with the server: the client starts a server of its own at once instead of waiting
    SHARED_WAIT_S (300 s) for a socket that will never come."""
    from memsweep.sweeper.forkserver_client import SHARED_WAIT_S, shared_name

    gone = tmp_path / "memsweep-fs-gone" / "sock"
    monkeypatch.setenv(SHARED_FORKSERVER_ENV, shared_name(str(gone)))
    server = ForkServer()
    t0 = time.monotonic()
    try:
        server._connect(preload=False).close()
        assert not server.shared and server.path != str(gone)
        assert time.monotonic() - t0 < SHARED_WAIT_S / 10
    finally:
        server.close()
    assert not Path(server.path).parent.exists()  # and its own directory went with its server


def test_an_exit_status_that_breaks_the_schema_is_ignored_and_said(tmp_path, caplog):
    """exit_status.json is checked against the published schema (document_problems): a field of
    the wrong type makes it no status at all (logged), a valid one is read as written."""
    from memsweep.sweeper.kept_runs import read_exit_status

    good = {"schema_version": 1, "ended": True, "returncode": 0, "timed_out": False, "wall_s": 1.5}
    write_json_atomic(tmp_path / "exit_status.json", good)
    assert read_exit_status(tmp_path) == good
    write_json_atomic(tmp_path / "exit_status.json", {**good, "returncode": "zero"})
    with caplog.at_level("WARNING", logger="memsweep"):
        assert read_exit_status(tmp_path) is None
    assert "returncode='zero'" in caplog.text and "exit_status.json ignored" in caplog.text


def test_a_resume_does_not_wait_for_a_kept_run_whose_handler_is_gone(tmp_path, caplog, monkeypatch):
    """exit_status.json says ended: false, but its handler (and worker) are gone (they died with the
    sweep's fork server): no wait, no warning that the handler 'wrote no exit status'. HANDOVER_S is
    made long, so that waiting it out could not pass for the immediate answer on a loaded machine."""
    monkeypatch.setattr("memsweep.sweeper.kept_runs.HANDOVER_S", 60.0)
    gone = subprocess.Popen(["true"])
    identity = process_identity(gone.pid)
    gone.wait()
    status = {"schema_version": 1, "ended": False, "worker_pid": gone.pid, "handler_pid": gone.pid}
    write_json_atomic(tmp_path / "exit_status.json", {**status, "handler_identity": identity or "x:1"})
    t0 = time.monotonic()
    with caplog.at_level("INFO", logger="memsweep"):
        assert wait_for_kept_run(tmp_path, None, 600) is None
    assert time.monotonic() - t0 < 30
    assert "wrote no" not in caplog.text and "handler ended before the run" in caplog.text


def test_stale_atomic_write_temporaries_are_removed(tmp_path):
    (tmp_path / ".record.json.abc123.tmp").write_text("{")
    (tmp_path / ".exit_status.json.x.tmp").write_text("{")
    (tmp_path / ".other.json.y.tmp").write_text("{")  # not a run file: left alone
    removed = remove_stale_temps(tmp_path, ("record.json", "exit_status.json"))
    assert sorted(p.name for p in removed) == [".exit_status.json.x.tmp", ".record.json.abc123.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.json.y.tmp"]


KILLED_WRITE = """
import os, sys
from memsweep.conf.contract import write_json_atomic
os.replace = lambda a, b: os._exit(9)  # killed between the write and the rename
write_json_atomic(sys.argv[1], {"a": 1})
"""


def _dead_pid() -> int:
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no live process
    return gone.pid


def _aged(path: Path, seconds: float) -> Path:
    """``path`` (written when missing) with its modification time ``seconds`` in the past."""
    if not path.exists():
        path.write_text("{")
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


def test_a_temporary_file_is_removed_only_once_its_writer_is_gone(tmp_path):
    """A writer killed mid-write leaves ``.NAME.PID.*.tmp``, named with its pid; it is removed once
    no process has that pid, or the one that has it started after the file was written (the pid
    reused: not its writer). A live writer's is never removed; a file whose pid names no process
    here is removed only once old when the caller says another host may write (min_age_s)."""
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITE, str(tmp_path / "record.json")])
    assert killed.returncode == 9
    (left,) = tmp_path.glob(".record.json.*.tmp")
    assert left.name.startswith(".record.json.") and left.name.split(".")[3].isdigit(), left.name
    live = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.05)
        alive = tmp_path / f".record.json.{live.pid}.a.tmp"  # its writer still writing
        alive.write_text("{")
        reused = _aged(tmp_path / f".record.json.{os.getpid()}.b.tmp", 3600)  # written before this process began
        fresh = tmp_path / f".result.json.{_dead_pid()}.c.tmp"
        fresh.write_text("{")
        assert sorted(remove_stale_temps(tmp_path, ("record.json",))) == sorted([left, reused])
        assert remove_stale_temps(tmp_path, ("result.json",), min_age_s=60) == [], "maybe another host's, writing"
        _aged(fresh, 120)
        assert remove_stale_temps(tmp_path, ("record.json", "result.json"), min_age_s=60) == [fresh]
        assert [p.name for p in tmp_path.iterdir()] == [alive.name]
    finally:
        live.kill()
        live.wait()


def test_a_resume_removes_the_temporary_files_of_dead_writers_only(tmp_path, tiny):
    """A resumed run that had ended (its result is kept) and a claimed sweep directory lose the
    temporary files their dead writers left; a live writer's stay."""
    from memsweep.sweeper.sweep_dir import claim_sweep_dir, release_sweep_dirs

    sweep = tmp_path / "s"
    spec = RunSpec.from_dict(tiny)
    assert execute(spec, sweep / "0")["outcome"] == "ok"
    live = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.05)
        dead = sweep / "0" / f".result.json.{_dead_pid()}.x.tmp"
        dead.write_text("{")
        kept = sweep / "0" / f".record.json.{live.pid}.y.tmp"
        kept.write_text("{")
        assert execute(spec, sweep / "0")["resumed"] is True
        assert not dead.exists() and kept.exists()
        old = _aged(sweep / f".sweep.json.{_dead_pid()}.z.tmp", 3600)
        restore = _aged(sweep / f".sweep.json.{_dead_pid()}.restore.tmp", 3600)  # a refused sweep's, killed
        writing = sweep / f".sweep.json.{live.pid}.w.tmp"
        writing.write_text("{")
        claim_sweep_dir(sweep)
        release_sweep_dirs(refused=False)
        assert not old.exists() and not restore.exists() and writing.exists()
    finally:
        live.kill()
        live.wait()


def test_a_sweeps_end_undoes_what_killed_writers_left_in_its_analyses(tmp_path):
    """The sweep's end (a resume's) recovers the sweep directory and each analysis/<time>/ in it:
    a dead writer's temporary tables, half-published set and report staging are removed; a
    directory a live writer holds (its lock) is left to it."""
    from filelock import FileLock

    from memsweep.analysis.publish import LOCK, MARKER, STAGING
    from memsweep.analysis.report.write import recover_sweep_outputs

    sweep, pid = tmp_path / "s", _dead_pid()
    done, busy = sweep / "analysis" / "2024-01-01_00-00-00-000001", sweep / "analysis" / "2024-01-01_00-00-00-000002"
    for d in (done, busy):
        d.mkdir(parents=True)
        (d / "runs.parquet").write_bytes(b"renamed before the kill")
        (d / f".phases.parquet.{pid}.tmp").write_bytes(b"")
        (d / MARKER.format(kind="tables", pid=pid)).write_text(json.dumps(["runs.parquet", "phases.parquet"]))
        (d / STAGING.format(kind="report", pid=pid)).mkdir()
    with FileLock(busy / LOCK):
        recover_sweep_outputs(sweep)
    assert sorted(p.name for p in done.iterdir()) == [LOCK]
    assert len(list(busy.iterdir())) == 5, "a directory held by a live writer is not touched"


def test_an_orchestrator_killed_but_not_yet_reaped_is_gone(monkeypatch):
    """A launcher worker checks its owner before a new attempt (stop_if_orphaned): a killed
    orchestrator its parent has not reaped (a zombie) keeps its pid and start time, and is gone."""
    owner = subprocess.Popen(["sleep", "30"])
    try:
        monkeypatch.setenv(OWNER_ENV, f"{owner.pid}={process_identity(owner.pid)}")
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
        assert not owner_gone()
        owner.kill()
        _wait(lambda: process_state(owner.pid) == "Z", 10, "a zombie")
        assert owner_gone()
    finally:
        owner.kill()
        owner.wait()


# ---- the fork server's socket directory goes with it ---------------------------------------


def _socket_dirs(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.glob(f"{SOCKET_DIR_PREFIX}*"))


@pytest.fixture
def left_dirs() -> Iterator[tuple[Path, list[str]]]:
    """A private TMPDIR holding socket directories left by others: one whose owner pid is gone
    (a killed orchestrator's: removed by the next server start), one of a live owner (this test's
    process) and one of the older unnamed form (both left alone). Yields it and the kept names.
    It is short, as the fork server's socket path must be (SUN_PATH_MAX; xdist's tmp_path is long)."""
    tmp = Path(tempfile.mkdtemp(prefix="ms-", dir="/tmp"))
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no process
    for name in (f"{SOCKET_DIR_PREFIX}{gone.pid}-dead", f"{SOCKET_DIR_PREFIX}{os.getpid()}-live", "memsweep-fs-legacy"):
        (tmp / name).mkdir()
        (tmp / name / "sock").touch()
    yield tmp, [f"{SOCKET_DIR_PREFIX}{os.getpid()}-live", "memsweep-fs-legacy"]
    shutil.rmtree(tmp, ignore_errors=True)


def test_a_sweep_leaves_no_fork_server_socket_directory_and_clears_a_dead_owners(tmp_path, left_dirs):
    tmp, kept = left_dirs
    cmd = [MEMSWEEP, "sweep", "sweep=none", "batch=1,2", f"hydra.sweep.dir={tmp_path / 's'}", *SMALLEST_CPU]
    proc = subprocess.run(cmd, cwd=tmp_path, env={**os.environ, "TMPDIR": str(tmp)}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(list((tmp_path / "s").glob("*/result.json"))) == 2
    assert _socket_dirs(tmp) == kept


def test_an_interrupted_sweep_leaves_no_fork_server_socket_directory(tmp_path, left_dirs):
    tmp, kept = left_dirs
    cmd = [MEMSWEEP, "sweep", "sweep=none", "batch=1,2", f"hydra.sweep.dir={tmp_path / 's'}", *SMALLEST_CPU, HANG]
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal's Ctrl-C finds it
    )
    try:
        _wait(lambda: list((tmp_path / "s").glob("*/record.json")) or proc.poll() is not None, 120, "a run's record")
        assert proc.poll() is None, proc.communicate()[0][-2000:]
        assert len(_socket_dirs(tmp)) == len(kept) + 1  # the sweep's own server's, while it runs
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole process group
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, out[-2000:]
    assert _socket_dirs(tmp) == kept


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_to_the_orchestrator_alone_ends_the_sweep_as_ctrl_c(tmp_path, signum):
    # a cluster's preemption (SLURM sends SIGTERM), a closed terminal (SIGHUP): exit 130, the resume
    # hint, nothing left running
    tag = uuid.uuid4().hex
    proc = _start_sweep(tmp_path, tag, "batch=1,2", HANG)
    try:
        _wait(lambda: list((tmp_path / "s").glob("*/record.json")) or proc.poll() is not None, 180, "a run's record")
        assert proc.poll() is None, proc.communicate()[0][-2000:]
        proc.send_signal(signum)  # the orchestrator only, not its process group
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 130, out[-2000:]
        assert "interrupted; finished runs are kept" in out and "Traceback" not in out
        _wait(lambda: not _tagged(tag), 10.0, f"no process of the sweep left (left: {_tagged(tag)})")
    finally:
        for pid, _ in _tagged(tag):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
