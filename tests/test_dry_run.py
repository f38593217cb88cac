"""Dry runs (spec ``dry_run``): the phases on fake tensors, predicted live tensor bytes per phase.

Each load is run twice through ``sweeper.process.execute`` (real worker processes): measured
on the CPU (LiveTensorTracker, "tracked allocated") and predicted (FakeTensorMode). The
predicted peak and final live bytes of every phase must be within 2% of the measured ones.
"""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from memsweep.conf.contract import RunSpec, SpecError
from memsweep.sweeper.process import execute
from tests.data.loads import MEMSWEEP, NO_REPORT, search_events

HERE = Path(__file__).resolve().parent
BASE = dict(context=16, width=32, dtype="float32", device="cpu", warmup=1, repeats=1, timeout_s=300, threads=1)
LM = {"name": "transformer", "layers": 2, "heads": 4, "kv_heads": 2, "vocab": 128}
MLP = {"name": "mlp", "depth": 2}
LOADS = {
    "mlp_inference": dict(BASE, batch=4, mode="inference", workload=MLP),
    "mlp_train": dict(BASE, batch=3, mode="train", workload=MLP),
    "mlp_train_bf16_wide": dict(
        BASE, batch=2, width=48, dtype="bfloat16", precision="pure", mode="train", workload=MLP
    ),
    "lm_inference": dict(BASE, batch=3, mode="inference", workload=LM),
    "lm_train": dict(BASE, batch=2, mode="train", workload=LM, micro_steps=2, eval_batch=3),
    "lm_generate": dict(BASE, batch=2, mode="generate", workload=LM, new_tokens=3),
}
TOLERANCE = 0.02


def run_dry_worker(root: Path, name: str, data: dict) -> dict:
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
            jobs[(name, "measured")] = pool.submit(run_dry_worker, root, f"{name}-measured", data)
            jobs[(name, "predicted")] = pool.submit(run_dry_worker, root, f"{name}-predicted", dict(data, dry_run=True))
        user = dict(
            BASE,
            batch=2,
            width=8,
            mode="inference",
            dry_run=True,
            workload={
                "name": "user",
                "path": [str(HERE / "dryrun_user")],
                "model": {"_target_": "datadep.model"},
                "inputs": {"_target_": "datadep.inputs"},
            },
        )
        jobs[("user_datadep", "predicted")] = pool.submit(run_dry_worker, root, "user-datadep", user)
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
    assert "in model (Gather)" in record["error_message"]  # the module whose forward was running
    assert record["phases"][-1]["error_type"] == "DryRunUnsupported"


@pytest.mark.parametrize(
    "change",
    [
        dict(device="cuda:0", devices=2),
        dict(device="cuda"),
        dict(export=True),
        dict(dry_run="yes"),
        dict(fault={"phase": "inputs", "kind": "raise"}),
    ],
)
def test_a_dry_run_refuses_what_it_cannot_predict(change):
    with pytest.raises(SpecError):
        RunSpec.from_dict({**BASE, "batch": 2, "workload": MLP, "dry_run": True, **change})


# ----- the predicted peak split by category --------------------------------------------------
SPLIT = (
    "predicted_parameter_bytes",
    "predicted_gradient_bytes",
    "predicted_optimizer_state_bytes",
    "predicted_activation_bytes",
)


def _split(phase: dict) -> dict:
    return {k.removeprefix("predicted_").removesuffix("_bytes"): phase[k] for k in SPLIT}


def _mlp_parameter_bytes(load: dict) -> int:
    """Bytes of the mlp's parameters from its shape: depth x (Linear(w, 4w) + Linear(4w, w)),
    weights and biases."""
    w, h, depth = load["width"], 4 * load["width"], load["workload"]["depth"]
    return depth * (2 * w * h + h + w) * {"float32": 4, "bfloat16": 2}[load["dtype"]]


@pytest.mark.parametrize("load", sorted(LOADS))
def test_the_categories_of_a_predicted_peak_sum_to_it(runs, load):
    for p in runs[(load, "predicted")]["record"]["phases"]:
        assert all(isinstance(p[k], int) and p[k] >= 0 for k in SPLIT), p
        assert sum(p[k] for k in SPLIT) == p["max_memory_allocated"], p["name"]
    for p in runs[(load, "measured")]["record"]["phases"]:  # a real run has no split: null, not 0
        assert all(k in p and p[k] is None for k in SPLIT), p["name"]


