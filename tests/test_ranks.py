"""DDP and FSDP ranks inside one run (issue #17), on the CPU: gloo, world_size 2 of a 2-block mlp
and 4 of a small transformer.

On the CPU the default capacity_mode=allocator counts each rank's tracked tensor bytes, so the
figures asserted here are the same on every machine; nothing here asserts a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from memsweep.conf.contract import RunSpec, SpecError
from tests.data.loads import MEMSWEEP, NO_REPORT

WIDTH, HIDDEN, DEPTH = 64, 128, 2
LOAD = {
    "schema_version": 1,
    "batch": 2,
    "context": 8,
    "width": WIDTH,
    "mode": "train",
    "device": "cpu",
    "warmup": 1,
    "repeats": 1,
    "workload": {"name": "mlp", "depth": DEPTH, "hidden": HIDDEN},
}
# every parameter of the mlp (worker.models.MLP): per block Linear(width, hidden) and Linear(hidden, width)
PARAM_BYTES = DEPTH * (WIDTH * HIDDEN + HIDDEN + HIDDEN * WIDTH + WIDTH) * 4
# An emulated capacity between the peak of an fsdp rank of this load at world_size 2 (464052 B:
# tracked tensor bytes, the same on every machine with this PyTorch) and at world_size 1 (683564 B),
# each more than 90 KB away from it.
EDGE_CAPACITY = "576KiB"
HANG_S = 300  # a run that has not ended by then hangs (a rank waiting on a dead peer)


def run_worker(run_dir: Path, **fields) -> tuple[int, dict]:
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps({**LOAD, **fields}))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run(
        [sys.executable, "-m", "memsweep.worker", str(run_dir / "spec.json")],
        env=env,
        timeout=HANG_S,
        capture_output=True,
    )
    return proc.returncode, json.loads((run_dir / "record.json").read_text())


@pytest.fixture(scope="module")
def ddp_fsdp(tmp_path_factory):
    base = tmp_path_factory.mktemp("ranks")
    return {p: run_worker(base / p, parallel=p, world_size=2) for p in ("ddp", "fsdp")}


def test_fsdp_ranks_hold_half_the_parameters_ddp_ranks_hold(ddp_fsdp):
    for parallel, (code, record) in ddp_fsdp.items():
        assert code == 0 and record["outcome"] == "ok", parallel
        assert record["world_size"] == 2 and record["global_batch"] == 2 * LOAD["batch"]
        assert record["model"]["parameter_bytes"] == PARAM_BYTES
        assert [r["rank"] for r in record["ranks"]] == [0, 1]
        assert all(r["outcome"] == "ok" and r["exit_code"] == 0 for r in record["ranks"])
        for phase in record["phases"]:  # every rank recorded every phase, under the same name
            assert [e["rank"] for e in phase["ranks"]] == [0, 1] and phase["status"] == "ok"
    ddp = [r["local_parameter_bytes"] for r in ddp_fsdp["ddp"][1]["ranks"]]
    fsdp = [r["local_parameter_bytes"] for r in ddp_fsdp["fsdp"][1]["ranks"]]
    assert ddp == [PARAM_BYTES, PARAM_BYTES]  # DDP: a whole replica per rank
    for shard in fsdp:  # FSDP: a half, padded to an even split of each parameter's first dimension
        assert PARAM_BYTES / 2 <= shard <= PARAM_BYTES / 2 * 1.01
    # what the allocator holds after model_load (DDP also allocates its gradient buckets there)
    load = {p: next(ph for ph in rec["phases"] if ph["name"] == "model_load") for p, (_, rec) in ddp_fsdp.items()}
    for entry in load["ddp"]["ranks"]:
        assert entry["memory_allocated"] >= PARAM_BYTES
    for entry in load["fsdp"]["ranks"]:
        assert entry["memory_allocated"] < min(e["memory_allocated"] for e in load["ddp"]["ranks"])


def test_an_fsdp_rank_holds_its_shard_of_the_parameters_after_model_load(ddp_fsdp):
    # FSDP2's sharded parameters are DTensors: the tracker counts their local shards (not the
    # wrapper's placeholder storage, which has the whole parameter's size and no memory), and the
    # full parameters fully_shard replaced are freed: what a rank holds after model_load is its
    # shard, plus the device mesh's few bytes (no gradients or optimizer states yet).
    code, record = ddp_fsdp["fsdp"]
    assert code == 0
    load = next(ph for ph in record["phases"] if ph["name"] == "model_load")
    world_size = record["world_size"]
    for entry, rank in zip(load["ranks"], record["ranks"]):
        shard = rank["local_parameter_bytes"]
        assert PARAM_BYTES / world_size <= shard <= PARAM_BYTES / world_size * 1.01
        assert shard <= entry["memory_allocated"] <= shard * 1.01, (entry, shard)


def test_the_run_peak_is_the_fullest_rank(ddp_fsdp):
    from memsweep.conf.contract import run_peak

    for _, record in ddp_fsdp.values():
        per_rank = [r["max_memory_allocated"] for r in record["ranks"]]
        peak, _ = run_peak(record)
        assert peak == max(per_rank) and record["ranks"][record["peak_rank"]]["max_memory_allocated"] == peak


def test_an_oom_on_one_rank_is_the_runs_oom_naming_it_without_a_hang(tmp_path):
    code, record = run_worker(
        tmp_path / "oom",
        parallel="ddp",
        world_size=2,
        fault={"phase": "cold_step.forward", "kind": "oom", "rank": 1},
    )
    assert code == 3 and record["complete"] and record["outcome"] == "oom"
    assert record["failed_rank"] == 1 and record["failed_phase"] == "cold_step.forward"
    assert record["error_message"].startswith("rank 1 in cold_step.forward:")
    outcomes = {r["rank"]: r["outcome"] for r in record["ranks"]}
    assert outcomes[1] == "oom" and outcomes[0] in ("aborted", "error")  # stopped, or its collective failed
    assert record["phases"][-1]["status"] == "oom" and record["phases"][-1]["rank"] == 1


def test_a_killed_rank_is_a_crash(tmp_path):
    code, record = run_worker(
        tmp_path / "kill",
        parallel="fsdp",
        world_size=2,
        fault={"phase": "cold_step.backward", "kind": "sigkill", "rank": 0},
    )
    assert code < 0 and not record["complete"] and record["failed_rank"] == 0
    assert {r["rank"]: r["outcome"] for r in record["ranks"]}[0] == "crash"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"world_size": 2}, "world_size"),
        ({"parallel": "zero", "world_size": 2}, "parallel"),
        ({"parallel": "ddp", "world_size": 2, "mode": "inference"}, "parallel"),
        ({"parallel": "fsdp", "world_size": 0}, "world_size"),
        ({"parallel": "fsdp", "world_size": 2, "fault": {"phase": "inputs", "kind": "oom", "rank": 2}}, "fault.rank"),
    ],
)
def test_bad_parallel_specs_are_refused_naming_the_field(fields, field):
    data = {k: v for k, v in {**LOAD, **fields}.items()}
    with pytest.raises(SpecError) as err:
        RunSpec.from_dict(data)
    assert err.value.field == field


def test_a_world_size_sweep_end_to_end(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = [
        "sweep",
        "sweep=none",
        "mode=train",
        "device=cpu",
        "parallel=fsdp",
        "world_size=1,2",
        "batch=2",
        "context=8",
        f"width={WIDTH}",
        f"workload.depth={DEPTH}",
        f"workload.hidden={HIDDEN}",
        "warmup=1",
        "repeats=1",
        f"capacity={EDGE_CAPACITY}",
        *NO_REPORT,
        f"hydra.sweep.dir={sweep_dir}",
    ]
    proc = subprocess.run([MEMSWEEP, *args], cwd=tmp_path, capture_output=True, text=True, timeout=2 * HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = pq.read_table(next(sweep_dir.rglob("runs.parquet"))).to_pylist()
    by_size = {r["world_size"]: r for r in runs}
    assert set(by_size) == {1, 2} and all(r["parallel"] == "fsdp" for r in runs)
    assert (by_size[1]["outcome"], by_size[2]["outcome"]) == ("oom", "ok")  # one rank holds it all; two, half each
    assert by_size[2]["global_batch"] == 4 and by_size[2]["peak_rank"] in (0, 1)
    phases = pq.read_table(next(sweep_dir.rglob("phases.parquet"))).to_pylist()
    two = [p for p in phases if len(p["ranks"] or []) == 2]
    assert two and all({e["rank"] for e in p["ranks"]} == {0, 1} for p in two)
    for size, run in by_size.items():  # each rank holds its 1/world_size of the parameters after model_load
        load = next(p for p in phases if p["run_id"] == run["run_id"] and p["phase"] == "model_load")
        for entry in load["ranks"]:
            assert PARAM_BYTES / size <= entry["memory_allocated"] <= PARAM_BYTES / size * 1.01, (size, entry)
    frontier = pq.read_table(next(sweep_dir.rglob("frontier.parquet"))).to_pylist()
    (row,) = [r for r in frontier if r["axis"] == "world_size"]
    # more ranks, less each: the edge reads fits from world_size=2 (min_ok), 1 runs out (max_oom)
    assert (row["direction"], row["min_ok"], row["max_oom"], row["exact"]) == ("decreasing", 2, 1, True)
    assert row["max_ok"] is None and row["min_oom"] is None
    assert row["min_ok_max_memory_allocated"] == by_size[2]["max_memory_allocated"]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_four_ranks_of_a_small_transformer_each_record_their_phases(tmp_path, parallel):
    """world_size 4 (gloo): one record per rank, every phase on every rank; DDP ranks hold a whole
    replica of the parameters, FSDP ranks a quarter (padded to an even split of each parameter's
    first dimension: at most one row more per parameter)."""
    code, record = run_worker(
        tmp_path / parallel,
        parallel=parallel,
        world_size=4,
        threads=1,
        context=8,
        width=32,
        workload={"name": "transformer", "layers": 1, "heads": 2, "vocab": 256},
    )
    assert code == 0 and record["outcome"] == "ok", record.get("error_message")
    assert [r["rank"] for r in record["ranks"]] == [0, 1, 2, 3]
    assert record["global_batch"] == 4 * LOAD["batch"]
    for phase in record["phases"]:
        assert [e["rank"] for e in phase["ranks"]] == [0, 1, 2, 3] and phase["status"] == "ok", phase["name"]
    whole = record["model"]["parameter_bytes"]
    shards = [r["local_parameter_bytes"] for r in record["ranks"]]
    if parallel == "ddp":
        assert shards == [whole] * 4
    else:
        assert all(whole / 4 <= s <= whole / 4 * 1.05 for s in shards), (shards, whole)
