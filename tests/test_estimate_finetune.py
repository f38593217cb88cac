"""An hf run's estimate with LoRA adapters or a 4-bit base (estimator/finetune.py): the
frozen base, fp32 adapters and the adapters' training state only, as the worker trains them
(tests/test_finetune.py measures the same figures); never the full fine-tuning figures. Every
expected value is derived here from the config's shapes and the rank; no worker runs."""

from __future__ import annotations

import pytest

import memsweep.estimator as E
from memsweep.conf.contract import RunSpec
from memsweep.estimator.finetune import base_formats, lora_settings
from memsweep.estimator.hf_load import estimate_hf_load

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, VOCAB = 64, 160, 2, 4, 2, 256
CONFIG = {
    "model_type": "llama",
    "hidden_size": HIDDEN,
    "intermediate_size": FFN,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "vocab_size": VOCAB,
    "tie_word_embeddings": False,
}
KV = KV_HEADS * HIDDEN // HEADS  # k_proj / v_proj outputs (head_dim 16)
SHAPES = {  # (in, out) of each Linear of a decoder layer
    "q_proj": (HIDDEN, HIDDEN),
    "k_proj": (HIDDEN, KV),
    "v_proj": (HIDDEN, KV),
    "o_proj": (HIDDEN, HIDDEN),
    "gate_proj": (HIDDEN, FFN),
    "up_proj": (HIDDEN, FFN),
    "down_proj": (FFN, HIDDEN),
}
LINEAR = LAYERS * sum(i * o for i, o in SHAPES.values())  # the decoder Linear weights
OTHERS = 2 * VOCAB * HIDDEN + (2 * LAYERS + 1) * HIDDEN  # embeddings, lm_head, RMSNorms
MODEL = E.parse_hf_config(CONFIG)


def _adapters(rank: int, targets) -> int:
    """r x (in + out) per adapted Linear, per layer (Hu et al. 2021, Sec. 4.1)."""
    return LAYERS * sum(rank * sum(SHAPES[t]) for t in targets)


def _spec(device="cpu", dtype="float32", **workload) -> RunSpec:
    load = {"name": "hf", "config": "LlamaConfig", "overrides": {"hidden_size": HIDDEN}, **workload}
    return RunSpec.from_dict(
        dict(batch=2, context=16, width=32, dtype=dtype, mode="train", device=device, workload=load)
    )


def test_the_shapes_here_are_the_parsers():
    assert MODEL.parameters == LINEAR + OTHERS
    assert {m.name: (m.in_features, m.out_features) for m in MODEL.linear_modules()} == SHAPES


@pytest.mark.parametrize(
    "rank, targets, expected",
    [(4, None, ("q_proj", "v_proj")), (8, ["q_proj", "k_proj", "v_proj", "o_proj"], None), (2, "all-linear", None)],
)
def test_a_lora_runs_training_state_is_the_adapters(rank, targets, expected):
    """fp32 adapters (peft's autocast_adapter_dtype) on a bfloat16 base: gradients 4 B and AdamW's
    two fp32 states 8 B per adapter value, plus on the CPU a 4-byte step per adapter tensor (A and
    B of each adapted Linear), as tests/test_finetune.py measures; weights: the base in bf16 and
    the adapters in fp32."""
    names = expected or (list(SHAPES) if targets == "all-linear" else targets)
    n = _adapters(rank, names)
    tensors = 2 * LAYERS * len(names)
    for device, steps in (("cpu", 4 * tensors), ("cuda", 0)):  # CUDA's default AdamW keeps step on the host
        spec = _spec(device, "bfloat16", lora_rank=rank, lora_targets=targets)
        est, reason = E.estimate_lm_run(MODEL, spec.to_dict())
        assert reason is None
        assert est.gradients == 4 * n
        assert est.optimizer_states == 8 * n + steps
        assert est.weights == 2 * (LINEAR + OTHERS) + 4 * n
        assert est.activations > 0 and est.temporaries is None
        # predict and --cards read the same figures (estimate_hf_load on the recorded config)
        load = estimate_hf_load(CONFIG, spec)
        assert (load.weights, load.gradients, load.optimizer_states) == (
            est.weights,
            est.gradients,
            est.optimizer_states,
        )
    full, _ = E.estimate_lm_run(MODEL, _spec(lora_rank=None).to_dict())
    assert full.gradients == 4 * (LINEAR + OTHERS) > 4 * n  # what a LoRA run must not show


def test_the_workloads_lora_fields_reach_the_settings():
    spec = _spec(lora_rank=16, lora_alpha=32, lora_dropout=0.1, lora_targets=["q_proj"])
    assert lora_settings(spec.workload) == E.LoraSettings(16, 32, ("q_proj",), 0.1, 4)
    assert lora_settings(_spec().workload) is None


def test_a_4bit_base_stores_the_linear_weights_in_nf4():
    """bitsandbytes' defaults (BitsAndBytesConfig: blocks of 64, an fp32 absmax per block, no
    double quantization): n/2 bytes + 4 B per 64 values for each decoder Linear weight; the other
    tensors in dtype, upcast to fp32 for LoRA training (prepare_model_for_kbit_training)."""
    linear = LINEAR // 2 + 4 * LINEAR // 64  # every Linear here holds a multiple of 64 values
    qlora = _spec(dtype="bfloat16", lora_rank=8, pretrained="/ckpt", quantization="nf4").to_dict()
    assert [f.name for f in base_formats(qlora)] == ["nf4", "fp32"]
    est, reason = E.estimate_lm_run(MODEL, qlora)
    n = _adapters(8, ("q_proj", "v_proj"))
    assert reason is None and est.weights == linear + 4 * OTHERS + 4 * n
    assert (est.gradients, est.optimizer_states) == (4 * n, 8 * n + 4 * 2 * LAYERS * 2)
    assert est.temporaries == 2 * HIDDEN * FFN  # the largest Linear dequantized to bf16 (MatMul4Bit)
    inference = {**qlora, "mode": "inference", "workload": {**qlora["workload"], "lora_rank": None}}
    est, _ = E.estimate_lm_run(MODEL, inference)
    assert est.weights == linear + 2 * OTHERS and est.gradients is None


def test_a_lora_estimate_that_cannot_be_made_is_null_with_the_reason():
    """No peft default for the architecture: peft refuses it without targets; the estimate is null
    with the reason, never the full fine-tuning figures."""
    count = {
        "config": {**CONFIG, "model_type": "mymodel"},
        "tensors": [
            {"kind": t.name, "shape": list(t.shape), "quantizable": t.quantizable, "count": 1} for t in MODEL.tensors()
        ],
        "linears": [
            {"name": m.name, "in": m.in_features, "out": m.out_features, "count": m.count}
            for m in MODEL.linear_modules()
        ],
        "source": "a hand-written count",
    }
    est, reason = E.estimate_run(_spec(lora_rank=8), count)
    assert est is None and "no default LoRA targets for model_type 'mymodel'" in reason
    est, reason = E.estimate_run(_spec(lora_rank=8, lora_targets=["q_proj"]), count)
    assert reason is None and est.gradients == 4 * _adapters(8, ["q_proj"])
    with pytest.raises(ValueError, match="match no Linear module"):
        estimate_hf_load(CONFIG, _spec(lora_rank=8, lora_targets=["qkv_proj"]))
