"""Every mode through real worker processes, tiny sizes: the phases and sub-phases in order, the
counters present, the KV cache bytes, the optimizer states, eval and export failures attributed
to their own phase, a crash attributed to the sub-phase it died in, and a user workload run by
the ``memsweep`` command.

The runs are started together by one module fixture (a few processes at a time) and the tests
read their records.
"""

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from memsweep.conf.contract import DEVICE_COUNTERS as COUNTERS
from memsweep.conf.contract import STEP_SUB_PHASES, RunSpec
from memsweep.sweeper.process import execute
from tests.data.loads import MEMSWEEP, TINY_HF_LLAMA
from tests.data.optional import HAS_TRANSFORMERS, needs_transformers

BASE = dict(batch=2, context=16, width=32, dtype="float32", device="cpu", warmup=1, repeats=2, timeout_s=300, threads=1)
LM = {"name": "transformer", "layers": 2, "heads": 4, "kv_heads": 2, "vocab": 128}

RUNS = {
    "train": dict(BASE, mode="train", workload=LM, micro_steps=2, eval_batch=3, export=True),
    "generate": dict(BASE, mode="generate", workload=LM, new_tokens=4),
    "eval_oom": dict(
        BASE, mode="train", workload=LM, repeats=1, eval_batch=3, export=True, fault={"phase": "eval", "kind": "oom"}
    ),
    "export_error": dict(
        BASE,
        mode="inference",
        workload={"name": "mlp", "depth": 2},
        export=True,
        fault={"phase": "export", "kind": "raise"},
    ),
    "killed_in_backward": dict(
        BASE,
        mode="train",
        workload={"name": "mlp", "depth": 2},
        warmup=0,
        fault={"phase": "warm_step.backward", "kind": "sigkill"},
    ),
}
if HAS_TRANSFORMERS:
    RUNS["hf_generate"] = dict(BASE, mode="generate", new_tokens=4, repeats=1, workload=TINY_HF_LLAMA)

USER_ARGS = [
    "workload=user_convnet",
    "mode=train",
    "batch=2",
    "context=8",
    "width=4",
    "warmup=0",
    "repeats=1",
    "eval_batch=3",
    "device=cpu",
    "threads=1",
    "sweep=none",
]


def _memsweep_user_run(root: Path) -> Path:
    run_dir = root / "user"
    proc = subprocess.run(
        [MEMSWEEP, "run", *USER_ARGS, f"hydra.run.dir={run_dir}"], capture_output=True, text=True, cwd=root, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("modes")
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(execute, RunSpec.from_dict(spec), root / name) for name, spec in RUNS.items()}
        user = pool.submit(_memsweep_user_run, root)
        out = {name: (f.result(), json.loads((root / name / "record.json").read_text())) for name, f in futures.items()}
        user_dir = user.result()
        out["user"] = (
            json.loads((user_dir / "result.json").read_text()),
            json.loads((user_dir / "record.json").read_text()),
        )
    out["_root"] = root
    return out


def _names(record):
    return [p["name"] for p in record["phases"]]


def _check_counters(phase):
    for counter in COUNTERS:
        assert isinstance(phase[counter], int) and phase[counter] >= 0, (phase["name"], counter)
    assert phase["max_memory_allocated"] >= max(phase["memory_allocated"], phase["memory_allocated_start"])


def _step(parent, micro_steps):
    return [f"{parent}.{sub}" for _ in range(micro_steps) for sub in STEP_SUB_PHASES[:3]] + [f"{parent}.optimizer_step"]


def test_train_records_sub_phases_in_order_then_eval_and_export(runs):
    result, record = runs["train"]
    assert result["outcome"] == "ok", result
    assert _names(record) == (
        [
            "model_load",
            "inputs",
            *_step("cold_step", 2),
            "warmup",
            *_step("warm_step", 2),
            *_step("warm_step", 2),
            "eval",
            "export",
        ]
    )
    for phase in record["phases"]:
        assert phase["status"] == "ok"
        _check_counters(phase)
    subs = [p for p in record["phases"] if p["parent"]]
    assert [(p["step"], p["micro_step"]) for p in subs if p["parent"] == "cold_step"] == [(0, 0)] * 3 + [(0, 1)] * 3 + [
        (0, None)
    ]
    assert [p["step"] for p in subs if p["sub_phase"] == "optimizer_step"] == [0, 0, 1]
    assert all(p["parent"] is None and p["sub_phase"] is None for p in record["phases"] if "." not in p["name"])
    # The optimizer's states (AdamW: two per parameter) appear in the first step only; every
    # optimizer_step also releases the step's loss at its end.
    opt = [p for p in subs if p["sub_phase"] == "optimizer_step"]
    param_bytes = record["model"]["parameter_bytes"]
    grew = [p["memory_allocated"] - p["memory_allocated_start"] for p in opt]
    assert grew[0] - grew[1] == opt[0]["optimizer_state_bytes"] >= 2 * param_bytes
    assert grew[1] == grew[2] <= 0
    assert all(p["gradient_bytes"] == param_bytes for p in subs if p["sub_phase"] == "backward")
    export = record["phases"][-1]
    assert export["export_bytes"] > param_bytes
    assert record["model"]["dims"]["kv_heads"] == 2 and record["model"]["dims"]["hidden"] == 32
    assert record["current_phase"] is None


