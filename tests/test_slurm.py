"""Ranks as SLURM tasks (issue #17): SLURM's environment -> torch.distributed's env:// rendezvous
(fake environments, no SLURM here), the spec's nodes/tasks_per_node checks, and two tasks of one
machine run as the two ranks of one DDP run on the CPU (gloo) with a faked SLURM environment."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from memsweep.conf.contract import RunSpec, SpecError
from memsweep.sweeper.inputs import check_task_ranks
from memsweep.worker.slurm import PORT_BASE, PORT_SPAN, expand_nodelist, slurm_rendezvous

TASK = {
    "SLURM_JOB_ID": "123456",
    "SLURM_JOB_NODELIST": "gpu[01-03,07]",
    "SLURM_NTASKS": "8",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "2",
}


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("node1,node2", ["node1", "node2"]),
        ("a[8-10],b3", ["a8", "a9", "a10", "b3"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("localhost", ["localhost"]),
    ],
)
def test_nodelists_expand_in_slurms_order(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("bad", ["gpu[01-03", "gpu[a-b]", "", "gpu]1["])
def test_a_bad_nodelist_is_refused_naming_it(bad):
    with pytest.raises(SpecError) as err:
        expand_nodelist(bad)
    assert err.value.field == "SLURM_JOB_NODELIST"


def test_a_slurm_task_maps_to_env_rendezvous():
    found = slurm_rendezvous(TASK, first_host=lambda nodelist: None)  # no scontrol: the fallback parser
    assert found == {
        "MASTER_ADDR": "gpu01",
        "MASTER_PORT": str(PORT_BASE + 123456 % PORT_SPAN),
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
    }
    asked = []
    by_scontrol = slurm_rendezvous(TASK, first_host=lambda nodelist: asked.append(nodelist) or "gpu01.cluster")
    assert asked == ["gpu[01-03,07]"] and by_scontrol["MASTER_ADDR"] == "gpu01.cluster"
    # every task of the job computes the same address and port
    other = slurm_rendezvous({**TASK, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}, first_host=lambda n: None)
    assert (other["MASTER_ADDR"], other["MASTER_PORT"]) == (found["MASTER_ADDR"], found["MASTER_PORT"])


def test_an_explicit_master_wins_and_no_slurm_is_none():
    found = slurm_rendezvous({**TASK, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}, first_host=lambda n: "x")
    assert (found["MASTER_ADDR"], found["MASTER_PORT"]) == ("10.0.0.1", "29500")
    assert slurm_rendezvous({"PATH": "/bin"}) is None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"SLURM_NTASKS": None}, "SLURM_NTASKS"),
        ({"SLURM_PROCID": "8"}, "SLURM_PROCID"),
        ({"SLURM_LOCALID": "x"}, "SLURM_LOCALID"),
        ({"SLURM_JOB_NODELIST": None}, "SLURM_JOB_NODELIST"),
        ({"SLURM_JOB_ID": None}, "SLURM_JOB_ID"),
    ],
)
def test_a_broken_slurm_environment_is_refused_naming_the_variable(change, field):
    env = {k: v for k, v in {**TASK, **change}.items() if v is not None}
    with pytest.raises(SpecError) as err:
        slurm_rendezvous(env, first_host=lambda n: None)
    assert err.value.field == field


LOAD = {
    "schema_version": 1,
    "batch": 2,
    "context": 8,
    "width": 64,
    "mode": "train",
    "device": "cpu",
    "warmup": 1,
    "repeats": 1,
    "workload": {"name": "mlp", "depth": 2, "hidden": 128},
    "parallel": "ddp",
}


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"world_size": 2, "nodes": 0, "tasks_per_node": 2}, "nodes"),
        ({"world_size": 2, "tasks_per_node": 0}, "tasks_per_node"),
        ({"world_size": 8, "nodes": 2, "tasks_per_node": 3}, "tasks_per_node"),
        ({"world_size": 8, "nodes": 2}, "tasks_per_node"),
        ({"world_size": 1, "parallel": "none", "tasks_per_node": 2}, "tasks_per_node"),
        # several nodes are the ranks of one run: parallel and world_size named, not tasks_per_node
        ({"parallel": "none", "nodes": 2}, "nodes"),
        ({"parallel": "none", "nodes": 2, "tasks_per_node": 1}, "nodes"),
        ({"world_size": 1, "nodes": 2, "tasks_per_node": 1}, "nodes"),
        # resharding is FSDP's choice
        ({"world_size": 2, "reshard_after_forward": False}, "reshard_after_forward"),
        ({"parallel": "none", "reshard_after_forward": False}, "reshard_after_forward"),
    ],
)
def test_bad_nodes_and_tasks_are_refused_naming_the_field(fields, field):
    with pytest.raises(SpecError) as err:
        RunSpec.from_dict({**LOAD, **fields})
    assert err.value.field == field


def test_the_slurm_cluster_config_asks_for_the_runs_nodes_and_tasks():
    from hydra import compose, initialize_config_module

    overrides = ["+cluster=slurm", "mode=train", "parallel=fsdp", "world_size=8", "nodes=2", "tasks_per_node=4"]
    with initialize_config_module(config_module="memsweep.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
        default = compose(config_name="config", overrides=["+cluster=slurm"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (2, 4, 4)
    assert (default.hydra.launcher.nodes, default.hydra.launcher.tasks_per_node) == (1, 1)


def test_ranks_as_tasks_need_the_slurm_launcher():
    spec = RunSpec.from_dict({**LOAD, "world_size": 8, "nodes": 2, "tasks_per_node": 4})
    assert spec.ranks_per_node == 4
    check_task_ranks(spec, "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher")
    with pytest.raises(SpecError) as err:
        check_task_ranks(spec, "hydra._internal.core_plugins.basic_launcher.BasicLauncher")
    assert err.value.field == "tasks_per_node"


@pytest.mark.parametrize(
    "fields",
    [
        {"world_size": 1, "tasks_per_node": 1},
        {"world_size": 2, "tasks_per_node": 2},
        {"world_size": 2},
        {"world_size": 1, "parallel": "none", "tasks_per_node": 1},
    ],
)
def test_the_sweeper_and_the_worker_refuse_the_same_task_ranks(fields, monkeypatch):
    """One rule (conf.contract.ranks_are_tasks): outside a SLURM task and without the SLURM
    launcher, the sweeper refuses exactly the specs whose rendezvous the worker refuses."""
    from memsweep.conf.contract import ranks_are_tasks
    from memsweep.worker.ranks import task_rendezvous

    for name in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    spec = RunSpec.from_dict({**LOAD, **fields})
    basic = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
    try:
        task_rendezvous(spec)
        worker_refuses = False
    except SpecError:
        worker_refuses = True
    try:
        check_task_ranks(spec, basic)
        sweeper_refuses = False
    except SpecError as err:
        assert err.field == "tasks_per_node"
        sweeper_refuses = True
    assert (
        sweeper_refuses
        == worker_refuses
        == ranks_are_tasks(spec)
        == (spec.parallel != "none" and "tasks_per_node" in fields)
    )
    check_task_ranks(spec, basic, environ={**TASK, "SLURM_NTASKS": str(spec.world_size)})  # inside a SLURM task: fine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_tasks_of_one_machine_are_the_two_ranks_of_one_run(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = run_dir / "spec.json"
    spec.write_text(json.dumps({**LOAD, "world_size": 2, "tasks_per_node": 2}))
    base = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "SLURM_JOB_ID": "1",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_NTASKS": "2",
        "SLURM_NODEID": "0",
        "MASTER_PORT": str(free_port()),  # not the job id's port: concurrent tests on this machine
    }
    tasks = [
        subprocess.Popen(
            [sys.executable, "-m", "memsweep.worker", str(spec)],
            env={**base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for r in (1, 0)
    ]
    codes = [t.wait(timeout=300) for t in tasks]
    assert codes == [0, 0], [t.stderr.read()[-2000:] for t in tasks]
    record = json.loads((run_dir / "record.json").read_text())
    assert record["complete"] and record["outcome"] == "ok" and record["world_size"] == 2
    assert [(r["rank"], r["outcome"], r["exit_code"]) for r in record["ranks"]] == [(0, "ok", 0), (1, "ok", 0)]
    assert record["ranks"][0]["pid"] != record["ranks"][1]["pid"]
    for phase in record["phases"]:  # both ranks, each its own task, recorded every phase
        assert [e["rank"] for e in phase["ranks"]] == [0, 1]
    # DDP: both ranks hold the same whole replica
    assert record["ranks"][0]["local_parameter_bytes"] == record["ranks"][1]["local_parameter_bytes"] > 0


@pytest.mark.parametrize(("cluster", "refused"), [("+cluster=slurm", False), ("+cluster=local", True)])
def test_the_ovat_sweeper_checks_task_ranks_against_the_sweeps_launcher(cluster, refused):
    """The ovat sweeper validates its conditions in the orchestrator, where no Hydra job config
    is set: each condition keeps the sweep's launcher, so ranks as SLURM tasks pass under
    submitit_slurm and are refused under any other launcher."""
    from hydra import compose, initialize_config_module

    from memsweep.sweeper.errors import InputRefused
    from memsweep.sweeper.ovat import OvatSweeperImpl
    from memsweep.sweeper.spec import checked_spec

    overrides = [cluster, "mode=train", "parallel=ddp", "world_size=2", "nodes=1", "tasks_per_node=2", "device=cpu"]
    with initialize_config_module(config_module="memsweep.conf", version_base="1.3"):
        config = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    sweeper = OvatSweeperImpl()
    sweeper.config = config
    (condition,) = sweeper.conditions([["batch=2"]])
    if refused:
        with pytest.raises(InputRefused) as err:
            checked_spec(condition)
        assert err.value.error.field == "tasks_per_node"
    else:
        assert checked_spec(condition).ranks_per_node == 2


def test_a_slurm_job_never_uses_a_fork_server_from_outside_the_job(monkeypatch, tmp_path):
    """A sweep's fork server, named in the environment that sbatch hands its jobs, serves only
    the processes of its own place: a SLURM job on the same host starts its own server, so that
    its runs stay in the job (its time limit and scancel end them)."""
    from memsweep.sweeper.forkserver_client import SHARED_FORKSERVER_ENV, shared_name, shared_server

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv(SHARED_FORKSERVER_ENV, shared_name(str(tmp_path / "sock")))  # this live process's
    assert shared_server() == str(tmp_path / "sock")
    monkeypatch.setenv("SLURM_JOB_ID", "77")  # the same variables, seen from inside a job
    assert shared_server() is None
    monkeypatch.setenv(SHARED_FORKSERVER_ENV, shared_name(str(tmp_path / "sock")))  # named inside job 77
    assert shared_server() == str(tmp_path / "sock")
    monkeypatch.setenv("SLURM_JOB_ID", "78")
    assert shared_server() is None


SLURM_LAUNCHER = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"


@pytest.mark.parametrize(
    ("answer", "partition", "field"),
    [
        (
            subprocess.CompletedProcess([], 1, "", "sinfo: error: Unable to contact slurm controller\n"),
            "gpu",
            "hydra/launcher",
        ),
        (None, None, "hydra/launcher"),  # sinfo did not answer in time
        (subprocess.CompletedProcess([], 0, "debug\ngpu\n", ""), "gpus", "hydra.launcher.partition"),
        (subprocess.CompletedProcess([], 0, "debug\ngpu\ngpu\n", ""), "gpu", None),
        (subprocess.CompletedProcess([], 0, "debug\n", ""), None, None),  # the cluster's default partition
    ],
)
def test_the_slurm_launcher_needs_a_controller_and_its_partition(monkeypatch, answer, partition, field):
    """Before any job is submitted: sinfo must reach a controller and list the partition asked for;
    else one refusal naming the field (no sbatch traceback)."""
    from memsweep.sweeper.inputs import check_launcher

    monkeypatch.setattr("shutil.which", lambda name, *a, **k: f"/usr/bin/{name}")
    if field is None:
        check_launcher(SLURM_LAUNCHER, partition, sinfo=lambda: answer)
        return
    with pytest.raises(SpecError) as err:
        check_launcher(SLURM_LAUNCHER, partition, sinfo=lambda: answer)
    assert err.value.field == field
    if field == "hydra/launcher" and answer is not None:
        assert "Unable to contact slurm controller" in str(err.value)
    if field == "hydra.launcher.partition":
        assert "debug, gpu" in str(err.value)


class UncompletedJobError(Exception):
    """submitit's exception class of that name (matched by name, as the sweeper does)."""


