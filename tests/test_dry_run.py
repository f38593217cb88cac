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
    return {"result": result, "record": record, "dir": run_dir}


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


# ----- memsweep predict ---------------------------------------------------------------------
PREDICT_LOAD = ["workload=mlp", "workload.depth=2", "mode=train", "context=16", "width=32", "threads=1"]


def test_predict_finds_the_edge_that_real_runs_confirm(tmp_path):
    import io

    from sweeper.predict import Predictor, predict

    base = RunSpec.from_dict(dict(BASE, batch=5, mode="train", workload=MLP))
    probe = Predictor(base, "batch", 10**12, tmp_path / "probe", "forkserver")
    peak5, peak6 = probe.run(5)["peak"], probe.run(6)["peak"]
    assert peak5 < peak6
    capacity = (peak5 + peak6) // 2

    out = io.StringIO()
    code = predict(PREDICT_LOAD + ["batch=3", f"capacity={capacity}", "--axis", "batch",
                                   f"results_dir={tmp_path}"], out=out)
    text = out.getvalue()
    assert code == 0, text
    assert "PREDICTED edge: max fit batch=5, min miss batch=6 (exact)" in text
    assert "CUDA context" in text and "prediction of live tensor bytes" in text
    summary = json.loads(next((tmp_path / "predict").glob("*/predict.json")).read_text())
    assert summary["max_fit"] == 5 and summary["min_miss"] == 6 and summary["source"] == "predicted"
    assert {r["value"] for r in summary["runs"]} >= {5, 6}

    # the same loads measured (tracked allocated on the CPU) fall on the same sides of the capacity
    measured = {b: _run(tmp_path, f"measured-{b}", dict(BASE, batch=b, mode="train", workload=MLP, repeats=1))
                for b in (5, 6)}
    peaks = {b: max(p["max_memory_allocated"] for p in m["record"]["phases"]) for b, m in measured.items()}
    assert peaks[5] <= capacity < peaks[6]


def test_predict_refuses_a_missing_capacity_and_an_unknown_axis(tmp_path, capsys):
    from sweeper.predict import predict

    assert predict(PREDICT_LOAD + [f"results_dir={tmp_path}"]) == 2
    assert predict(PREDICT_LOAD + ["capacity=1GB", "--axis", "dtype", f"results_dir={tmp_path}"]) == 2
    assert "capacity" in capsys.readouterr().err


def test_analysis_labels_predictions_and_keeps_them_out_of_the_frontier(runs, tmp_path):
    import shutil

    from analysis.frontier import frontier_table
    from analysis.tables import build_tables

    sweep = tmp_path / "sweep"  # mlp_train measured at batch 3, predicted at batch 3 and (relabelled) 4
    shutil.copytree(runs[("mlp_train", "measured")]["dir"], sweep / "m3")
    shutil.copytree(runs[("mlp_train", "predicted")]["dir"], sweep / "p3")
    shutil.copytree(runs[("mlp_train", "predicted")]["dir"], sweep / "p4")
    spec = json.loads((sweep / "p4" / "spec.json").read_text())
    (sweep / "p4" / "spec.json").write_text(json.dumps({**spec, "batch": 4}))
    table, _, _ = build_tables([sweep])
    assert sorted(r["source"] for r in table.to_pylist()) == ["measured", "predicted", "predicted"]
    assert frontier_table(table).num_rows == 0  # with the predictions it would span batch 3..4


# ----- the frontier search seeded with the predicted edge -----------------------------------
@pytest.mark.parametrize("strategy", ["model", "bisect"])
@pytest.mark.parametrize("seed, edge, most_runs", [(37, 37, 2), (36, 37, 8), (38, 37, 3), (500, 37, 12),
                                                   (1, 37, 12), (10, 1, 8), (10, 0, 3)])
def test_a_seeded_search_finds_the_exact_edge(strategy, seed, edge, most_runs):
    from sweeper.frontier import FrontierSearch, Lattice, run_search

    capacity = 1000 + 100 * edge + 50  # peak(x) = 1000 + 100 x: x fits iff x <= edge

    def oracle(x):
        peak = 1000 + 100 * x
        return ("ok" if peak <= capacity else "oom"), (peak if peak <= capacity else None), capacity

    search = FrontierSearch("batch", Lattice.make(1, 4096), strategy, seed=seed)
    result = run_search(search, oracle)
    if edge == 0:
        assert result["max_ok"] is None and result["min_oom"] == 1
    else:
        assert result["max_ok"] == edge and result["min_oom"] == edge + 1
    assert result["runs_used"] <= most_runs, result


def test_frontier_sweeper_seeded_from_dry_runs_lands_on_the_edge(tmp_path, memsweep_cmd):
    """The frontier integration load (tests/test_frontier_integration.py: mlp inference at an
    emulated 64 MiB, lattice 352..448 step 32, edge between 384 and 416): the dry runs predict
    the edge, and the real search needs only the two probes that bracket it."""
    import os
    import subprocess

    from test_frontier_integration import LOAD, RANGE

    sweep_dir = tmp_path / "seeded"
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    proc = subprocess.run(memsweep_cmd + ["sweep", "hydra/sweeper=frontier", *LOAD, *RANGE, "hydra.sweeper.confirm=0",
                                          "hydra.sweeper.seed_from_dry_run=true", f"hydra.sweep.dir={sweep_dir}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = [json.loads(x) for x in (sweep_dir / "search.jsonl").read_text().splitlines()]
    (dry,) = [e for e in events if e["event"] == "dry_run"]
    assert dry["error"] is None and 384 <= dry["predicted_max_ok"] < 416
    probes = [e for e in events if e["event"] == "probe"]
    assert [p["value"] for p in probes] == [384, 416] and "dry run" in probes[0]["reason"]
    (result,) = [e for e in events if e["event"] == "result"]
    assert (result["max_ok"], result["min_oom"], result["exact"], result["runs_used"]) == (384, 416, True, 2)
    assert not list(sweep_dir.glob("*/spec.json")) or all(
        not json.loads(p.read_text()).get("dry_run") for p in sweep_dir.glob("*/spec.json"))
    # The dry runs stay inside the sweep directory, hidden from the analysis of measured runs.
    assert list((sweep_dir / ".dry_run").rglob("record.json")) and not (tmp_path / "seeded-dry_run").exists()
    import pyarrow.parquet as pq
    assert set(pq.read_table(sweep_dir / "runs.parquet").column("source").to_pylist()) <= {"measured", None}
