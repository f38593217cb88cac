"""The CPU capacity with a GPU capacity's meaning (``capacity_mode=allocator``, the default):
the worker's live-tensor tracker refuses what would take the tensors past the capacity with a
real ``torch.OutOfMemoryError``, so the edge depends on the load's tensors only, never on the
machine (malloc settings, thread count, other memory the process holds).
``capacity_mode=process`` keeps RLIMIT_DATA on the whole worker process.
"""

import json
import os
import subprocess

import pytest
import torch

from memsweep.conf.contract import RunSpec, SpecError
from memsweep.worker.classify import classify_failure
from memsweep.worker.counters import LiveTensorTracker
from tests.data.loads import MEMSWEEP, NO_REPORT, search_events

F32 = 4


def test_the_tracker_refuses_an_operator_past_the_capacity_and_never_counts_it():
    tracker = LiveTensorTracker(capacity=4096)
    with tracker:
        kept = torch.empty(512)  # 2048 B: fits
        with pytest.raises(torch.OutOfMemoryError) as info:
            torch.empty(600)  # 2400 B more: 4448 B > 4096 B
        assert tracker.live == tracker.peak == 512 * F32
        assert tracker.refused == {
            "oom_request_bytes": 600 * F32,
            "oom_allocated_bytes": 512 * F32,
            "oom_operator": "aten.empty.memory_format",
        }
        more = torch.empty(512)  # exactly at the capacity: fits
        assert tracker.live == tracker.peak == 4096
    message = str(info.value)
    assert "Tried to allocate" in message and "(2400 bytes)" in message and "(4096 bytes)" in message
    assert classify_failure(info.value) == "oom"
    del kept, more


def test_a_refusal_inside_backward_is_still_an_out_of_memory_error():
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    x = torch.randn(512, 64)
    probe = LiveTensorTracker()
    with probe:  # the forward pass alone, measured, to put the capacity between forward and backward
        loss = model(x).sum()
    forward_peak = probe.peak
    del loss
    tracker = LiveTensorTracker(capacity=forward_peak + 1024)
    with tracker:
        loss = model(x).sum()
        with pytest.raises(torch.OutOfMemoryError) as info:
            loss.backward()
    assert classify_failure(info.value) == "oom" and tracker.peak <= forward_peak + 1024


@pytest.mark.parametrize(
    "fields",
    [
        dict(device="cuda:0", capacity_mode="process"),
        dict(dry_run=True, capacity_mode="process"),
        dict(capacity_mode="rlimit"),
    ],
)
def test_capacity_mode_is_checked_and_named(tiny, fields):
    with pytest.raises(SpecError) as info:
        RunSpec(**{**tiny, "capacity_bytes": 2**26, **fields})
    assert "capacity_mode" in str(info.value) and "allocator" in str(info.value)


def test_process_capacity_mode_needs_a_capacity(tiny):
    with pytest.raises(SpecError, match=r"invalid capacity_mode='process'.*needs a size") as info:
        RunSpec(**{**tiny, "capacity_bytes": None, "capacity_mode": "process"})
    assert info.value.field == "capacity_mode"
    assert RunSpec(**{**tiny, "capacity_bytes": 2**26, "capacity_mode": "process"}).capacity_mode == "process"


LOAD = ["device=cpu", "capacity=64MiB", "context=64", "width=64", "workload.depth=2", "warmup=1", "repeats=1"]


def search(sweep_dir, env, *args):
    proc = subprocess.run(
        [
            MEMSWEEP,
            "sweep",
            "hydra/sweeper=frontier",
            *LOAD,
            "hydra.sweeper.lower=256",
            "hydra.sweeper.upper=1024",
            "hydra.sweeper.confirm=0",
            *NO_REPORT,  # the search's log and the records are read, not the report
            *args,
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=sweep_dir.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = search_events(sweep_dir, "result")
    records = [json.loads(p.read_text()) for p in sweep_dir.glob("*/record.json")]
    return result, records


def test_the_allocator_mode_finds_the_same_edge_whatever_the_process_state(tmp_path):
    """One search of the frontier integration load, to the batch item, twice: a plain worker with
    one thread, and a spawned worker with two threads, other malloc settings and 32 MiB of
    non-tensor ballast (half the capacity). The capacity caps tensor bytes only: one answer."""
    plain = dict(os.environ)
    for key in ("MEMSWEEP_BALLAST_BYTES", "MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_"):
        plain.pop(key, None)
    burdened = dict(
        plain,
        MEMSWEEP_BALLAST_BYTES=str(32 * 2**20),
        MALLOC_ARENA_MAX="1",
        MALLOC_MMAP_THRESHOLD_="33554432",
        MALLOC_TOP_PAD_="16777216",
    )
    first, first_records = search(tmp_path / "plain", plain, "threads=1")
    second, second_records = search(tmp_path / "burdened", burdened, "threads=2", "isolation=spawn")
    assert first["exact"] and second["exact"]
    assert (first["max_ok"], first["min_oom"]) == (second["max_ok"], second["min_oom"])
    assert first["min_oom"] == first["max_ok"] + 1
    # the second search really ran in the other state
    assert {r["environment"]["ballast_bytes"] for r in second_records} == {32 * 2**20}
    assert {r["environment"]["torch_threads"] for r in second_records} == {2}
    assert {r["environment"]["ballast_bytes"] for r in first_records} == {None}
    for record in first_records + second_records:
        assert record["capacity"]["capacity_mode"] == "allocator"
        peaks = [p["max_memory_allocated"] for p in record["phases"]]
        assert max(peaks) <= 64 * 2**20  # an OOM run's peak never shows more than the capacity
        if record["outcome"] == "oom":
            (failed,) = [p for p in record["phases"] if p["status"] == "oom"]
            assert (
                failed["max_memory_allocated"] + 0
                <= 64 * 2**20
                < failed["oom_allocated_bytes"] + failed["oom_request_bytes"]
            )


def test_the_process_mode_limits_the_whole_process(tmp_path, tiny):
    from memsweep.sweeper.process import execute

    result = execute(RunSpec(**{**tiny, "capacity_bytes": 2**30, "capacity_mode": "process"}), tmp_path / "run")
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    assert result["outcome"] == "ok"
    assert record["capacity"]["capacity_mode"] == "process"
    assert record["capacity"]["capacity_method"].startswith("RLIMIT_DATA")