@pytest.mark.parametrize(
    ("message", "timed_out"),
    [
        (
            "Job 12_1 (task: 0) with path /s/.submitit/12_1/12_1_0_result.pkl\n"
            "has not produced any output (state: TIMEOUT)",
            True,
        ),
        (
            "Job 12_1 (task: 0) with path /s/.submitit/12_1/12_1_0_result.pkl\n"
            "has not produced any output (state: CANCELLED)",
            False,
        ),
        (
            "Job (task=0) failed during processing with trace:\nJob not requeued because: timed-out too many times.\n"
            "  - /s/.submitit/12_1/12_1_0_log.err",
            True,
        ),
    ],
)
def test_a_job_slurm_ended_at_its_time_limit_is_its_runs_timeout(tmp_path, message, timed_out):
    from memsweep.sweeper.lost_workers import is_lost_worker, mark_time_limit

    run_dirs = [tmp_path / "0", tmp_path / "1"]
    for run_dir in run_dirs:
        run_dir.mkdir()
    exc = UncompletedJobError(message)
    assert is_lost_worker(exc)
    marked = mark_time_limit(exc, run_dirs)
    if not timed_out:
        assert marked is None and not (tmp_path / "1" / "result.json").exists()
        return
    assert marked == tmp_path / "1" and not (tmp_path / "0" / "result.json").exists()
    result = json.loads((tmp_path / "1" / "result.json").read_text())
    assert (result["outcome"], result["error_type"], result["timed_out"]) == ("timeout", "SlurmTimeLimit", True)
    assert mark_time_limit(exc, run_dirs) is None  # a result already there is kept