def test_mlp_train_peak_split_parameters_gradients_adamw_states(runs):
    record = runs[("mlp_train", "predicted")]["record"]
    params = _mlp_parameter_bytes(LOADS["mlp_train"])
    tensors = 4 * LOADS["mlp_train"]["workload"]["depth"]  # weight and bias of two Linear per block
    assert record["model"]["parameter_bytes"] == params
    adamw = 2 * params + 4 * tensors  # exp_avg, exp_avg_sq (float32) and a float32 0-dim step per tensor
    by_name = {p["name"]: p for p in record["phases"]}
    for p in record["phases"]:
        assert _split(p)["parameter"] == params, p["name"]
    for name in ("cold_step.optimizer_step", "warm_step.optimizer_step"):
        split = _split(by_name[name])
        assert split["gradient"] == params and split["optimizer_state"] == adamw, (name, split)
        assert by_name[name]["optimizer_state_bytes"] == adamw
    for name in ("cold_step.backward", "warm_step.backward"):
        split = _split(by_name[name])  # the peak comes before the last gradients are made
        assert 0 < split["gradient"] <= params and split["activation"] > 0, (name, split)
    cold = _split(by_name["cold_step.forward"])
    assert cold["gradient"] == 0 and cold["optimizer_state"] == 0  # AdamW's states appear in the first step
    assert _split(by_name["warm_step.forward"])["optimizer_state"] == adamw
    assert _split(by_name["model_load"]) == {"parameter": params, "gradient": 0, "optimizer_state": 0, "activation": 0}


def test_mlp_inference_peak_split_has_no_gradients_or_optimizer_states(runs):
    record = runs[("mlp_inference", "predicted")]["record"]
    params = _mlp_parameter_bytes(LOADS["mlp_inference"])
    for p in record["phases"]:
        split = _split(p)
        assert split["parameter"] == params and split["gradient"] == 0 and split["optimizer_state"] == 0, p["name"]
    assert _split(record["phases"][-1])["activation"] > 0


def test_a_parameter_replaced_inside_a_phase_is_still_a_parameter(runs):
    """bfloat16 mlp: built in float32, then each weight cast and replaced in model_load; the
    float32 originals are parameters of the model until replaced (registration hook)."""
    record = runs[("mlp_train_bf16_wide", "predicted")]["record"]
    load = record["phases"][0]
    params = _mlp_parameter_bytes(LOADS["mlp_train_bf16_wide"])
    assert load["name"] == "model_load" and _split(load)["activation"] == 0
    assert _split(load)["parameter"] == load["max_memory_allocated"] > 2 * params  # float32 = 2 x bfloat16
    assert all(_split(p)["parameter"] == params for p in record["phases"][1:])