def test_generate_records_prefill_decode_and_the_kv_cache_formula(runs):
    result, record = runs["generate"]
    assert result["outcome"] == "ok", result
    assert _names(record) == [
        "model_load",
        "inputs",
        "cold_generate.prefill",
        "cold_generate.decode",
        "warmup",
        "warm_generate.prefill",
        "warm_generate.decode",
        "warm_generate.prefill",
        "warm_generate.decode",
    ]
    dims = record["model"]["dims"]
    for phase in record["phases"]:
        _check_counters(phase)
        if phase["parent"]:
            tokens = 16 if phase["sub_phase"] == "prefill" else 16 + 4
            # 2 (K and V) x layers x kv_heads x head_dim x tokens x bytes per value x batch
            assert phase["kv_cache_bytes"] == 2 * dims["layers"] * dims["kv_heads"] * dims["head_dim"] * tokens * 4 * 2
            assert phase["kv_cache_tokens"] == tokens
    prefill, decode = record["phases"][2:4]
    assert prefill["memory_allocated"] - prefill["memory_allocated_start"] >= prefill["kv_cache_bytes"]
    assert (
        decode["memory_allocated"] - decode["memory_allocated_start"]
        >= decode["kv_cache_bytes"] - prefill["kv_cache_bytes"]
    )
    # the cache of a generation is released after it: the next one starts where the first did
    assert record["phases"][5]["memory_allocated_start"] == prefill["memory_allocated_start"]


def test_oom_in_eval_is_an_eval_failure_with_training_intact(runs):
    result, record = runs["eval_oom"]
    assert (result["outcome"], result["failed_phase"]) == ("oom", "eval")
    assert record["failed_phase"] == "eval" and record["phases"][-1]["name"] == "eval"
    assert record["phases"][-1]["status"] == "oom"
    assert all(p["status"] == "ok" for p in record["phases"][:-1])
    assert "warm_step.optimizer_step" in _names(record) and "export" not in _names(record)


def test_error_in_export_is_attributed_to_export(runs):
    result, record = runs["export_error"]
    assert (result["outcome"], result["failed_phase"], result["error_type"]) == ("error", "export", "ValueError")
    assert _names(record)[-2:] == ["warm_forward", "export"]
    assert [p["status"] for p in record["phases"]][-2:] == ["ok", "error"]


def test_crash_is_attributed_to_the_sub_phase_it_died_in(runs):
    result, record = runs["killed_in_backward"]
    assert result["outcome"] == "crash" and result["failed_phase"] == "warm_step.backward"
    assert _names(record)[-2:] == ["warm_step.forward", "warm_step.loss"]
    assert record["current_phase"] == "warm_step.backward"


@needs_transformers
def test_hf_llama_generate_in_a_worker(runs):
    result, record = runs["hf_generate"]
    assert result["outcome"] == "ok", result
    dims = record["model"]["dims"]
    assert (dims["config_class"], dims["layers"], dims["kv_heads"], dims["head_dim"]) == ("LlamaConfig", 2, 2, 8)
    decode = record["phases"][3]
    assert decode["name"] == "cold_generate.decode" and decode["kv_cache_bytes"] == 2 * 2 * 2 * 8 * 20 * 4 * 2


def test_user_workload_through_the_memsweep_command(runs):
    result, record = runs["user"]
    assert result["outcome"] == "ok", result
    assert record["spec"]["workload"]["model"]["_target_"] == "memsweep.conf.examples.convnet.build_model"
    assert _names(record)[-1] == "eval" and "cold_step.backward" in _names(record)
    # conv weights and biases of two blocks of 4 channels (3 blocks), then Linear(4, 10)
    params = (3 * 4 * 9 + 4) + 2 * (4 * 4 * 9 + 4) + (4 * 10 + 10)
    assert record["model"]["parameters"] == params
    assert record["phases"][0]["memory_allocated"] == 4 * params


def test_analysis_tables_read_sub_phases_and_options(runs):
    from memsweep.analysis.tables import build_tables

    runs_table, phases, problems = build_tables([runs["_root"]])
    rows = {Path(r["run_dir"]).name: r for r in runs_table.to_pylist()}
    train = rows["train"]
    assert train["cold_max_memory_allocated"] and train["warm_max_memory_allocated"]
    assert (train["optimizer"], train["micro_steps"], train["eval_batch"], train["export"]) == ("adamw", 2, 3, True)
    assert train["parameters"] > 0
    assert rows["generate"]["cold_max_memory_allocated"] is not None
    sub = [r for r in phases.to_pylist() if r["run_id"].endswith("generate") and r["sub_phase"] == "decode"]
    assert sub and all(r["parent"] in ("cold_generate", "warm_generate") and r["kv_cache_bytes"] for r in sub)


def test_fork_server_outlives_the_threads_that_started_runs(runs):
    """The runs above started from pool threads, now gone: the fork server (PR_SET_PDEATHSIG is
    per thread) must still serve the next run instead of resetting its connection."""
    from memsweep.sweeper import process

    if process.execute.__defaults__ and "forkserver" not in process.execute.__defaults__:
        pytest.skip("execute() does not default to the fork server")
    assert process._FORKSERVER.proc is not None and process._FORKSERVER.proc.poll() is None