def test_a_run_whose_job_slurm_ends_is_never_the_loads_crash(tmp_path, monkeypatch):
    """Inside a SLURM job: submitit's stop at the time limit is a timeout; a SIGTERM mid-run (scancel)
    turns the worker's crash into a lost launcher worker; outside a job nothing changes."""
    import signal

    from memsweep.sweeper.slurm_job import ended_by_slurm

    def timed_out():
        raise UncompletedJobError("Job not requeued because: timed-out too many times.")

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)

    def other():
        raise RuntimeError("another error")

    with pytest.raises(RuntimeError):  # not SLURM's doing: raised as it is
        ended_by_slurm(tmp_path, other)
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setattr("memsweep.sweeper.slurm_job.job_state", lambda job: "RUNNING")
    assert ended_by_slurm(tmp_path, timed_out)["error_type"] == "SlurmTimeLimit"

    def cancelled():
        os.kill(os.getpid(), signal.SIGTERM)  # SLURM's SIGTERM to the job, noted and passed on
        return {"outcome": "crash", "signal": 15}

    before = signal.signal(signal.SIGTERM, lambda s, f: None)
    try:
        result = ended_by_slurm(tmp_path, cancelled)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert (result["outcome"], result["error_type"]) == ("crash", "LauncherWorkerLost")
    assert json.loads((tmp_path / "result.json").read_text())["error_type"] == "LauncherWorkerLost"
    assert ended_by_slurm(tmp_path, lambda: {"outcome": "ok"}) == {"outcome": "ok"}  # no SIGTERM: as it ran
