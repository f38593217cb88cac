"""Real worker processes, tiny loads: every outcome, the phases kept, nothing overwritten."""

import json
import signal

import pytest

from memsweep.conf.contract import DEVICE_COUNTERS as COUNTERS
from memsweep.conf.contract import INFERENCE_PHASES, TRAIN_PHASES, RunSpec
from memsweep.sweeper.process import RunDirError, execute


def _record(run_dir):
    return json.loads((run_dir / "record.json").read_text())


@pytest.mark.parametrize("mode, phases", [("inference", INFERENCE_PHASES), ("train", TRAIN_PHASES)])
def test_run_that_fits_records_every_phase(tmp_path, tiny, mode, phases):
    spec = RunSpec.from_dict(dict(tiny, mode=mode))
    result = execute(spec, tmp_path / "run")
    assert result["outcome"] == "ok" and result["returncode"] == 0
    record = _record(tmp_path / "run")
    assert record["complete"] and record["outcome"] == "ok"
    assert [p["name"] for p in record["phases"]] == list(phases)
    for phase in record["phases"]:
        assert phase["status"] == "ok"
        for counter in COUNTERS:
            assert isinstance(phase[counter], int), (phase["name"], counter)
        assert phase["max_memory_allocated"] >= phase["memory_allocated"]
        assert phase["max_memory_allocated"] >= phase["memory_allocated_start"]
        assert phase["max_memory_reserved"] >= phase["memory_reserved"]
        assert phase["memory_allocated"] <= phase["memory_reserved"]
    # The tracker counts real tensor bytes: after model_load, exactly the mlp's parameters.
    width, hidden, depth = tiny["width"], 4 * tiny["width"], tiny["workload"]["depth"]
    params = depth * (width * hidden + hidden + hidden * width + width)
    assert record["phases"][0]["memory_allocated"] == 4 * params
    assert record["counter_sources"]["memory_allocated"].startswith("cpu:")
    assert record["environment"]["torch"] and record["environment"]["device"] == "cpu"
    assert record["capacity_bytes"] == record["device_total_memory"] > 0
    # one rank without parallel; samples per optimizer step only where there is one (mode=train)
    global_batch = spec.batch * spec.micro_steps if mode == "train" else None
    assert (record["world_size"], record["parallel"], record["global_batch"]) == (1, "none", global_batch)


GELU_OUT = 64 * 64 * (4 * 64) * 4  # (batch, context, hidden = 4 x width) float32: the refused tensor


@pytest.mark.parametrize(
    "mode, message",
    [("allocator", f"Tried to allocate 4.00 MiB ({GELU_OUT} bytes)"), ("process", "can't allocate memory")],
)
def test_load_above_emulated_capacity_is_oom_in_its_phase(tmp_path, tiny, mode, message):
    """(64, 64, 64) inputs fit in 8 MiB; the (64, 64, 256) hidden activations do not: the
    tracker refuses the 4 MiB gelu output (allocator), or malloc fails under RLIMIT_DATA (process)."""
    spec = RunSpec.from_dict(dict(tiny, batch=64, context=64, width=64, capacity_bytes=8 * 2**20, capacity_mode=mode))
    result = execute(spec, tmp_path / "run", isolation="spawn")  # the other tests use the forkserver
    assert result["outcome"] == "oom" and result["returncode"] == 3
    assert result["failed_phase"] == "cold_forward"
    assert message in result["error_message"]
    record = _record(tmp_path / "run")
    assert [p["status"] for p in record["phases"]] == ["ok", "ok", "oom"]
    assert record["capacity_bytes"] == 8 * 2**20 and record["capacity"]["capacity_mode"] == mode
    assert record["phases"][-1]["max_memory_allocated"] is not None  # the last values available are kept
    if mode == "allocator":  # the peak never shows more than the capacity; the refused request is apart
        oom = record["phases"][-1]
        assert oom["max_memory_allocated"] <= 8 * 2**20 < oom["oom_allocated_bytes"] + oom["oom_request_bytes"]
        assert oom["oom_request_bytes"] == GELU_OUT and oom["oom_operator"] == "aten.gelu.default"


