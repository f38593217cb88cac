"""Every workload's estimate in runs.parquet (est_*, estimate_error), or null with the reason:
transformer and hf runs estimated by the formulas and measured by real workers, user runs
null with the reason, mlp runs with options the replay does not model null with the options."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import memsweep.estimator as E
from memsweep.analysis.tables import build_tables
from memsweep.conf.contract import SPEC_FILE, RunSpec, write_json_atomic
from memsweep.sweeper.spec import with_estimate
from tests.data.loads import run_worker
from tests.data.optional import HAS_PEFT, HAS_TRANSFORMERS, needs_peft, needs_transformers

SMALL_LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}


def _spec(workload, mode="train", dtype="float32", **kw) -> RunSpec:
    fields = dict(batch=2, context=16, width=32, dtype=dtype, mode=mode, device="cpu", workload=workload)
    fields.update(warmup=1, repeats=1, timeout_s=240, threads=1, **kw)
    return RunSpec(**fields)


@pytest.mark.parametrize(
    "workload",
    [
        {"name": "transformer", "layers": 2, "heads": 4, "kv_heads": 2, "ffn": "swiglu", "vocab": 100},
        {"name": "transformer", "layers": 3, "heads": 2, "norm": "layernorm", "tie_embeddings": True, "vocab": 50},
    ],
)
def test_transformer_workload_parameters_equal_the_worker_model(workload):
    """The estimator's description of memsweep's transformer has the worker model's parameters."""
    import torch

    from memsweep.worker.models import Transformer
    from memsweep.worker.workloads.transformer import transformer_dims

    spec = _spec(workload)
    with torch.device("meta"):
        model = Transformer(**transformer_dims(spec))
    described = E.transformer_workload_model(spec.workload, spec.width)
    assert described.parameters == sum(p.numel() for p in model.parameters())


def test_reasons_for_what_is_not_estimated():
    user = {"name": "user", "model": {"_target_": "a.b"}, "inputs": {"_target_": "a.c"}}
    assert E.estimate_run(_spec(user)) == (None, E.USER_REASON)
    est, reason = E.estimate_run(_spec({"name": "mlp"}, checkpointing=True, micro_steps=2))
    assert est is None and "checkpointing=True" in reason and "micro_steps=2" in reason
    est, reason = E.estimate_run(_spec({"name": "transformer"}, mode="inference"))
    assert est.weights > 0 and est.activations is None and "inference activations" in reason
    est, reason = E.estimate_run(_spec({"name": "transformer"}, mode="generate", new_tokens=8))
    model = E.transformer_workload_model(_spec({"name": "transformer"}).workload, 32)
    # 2 x layers x kv_heads x head_dim x (context + new_tokens) x 4 bytes x batch
    assert est.kv_cache == 2 * model.layers * model.kv_heads * model.head_dim * (16 + 8) * 4 * 2
    assert "prefill" in reason
    est, reason = E.estimate_run(_spec({"name": "hf", "config": "gpt2"}), {"error": "no such model"})
    assert est is None and "no such model" in reason
    est, reason = E.estimate_run(_spec({"name": "transformer"}))
    assert reason is None and est.gradients == est.weights  # pure float32: gradients as the weights