def test_the_split_follows_the_storage_not_its_address():
    """In-process: a gradient freed inside the phase (zero_grad set_to_none) counts as a
    gradient when it was live at the peak; a storage freed before the peak is not counted."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memsweep.worker.counters import FakeLiveTensorTracker

    tracker = FakeLiveTensorTracker()
    with FakeTensorMode(), tracker:
        w = torch.empty(256)  # 1024 B, a parameter
        g = torch.empty(256)  # 1024 B, its gradient
        tracker.tag("parameter", [w])
        tracker.tag("gradient", [g, torch.empty(1)])  # the second one is a temporary: freed now
        tracker.reset_peak()  # phase start: 2048 B live
        del g  # freed: the phase peak stays at its start
        a = torch.empty(128)  # 512 B
        split_1 = tracker.peak_split()
        b = torch.empty(1024)  # 4096 B: a new peak without the gradient
        split_2 = tracker.peak_split()
        del a, b
        tracker.reset_peak()
        split_3 = tracker.peak_split()
    assert split_1 == {
        "predicted_parameter_bytes": 1024,
        "predicted_gradient_bytes": 1024,
        "predicted_optimizer_state_bytes": 0,
        "predicted_activation_bytes": 0,
    }
    assert split_2 == {
        "predicted_parameter_bytes": 1024,
        "predicted_gradient_bytes": 0,
        "predicted_optimizer_state_bytes": 0,
        "predicted_activation_bytes": 512 + 4096,
    }
    assert split_3 == {
        "predicted_parameter_bytes": 1024,
        "predicted_gradient_bytes": 0,
        "predicted_optimizer_state_bytes": 0,
        "predicted_activation_bytes": 0,
    }
    assert tracker.peak == tracker.live == 1024


def test_module_to_on_fake_modules_converts_like_module_to(monkeypatch):
    """In-process: with ``install_fake_module_apply`` (every dry run's), ``Module.to`` works on
    a module built under FakeTensorMode (PyTorch's swaps each fake parameter, and refuses the
    weak reference FakeTensorMode keeps to it), with the bytes of PyTorch's ``Module.to`` on
    real tensors (tracked the same way): a tied weight stays tied, the old storages are released
    one at a time, and a no-op ``.to`` keeps the objects."""
    import torch
    from torch import nn
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from memsweep.worker.counters import FakeLiveTensorTracker, LiveTensorTracker
    from memsweep.worker.counters.fake import install_fake_module_apply

    def cast(tracker):
        model = nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 64))
        model[1].weight = model[0].weight  # tied, as an LM head: (64, 16)
        model[1].bias.grad = torch.zeros(64)
        kept = list(model.parameters())
        assert model.to(torch.float32) is model
        assert list(model.parameters()) == kept  # nothing to convert: the same objects
        del kept
        tracker.reset_peak()
        model.to(torch.bfloat16)
        assert model[1].weight is model[0].weight and isinstance(model[0].weight, nn.Parameter)
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())
        assert model[1].bias.grad.dtype == torch.bfloat16
        return model, tracker.peak, tracker.live

    real = LiveTensorTracker()
    with real:
        _, real_peak, real_live = cast(real)
    monkeypatch.setattr(nn.Module, "_apply", nn.Module._apply)  # put back after the test
    assert install_fake_module_apply() and not install_fake_module_apply()
    tracker = FakeLiveTensorTracker()
    with FakeTensorMode(), tracker:
        model, peak, live = cast(tracker)
    assert all(isinstance(p, FakeTensor) for p in model.parameters())
    # after: the tied weight, the bias and its gradient in 2 B; at the peak: all in float32 and
    # the weight's bfloat16 copy (PyTorch converts one tensor at a time)
    assert (peak, live) == (real_peak, real_live) == ((64 * 16 + 64 + 64) * 4 + 64 * 16 * 2, (64 * 16 + 64 + 64) * 2)


# ----- memsweep predict ---------------------------------------------------------------------
PREDICT_LOAD = ["workload=mlp", "workload.depth=2", "mode=train", "context=16", "width=32", "threads=1"]


def test_predict_finds_the_edge_that_real_runs_confirm(tmp_path):
    import io

    from memsweep.sweeper.cli import predict_command as predict
    from memsweep.sweeper.predict import Predictor

    base = RunSpec.from_dict(dict(BASE, batch=5, mode="train", workload=MLP))
    probe = Predictor(base, "batch", 10**12, tmp_path / "probe", "forkserver")
    peak5, peak6 = probe.run(5)["peak"], probe.run(6)["peak"]
    assert peak5 < peak6
    capacity = (peak5 + peak6) // 2

    out = io.StringIO()
    code = predict(
        PREDICT_LOAD + ["batch=3", f"capacity={capacity}B", "--axis", "batch", f"results_dir={tmp_path}"], out=out
    )
    text = out.getvalue()
    assert code == 0, text
    assert "PREDICTED edge: max fit batch=5, min miss batch=6 (exact)" in text
    assert "CUDA context" in text and "prediction of live tensor bytes" in text
    summary = json.loads(next((tmp_path / "predict").glob("*/predict.json")).read_text())
    assert summary["max_fit"] == 5 and summary["min_miss"] == 6 and summary["source"] == "predicted"
    # the split of the largest phase peak at the edge, printed in bytes with GB and GiB
    split = summary["peak_split"]
    assert split["peak_bytes"] == probe.run(5)["peak"] == peak5
    parts = {
        k: split[k]
        for k in (
            "predicted_parameter_bytes",
            "predicted_gradient_bytes",
            "predicted_optimizer_state_bytes",
            "predicted_activation_bytes",
        )
    }
    assert sum(parts.values()) == peak5 and parts["predicted_gradient_bytes"] > 0
    assert f"at the largest phase peak of batch=5 ({split['phase']})" in text
    for label, key in (
        ("parameters", "parameter"),
        ("gradients", "gradient"),
        ("optimizer states", "optimizer_state"),
        ("activations and temporaries", "activation"),
    ):
        n = parts[f"predicted_{key}_bytes"]
        assert f"{label:<28} {n} B = {n / 1e9:.3f} GB = {n / 2**30:.3f} GiB" in text, (label, text)
    assert {r["value"] for r in summary["runs"]} >= {5, 6}

    # the same loads measured (tracked allocated on the CPU) fall on the same sides of the capacity
    measured = {
        b: run_dry_worker(tmp_path, f"measured-{b}", dict(BASE, batch=b, mode="train", workload=MLP, repeats=1))
        for b in (5, 6)
    }
    peaks = {b: max(p["max_memory_allocated"] for p in m["record"]["phases"]) for b, m in measured.items()}
    assert peaks[5] <= capacity < peaks[6]


def test_predict_refuses_a_missing_capacity_and_an_unknown_axis(tmp_path, capsys):
    from memsweep.sweeper.cli import predict_command as predict

    assert predict(PREDICT_LOAD + [f"results_dir={tmp_path}"]) == 2
    assert predict(PREDICT_LOAD + ["capacity=1GB", "--axis", "dtype", f"results_dir={tmp_path}"]) == 2
    assert "capacity" in capsys.readouterr().err


def test_analysis_labels_predictions_and_keeps_them_out_of_the_frontier(runs, tmp_path):
    import shutil

    import pyarrow as pa

    from memsweep.analysis.frontier import frontier_table
    from memsweep.analysis.tables import build_tables

    sweep = tmp_path / "sweep"  # mlp_train measured at batch 3, predicted at batch 3 and (relabelled) 4
    shutil.copytree(runs[("mlp_train", "measured")]["dir"], sweep / "m3")
    shutil.copytree(runs[("mlp_train", "predicted")]["dir"], sweep / "p3")
    shutil.copytree(runs[("mlp_train", "predicted")]["dir"], sweep / "p4")
    spec = json.loads((sweep / "p4" / "spec.json").read_text())
    (sweep / "p4" / "spec.json").write_text(json.dumps({**spec, "batch": 4}))
    table, phases, _ = build_tables([sweep])
    assert sorted(r["source"] for r in table.to_pylist()) == ["measured", "predicted", "predicted"]
    for row in phases.to_pylist():  # the peak split: predicted rows only, null on measured ones
        split = [row[k] for k in SPLIT]
        if row["source"] == "predicted":
            assert sum(split) == row["max_memory_allocated"], row
        else:
            assert row["source"] == "measured" and split == [None] * 4, row
    assert {phases.schema.field(k).type for k in SPLIT} == {pa.int64()}
    assert frontier_table(table).num_rows == 0  # with the predictions it would span batch 3..4


# ----- the frontier search seeded with the predicted edge -----------------------------------
@pytest.mark.parametrize("strategy", ["model", "bisect"])
@pytest.mark.parametrize(
    "seed, edge, most_runs", [(37, 37, 2), (36, 37, 8), (38, 37, 3), (500, 37, 12), (1, 37, 12), (10, 1, 8), (10, 0, 3)]
)
def test_a_seeded_search_finds_the_exact_edge(strategy, seed, edge, most_runs):
    from memsweep.sweeper.search import FrontierSearch, Lattice, run_search

    capacity = 1000 + 100 * edge + 50  # peak(x) = 1000 + 100 x: x fits iff x <= edge

    def oracle(x):
        peak = 1000 + 100 * x
        return ("ok" if peak <= capacity else "oom"), (peak if peak <= capacity else None), capacity

    search = FrontierSearch("batch", Lattice.make(1, 4096), strategy, seed=seed)
    result = run_search(search, oracle)
    if edge == 0:
        assert result.max_ok is None and result.min_oom == 1
    else:
        assert result.max_ok == edge and result.min_oom == edge + 1
    assert result.runs_used <= most_runs, result


def test_frontier_sweeper_seeded_from_dry_runs_lands_on_the_edge(tmp_path):
    """The frontier integration load (tests/test_frontier_integration.py: mlp inference at an
    emulated 64 MiB, lattice 352..448 step 32, edge between 384 and 416 on every machine: the
    allocator capacity counts the bytes the dry run predicts): the dry runs predict the edge, and
    the real search needs only the two probes that bracket it, then one for the margin's edge."""
    import subprocess

    from test_frontier_integration import LOAD, RANGE

    sweep_dir = tmp_path / "seeded"
    proc = subprocess.run(
        [
            MEMSWEEP,
            "sweep",
            "hydra/sweeper=frontier",
            *LOAD,
            *RANGE,
            "hydra.sweeper.confirm=0",
            "hydra.sweeper.seed_from_dry_run=true",
            *NO_REPORT,
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = search_events(sweep_dir)
    (dry,) = [e for e in events if e["event"] == "dry_run"]
    assert dry["error"] is None and 384 <= dry["predicted_max_ok"] < 416
    probes = [e for e in events if e["event"] == "probe"]
    # the edge in the first two probes; then the margin's edge (the default 10 %: 384's peak leaves less), 352
    assert [p["value"] for p in probes] == [384, 416, 352] and "dry run" in probes[0]["reason"]
    assert probes[2]["reason"].startswith("margin edge") or ": margin edge" in probes[2]["reason"]
    (result,) = [e for e in events if e["event"] == "result"]
    assert (result["max_ok"], result["min_oom"], result["exact"], result["runs_used"]) == (384, 416, True, 3)
    assert result["margin_edge"] == 352
    assert not list(sweep_dir.glob("*/spec.json")) or all(
        not json.loads(p.read_text()).get("dry_run") for p in sweep_dir.glob("*/spec.json")
    )
    # The dry runs stay inside the sweep directory, hidden from the analysis of measured runs.
    assert list((sweep_dir / ".dry_run").rglob("record.json")) and not (tmp_path / "seeded-dry_run").exists()
    import pyarrow.parquet as pq

    assert set(pq.read_table(sweep_dir / "runs.parquet").column("source").to_pylist()) <= {"measured", None}
