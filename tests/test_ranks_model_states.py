"""A DDP/FSDP run's model states per rank beside the estimator's ZeRO figure (issue #17), on the
CPU: gloo, world_size 2, a tiny transformer whose every parameter's first dimension is even (so
FSDP2 shards it without padding).

The figures compared are storage bytes of tensors whose shapes the test fixes (and the tracked
tensor bytes of the CPU allocator counters), so they are the same on every machine; nothing here
asserts a time.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from memsweep.analysis.doc import to_markdown
from memsweep.analysis.frontier import frontier_table
from memsweep.analysis.ranks import model_state_columns
from memsweep.analysis.report import build_report
from memsweep.analysis.schemas import MODEL_STATE_COLUMNS
from memsweep.analysis.tables import build_tables
from memsweep.conf.contract import ISOLATION_SPAWN, RunSpec
from memsweep.estimator import (
    ADAM_STEP_BYTES,
    PARALLEL_ZERO_STAGE,
    estimate_run,
    transformer_workload_model,
    zero_partition,
)
from memsweep.estimator.breakdown import ceil_div
from memsweep.sweeper.process import execute
from memsweep.sweeper.spec import with_estimate

WORLD_SIZE = 2
LOAD = {
    "batch": 2,
    "context": 16,
    "width": 64,
    "mode": "train",
    "device": "cpu",
    "warmup": 0,
    "repeats": 1,
    "workload": {"name": "transformer", "layers": 2, "vocab": 512},
    "world_size": WORLD_SIZE,
}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("model_states")
    for parallel in ("ddp", "fsdp"):
        spec = with_estimate(RunSpec.from_dict({**LOAD, "parallel": parallel}))
        assert execute(spec, sweep / parallel, isolation=ISOLATION_SPAWN)["outcome"] == "ok"
    tables = build_tables([sweep])
    table, _, problems = tables
    assert not problems
    path = sweep / "runs.parquet"
    pq.write_table(table, path)  # what runs.parquet holds, read back
    return {row["parallel"]: row for row in pq.read_table(path).to_pylist()}, tables


@pytest.fixture(scope="module")
def runs(measured):
    return measured[0]


def whole_replica(row: dict) -> tuple[int, int]:
    """(parameter bytes, parameter tensors) of the run's model, calculated from its shape."""
    tensors = transformer_workload_model(LOAD["workload"], LOAD["width"]).tensors()
    params = sum(t.numel for t in tensors) * 4  # float32
    assert params == row["parameter_bytes"]  # the worker's count by construction agrees
    return params, len(tensors)


def test_ddp_model_states_are_zero_stage_0(runs):
    row = runs["ddp"]
    params, tensors = whole_replica(row)
    # AdamW on the CPU: parameters + gradients + two moments + a 4-byte step per tensor, whole
    whole = 4 * params + ADAM_STEP_BYTES * tensors
    assert row["model_states_zero_stage"] == 0
    assert row["estimated_model_states_bytes"] == whole
    assert row["model_states_bytes"] == whole and row["model_states_ratio"] == 1.0
    # between steps the allocator also holds DDP's gradient buckets: one more replica's size
    assert row["model_states_allocated_bytes"] == whole + params
    assert row["model_states_allocated_ratio"] == pytest.approx((whole + params) / whole)


def test_fsdp_model_states_agree_with_zero_stage_3_within_1_percent(runs):
    row = runs["fsdp"]
    params, tensors = whole_replica(row)
    estimated = 2 * ceil_div(params, WORLD_SIZE) + ceil_div(2 * params + ADAM_STEP_BYTES * tensors, WORLD_SIZE)
    assert row["model_states_zero_stage"] == 3
    assert row["estimated_model_states_bytes"] == estimated
    assert abs(row["model_states_ratio"] - 1) <= 0.01
    # the whole difference: Adam's per-tensor step stays whole on every rank (the formula shards
    # it with the rest of the optimizer states); no padding, every first dimension being even
    step_gap = ADAM_STEP_BYTES * tensors - ceil_div(ADAM_STEP_BYTES * tensors, WORLD_SIZE)
    assert row["model_states_bytes"] - estimated == step_gap
    # the counters: the shards, plus FSDP's device mesh (a few bytes), no replica left behind
    extra = row["model_states_allocated_bytes"] - row["model_states_bytes"]
    assert 0 <= extra <= 0.001 * estimated
    assert abs(row["model_states_allocated_ratio"] - 1) <= 0.01


def test_est_columns_are_the_fullest_ranks_estimate(runs):
    """est_* and estimate_error describe one rank, as max_memory_allocated is the fullest rank's:
    the whole replica's estimate partitioned at the run's ZeRO stage over world_size."""
    for parallel, row in runs.items():
        whole, _ = estimate_run(RunSpec.from_dict({**LOAD, "parallel": parallel}))
        rank = zero_partition(whole, PARALLEL_ZERO_STAGE[parallel], WORLD_SIZE)
        assert (row["est_weights_bytes"], row["est_peak_bytes"]) == (rank.weights, rank.peak)
        assert row["est_activations_bytes"] == whole.activations  # batch is each rank's micro-batch
        measured = row["max_memory_allocated"]
        assert row["estimate_error"] == pytest.approx((rank.peak - measured) / measured)
    assert runs["fsdp"]["est_peak_bytes"] < runs["ddp"]["est_peak_bytes"]


def test_a_one_process_run_has_no_model_state_columns():
    spec = with_estimate(RunSpec.from_dict({**LOAD, "world_size": 1})).to_dict()
    assert spec["estimate"]["weights"] is not None  # estimated, yet not a DDP/FSDP run
    columns = model_state_columns(spec, {"phases": [], "ranks": None})
    assert set(columns) == set(MODEL_STATE_COLUMNS) and set(columns.values()) == {None}


def test_the_report_shows_the_comparison_for_each_parallel_run(measured):
    runs, (table, phases, _) = measured
    report = build_report(table, phases, frontier_table(table), render_plots=False)
    text = to_markdown(report.doc, "img")
    heading = "Model states per rank beside the ZeRO estimate (DDP/FSDP)"
    assert heading in text
    section = text.split(heading)[1].split("\n#")[0]
    for parallel, row in runs.items():
        line = next(line for line in section.splitlines() if f"| {parallel} |" in line)
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[2:5] == ["2", str(row["model_states_zero_stage"]), str(row["estimated_model_states_bytes"])]
        assert str(row["model_states_bytes"]) in cells and f"{row['model_states_ratio']:.4f}" in cells
