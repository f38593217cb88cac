"""Dry runs of the hf workload: the prediction of every phase against the measured CPU run.

Each load runs twice through ``sweeper.process.execute`` (real worker processes): measured
(LiveTensorTracker, "tracked allocated") and predicted (FakeTensorMode). Shrunk configs of five
families (2 layers, hidden 32, vocabulary 128) written from their published shapes: Llama
(grouped-query attention), GPT-2 (learned positions, Conv1D, tied embeddings), Qwen2 (biases on
q/k/v), Mistral (sliding window shorter than the context), Phi-3 (fused qkv and gate_up); and LoRA
adapters through peft on the Llama config (skipped where peft is not installed).
Skipped where transformers is not installed.
"""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from memsweep.conf.contract import RunSpec
from memsweep.sweeper.process import execute
from tests.data.loads import TINY_HF_GPT2, TINY_HF_LLAMA, TINY_LLAMA_OVERRIDES
from tests.data.optional import HAS_PEFT, needs_transformers

pytestmark = needs_transformers

FAMILIES = {
    "llama": TINY_HF_LLAMA,
    "gpt2": TINY_HF_GPT2,
    "qwen2": {"name": "hf", "config": "Qwen2Config", "overrides": TINY_LLAMA_OVERRIDES},
    "mistral": {"name": "hf", "config": "MistralConfig", "overrides": {**TINY_LLAMA_OVERRIDES, "sliding_window": 8}},
    "phi3": {"name": "hf", "config": "Phi3Config", "overrides": {**TINY_LLAMA_OVERRIDES, "pad_token_id": 0}},
}
BASE = dict(batch=2, context=16, width=32, dtype="float32", device="cpu", warmup=1, repeats=1, timeout_s=300, threads=1)
LOADS = {
    **{f"{name}_train": dict(BASE, mode="train", workload=w) for name, w in FAMILIES.items()},
    "llama_train_bf16_ckpt_eval": dict(
        BASE,
        mode="train",
        dtype="bfloat16",
        checkpointing=True,
        micro_steps=2,
        eval_batch=3,
        workload=FAMILIES["llama"],
    ),
    "llama_generate": dict(BASE, mode="generate", new_tokens=3, workload=FAMILIES["llama"]),
    "llama_generate_static": dict(BASE, mode="generate", new_tokens=3, kv_cache="static", workload=FAMILIES["llama"]),
    "gpt2_generate": dict(BASE, mode="generate", new_tokens=3, workload=FAMILIES["gpt2"]),
    "qwen2_inference": dict(BASE, mode="inference", workload=FAMILIES["qwen2"]),
}
if HAS_PEFT:  # adapters created in float32, then cast to the base's bfloat16 by peft (Module.to)
    LOADS["llama_lora_train"] = dict(BASE, mode="train", workload={**FAMILIES["llama"], "lora_rank": 4})
    LOADS["llama_lora_bf16_ckpt_dropout"] = dict(
        BASE,
        mode="train",
        dtype="bfloat16",
        checkpointing=True,
        micro_steps=2,
        workload={
            **FAMILIES["llama"],
            "lora_rank": 8,
            "lora_alpha": 16,
            "lora_dropout": 0.1,
            "lora_targets": "all-linear",
        },
    )
TOLERANCE = 0.01  # of the measured phase peak
CUDA_LOADS = ("llama_generate", "llama_generate_static", "qwen2_inference")
SPLIT = ("predicted_parameter_bytes", "predicted_gradient_bytes", "predicted_optimizer_state_bytes")


