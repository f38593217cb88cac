"""Dry runs (spec ``dry_run``): the phases on fake tensors, predicted live tensor bytes per phase.

Each load is run twice through ``sweeper.process.execute`` (real worker processes): measured
on the CPU (LiveTensorTracker, "tracked allocated") and predicted (FakeTensorMode). The
predicted peak and final live bytes of every phase must be within 2% of the measured ones.
"""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sweeper.process import execute
from worker.records import RunSpec, SpecError

HERE = Path(__file__).resolve().parent
BASE = dict(context=16, width=32, dtype="float32", device="cpu", warmup=1, repeats=1, timeout_s=300, threads=1)
LM = {"name": "transformer", "layers": 2, "heads": 4, "kv_heads": 2, "vocab": 128}
MLP = {"name": "mlp", "depth": 2}
LOADS = {
    "mlp_inference": dict(BASE, batch=4, mode="inference", workload=MLP),
    "mlp_train": dict(BASE, batch=3, mode="train", workload=MLP),
    "mlp_train_bf16_wide": dict(BASE, batch=2, width=48, dtype="bfloat16", mode="train", workload=MLP),
    "lm_inference": dict(BASE, batch=3, mode="inference", workload=LM),
    "lm_train": dict(BASE, batch=2, mode="train", workload=LM, micro_steps=2, eval_batch=3),
    "lm_generate": dict(BASE, batch=2, mode="generate", workload=LM, new_tokens=3),
}
TOLERANCE = 0.02


def _run(root: Path, name: str, data: dict) -> dict:
    run_dir = root / name
    result = execute(RunSpec.from_dict(data), run_dir)
    record = json.loads((run_dir / "record.json").read_text())
    return {"result": result, "record": record}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dryrun")
    jobs = {}
    with ThreadPoolExecutor(2) as pool:
        for name, data in LOADS.items():
            jobs[(name, "measured")] = pool.submit(_run, root, f"{name}-measured", data)
            jobs[(name, "predicted")] = pool.submit(_run, root, f"{name}-predicted", dict(data, dry_run=True))
        user = dict(BASE, batch=2, width=8, mode="inference", dry_run=True,
                    workload={"name": "user", "path": [str(HERE / "dryrun_user")],
                              "model": {"_target_": "datadep.model"}, "inputs": {"_target_": "datadep.inputs"}})
        jobs[("user_datadep", "predicted")] = pool.submit(_run, root, "user-datadep", user)
        return {key: job.result() for key, job in jobs.items()}


def _close(predicted: int, measured: int) -> bool:
    return abs(predicted - measured) <= TOLERANCE * max(measured, 1)


@pytest.mark.parametrize("load", sorted(LOADS))
def test_predicted_peak_of_every_phase_matches_the_measured_one(runs, load):
    measured, predicted = runs[(load, "measured")]["record"], runs[(load, "predicted")]["record"]
    assert measured["outcome"] == "ok" and predicted["outcome"] == "ok", predicted.get("error_message")
    assert [p["name"] for p in predicted["phases"]] == [p["name"] for p in measured["phases"]]
    for m, p in zip(measured["phases"], predicted["phases"]):
        assert _close(p["max_memory_allocated"], m["max_memory_allocated"]), (p["name"], p, m)
        assert _close(p["memory_allocated"], m["memory_allocated"]), (p["name"], p, m)
        for key in ("gradient_bytes", "optimizer_state_bytes", "kv_cache_bytes"):
            assert p.get(key) == m.get(key), (p["name"], key)
    assert predicted["model"]["parameter_bytes"] == measured["model"]["parameter_bytes"]


@pytest.mark.parametrize("load", sorted(LOADS))
def test_a_prediction_is_labelled_and_never_carries_measured_counters(runs, load):
    measured, predicted = runs[(load, "measured")]["record"], runs[(load, "predicted")]["record"]
    assert measured["source"] == "measured" and predicted["source"] == "predicted"
    assert all(v is None or v.startswith("predicted") for v in predicted["counter_sources"].values())
    assert predicted["device_total_memory"] is None
    for p in predicted["phases"]:
        assert p["memory_reserved"] is None and p["max_memory_reserved"] is None
        assert p["device_free_memory"] is None


def test_an_operator_fake_tensors_cannot_run_is_named(runs):
    run = runs[("user_datadep", "predicted")]
    record = run["record"]
    assert run["result"]["outcome"] == "error"
    assert record["outcome"] == "error" and record["error_type"] == "DryRunUnsupported"
    assert record["failed_phase"] == "cold_forward"
    assert "nonzero" in record["error_message"]
    assert record["phases"][-1]["error_type"] == "DryRunUnsupported"


@pytest.mark.parametrize("change", [dict(device="cuda:0"), dict(export=True), dict(dry_run="yes"),
                                    dict(fault={"phase": "inputs", "kind": "raise"})])
def test_a_dry_run_refuses_what_it_cannot_predict(change):
    with pytest.raises(SpecError):
        RunSpec.from_dict({**BASE, "batch": 2, "workload": MLP, "dry_run": True, **change})
