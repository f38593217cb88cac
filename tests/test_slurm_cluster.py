"""The cluster path end to end through a real SLURM (tests/slurm_cluster.py: munged, slurmctld and
slurmd on this machine, one node, one partition): ``+cluster=slurm`` sweeps whose conditions are
SLURM jobs submitted by submitit's real sbatch, a frontier search whose probes are jobs, a DDP run
whose two ranks are the two tasks of one job, a cancelled job run again once on resume, a job
killed at its time limit read as ``timeout``, and SIGTERM to the orchestrator. Tiny CPU loads with
an emulated capacity; the tests skip, saying why, where no cluster can start."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from memsweep.conf.contract import read_json
from tests.data.loads import MEMSWEEP, NO_REPORT, TINY_CPU, search_events
from tests.slurm_cluster import PARTITION

# Every job on one CPU with no GPU: the node of tests/slurm_cluster.py has this machine's CPUs only.
ON_THIS_NODE = [
    "+cluster=slurm",
    "hydra.launcher.gpus_per_node=0",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.mem_gb=1",
    "hydra.launcher.timeout_min=10",
]
LOAD = ["capacity=64MiB", *TINY_CPU]
BATCHES = "batch=8,1024"  # one fits in 64 MiB, one runs out of memory
FRONTIER_COLUMNS = ("axis", "values", "n_runs", "n_ok", "n_oom", "n_other", "max_ok", "min_oom", "exact", "monotonic")


def memsweep(cluster, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``memsweep ARGS`` as a user runs it on a login node of ``cluster`` (its SLURM_CONF, the
    partition in MEMSWEEP_PARTITION, as conf/cluster/slurm.yaml reads it)."""
    env = {**cluster.env, "MEMSWEEP_PARTITION": PARTITION}
    return subprocess.run([MEMSWEEP, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def outcomes(sweep_dir: Path) -> dict:
    """batch -> outcome of every run directory of a sweep (result.json), attempts set aside excluded."""
    found = {}
    for spec in sorted(sweep_dir.glob("*/spec.json")):
        found[read_json(spec, "spec")["batch"]] = read_json(spec.parent / "result.json", "result")["outcome"]
    return found


def frontier_rows(sweep_dir: Path) -> list[dict]:
    """The frontier table's rows (FRONTIER_COLUMNS), comparable across sweeps."""
    import pandas as pd

    table = pd.read_parquet(sweep_dir / "frontier.parquet")
    return json.loads(table[list(FRONTIER_COLUMNS)].to_json(orient="records"))


def job_ids(sweep_dir: Path) -> set[str]:
    """The SLURM job ids submitit submitted for a sweep (its ``.submitit/`` folders)."""
    return {p.name.split("_")[0] for p in (sweep_dir / ".submitit").iterdir() if p.is_dir()}


def array_tasks(sweep_dir: Path) -> set[str]:
    """The SLURM array tasks (``ID_INDEX``) submitit submitted for a sweep: one per job it launched."""
    return {p.name for p in (sweep_dir / ".submitit").iterdir() if p.is_dir() and "_" in p.name}


def test_an_ovat_sweep_through_slurm_equals_the_same_sweep_run_here(slurm_cluster, tmp_path):
    here = subprocess.Popen(
        [MEMSWEEP, "sweep", "sweep=none", BATCHES, *LOAD, f"hydra.sweep.dir={tmp_path / 'here'}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    slurm = memsweep(
        slurm_cluster,
        "sweep",
        "sweep=none",
        BATCHES,
        *LOAD,
        *ON_THIS_NODE,
        f"hydra.sweep.dir={tmp_path / 'slurm'}",
        cwd=tmp_path,
    )
    _, here_err = here.communicate(timeout=300)
    assert slurm.returncode == 0, slurm.stderr[-3000:] + slurm_cluster.logs()
    assert here.returncode == 0, here_err[-3000:]
    assert outcomes(tmp_path / "slurm") == outcomes(tmp_path / "here") == {8: "ok", 1024: "oom"}
    assert frontier_rows(tmp_path / "slurm") == frontier_rows(tmp_path / "here")
    assert len(job_ids(tmp_path / "slurm")) == 1 and len(array_tasks(tmp_path / "slurm")) == 2  # one array
    for sweep in ("slurm", "here"):  # the sweep's end wrote its report on both
        assert (tmp_path / sweep / "report.md").is_file() and (tmp_path / sweep / "report.html").is_file()


def test_a_frontier_search_probes_as_slurm_jobs(slurm_cluster, tmp_path):
    bounds = ["hydra.sweeper.lower=352", "hydra.sweeper.upper=448", "hydra.sweeper.multiple_of=32"]
    rounds = ["hydra.sweeper.confirm=0", "hydra.sweeper.parallel=2"]  # two probes a round, the node's 2 CPUs
    args = ["sweep", "hydra/sweeper=frontier", *rounds, *bounds, *LOAD, *ON_THIS_NODE, *NO_REPORT]
    proc = memsweep(slurm_cluster, *args, f"hydra.sweep.dir={tmp_path / 's'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = search_events(tmp_path / "s", "result")
    probes = search_events(tmp_path / "s", "probe")
    assert result["exact"] and result["max_ok"] < result["min_oom"]
    ran = outcomes(tmp_path / "s")
    assert ran[result["max_ok"]] == "ok" and ran[result["min_oom"]] == "oom"
    assert len(array_tasks(tmp_path / "s")) == len(probes) == len(ran)  # every probe its own SLURM job


def test_ddp_ranks_are_the_tasks_of_one_slurm_job(slurm_cluster, tmp_path):
    args = ["sweep", "sweep=none", "batch=choice(2)", "mode=train", "parallel=ddp", "world_size=2", "nodes=1"]
    args += ["tasks_per_node=2", *TINY_CPU, *ON_THIS_NODE, *NO_REPORT]
    proc = memsweep(slurm_cluster, *args, f"hydra.sweep.dir={tmp_path / 's'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record_path,) = (tmp_path / "s").glob("*/record.json")
    record = json.loads(record_path.read_text())
    assert record["complete"] and record["outcome"] == "ok" and record["world_size"] == 2
    assert [(r["rank"], r["outcome"]) for r in record["ranks"]] == [(0, "ok"), (1, "ok")]
    assert record["ranks"][0]["pid"] != record["ranks"][1]["pid"]  # each rank its own task's process
    for phase in record["phases"]:
        assert [e["rank"] for e in phase["ranks"]] == [0, 1]
    (job,) = job_ids(tmp_path / "s")
    steps = slurm_cluster.client("sacct", "-n", "-P", "-j", job, "-o", "JobID,NTasks").stdout.split()
    assert f"{job}.0|2" in steps or not slurm_cluster.accounted, steps  # one step of two tasks
    assert os.environ.get("SLURM_JOB_ID") is None  # the test itself ran outside SLURM


def test_a_partition_the_cluster_lacks_is_refused_before_any_job(slurm_cluster, tmp_path):
    args = ["sweep", "sweep=none", BATCHES, *LOAD, *ON_THIS_NODE, "hydra.launcher.partition=nope"]
    proc = memsweep(slurm_cluster, *args, f"hydra.sweep.dir={tmp_path / 's'}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"invalid hydra.launcher.partition='nope': expected a partition of this cluster: {PARTITION}" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "s").exists()


HANG = "+fault={phase:warm_forward,kind:hang}"  # the worker hangs in its warm forward (fault injection)


def start_sweep(cluster, tmp_path: Path, *args: str) -> subprocess.Popen:
    """``memsweep sweep ARGS`` on the cluster, started (not waited for)."""
    env = {**cluster.env, "MEMSWEEP_PARTITION": PARTITION}
    return subprocess.Popen(
        [MEMSWEEP, "sweep", *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for_file(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Wait until ``path`` exists (the sweep ``proc`` still running)."""
    import time

    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.2)


def wait_until(condition, timeout: float) -> None:
    """Poll ``condition()`` until true; fail after ``timeout`` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not so after {timeout} s"
        time.sleep(0.5)


def test_a_cancelled_job_is_run_again_once_and_nothing_twice(slurm_cluster, tmp_path):
    sweep_dir = tmp_path / "s"
    slower = [w for w in TINY_CPU if not w.startswith("repeats=")] + ["repeats=200"]  # mid-run for longer
    args = ["sweep=none", "batch=4,8", *slower, *ON_THIS_NODE, *NO_REPORT]
    args.append(f"hydra.sweep.dir={sweep_dir}")
    first = start_sweep(slurm_cluster, tmp_path, *args)
    wait_for_file(sweep_dir / "1" / "spec.json", first)  # its job started the run: cancel it mid-run
    (job,) = job_ids(sweep_dir)
    assert slurm_cluster.client("scancel", f"{job}_1").returncode == 0
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    again = memsweep(slurm_cluster, "sweep", *args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert outcomes(sweep_dir) == {4: "ok", 8: "ok"}
    attempts = sorted(p.relative_to(sweep_dir).as_posix() for p in sweep_dir.glob("*/.attempts/*"))
    assert attempts == ["1/.attempts/1"]  # the cancelled attempt, set aside once; run again once
    aside = json.loads((sweep_dir / "1" / ".attempts" / "1" / "result.json").read_text())
    assert (aside["outcome"], aside["error_type"]) == ("crash", "LauncherWorkerLost")
    assert len(list(sweep_dir.glob("*/result.json"))) == 2


def test_a_job_slurm_ends_at_its_time_limit_is_a_timeout(slurm_cluster, tmp_path):
    sweep_dir = tmp_path / "s"
    limit = ["hydra.launcher.timeout_min=1", "+hydra.launcher.additional_parameters.time='0:15'"]
    args = ["sweep=none", "batch=choice(4)", HANG, *TINY_CPU, *ON_THIS_NODE, *limit, *NO_REPORT]
    args.append(f"hydra.sweep.dir={sweep_dir}")
    proc = memsweep(slurm_cluster, "sweep", *args, cwd=tmp_path)
    assert proc.returncode == 4, proc.stderr[-3000:]  # a sweep that measured nothing that answers
    result = json.loads((sweep_dir / "0" / "result.json").read_text())
    assert (result["outcome"], result["error_type"], result["timed_out"]) == ("timeout", "SlurmTimeLimit", True)
    again = memsweep(slurm_cluster, "sweep", *args, cwd=tmp_path)  # a timeout is the run's outcome: kept
    assert again.returncode == 4 and not (sweep_dir / "0" / ".attempts").exists(), again.stderr[-3000:]


def test_sigterm_to_the_orchestrator_is_an_interrupt(slurm_cluster, tmp_path):
    import signal

    sweep_dir = tmp_path / "s"
    proc = start_sweep(
        slurm_cluster,
        tmp_path,
        "sweep=none",
        "batch=choice(4)",
        HANG,
        *TINY_CPU,
        *ON_THIS_NODE,
        f"hydra.sweep.dir={sweep_dir}",
    )
    wait_for_file(sweep_dir / "0" / "spec.json", proc)
    proc.send_signal(signal.SIGTERM)  # what SLURM sends before it preempts the job the orchestrator runs in
    _, err = proc.communicate(timeout=120)
    (job,) = job_ids(sweep_dir)
    slurm_cluster.client("scancel", job)  # the run's job hangs by design
    wait_until(lambda: not slurm_cluster.client("squeue", "-h", "-j", job).stdout.strip(), 60)
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted; finished runs are kept" in err and "Traceback" not in err