def test_other_exception_is_error_not_oom(tmp_path, tiny):
    spec = RunSpec.from_dict(dict(tiny, fault={"phase": "cold_forward", "kind": "raise"}))
    result = execute(spec, tmp_path / "run")
    assert result["outcome"] == "error" and result["returncode"] == 4
    assert result["failed_phase"] == "cold_forward" and result["error_type"] == "ValueError"
    assert [p["status"] for p in _record(tmp_path / "run")["phases"]] == ["ok", "ok", "error"]


@pytest.mark.parametrize(
    "kind, phase, sig", [("sigkill", "warmup", signal.SIGKILL), ("segfault", "inputs", signal.SIGSEGV)]
)
def test_killed_worker_is_crash_and_keeps_complete_phases(tmp_path, tiny, kind, phase, sig):
    spec = RunSpec.from_dict(dict(tiny, fault={"phase": phase, "kind": kind}))
    result = execute(spec, tmp_path / "run")
    assert result["outcome"] == "crash" and result["signal"] == sig
    assert result["failed_phase"] == phase
    record = _record(tmp_path / "run")
    assert not record["complete"] and record["outcome"] is None
    done = list(INFERENCE_PHASES[: INFERENCE_PHASES.index(phase)])
    assert [p["name"] for p in record["phases"]] == done
    assert all(p["status"] == "ok" for p in record["phases"])


def test_hung_worker_is_timeout(tmp_path, tiny):
    spec = RunSpec.from_dict(dict(tiny, timeout_s=6, fault={"phase": "model_load", "kind": "hang"}))
    result = execute(spec, tmp_path / "run", isolation="spawn")
    assert result["outcome"] == "timeout" and result["timed_out"]
    assert result["wall_s"] < 60


def test_garbage_record_is_crash_with_the_problem_named(tmp_path, tiny):
    spec = RunSpec.from_dict(dict(tiny, fault={"phase": "cold_forward", "kind": "garbage"}))
    result = execute(spec, tmp_path / "run")
    assert result["outcome"] == "crash" and result["returncode"] == 0
    assert "corrupt or truncated" in result["record_problem"]


def test_run_dir_with_a_record_is_never_overwritten(tmp_path, tiny):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "record.json").write_text("precious")
    with pytest.raises(RunDirError, match="never overwrites"):
        execute(RunSpec.from_dict(tiny), run_dir)
    assert (run_dir / "record.json").read_text() == "precious"
    assert not (run_dir / "spec.json").exists()


def test_resume_returns_a_finished_run_without_running_it_again(tmp_path, tiny):
    spec = RunSpec.from_dict(tiny)
    first = execute(spec, tmp_path / "run")
    record = (tmp_path / "run" / "record.json").read_bytes()
    again = execute(spec, tmp_path / "run")
    assert again["resumed"] and again["worker_pid"] == first["worker_pid"]
    assert (tmp_path / "run" / "record.json").read_bytes() == record
    with pytest.raises(RunDirError, match="another condition"):
        execute(RunSpec.from_dict(dict(tiny, batch=3)), tmp_path / "run")
    with pytest.raises(RunDirError):
        execute(spec, tmp_path / "run", resume=False)


def test_resume_reruns_a_run_that_died_and_keeps_the_partial_attempt(tmp_path, tiny):
    spec = RunSpec.from_dict(tiny)
    run_dir = tmp_path / "run"
    execute(spec, run_dir)
    partial = json.loads((run_dir / "record.json").read_text())
    partial.update(complete=False, outcome=None, phases=partial["phases"][:2])
    (run_dir / "record.json").write_text(json.dumps(partial))
    (run_dir / "result.json").unlink()  # as if the orchestrator died with its worker mid-run
    result = execute(spec, run_dir)
    assert result["outcome"] == "ok" and not result.get("resumed")
    kept = json.loads((run_dir / ".attempts" / "1" / "record.json").read_text())
    assert [p["name"] for p in kept["phases"]] == ["model_load", "inputs"]
    assert len(_record(run_dir)["phases"]) == 5
