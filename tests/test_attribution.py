"""Phase attribution: an OOM counts against an axis only when the failing phase scales with it.

The issue's case end to end (a training batch sweep whose runs all run out of memory in eval),
eval_batch swept as an axis, the frontier table on made-up runs, and the frontier sweeper's
reading of a probe (scripted records, no worker)."""

import subprocess

import pyarrow.parquet as pq
import pytest

from memsweep.analysis.frontier import frontier_table
from memsweep.analysis.tables import RUNS_SCHEMA, coerce_table
from memsweep.conf.contract import (
    PHASE_SIZE_VARIABLES,
    RunSpec,
    failure_words,
    oom_attribution,
    phase_variables,
    planned_phases,
    run_peak,
)
from memsweep.sweeper.frontier_runs import axis_reading
from tests.data.loads import MEMSWEEP, NO_REPORT, TINY_CPU

TRAIN = planned_phases("train", 4096, False)


def test_the_declared_phase_variables():
    # world_size: the ranks of a DDP/FSDP run split the model states (FSDP shards, DDP buckets)
    assert phase_variables("cold_step.backward") == ("batch", "context", "width", "dtype", "world_size")
    assert phase_variables("eval")[0] == "eval_batch" and "batch" not in phase_variables("eval")
    assert phase_variables("cold_generate.prefill")[0] == "context"
    assert {"context", "new_tokens"} <= set(phase_variables("warm_generate.decode"))
    assert phase_variables("export") == ("width", "dtype", "world_size")
    assert "batch" in phase_variables("setup") and "eval_batch" in phase_variables(None)  # unplaced: every variable
    assert (
        planned_phases("train", 8, True)
        == RunSpec(batch=1, context=8, width=8, mode="train", eval_batch=8, export=True).phases
    )
    assert set(PHASE_SIZE_VARIABLES) >= {"model_load", "inputs", "eval", "export", "prefill", "decode", "backward"}


@pytest.mark.parametrize(
    "phase, axis, planned, expected",
    [
        ("eval", "batch", TRAIN, "past"),  # every batch phase ran ok before the eval failed
        ("eval", "eval_batch", TRAIN, "axis"),
        ("cold_step.backward", "batch", TRAIN, "axis"),
        ("cold_step.backward", "eval_batch", TRAIN, "short"),  # eval never ran
        ("model_load", "batch", TRAIN, "short"),
        ("model_load", "width", TRAIN, "axis"),
        ("export", "context", planned_phases("train", None, True), "past"),
        ("setup", "batch", TRAIN, "axis"),  # a failure nobody can place counts as before
        (None, "batch", TRAIN, "axis"),
    ],
)
def test_oom_attribution(phase, axis, planned, expected):
    assert oom_attribution(phase, axis, planned) == expected


def test_failure_words():
    assert failure_words("eval", {"eval_batch": 4096, "batch": 8}) == "eval at eval_batch=4096"
    assert failure_words("cold_generate.prefill", {"context": 2048}) == "cold_generate.prefill at context=2048"
    assert failure_words("setup", {"batch": 8}) == "setup"


BASE = dict(
    sweep_dir="s",
    workload="mlp",
    mode="train",
    device="cpu",
    capacity_bytes=128 << 20,
    context=64,
    width=64,
    dtype="float32",
    warmup=1,
    repeats=1,
    devices=1,
)


def rows_of(runs, axis):
    return [r for r in frontier_table(coerce_table(runs, RUNS_SCHEMA)).to_pylist() if r["axis"] == axis]


def test_frontier_counts_an_oom_only_against_the_axis_of_its_phase():
    runs = [
        dict(BASE, run_id="a", batch=4, eval_batch=4096, outcome="oom", failed_phase="eval", max_memory_allocated=9,
             completed_max_memory_allocated=4),
        dict(BASE, run_id="b", batch=8, eval_batch=4096, outcome="oom", failed_phase="eval", max_memory_allocated=9,
             completed_max_memory_allocated=8),
    ]  # fmt: skip
    (row,) = rows_of(runs, "batch")
    assert (row["max_ok"], row["min_oom"], row["n_oom"], row["n_oom_elsewhere"]) == (8, None, 2, 2)
    assert row["max_ok_max_memory_allocated"] == 8  # the peak of its completed phases, not the eval's
    assert (row["oom_elsewhere_phases"], row["oom_elsewhere_variables"]) == ("eval", "eval_batch")
    assert row["not_reached"] == (
        "the batch frontier was not reached: eval at eval_batch=4096 runs out of memory in every run"
    )
    assert row["exact"] is False


def test_eval_batch_is_an_axis_whose_frontier_counts_eval_ooms():
    runs = [
        dict(BASE, run_id="a", batch=4, eval_batch=16, outcome="ok", max_memory_allocated=5),
        dict(BASE, run_id="b", batch=4, eval_batch=32, outcome="ok", max_memory_allocated=6),
        dict(BASE, run_id="c", batch=4, eval_batch=64, outcome="oom", failed_phase="eval"),
    ]
    (row,) = rows_of(runs, "eval_batch")
    assert (row["max_ok"], row["min_oom"], row["exact"], row["n_oom_elsewhere"]) == (32, 64, True, 0)
    assert row["not_reached"] is None and row["eval_batch"] is None  # the swept column is null


