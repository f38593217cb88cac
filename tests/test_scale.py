"""Scale-out: leases (one device or core set per concurrent run), launchers, forkserver isolation."""

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from memsweep.conf.contract import LEASE_LOCKS_ENV, SpecError
from memsweep.sweeper.pool import core_slots, lease, placement
from tests.data.loads import MEMSWEEP, NO_REPORT, TINY_CPU

EDGE = ["batch=4,64", "capacity=8MiB", *TINY_CPU, "sweep=none", *NO_REPORT]
"""A two-run sweep whose frontier is batch 4 ok, 64 out of memory; its tables are read, not its report."""


def test_a_lease_is_exclusive_and_freed_when_its_holder_is_killed(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; from sweeper.pool import lease\n"
                f"with lease('gpu', ['0'], {str(tmp_path)!r}):\n"
                "    print('held', flush=True); time.sleep(600)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert holder.stdout.readline().strip() == "held"
    with lease("gpu", ["0", "1"], tmp_path) as slot:
        assert slot == "1"  # never the one another run holds
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    # the killed run's lease is free: taken on the first tries. lease() waits for ever while a
    # slot is held, so it runs in a thread with a generous bound (a fail, not a hang, if never freed)
    got: list[str] = []

    def take() -> None:
        with lease("gpu", ["0"], tmp_path) as slot:
            got.append(slot)

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    taker.join(30)
    assert got == ["0"], "the killed holder's lease was not freed"


def _held(path: str) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open file: refused while the lease holds it
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def test_placement_environment(tmp_path):
    with placement("cores", "cpu", 1, None, tmp_path) as env:
        assert env["MEMSWEEP_CPU_CORES"] in core_slots(1) and env["MEMSWEEP_LEASE"].startswith("cores:")
    with placement("gpus", "cuda:0", 1, {"device_count": 2}, tmp_path) as env:
        assert env["CUDA_VISIBLE_DEVICES"] in ("0", "1")
        # the lock files named to the run (for its fork-server handler to take over) are the ones held
        locks = env[LEASE_LOCKS_ENV].split(os.pathsep)
        assert [Path(p).parent for p in locks] == [tmp_path] and all(_held(p) for p in locks)
    assert not any(_held(p) for p in locks), "released with the lease"
    with placement("gpus", "cpu", 1, None, tmp_path) as env:
        assert env == {}
    with pytest.raises(SpecError, match="pool=gpus"):
        with placement("gpus", "cuda:3", 1, {"device_count": 4}, tmp_path):
            pass
    with pytest.raises(SpecError, match="cores_per_run"):
        core_slots(10_000)


def _intervals(sweep_dir):
    out = []
    for rec_path in sorted(sweep_dir.glob("*/record.json")):
        rec = json.loads(rec_path.read_text())
        out.append(
            (
                rec["started_at"],
                rec["updated_at"],
                rec["environment"]["lease"],
                rec["environment"]["cpu_affinity"],
                rec["environment"]["isolation"],
                rec["outcome"],
            )
        )
    return out


def test_concurrent_runs_never_share_a_lease(tmp_path):
    sweep_dir = tmp_path / "par"
    proc = subprocess.run(
        [
            MEMSWEEP,
            "sweep",
            "sweep=none",
            "batch=1,2,3,4",
            "context=8",
            "width=16",
            "warmup=1",
            "repeats=1",
            "device=cpu",
            "pool=cores",
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            *NO_REPORT,
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = _intervals(sweep_dir)
    assert len(runs) == 4 and all(r[5] == "ok" for r in runs)
    for i, a in enumerate(runs):
        assert len(a[3]) == 1 and a[2] == f"cores:{a[3][0]}"  # pinned to the core it leased
        for b in runs[i + 1 :]:
            overlap = a[0] < b[1] and b[0] < a[1]
            if overlap:
                assert a[2] != b[2], (a, b)


def _edge_frontier(sweep_dir, *args):
    """The frontier rows (axis, max_ok, min_oom, exact) of the EDGE sweep run into ``sweep_dir``."""
    proc = subprocess.run(
        [MEMSWEEP, "sweep", *EDGE, *args, f"hydra.sweep.dir={sweep_dir}"],
        cwd=sweep_dir.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    frontier = pq.read_table(sweep_dir / "frontier.parquet").to_pylist()
    return [(r["axis"], r["max_ok"], r["min_oom"], r["exact"]) for r in frontier]


@pytest.fixture(scope="module")
def spawn_frontier(tmp_path_factory):
    """The EDGE sweep's frontier with spawned workers and the basic launcher, run once for the
    comparisons below."""
    return _edge_frontier(tmp_path_factory.mktemp("spawn") / "basic", "isolation=spawn")


@pytest.mark.parametrize(
    "extra", [["isolation=forkserver"], ["hydra/launcher=submitit_local"]], ids=["forkserver", "submitit_local"]
)
def test_same_frontier_as_spawn_with_the_basic_launcher(tmp_path, spawn_frontier, extra):
    other = _edge_frontier(tmp_path / "other", *extra)
    assert spawn_frontier == other == [("batch", 4, 64, True)]
    if extra == ["isolation=forkserver"]:
        assert {r[4] for r in _intervals(tmp_path / "other")} == {"forkserver"}


@pytest.mark.parametrize("cluster, target", [("slurm", "SlurmLauncher"), ("local", "LocalLauncher")])
def test_cluster_configs_compose(cluster, target, monkeypatch):
    from hydra import compose, initialize_config_module

    monkeypatch.setenv("MEMSWEEP_PARTITION", "a100")
    with initialize_config_module(config_module="memsweep.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"+cluster={cluster}"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith(target)
    assert cfg.pool == "gpus" and cfg.hydra.launcher.tasks_per_node == 1
    if cluster == "slurm":
        assert cfg.hydra.launcher.partition == "a100" and cfg.hydra.launcher.gpus_per_node == 1


CLIENT = """
import json, sys
from pathlib import Path
import memsweep.sweeper.process as p
from memsweep.conf.contract import RunSpec
spec = RunSpec.from_dict(json.loads(sys.argv[2]))
result = p.execute(spec, Path(sys.argv[1]), isolation="forkserver")
print(json.dumps({"outcome": result["outcome"], "shared": p._FORKSERVER.shared,
                  "own_server": p._FORKSERVER.proc is not None}))
"""
TINY = {
    "batch": 1,
    "context": 4,
    "width": 8,
    "device": "cpu",
    "workload": {"name": "mlp", "depth": 1},
    "warmup": 0,
    "repeats": 1,
    "threads": 1,
}


def run_client(run_dir: Path) -> dict:
    """CLIENT on TINY in a fresh process (a loky worker's place), to its end: what it printed."""
    proc = subprocess.run(
        [sys.executable, "-c", CLIENT, str(run_dir), json.dumps(TINY)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.fixture
def shared_server(monkeypatch):
    from memsweep.sweeper import process

    monkeypatch.setenv(process.SHARED_FORKSERVER_ENV, "")  # restored after the test
    process.share_fork_server("forkserver")
    return process._FORKSERVER


def test_launcher_workers_fork_their_runs_from_the_sweeps_one_server(tmp_path, shared_server):
    """A process started after share_fork_server (a loky worker) uses that server, not its own."""
    assert run_client(tmp_path / "run") == {"outcome": "ok", "shared": True, "own_server": False}


def test_a_client_whose_shared_server_is_gone_starts_its_own(tmp_path, monkeypatch):
    import socket

    from memsweep.sweeper import process

    owner = subprocess.Popen(["true"])
    owner.wait()  # the owner of the named server has exited
    (tmp_path / "sock").write_text("")  # and nothing listens there
    monkeypatch.setenv(process.SHARED_FORKSERVER_ENV, f"{socket.gethostname()}:{owner.pid}:{tmp_path / 'sock'}")
    assert run_client(tmp_path / "run") == {"outcome": "ok", "shared": False, "own_server": True}


def test_a_killed_client_leaves_its_run_to_the_shared_servers_handler(tmp_path, shared_server):
    """The server outlives a killed loky worker, and so does the run that worker was waiting for:
    its handler keeps it (bounded by its timeout_s) and writes its exit status for the sweeper
    that takes it over (sweeper.kept_runs)."""
    hang = dict(TINY, timeout_s=600, fault={"phase": "model_load", "kind": "hang"})
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(tmp_path / "run"), json.dumps(hang)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run_dir = tmp_path / "run"
    deadline = time.monotonic() + 120
    while not (run_dir / "record.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    pid = json.loads((run_dir / "record.json").read_text())["pid"]
    assert Path(f"/proc/{pid}").exists()
    client.send_signal(signal.SIGKILL)
    client.wait()
    deadline = time.monotonic() + 30
    while not (run_dir / "exit_status.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    kept = json.loads((run_dir / "exit_status.json").read_text())
    assert kept["ended"] is False and kept["worker_pid"] == pid
    assert _alive(pid), "the run goes on (it hangs until its timeout_s=600)"
    assert shared_server.proc.poll() is None  # the server itself goes on serving
    os.kill(pid, signal.SIGKILL)  # the run ends; its handler says how
    deadline = time.monotonic() + 30
    while not json.loads((run_dir / "exit_status.json").read_text())["ended"] and time.monotonic() < deadline:
        time.sleep(0.1)
    ended = json.loads((run_dir / "exit_status.json").read_text())
    assert (ended["ended"], ended["returncode"], ended["timed_out"]) == (True, -signal.SIGKILL, False)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.fixture
def own_server(monkeypatch):
    """A fork server of this test's own, not started yet (and no shared one)."""
    from memsweep.sweeper import process

    monkeypatch.setenv(process.SHARED_FORKSERVER_ENV, "")
    server = process.ForkServer()
    monkeypatch.setattr(process, "_FORKSERVER", server)
    yield server
    server.close()


def test_timeout_counts_from_the_fork_not_from_the_servers_start(tmp_path, own_server, monkeypatch):
    """The first run of a sweep waits while the server imports torch (seconds); its timeout_s
    and wall_s are the worker's own.

    The server's start is made longer than timeout_s on every machine (a sitecustomize that
    sleeps before the server imports anything), rather than hoping torch's import outlasts the
    timeout here; timeout_s itself leaves the tiny run (a tenth of a second) a wide margin."""
    from memsweep.conf.contract import RunSpec
    from memsweep.sweeper.process import execute

    timeout_s = 5.0
    slow = tmp_path / "slow_start"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(
        "import os, time\nif os.environ.get('MEMSWEEP_TEST_SLOW_START_S'):\n"
        "    time.sleep(float(os.environ['MEMSWEEP_TEST_SLOW_START_S']))\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(slow), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("MEMSWEEP_TEST_SLOW_START_S", str(timeout_s))
    t0 = time.monotonic()
    result = execute(RunSpec.from_dict(dict(TINY, timeout_s=timeout_s)), tmp_path / "run", isolation="forkserver")
    waited = time.monotonic() - t0
    assert waited > timeout_s, "premise: the server's start alone outlasted timeout_s"
    assert result["outcome"] == "ok", result
    assert result["wall_s"] < timeout_s < waited


def test_a_run_whose_fork_server_dies_runs_again_from_a_new_one(tmp_path, own_server):
    """The server killed mid-run (the OOM killer's choice, say): not the load's crash. The
    attempt is set aside and the run starts again from a new server (here it hangs again and
    times out, a deterministic second attempt)."""
    from memsweep.conf.contract import RunSpec
    from memsweep.sweeper.process import execute

    hang = dict(TINY, timeout_s=3, fault={"phase": "model_load", "kind": "hang"})
    record = tmp_path / "run" / "record.json"
    killed = []

    def kill_server_once_the_worker_runs() -> None:
        deadline = time.monotonic() + 120
        while not record.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        killed.append(own_server.proc.pid)
        own_server.proc.kill()

    threading.Thread(target=kill_server_once_the_worker_runs, daemon=True).start()
    result = execute(RunSpec.from_dict(hang), tmp_path / "run", isolation="forkserver")
    assert killed and own_server.proc.pid != killed[0]  # a new server served the second attempt
    assert (tmp_path / "run" / ".attempts" / "1" / "record.json").is_file()  # the lost attempt, kept
    assert result["outcome"] == "timeout" and result["error_message"] == "killed after timeout_s=3", result