def test_training_estimate_by_hand():
    """transformer, train, float32 pure, AdamW on the CPU: weights 4 B, gradients 4 B, two fp32
    states 8 B per parameter plus Adam's 4-byte step per parameter tensor."""
    spec = _spec({"name": "transformer", "layers": 2, "heads": 4, "vocab": 100})
    model = E.transformer_workload_model(spec.workload, spec.width)
    n, tensors = model.parameters, len(model.tensors())
    est, _ = E.estimate_run(spec)
    assert (est.weights, est.gradients, est.optimizer_states) == (4 * n, 4 * n, 8 * n + 4 * tensors)
    acts, _ = E.training_activations(
        model, E.ActivationSettings(2, 16, fused_attention=True, dropout=False), compute_bytes=4
    )
    assert est.activations == acts


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A transformer and an hf training run measured by real workers, a user run that never
    started; their specs written as the sweeper writes them (``with_estimate``)."""
    root = tmp_path_factory.mktemp("estimate_runs")
    (root / "llama").mkdir()
    (root / "llama" / "config.json").write_text(json.dumps(SMALL_LLAMA))
    specs = {
        "transformer": _spec({"name": "transformer", "layers": 2, "heads": 4, "kv_heads": 2, "vocab": 100}),
        "user": _spec({"name": "user", "model": {"_target_": "a.b"}, "inputs": {"_target_": "a.c"}}),
    }
    if HAS_TRANSFORMERS:
        specs["hf"] = _spec({"name": "hf", "config": str(root / "llama")}, dtype="bfloat16")
    if HAS_PEFT:  # LoRA rank 4 on peft's default targets (q_proj, v_proj) of a bfloat16 base
        specs["hf_lora"] = _spec({"name": "hf", "config": str(root / "llama"), "lora_rank": 4}, dtype="bfloat16")
    dirs = {}
    for name, spec in specs.items():
        dirs[name] = root / "sweep" / name
        dirs[name].mkdir(parents=True)
        write_json_atomic(dirs[name] / SPEC_FILE, with_estimate(spec).to_dict())

    def measure(run_dir):
        return run_worker(run_dir, timeout=300)

    ran = [n for n in specs if n != "user"]
    with ThreadPoolExecutor(len(ran)) as pool:
        procs = dict(zip(ran, pool.map(measure, [dirs[n] for n in ran])))
    for name, proc in procs.items():
        assert proc.returncode == 0, (name, proc.stderr[-2000:])
    runs, _, _ = build_tables([root / "sweep"])
    return {row["run_id"]: row for row in runs.to_pylist()}


def test_runs_parquet_has_every_workloads_estimate_or_the_reason(measured):
    t = measured["transformer"]
    assert t["outcome"] == "ok" and t["estimate_missing_reason"] is None
    assert t["est_weights_bytes"] == t["parameter_bytes"]  # the worker's own count, by construction
    assert t["estimate_error"] == pytest.approx(
        (t["est_peak_bytes"] - t["max_memory_allocated"]) / t["max_memory_allocated"]
    )
    u = measured["user"]
    assert u["est_peak_bytes"] is None and u["estimate_error"] is None
    assert u["estimate_missing_reason"] == E.USER_REASON


@needs_transformers
def test_hf_run_is_counted_by_transformers_and_estimated(measured):
    h = measured["hf"]
    assert h["outcome"] == "ok" and h["estimate_missing_reason"] is None
    assert h["est_weights_bytes"] == h["parameter_bytes"]  # bfloat16: 2 B x transformers' count
    assert h["est_optimizer_states_bytes"] > 0 and h["est_activations_bytes"] > 0
    assert h["estimate_error"] == pytest.approx(
        (h["est_peak_bytes"] - h["max_memory_allocated"]) / h["max_memory_allocated"]
    )


@needs_peft
def test_hf_lora_run_estimates_the_adapters_training_state(measured):
    """Only the adapters train: r x (in + out) fp32 values per adapted Linear (Hu et al. 2021;
    peft keeps them in fp32 on a bfloat16 base), their gradients (4 B) and AdamW states (8 B, plus
    a 4-byte step per adapter tensor on the CPU), derived here from the config's shapes; they are
    the measured record's figures, not the full fine-tuning ones."""
    rank, head_dim = 4, SMALL_LLAMA["hidden_size"] // SMALL_LLAMA["num_attention_heads"]
    hidden, layers = SMALL_LLAMA["hidden_size"], SMALL_LLAMA["num_hidden_layers"]
    q, v = (hidden, hidden), (hidden, SMALL_LLAMA["num_key_value_heads"] * head_dim)  # (in, out)
    adapters = layers * (rank * sum(q) + rank * sum(v))
    steps = 4 * 2 * 2 * layers  # A and B of q_proj and v_proj in every layer
    h = measured["hf_lora"]
    assert h["outcome"] == "ok" and h["estimate_missing_reason"] is None
    assert h["trainable_parameters"] == adapters and h["trainable_parameter_bytes"] == 4 * adapters
    assert h["est_gradients_bytes"] == 4 * adapters
    assert h["est_optimizer_states_bytes"] == 8 * adapters + steps
    assert h["est_weights_bytes"] == h["parameter_bytes"]  # the bfloat16 base + the fp32 adapters
    full = measured["hf"]  # the same model fully trained: what a LoRA run must not be shown
    assert full["est_gradients_bytes"] == full["parameter_bytes"] > 10 * h["est_gradients_bytes"]
    record = json.loads((Path(h["run_dir"]) / "record.json").read_text())
    phases = {p["name"]: p for p in record["phases"]}
    assert phases["cold_step.backward"]["gradient_bytes"] == h["est_gradients_bytes"]
    assert phases["cold_step.optimizer_step"]["optimizer_state_bytes"] == h["est_optimizer_states_bytes"]