def test_an_oom_before_the_axis_phases_is_neither_side():
    runs = [
        dict(BASE, run_id="a", batch=4, outcome="ok", max_memory_allocated=5),
        dict(BASE, run_id="b", batch=8, outcome="oom", failed_phase="model_load"),
        dict(BASE, run_id="c", batch=16, outcome="oom", failed_phase="cold_step.forward"),
    ]
    (row,) = rows_of(runs, "batch")
    assert (row["max_ok"], row["min_oom"], row["n_oom_elsewhere"]) == (4, 16, 1)
    assert row["exact"] is False  # batch=8 says nothing about batch: 4 and 16 are not neighbours of what ran
    assert row["not_reached"] is None and row["oom_elsewhere_phases"] == "model_load"


def record(phases, **spec):
    return {"device_kind": "cpu", "spec": dict(mode="train", batch=8, width=64, **spec), "phases": phases}


def test_the_search_reads_a_probe_by_the_phase_that_failed():
    phases = [
        {"name": "cold_step.backward", "status": "ok", "max_memory_allocated": 50},
        {"name": "eval", "status": "oom", "max_memory_allocated": 100},
    ]
    run = {"outcome": "oom", "failed_phase": "eval", "message": "eval: OutOfMemoryError: x", "record": None}
    run["record"] = record(phases, eval_batch=4096)
    assert axis_reading(run, "batch")[:3] == ("ok", 50, "max_memory_allocated")
    assert axis_reading(run, "eval_batch")[:2] == ("oom", None)
    short = dict(run, failed_phase="model_load", record=record([{"name": "model_load", "status": "oom"}]))
    outcome, _, _, message = axis_reading(short, "batch")
    assert outcome == "oom_elsewhere" and message.startswith("model_load at width=64 runs out of memory")
    assert run_peak(run["record"]) == (100, "max_memory_allocated")  # all phases without an axis


@pytest.fixture(scope="module")
def issue_sweep(tmp_path_factory):
    """The issue's case with a small model: batch 4 and 8 train fine and run out of memory in eval."""
    root = tmp_path_factory.mktemp("attr")
    proc = subprocess.run(
        [MEMSWEEP, "sweep", "sweep=none", "mode=train", "batch=4,8", "eval_batch=4096", "capacity=128MiB",
         f"hydra.sweep.dir={root}/s", *TINY_CPU],
        cwd=root, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    return proc, root / "s"


def test_the_issue_case_names_the_eval_failure(issue_sweep):
    proc, sweep_dir = issue_sweep
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = pq.read_table(sweep_dir / "runs.parquet").to_pylist()
    assert {(r["outcome"], r["failed_phase"]) for r in runs} == {("oom", "eval")}
    (row,) = [r for r in pq.read_table(sweep_dir / "frontier.parquet").to_pylist() if r["axis"] == "batch"]
    assert (row["max_ok"], row["min_oom"], row["n_oom_elsewhere"]) == (8, None, 2)
    batch8 = next(r for r in runs if r["batch"] == 8)
    # what the OOM said, in runs.parquet: the tracker's exact request and live bytes, the capacity as the limit
    assert batch8["failure_class"] == "oom" and batch8["failure_wording"] == "memsweep_cpu_tracker"
    assert batch8["oom_limit_bytes"] == 128 << 20
    assert batch8["oom_allocated_bytes"] + batch8["oom_request_bytes"] > 128 << 20
    assert batch8["oom_free_bytes"] == (128 << 20) - batch8["oom_allocated_bytes"]
    assert row["max_ok_max_memory_allocated"] == batch8["completed_max_memory_allocated"] < 128 << 20
    words = "the batch frontier was not reached: eval at eval_batch=4096 runs out of memory in every run"
    assert row["not_reached"] == words
    assert words in proc.stdout
    assert words in (sweep_dir / "report.md").read_text()


def test_eval_batch_is_swept_like_any_axis(tmp_path):
    proc = subprocess.run(
        [MEMSWEEP, "sweep", "sweep=none", "mode=train", "batch=4", "eval_batch=16,4096", "capacity=128MiB",
         f"hydra.sweep.dir={tmp_path}/s", *TINY_CPU, *NO_REPORT],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = [r for r in pq.read_table(tmp_path / "s" / "frontier.parquet").to_pylist() if r["axis"] == "eval_batch"]
    assert (row["max_ok"], row["min_oom"], row["exact"], row["n_oom_elsewhere"]) == (16, 4096, True, 0)


def test_a_memory_suspect_error_is_marked_and_the_search_can_be_told_how_to_read_it():
    runs = [
        dict(BASE, run_id="a", batch=4, outcome="ok", max_memory_allocated=5),
        dict(BASE, run_id="b", batch=8, outcome="error", failed_phase="cold_step.forward",
             failure_class="memory_suspect"),
    ]  # fmt: skip
    (row,) = rows_of(runs, "batch")
    assert (row["max_ok"], row["min_oom"], row["n_other"], row["n_memory_suspect"]) == (4, None, 1, 1)
    phases = [{"name": "cold_step.forward", "status": "error", "failure_class": "memory_suspect"}]
    run = {"outcome": "error", "failed_phase": "cold_step.forward", "message": "x", "record": record(phases)}
    assert axis_reading(run, "batch")[0] == "memory_suspect"  # stops the search (STOP_OUTCOMES)
    assert axis_reading(run, "batch", "oom")[0] == "oom"
    plain = dict(run, record=record([{"name": "cold_step.forward", "status": "error", "failure_class": "error"}]))
    assert axis_reading(plain, "batch", "oom")[0] == "error"
