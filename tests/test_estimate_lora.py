"""LoRA / QLoRA training estimates against hand-computed values for a small Llama, and, where
peft is installed, against peft's own trainable count for the same configs."""

from __future__ import annotations

import json

import pytest

import memsweep.estimator as E
from memsweep.estimator.cli import main as estimate_main
from tests.data.optional import needs_peft

# hidden 256, 4 heads of 64, 2 KV heads (GQA): q/o 256x256, k/v 128x256; MLP 688; 2 layers.
SMALL_LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
SMALL_GPT2 = {"model_type": "gpt2", "n_embd": 128, "n_layer": 2, "n_head": 4, "vocab_size": 1000, "n_positions": 256}


@pytest.fixture()
def llama_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMALL_LLAMA))
    return tmp_path


@pytest.fixture()
def llama(llama_dir):
    return E.describe_config(llama_dir, "parser")


def test_default_targets_are_peft_query_and_value(llama):
    """peft's default for llama is q_proj, v_proj: r (in + out) each, per layer (Hu et al. 2021)."""
    modules = E.lora_targets(llama)
    assert sorted((m.name, m.in_features, m.out_features, m.count) for m in modules) == [
        ("q_proj", 256, 256, 2),
        ("v_proj", 256, 128, 2),
    ]
    r = 8
    by_hand = 2 * (r * (256 + 256) + r * (256 + 128))  # 2 layers x (q + v)
    assert E.lora_parameters(modules, r) == by_hand == 14_336


def test_all_linear_and_explicit_targets(llama):
    r = 4
    per_layer = r * ((256 + 256) * 2 + (256 + 128) * 2 + 3 * (256 + 688))  # q, o; k, v; gate, up, down
    assert E.lora_parameters(E.lora_targets(llama, ["all-linear"]), r) == 2 * per_layer
    # a module path counts by its last component, as peft's suffix match
    assert E.lora_parameters(E.lora_targets(llama, ["self_attn.o_proj", "down_proj"]), r) == 2 * r * (
        (256 + 256) + (688 + 256)
    )


def test_unknown_targets_and_architectures_are_refused(llama):
    with pytest.raises(ValueError, match="c_attn.*q_proj"):
        E.lora_targets(llama, ["c_attn"])
    phi3 = E.TransformerConfig("phi3", 2, 64, 4, 4, 16, 128, 100)
    with pytest.raises(ValueError, match="no default LoRA targets for model_type 'phi3'.*down_proj"):
        E.lora_targets(phi3)


