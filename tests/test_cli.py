"""The `memsweep` command end to end, as a user runs it (real processes, tiny loads)."""

import json
import subprocess

import pyarrow.parquet as pq
import pytest

from memsweep.analysis.frontier import FRONTIER_SCHEMA
from memsweep.analysis.tables import PHASES_SCHEMA, RUNS_SCHEMA
from memsweep.worker.environment import cpu_name
from tests.data.loads import MEMSWEEP, NO_REPORT, TINY_CPU


def run(cmd, cwd):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def crash_sweep(tmp_path_factory):
    """A 4-run sweep: batch 4 fits and batch 64 does not at 8 MiB; half the runs are SIGKILLed in warmup.
    Its tables are read, not its report (a report of crashed runs: tests/test_faults.py's matrix)."""
    root = tmp_path_factory.mktemp("sweep")
    proc = run(
        [
            MEMSWEEP,
            "sweep",
            "hydra/sweeper=basic",
            "fault={phase:warmup,kind:sigkill},null",
            "batch=4,64",
            "capacity=8MiB",
            f"hydra.sweep.dir={root}/s",
            *TINY_CPU,
            *NO_REPORT,
        ],
        cwd=root,
    )
    return proc, root / "s"


def test_sweep_goes_on_after_a_crash_and_finds_the_frontier(crash_sweep):
    proc, sweep_dir = crash_sweep
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = pq.read_table(sweep_dir / "runs.parquet")
    assert runs.schema.equals(RUNS_SCHEMA)
    rows = sorted(runs.to_pylist(), key=lambda r: r["run_id"])
    assert [r["outcome"] for r in rows] == ["crash", "oom", "ok", "oom"]
    assert rows[0]["failed_phase"] == "warmup" and rows[0]["signal"] == 9
    assert rows[1]["failed_phase"] == "cold_forward"  # OOM before reaching the injected fault
    pids = [r["worker_pid"] for r in rows]
    assert len(set(pids)) == 4, "every run is its own process"
    record_pids = {json.loads((sweep_dir / r["run_id"] / "record.json").read_text())["pid"] for r in rows}
    assert record_pids == set(pids)
    frontier = pq.read_table(sweep_dir / "frontier.parquet")
    assert frontier.schema.equals(FRONTIER_SCHEMA)
    (batch_row,) = [r for r in frontier.to_pylist() if r["axis"] == "batch"]
    assert (batch_row["max_ok"], batch_row["min_oom"], batch_row["exact"]) == (4, 64, True)
    assert batch_row["n_other"] == 1  # the crash counts neither as a success nor as an OOM
    ok_run = [r for r in rows if r["outcome"] == "ok"][0]
    assert ok_run["batch"] == 4 and batch_row["max_ok_max_memory_allocated"] == ok_run["max_memory_allocated"]
    phases = pq.read_table(sweep_dir / "phases.parquet")
    assert phases.schema.equals(PHASES_SCHEMA)
    assert phases.num_rows == 3 + 3 + 5 + 3  # crash keeps 3 phases, OOMs stop at their 3rd
    assert "max_ok" in proc.stdout and "GiB" in proc.stdout


