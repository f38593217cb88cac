"""`memsweep sweep hydra/sweeper=frontier` end to end: real worker processes on the CPU at an
emulated capacity, through the basic launcher and through submitit_local.

The load: the mlp in inference, context=64 width=64 depth=2, at capacity=64MiB; its
tracked peak is 264,704 B + 163,840 B per batch item. The capacity caps the tracked tensor
bytes (``capacity_mode=allocator``, the default), so the edge is 407/408 on every machine
(tests/test_capacity_mode.py checks that it does not move with the process's state). The
search range is the lattice 352, 384, 416, 448 (multiple_of=32): small enough to run every
value once and compare (the exhaustive check).
"""

import subprocess

import pyarrow.parquet as pq
import pytest

from memsweep.conf.contract import RunSpec, read_json
from memsweep.sweeper.process import execute
from memsweep.sweeper.search import ERRORS_IN_A_ROW
from tests.data.loads import MEMSWEEP, NO_REPORT, TINY_CPU, search_events

LOAD = ["capacity=64MiB", *TINY_CPU]
LATTICE = (352, 384, 416, 448)
RANGE = ["hydra.sweeper.lower=352", "hydra.sweeper.upper=448", "hydra.sweeper.multiple_of=32"]


def sweep(sweep_dir, *args, timeout=300, bounds=RANGE):
    """``memsweep sweep`` of the frontier sweeper on LOAD in ``sweep_dir``, without the report (the
    tests here read the search's log, the tables and the printed lines)."""
    return subprocess.run(
        [
            MEMSWEEP,
            "sweep",
            "hydra/sweeper=frontier",
            *LOAD,
            *bounds,
            *args,
            *NO_REPORT,
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=sweep_dir.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def outcomes_by_value(sweep_dir):
    """batch -> outcome of every run directory in ``sweep_dir`` (from result.json)."""
    out = {}
    for spec_path in sweep_dir.glob("*/spec.json"):
        out.setdefault(read_json(spec_path, "spec")["batch"], []).append(
            read_json(spec_path.parent / "result.json", "result")["outcome"]
        )
    return out


@pytest.fixture(scope="module")
def basic(tmp_path_factory):
    """One search through the basic launcher (no confirmation), kept for the tests below."""
    sweep_dir = tmp_path_factory.mktemp("frontier") / "basic"
    proc = sweep(sweep_dir, "hydra.sweeper.confirm=0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep_dir, proc


@pytest.fixture(scope="module")
def exhaustive(basic):
    """Every lattice value run once (the ones the search did not run are run here, in the
    same fresh-process way), and the edge read from their outcomes alone."""
    sweep_dir, _ = basic
    ran = outcomes_by_value(sweep_dir)
    spec = read_json(next(sweep_dir.glob("*/spec.json")), "spec")
    for value in LATTICE:
        if value not in ran:
            result = execute(RunSpec.from_dict({**spec, "batch": value}), sweep_dir.parent / f"all_{value}")
            ran[value] = [result["outcome"]]
    outcome = {v: ran[v][0] for v in LATTICE}
    assert all(len(set(o)) == 1 for o in ran.values()), ran
    ok = [v for v in LATTICE if outcome[v] == "ok"]
    oom = [v for v in LATTICE if outcome[v] == "oom"]
    assert ok and oom and max(ok) < min(oom), outcome  # monotonic, with an edge inside the range
    return max(ok), min(oom)


def test_basic_launcher_finds_the_exhaustive_edge(basic, exhaustive):
    sweep_dir, proc = basic
    (result,) = search_events(sweep_dir, "result")
    assert (result["max_ok"], result["min_oom"]) == exhaustive
    assert result["exact"] and result["stopped_by"] is None and result["runs_used"] <= 3
    assert result["strategy"] == "model" and "max_memory_allocated" in result["peak_counter"]
    (row,) = [r for r in pq.read_table(sweep_dir / "frontier.parquet").to_pylist() if r["axis"] == "batch"]
    assert (row["max_ok"], row["min_oom"], row["exact"], row["strategy"]) == (*exhaustive, True, "model")
    assert row["runs_used"] == result["runs_used"] and row["search_status"].startswith("exact edge")
    assert "search (model" in proc.stdout
    probes = search_events(sweep_dir, "probe")
    assert all(p["reason"] and p["outcome"] in ("ok", "oom") and p["run_dir"] for p in probes)


def test_resume_reuses_the_runs(basic):
    sweep_dir, _ = basic

    def runs():
        return {p.parent.name: p.parent.joinpath("result.json").read_bytes() for p in sweep_dir.glob("*/spec.json")}

    before = runs()
    proc = sweep(sweep_dir, "hydra.sweeper.confirm=0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert runs() == before  # nothing ran again, nothing was overwritten
    assert (sweep_dir / "frontier.parquet").exists() and list(sweep_dir.glob("analysis/*/frontier.parquet"))
    first, second = search_events(sweep_dir, "result")
    assert second["runs_reused"] == second["runs_used"] == first["runs_used"]
    assert (second["max_ok"], second["min_oom"]) == (first["max_ok"], first["min_oom"])


def test_submitit_local_finds_the_same_edge_two_probes_at_a_time(exhaustive, tmp_path):
    sweep_dir = tmp_path / "submitit"
    # the two lattice values around the edge, run at once: one round
    lower, upper = exhaustive
    proc = sweep(
        sweep_dir,
        "hydra/launcher=submitit_local",
        "hydra.sweeper.parallel=2",
        "hydra.sweeper.confirm=0",
        bounds=[f"hydra.sweeper.lower={lower}", f"hydra.sweeper.upper={upper}", "hydra.sweeper.multiple_of=32"],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = search_events(sweep_dir, "result")
    assert (result["max_ok"], result["min_oom"], result["exact"]) == (*exhaustive, True)
    assert result["rounds"] == 1 and result["runs_used"] == 2
    assert (sweep_dir / ".submitit").is_dir() and (sweep_dir / "frontier.parquet").exists()


def test_errors_in_a_row_stop_the_search_and_are_reported(tmp_path):
    # an error at every value: stepped past (it could be the value's shape) until ERRORS_IN_A_ROW in a row
    sweep_dir = tmp_path / "fault"
    proc = sweep(sweep_dir, "fault={phase:cold_forward,kind:raise}", "hydra.sweeper.confirm=1")
    assert proc.returncode == 4, proc.stderr[-3000:]  # no run ended ok or oom: nothing answered
    assert "none of the 3 run(s) of this sweep ended ok or oom" in proc.stderr
    (result,) = search_events(sweep_dir, "result")
    assert result["stopped_by"] == "error" and result["stop_value"] == 352 and result["runs_used"] == ERRORS_IN_A_ROW
    assert result["max_ok"] is None and result["min_oom"] is None and "injected fault" in result["stop_message"]
    assert result["error_values"] == list(LATTICE[:ERRORS_IN_A_ROW])
    (row,) = pq.read_table(sweep_dir / "frontier.parquet").to_pylist()
    assert row["stopped_by"] == "error" and row["n_other"] == ERRORS_IN_A_ROW and row["max_ok"] is None
    assert "stopped by error at batch=352: 3 values in a row raised errors (352, 384, 416)" in proc.stdout


def test_bad_settings_exit_2_before_any_run(tmp_path):
    for args, field in ((["hydra.sweeper.strategy=random"], "hydra.sweeper.strategy"), (["batch=1,2"], "batch")):
        sweep_dir = tmp_path / field
        proc = sweep(sweep_dir, *args)
        assert proc.returncode == 2 and f"invalid {field}=" in proc.stderr, proc.stderr[-2000:]
        assert not sweep_dir.exists() or not list(sweep_dir.glob("*/spec.json"))