def test_qlora_breakdown_by_hand(llama):
    """nf4 with double quantization: n/2 bytes + one 8-bit scale per 64 values + one fp32 per 256
    scales (Dettmers et al. 2023); embeddings, lm_head and norms stay bf16; fp32 adapters with
    AdamW: 4 B weights + 4 B gradients + 8 B states per adapter parameter, no master copy."""

    def nf4_dq(n):
        blocks = -(-n // 64)
        return n // 2 + blocks + -(-blocks // 256) * 4

    linear = 2 * nf4_dq(256 * 256) + 2 * nf4_dq(128 * 256) + 3 * nf4_dq(688 * 256)
    kept = 2 * (2 * 1000 * 256 + 2 * 2 * 256 + 256)  # embed + lm_head, 4 layer norms + final, bf16
    trainable = 14_336
    lora = E.LoraSettings(rank=8)
    b = E.estimate_lora(llama, lora, base_format=E.storage_format("nf4", double_quant=True))
    assert b.weights == 2 * linear + kept + 4 * trainable
    assert b.gradients == 4 * trainable
    assert b.optimizer_states == 8 * trainable
    assert b.temporaries == 2 * 688 * 256  # the largest 4-bit weight, dequantized to bf16
    assert b.activations is None and b.kv_cache is None
    bf16 = E.estimate_lora(llama, lora, base_format="bf16")
    assert bf16.weights == 2 * llama.parameters + 4 * trainable and bf16.temporaries is None
    int8 = E.estimate_lora(llama, lora, base_format="int8")
    # LLM.int8(): 1 B per value + one fp32 scale per output row of each Linear
    rows = 2 * (256 + 128 + 128 + 256 + 688 + 688 + 256)
    assert int8.weights == (llama.parameters - kept // 2) + 4 * rows + kept + 4 * trainable


def test_sixteen_bit_adapters_get_a_master_copy(llama):
    b = E.estimate_lora(llama, E.LoraSettings(rank=8, adapter_bytes=2))
    assert b.gradients == 2 * 14_336
    assert b.optimizer_states == (4 + 8) * 14_336  # fp32 master copy + fp32 m and v


def test_adapter_activations_by_hand(llama):
    """Stored activations of the base (Korthikanti et al.) are still counted, plus per adapted
    module and token peft's fp32 copy of the input (in x 4 B) and lora_A's output (r x 4 B)."""
    tokens = 2 * 128
    lora = E.LoraSettings(rank=8)
    b = E.estimate_lora(llama, lora, activations=E.ActivationSettings(2, 128))
    base, _ = E.training_activations(llama, E.ActivationSettings(2, 128))
    per_token = 2 * ((256 * 4 + 8 * 4) + (256 * 4 + 8 * 4))  # 2 layers x (q, v)
    assert b.activations == base + tokens * per_token
    drop = E.estimate_lora(llama, E.LoraSettings(rank=8, dropout=0.1), activations=E.ActivationSettings(2, 128))
    assert drop.activations - base == tokens * 2 * 2 * (256 * 5 + 8 * 4)  # dropped copy + 1-byte mask
    same = E.estimate_lora(llama, E.LoraSettings(rank=8, adapter_bytes=2), activations=E.ActivationSettings(2, 128))
    assert same.activations - base == tokens * 2 * 2 * 8 * 2  # no cast copy: only lora_A's output


def test_cli_lora_json(llama_dir, capsys):
    assert (
        estimate_main(
            [
                "--config",
                str(llama_dir),
                "--count-with",
                "parser",
                "--lora-rank",
                "8",
                "--base-format",
                "nf4",
                "--double-quant",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["estimate"]["gradients"] == 4 * 14_336
    assert any("14336 trainable parameters" in n for n in out["notes"])
    assert "QLoRA" in out["title"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--parameters", "1000", "--bits", "16", "--lora-rank", "8"], "needs --config"),
        (["--lora-rank", "8", "--format", "bf16", "--base-format", "nf4"], "not both"),
        (["--lora-rank", "8", "--lora-targets", "c_attn"], "match no Linear"),
        (["--lora-rank", "8", "--zero-stage", "2"], "ZeRO"),
        (["--format", "nf4", "--train"], "--lora-rank"),
    ],
)
def test_cli_lora_refusals(llama_dir, capsys, argv, message):
    if "--parameters" not in argv:
        argv = ["--config", str(llama_dir), "--count-with", "parser", *argv]
    assert estimate_main(argv) == 2
    assert message in capsys.readouterr().err


@needs_peft
def test_trainable_count_equals_peft(tmp_path):
    """peft's own count, for the models transformers builds from the same configs (GPT-2's
    c_attn is a Conv1D), equals memsweep's from the count worker's Linear modules."""
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    paths = []
    for name, cfg in (("llama", SMALL_LLAMA), ("gpt2", SMALL_GPT2)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
        paths.append(tmp_path / name)
    counted = [E.model_from_count(c) for c in E.count_with_transformers(paths)]
    for cfg, model in zip((SMALL_LLAMA, SMALL_GPT2), counted):
        for rank, targets in ((8, None), (4, ["all-linear"])):
            config = transformers.AutoConfig.for_model(**cfg)
            with torch.device("meta"):
                hf = transformers.AutoModelForCausalLM.from_config(config)
            peft_model = get_peft_model(hf, LoraConfig(r=rank, target_modules=targets and targets[0]))
            trainable, _ = peft_model.get_nb_trainable_parameters()
            assert E.lora_parameters(E.lora_targets(model, targets), rank) == trainable, (cfg["model_type"], targets)