def write_measured_run(run_dir, spec: RunSpec, peak: int) -> None:
    """A run directory written by hand (no worker): the spec as the sweeper writes it, a
    complete ok record whose peak is ``peak`` bytes."""
    run_dir.mkdir(parents=True)
    write_json_atomic(run_dir / SPEC_FILE, with_estimate(spec).to_dict())
    phase = {"name": "model_load", "status": "ok", "max_memory_allocated": peak, "max_memory_reserved": peak}
    record = {"schema_version": 1, "complete": True, "outcome": "ok", "phases": [phase], "device_kind": "cpu"}
    write_json_atomic(run_dir / "record.json", record)
    write_json_atomic(run_dir / "result.json", {"schema_version": 1, "outcome": "ok", "returncode": 0})


def test_a_parallel_runs_estimate_is_one_ranks(tmp_path):
    """A DDP/FSDP run's est_* and estimate_error describe one rank (its max_memory_allocated is the
    fullest rank's): the whole replica's model states partitioned at the run's ZeRO stage over its
    world_size, activations as estimated for the per-rank batch; a one-process run's unchanged."""
    workload = {"name": "transformer", "layers": 2, "heads": 4, "vocab": 100}
    specs = {
        "none": _spec(workload),
        "ddp": _spec(workload, parallel="ddp", world_size=2),
        "fsdp": _spec(workload, parallel="fsdp", world_size=2),
        "fsdp4": _spec(workload, parallel="fsdp", world_size=4),
    }
    peak = 10**6
    for name, spec in specs.items():
        write_measured_run(tmp_path / name, spec, peak)
    runs, _, problems = build_tables([tmp_path])
    assert not problems
    rows = {row["run_id"]: row for row in runs.to_pylist()}
    whole, _ = E.estimate_run(specs["none"])
    for name, spec in specs.items():
        # the same whole replica for every run: world_size and parallel change no formula's input
        assert E.estimate_run(spec)[0].to_dict() == whole.to_dict()
        stage = E.PARALLEL_ZERO_STAGE.get(spec.parallel)
        rank = whole if stage is None else E.zero_partition(whole, stage, spec.world_size)
        row = rows[name]
        assert {c: row[f"est_{c}_bytes"] for c in E.COMPONENTS} == {c: getattr(rank, c) for c in E.COMPONENTS}
        assert row["est_peak_bytes"] == rank.peak
        assert row["estimate_error"] == pytest.approx((rank.peak - peak) / peak)
        assert row["est_activations_bytes"] == whole.activations  # per rank: batch is each rank's micro-batch
    n = specs["fsdp"].world_size
    assert rows["fsdp"]["est_weights_bytes"] == -(-whole.weights // n)  # ceil(weights / world_size)
    assert rows["fsdp"]["est_peak_bytes"] < rows["ddp"]["est_peak_bytes"] == rows["none"]["est_peak_bytes"]
    assert rows["fsdp4"]["est_peak_bytes"] < rows["fsdp"]["est_peak_bytes"]
    # the model states of est_* are the figure the DDP/FSDP comparison columns use
    for name in ("ddp", "fsdp", "fsdp4"):
        states = sum(rows[name][f"est_{c}_bytes"] for c in E.MODEL_STATE_COMPONENTS)
        assert rows[name]["estimated_model_states_bytes"] == states


def test_rank_estimate_of_a_corrupt_or_missing_estimate_is_null():
    whole = E.estimate_run(_spec({"name": "transformer"}))[0].to_dict()
    assert E.rank_estimate(whole, "none", 1) == whole and E.rank_estimate(whole, None, 1) == whole
    assert E.rank_estimate(None, "none", 1) is None and E.rank_estimate(None, "fsdp", 2) is None
    assert E.rank_estimate({**whole, "weights": "many"}, "fsdp", 2) is None  # never the replica as a rank's
    assert E.rank_estimate(whole, "fsdp", 0) is None and E.rank_estimate(whole, "fsdp", True) is None