def _run(root, name: str, data: dict) -> dict:
    run_dir = root / name
    execute(RunSpec.from_dict(data), run_dir)
    return json.loads((run_dir / "record.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dryrun_hf")
    with ThreadPoolExecutor(2) as pool:
        jobs = {
            (name, kind): pool.submit(_run, root, f"{name}-{kind}", dict(data, dry_run=kind == "predicted"))
            for name, data in LOADS.items()
            for kind in ("measured", "predicted")
        }
        for name in CUDA_LOADS:  # the same load predicted on fake CUDA tensors (no GPU needed)
            jobs[(name, "cuda")] = pool.submit(
                _run, root, f"{name}-cuda", dict(LOADS[name], dry_run=True, device="cuda:0")
            )
        return {key: job.result() for key, job in jobs.items()}


@pytest.mark.parametrize("load", sorted(LOADS))
def test_hf_prediction_of_every_phase_is_within_one_percent_of_the_measured_run(runs, load):
    measured, predicted = runs[(load, "measured")], runs[(load, "predicted")]
    assert measured["outcome"] == "ok", measured.get("error_message")
    assert predicted["outcome"] == "ok", predicted.get("error_message")
    assert predicted["source"] == "predicted" and measured["source"] == "measured"
    assert [p["name"] for p in predicted["phases"]] == [p["name"] for p in measured["phases"]]
    for m, p in zip(measured["phases"], predicted["phases"]):
        assert abs(p["max_memory_allocated"] - m["max_memory_allocated"]) <= TOLERANCE * m["max_memory_allocated"], (
            p["name"],
            p["max_memory_allocated"],
            m["max_memory_allocated"],
        )
        assert abs(p["memory_allocated"] - m["memory_allocated"]) <= TOLERANCE * m["max_memory_allocated"], p["name"]
        for key in ("gradient_bytes", "optimizer_state_bytes", "kv_cache_bytes", "kv_cache_tokens"):
            assert p.get(key) == m.get(key), (p["name"], key)
    assert predicted["model"]["parameter_bytes"] == measured["model"]["parameter_bytes"]
    assert predicted["model"]["dims"] == measured["model"]["dims"]
    assert predicted["model"].get("lora") == measured["model"].get("lora")
    if "lora" in load:  # only the adapters train: their gradients and AdamW states, not the base's
        model, lora = predicted["model"], predicted["model"]["lora"]
        # r x (in + out) per adapted Linear (Hu et al. 2021), in float32 on a bfloat16 base too
        # (get_peft_model's autocast_adapter_dtype=True, peft's default)
        adapters = sum(s["count"] * lora["rank"] * (s["in"] + s["out"]) for s in lora["adapter_shapes"].values())
        assert model["trainable_parameter_bytes"] == adapters * 4
        # 2 layers x (q_proj, v_proj: peft's default for Llama; all-linear: 7, the head excepted)
        assert lora["adapted_modules"] == 2 * (7 if LOADS[load]["workload"].get("lora_targets") else 2)
        step = next(p for p in predicted["phases"] if p["name"] == "cold_step.optimizer_step")
        assert step["predicted_gradient_bytes"] == model["trainable_parameter_bytes"]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hf_train_split_holds_the_parameters_gradients_and_adamw_states(runs, family):
    record = runs[(f"{family}_train", "predicted")]
    params = record["model"]["parameter_bytes"]
    by_name = {p["name"]: p for p in record["phases"]}
    for p in record["phases"]:
        # model_load may hold a parameter replaced while the model is built (GPT-2's head,
        # created then tied to the embedding): a parameter until freed
        if p["name"] == "model_load":
            assert p["predicted_parameter_bytes"] >= params
        else:
            assert p["predicted_parameter_bytes"] == params, p["name"]
        assert sum(p[k] for k in (*SPLIT, "predicted_activation_bytes")) == p["max_memory_allocated"]
    step = by_name["cold_step.optimizer_step"]
    grads = by_name["cold_step.backward"]["gradient_bytes"]  # sizes at the end of backward
    assert step["predicted_gradient_bytes"] == grads == params  # float32 gradients
    assert step["predicted_optimizer_state_bytes"] == step["optimizer_state_bytes"]
    assert step["optimizer_state_bytes"] > 2 * params  # exp_avg, exp_avg_sq and a step per tensor
    assert by_name["cold_step.forward"]["predicted_optimizer_state_bytes"] == 0


def test_hf_generate_split_has_the_kv_cache_among_the_activations(runs):
    record = runs[("llama_generate", "predicted")]
    decode = next(p for p in record["phases"] if p["name"] == "cold_generate.decode")
    # 2 (K, V) x layers x kv_heads x head_dim x tokens x 4 B x batch
    assert decode["kv_cache_bytes"] == 2 * 2 * 2 * 8 * (16 + 3) * 4 * 2
    assert decode["predicted_activation_bytes"] >= decode["kv_cache_bytes"]
    assert decode["predicted_gradient_bytes"] == decode["predicted_optimizer_state_bytes"] == 0


@pytest.mark.parametrize("load", CUDA_LOADS)
def test_hf_generate_and_inference_dry_run_on_fake_cuda_without_a_gpu(runs, load):
    """On fake CUDA tensors (here a CPU-only PyTorch): every phase runs (generate's DynamicCache
    makes its empty cache with torch.tensor(..., device) under inference_mode), CUDA is never
    initialised, the KV cache has the CPU run's bytes, and each phase's peak covers the
    measured CPU one (every storage rounded up to 512 B blocks)."""
    cuda, measured = runs[(load, "cuda")], runs[(load, "measured")]
    assert cuda["outcome"] == "ok", cuda.get("error_message")
    assert cuda["device"] == "cuda:0" and cuda["cuda_initialized"] is False and "512 B" in cuda["prediction_rounding"]
    assert [p["name"] for p in cuda["phases"]] == [p["name"] for p in measured["phases"]]
    for c, m in zip(cuda["phases"], measured["phases"]):
        assert c["max_memory_allocated"] % 512 == 0 and c["max_memory_allocated"] >= m["max_memory_allocated"]
        assert (c.get("kv_cache_bytes"), c.get("kv_cache_tokens")) == (
            m.get("kv_cache_bytes"),
            m.get("kv_cache_tokens"),
        )


# ----- transformers' tracing branches on fake tensors ------------------------------------------
def _keep(monkeypatch, module, *names):
    for name in names:  # monkeypatch puts back what install replaces in this test process
        if hasattr(module, name):
            monkeypatch.setattr(module, name, getattr(module, name))


def test_the_answers_given_to_transformers_are_its_own_on_memsweeps_inputs(monkeypatch):
    """What ``hf_dry.install`` answers on fake tensors equals what transformers computes on the
    real position ids of memsweep's inputs (one arange per row), and a place it does not know
    refuses, naming the function."""
    import sys
    import types

    import torch
    import transformers
    from torch import nn
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import masking_utils, modeling_utils

    from memsweep.worker.counters import dry_run_unsupported
    from memsweep.worker.workloads.hf_dry import TracingBranch, install

    _keep(monkeypatch, masking_utils, "find_packed_sequence_indices", "_ignore_causal_mask_sdpa", "is_tracing")
    _keep(monkeypatch, modeling_utils, "is_tracing")
    positions = torch.arange(16).unsqueeze(0).expand(2, 16)
    real = masking_utils.find_packed_sequence_indices(positions)
    real_skip = masking_utils._ignore_causal_mask_sdpa(None, 16, 19, 0, 0)

    probe = types.ModuleType("memsweep_probe_model")  # a model module that asks is_tracing
    probe.is_tracing = transformers.utils.import_utils.is_tracing
    exec("def reads_values(x):\n    return is_tracing(x)\n", probe.__dict__)
    monkeypatch.setitem(sys.modules, probe.__name__, probe)
    Model = type("ProbeModel", (nn.Module,), {"__module__": probe.__name__})
    done = install(transformers, Model())
    assert "masking_utils.find_packed_sequence_indices" in done and "watch:memsweep_probe_model" in done
    with FakeTensorMode() as mode:
        fake_positions = mode.from_tensor(positions)
        assert masking_utils.find_packed_sequence_indices(fake_positions) is real is None
        q_offset = mode.from_tensor(torch.tensor(0))
        assert masking_utils._ignore_causal_mask_sdpa(None, 16, 19, q_offset, 0) is real_skip is True
        with pytest.raises(TracingBranch) as caught:
            probe.reads_values(fake_positions)
    assert probe.reads_values(positions) is False  # real tensors: transformers' own answer
    message = dry_run_unsupported(caught.value, "in model.layers.0 (ProbeLayer)")
    assert "memsweep_probe_model.reads_values" in message and "model.layers.0 (ProbeLayer)" in message
    assert "measure this load with a real run" in message


# ----- memsweep predict over a card list ---------------------------------------------------------
def test_predict_over_cards_gives_each_card_its_edge_and_the_estimators_figures(tmp_path, monkeypatch, capsys):
    """Two small pretend cards (the catalog's are far larger than a shrunk model): each row's
    edge is the predicted one (max_fit's peak fits, min_miss's does not), the dry runs are
    shared, and the estimator's weights + gradients + optimizer states equal the dry run's at
    the optimizer step."""
    import memsweep.sweeper.predict_cards as pc
    from memsweep.estimator.cards import Card
    from memsweep.sweeper.cli import main

    cards = (Card("pretend 1 MiB", "", "", 2**20, "", ""), Card("pretend 3 MiB", "", "", 3 * 2**20, "", ""))
    monkeypatch.setattr(pc, "CARDS", cards)
    w = FAMILIES["llama"]["overrides"]
    load = [
        "workload=hf",
        "workload.config=LlamaConfig",
        "+workload.overrides={" + ", ".join(f"{k}: {v}" for k, v in w.items()) + "}",
        "mode=train",
        "context=16",
        "threads=1",
        f"results_dir={tmp_path}",
    ]
    summary = pc.predict_cards(load, "batch")
    rows = {r["card"]: r for r in summary["cards"]}
    assert summary["source"] == "predicted" and summary["blind_spots"]
    assert rows["pretend 1 MiB"]["max_fit"] < rows["pretend 3 MiB"]["max_fit"]
    for card in cards:
        row = rows[card.name]
        assert row["exact"] and row["min_miss"] == row["max_fit"] + 1 and row["error"] is None
        peaks = {}
        for value in (row["max_fit"], row["min_miss"]):
            record = json.loads(
                (tmp_path / "predict").glob("*").__next__().joinpath(f"batch={value}", "record.json").read_text()
            )
            peaks[value] = max(p["max_memory_allocated"] for p in record["phases"])
        assert peaks[row["max_fit"]] <= card.reported_bytes < peaks[row["min_miss"]]
        assert row["peak_bytes"] == peaks[row["max_fit"]]
        step = next(p for p in record["phases"] if p["name"] == "cold_step.optimizer_step")
        assert row["estimator_fixed_bytes"] == sum(step[k] for k in SPLIT)
        assert isinstance(row["estimator_edge"], int)
    assert main(["predict", *load, "--cards=pretend 1"]) == 0
    printed = capsys.readouterr().out
    assert "pretend 1 MiB" in printed and "pretend 3 MiB" not in printed and "It cannot see" in printed
    assert main(["predict", *load, "--cards=no such card"]) == 2
    assert "--cards" in capsys.readouterr().err