def test_analyze_never_overwrites_and_writes_elsewhere(crash_sweep, tmp_path):
    _, sweep_dir = crash_sweep
    before = (sweep_dir / "runs.parquet").read_bytes()
    proc = run([MEMSWEEP, "analyze", str(sweep_dir)], cwd=tmp_path)
    assert proc.returncode == 1 and "already exists" in proc.stderr
    assert (sweep_dir / "runs.parquet").read_bytes() == before
    proc = run([MEMSWEEP, "analyze", str(sweep_dir), "--out", str(tmp_path / "again")], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert pq.read_table(tmp_path / "again" / "runs.parquet").num_rows == 4


def test_empty_or_all_failed_tables_share_the_schema(tmp_path):
    """A sweep whose every run failed still writes files that read as one dataset with the others."""
    from memsweep.analysis.cli import analyze

    (tmp_path / "empty").mkdir()
    proc = run([MEMSWEEP, "analyze", str(tmp_path / "empty")], cwd=tmp_path)
    assert proc.returncode == 2 and "holds no sweep" in proc.stderr, proc.stderr  # the command refuses it
    assert list((tmp_path / "empty").iterdir()) == [], "nothing written"
    analyze([tmp_path / "empty"], out_dir=tmp_path / "out")  # a sweep's end writes its tables whatever ran
    assert pq.read_table(tmp_path / "out" / "runs.parquet").schema.equals(RUNS_SCHEMA)
    assert pq.read_table(tmp_path / "out" / "frontier.parquet").schema.equals(FRONTIER_SCHEMA)


def test_second_run_into_same_directory_refuses(tmp_path):
    run_dir = tmp_path / "r"
    first = run([MEMSWEEP, "run", "batch=2", f"hydra.run.dir={run_dir}", *TINY_CPU], cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    record = (run_dir / "record.json").read_bytes()
    hydra_cfg = (run_dir / ".hydra" / "config.yaml").read_bytes()
    second = run([MEMSWEEP, "run", "batch=4", f"hydra.run.dir={run_dir}", *TINY_CPU], cwd=tmp_path)
    assert second.returncode != 0 and "never overwrites" in second.stderr
    assert (run_dir / "record.json").read_bytes() == record
    assert (run_dir / ".hydra" / "config.yaml").read_bytes() == hydra_cfg


def test_refused_run_leaves_no_directory_of_its_own_and_keeps_yours(tmp_path):
    proc = run([MEMSWEEP, "run", "batch=0", f"results_dir={tmp_path}/res", *TINY_CPU], cwd=tmp_path)
    assert proc.returncode == 2 and "invalid batch=0" in proc.stderr
    assert not (tmp_path / "res").exists()  # Hydra's new timestamped directory and its new parents are gone
    mine = tmp_path / "mine"
    mine.mkdir()
    proc = run([MEMSWEEP, "run", "batch=0", f"hydra.run.dir={mine}", *TINY_CPU], cwd=tmp_path)
    assert proc.returncode == 2 and mine.is_dir()  # a directory that existed before is the user's
    yours = tmp_path / "yours"
    yours.mkdir()
    proc = run([MEMSWEEP, "run", "batch=0", f"hydra.run.dir={yours}/a/b", *TINY_CPU], cwd=tmp_path)
    assert proc.returncode == 2 and yours.is_dir() and list(yours.iterdir()) == []  # a/b made by Hydra: gone


def test_run_exits_with_its_outcome(tmp_path):
    """`memsweep run ... && echo fits` can be trusted: ok 0, out of memory 3, error 4. Only the ok
    run's answer gives a headroom: an oom or an error has partial peaks, up to the failure, and an
    error's ERROR line comes first, before the answer."""
    cases = {
        "ok": (["batch=2"], 0),
        "oom": (["batch=1024", "capacity=8MiB"], 3),
        "error": (["batch=2", "fault={phase:cold_forward,kind:raise}"], 4),
    }
    for outcome, (args, code) in cases.items():
        run_dir = tmp_path / outcome
        proc = run([MEMSWEEP, "run", *args, f"hydra.run.dir={run_dir}", *TINY_CPU], cwd=tmp_path)
        assert json.loads((run_dir / "result.json").read_text())["outcome"] == outcome
        assert proc.returncode == code, (outcome, proc.returncode, proc.stderr[-1000:])
        lines = (proc.stdout + proc.stderr).splitlines()
        answer = [i for i, line in enumerate(lines) if "  peak on " in line or "; headroom" in line]
        assert len(answer) == 2, (outcome, lines[-8:])
        assert ("headroom = capacity - " in lines[answer[1]]) == (outcome == "ok"), lines[answer[1]]
        if outcome != "ok":
            assert "headroom: none (" in lines[answer[1]] and "up to the failure" in lines[answer[0]]
        errors = [i for i, line in enumerate(lines) if "[ERROR]" in line]
        assert bool(errors) == (outcome == "error") and all(i < answer[0] for i in errors), lines[-8:]


@pytest.mark.parametrize(
    "args, field, accepted",
    [
        (["batch=4,0"], "batch", "integer from 1"),
        (["batch=-1"], "batch", "integer from 1"),
        (["dtype=float8"], "dtype", "float32, float16, bfloat16"),
        (["capacity=lots"], "capacity", "2GiB, 1500MB, 24GB"),
        (["capacity=12XB"], "capacity", "GiB"),
        (["mode=serve"], "mode", "inference, train"),
        (["device=tpu:0"], "device", "auto, cpu, cuda, cuda:N"),
        (["device=cuda:0"], "device", "visible device"),
        (["width=1.5"], "width", "integer"),
        (["+workload.heads=4"], "workload.heads", "depth, hidden, activation"),
        (["hydra.sweeper.order=random"], "hydra.sweeper.order", "largest_first or given"),
    ],
)
def test_bad_input_fails_before_any_worker(tmp_path, args, field, accepted):
    proc = run([MEMSWEEP, "sweep", "context=8,16", f"results_dir={tmp_path}/res", *args], cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout[-1000:], proc.stderr[-2000:])
    assert f"invalid {field}=" in proc.stderr and accepted in proc.stderr
    assert not list(tmp_path.rglob("spec.json")), "no worker may start on bad input"


def test_unknown_workload_names_the_group_and_options(tmp_path):
    proc = run([MEMSWEEP, "sweep", "workload=resnet", f"results_dir={tmp_path}/res"], cwd=tmp_path)
    assert proc.returncode != 0
    assert "workload/resnet" in proc.stderr and "mlp" in proc.stderr
    assert not list(tmp_path.rglob("spec.json"))


def test_env_reports_the_machine_and_exits_2_without_the_device(tmp_path):
    proc = run([MEMSWEEP, "env", "--json"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    env = info["environment"]
    assert info["available"] and env["torch"] and env["python"] and "alloc_conf" in env
    assert info["total_memory"] > 0 and env["backend"] in ("cpu", "cuda", "hip")
    if env["backend"] == "cpu":  # the processor's model name as /proc/cpuinfo gives it, not the architecture
        assert env["device_name"] == cpu_name()  # /proc/cpuinfo's model name (tested below)
    missing = run([MEMSWEEP, "env", "--device", "cuda:9"], cwd=tmp_path)
    assert missing.returncode == 2 and "available: False" in missing.stdout
    bad = run([MEMSWEEP, "env", "--device", "tpu"], cwd=tmp_path)
    assert bad.returncode == 2 and "invalid device='tpu'" in bad.stderr


def test_the_cpu_name_is_cpuinfos_model_name_or_null_never_the_architecture(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Fancy CPU @ 2.00GHz \n\nprocessor\t: 1\n")
    arm = tmp_path / "arm"  # many aarch64 kernels name no model
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n")
    assert cpu_name(str(x86)) == "Fancy CPU @ 2.00GHz"
    assert cpu_name(str(arm)) is None and cpu_name(str(tmp_path / "missing")) is None


@pytest.mark.parametrize(
    "args, shown",
    [
        (["--cfg", "job", "batch=4"], "batch: 4"),
        (["-c", "job", "hydra/sweeper=frontier"], "context:"),
        (["--cfg", "hydra"], "OvatSweeper"),
        (["--info", "plugins"], "Installed Hydra Plugins"),
    ],
)
def test_sweep_passes_hydras_show_commands_through_and_runs_nothing(tmp_path, args, shown):
    proc = run([MEMSWEEP, "sweep", *args, f"results_dir={tmp_path / 'res'}"], cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert shown in proc.stdout
    assert not (tmp_path / "res").exists() and not list(tmp_path.rglob("spec.json"))


def test_resuming_a_directory_with_another_sweep_is_refused_before_anything_is_written(tmp_path):
    sweep_dir = tmp_path / "s"
    sweep = [MEMSWEEP, "sweep", "sweep=none", f"hydra.sweep.dir={sweep_dir}", *TINY_CPU]
    first = run([*sweep, "batch=1,2", "hydra.sweeper.order=given"], cwd=tmp_path)  # batch 1 is job 0
    assert first.returncode == 0, first.stderr[-2000:]
    assert json.loads((sweep_dir / "0" / "spec.json").read_text())["batch"] == 1
    before = {p: p.read_bytes() for p in sweep_dir.rglob("*") if p.is_file()}
    other = run([*sweep, "batch=4,2"], cwd=tmp_path)
    assert other.returncode == 2, other.stderr[-2000:]
    assert "already exists for another condition" in other.stderr and "Traceback" not in other.stderr
    assert {p: p.read_bytes() for p in sweep_dir.rglob("*") if p.is_file()} == before  # multirun.yaml too
    # started in the given order, resumed largest first: both runs already ran, the job numbers are kept
    resumed = run([*sweep, "batch=1,2", *NO_REPORT], cwd=tmp_path)  # its report is not read
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0 and out.count("already ran") == 2, out[-2000:]
    specs = {p: b for p, b in before.items() if p.name == "spec.json"}
    assert len(specs) == 2 and {p: p.read_bytes() for p in sweep_dir.glob("*/spec.json")} == specs


def test_output_piped_into_a_reader_that_leaves_ends_without_a_traceback(tmp_path):
    """`memsweep estimate ... | head -1`: the reader closes the pipe early (BrokenPipeError). Here
    the reader (`true`) has left before memsweep has even imported its modules."""
    import shlex

    cmd = " ".join(
        map(
            shlex.quote,
            [MEMSWEEP, "estimate", "--workload", "mlp", "--batch", "8", "--context", "128", "--width", "256"],
        )
    )
    proc = subprocess.run(
        f"set -o pipefail; {cmd} 2> err.txt | true", shell=True, executable="/bin/bash", cwd=tmp_path, timeout=120
    )
    assert proc.returncode in (0, 1), proc.returncode  # memsweep's own status: 0, or 1 on its closed stdout
    err = (tmp_path / "err.txt").read_text()
    assert "Traceback" not in err and "error" not in err, err
