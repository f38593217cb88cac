"""Exact sizes for public architectures: transformers' own count (the model built on the meta
device in a worker process) against the published parameter counts, memsweep's formula
parser against that count, the parser's refusals, and the KV cache per layer kind against a
measured CPU ``generate`` run of 2-layer variants.

The configs are written from the published config.json numbers (tests/data/published_configs.py);
nothing is downloaded. One worker process counts all twelve (a few seconds).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

import memsweep.estimator as E
from memsweep.conf.contract import RunSpec
from memsweep.sweeper.process import execute
from tests.data.optional import needs_transformers
from tests.data.published_configs import MIXTRAL_8X7B, PUBLISHED

MOE_OR_MLA = {"Mixtral-8x7B", "Qwen3-30B-A3B", "gpt-oss-20b", "DeepSeek-V2-Lite"}


def _write(root, name, cfg):
    d = root / name.replace(" ", "_").replace("(", "").replace(")", "")
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(scope="module")
def counted(tmp_path_factory):
    root = tmp_path_factory.mktemp("configs")
    paths = {name: _write(root, name, cfg) for name, (cfg, _, _) in PUBLISHED.items()}
    counts = E.count_with_transformers(list(paths.values()))
    return {name: E.model_from_count(c) for name, c in zip(paths, counts)}


def test_the_table_covers_twelve_architectures():
    assert len(PUBLISHED) >= 12
    assert len({cfg["model_type"] for cfg, _, _ in PUBLISHED.values()}) >= 11


@needs_transformers
@pytest.mark.parametrize("name", list(PUBLISHED))
def test_transformers_count_equals_the_published_count(counted, name):
    _, total, _ = PUBLISHED[name]
    model = counted[name]
    assert model.parameters == total
    assert model.source.startswith("transformers ")


@needs_transformers
def test_mixture_of_experts_total_and_active(counted):
    """Mixtral-8x7B: 46,702,792,704 parameters; a token uses 2 of 8 experts: 12,879,925,248."""
    mixtral = counted["Mixtral-8x7B"]
    assert (mixtral.parameters, mixtral.active) == (46_702_792_704, 12_879_925_248)
    assert (mixtral.experts, mixtral.experts_per_token) == (8, 2)
    # active = everything outside the routed experts + 2/8 of the experts, by formula
    per_expert = 3 * 4096 * 14336
    assert mixtral.parameters - mixtral.active == 32 * (8 - 2) * per_expert
    for name in MOE_OR_MLA:
        assert counted[name].experts and counted[name].active < counted[name].parameters
    b = E.estimate_transformer(mixtral, train=True, optimizer="adamw")
    assert b.gradients == 2 * 46_702_792_704  # every expert is trained: from the total
    assert any("12879925248 active" in n for n in b.notes)


@needs_transformers
def test_tied_weights_are_counted_once(counted):
    """Gemma's config class ties lm_head to the embedding when the key is absent: 2,506,172,416,
    not 2,506,172,416 + 256000 x 2048."""
    for name in ("Llama-3.2-1B", "Gemma-2B (no tie key)", "Gemma-3-1B", "GPT-2"):
        assert counted[name].tie_embeddings, name
    assert not counted["Llama-3-8B"].tie_embeddings


@needs_transformers
@pytest.mark.parametrize("name", [n for n in PUBLISHED if n not in MOE_OR_MLA])
def test_the_formula_parser_equals_transformers_on_dense_models(counted, name):
    cfg, _, _ = PUBLISHED[name]
    parsed = E.parse_hf_config(cfg)
    assert parsed.parameters == counted[name].parameters
    assert parsed.cached_values_per_token == counted[name].cached_values_per_token
    assert parsed.kv_layer_tokens(8192) == counted[name].kv_layer_tokens(8192)


@pytest.mark.parametrize(
    "name, key",
    [
        ("Mixtral-8x7B", "num_local_experts"),
        ("Qwen3-30B-A3B", "num_experts"),
        ("gpt-oss-20b", "num_local_experts"),
        ("DeepSeek-V2-Lite", "kv_lora_rank"),
    ],
)
def test_the_parser_refuses_what_it_does_not_model_by_name(name, key):
    cfg, _, _ = PUBLISHED[name]
    with pytest.raises(E.UnknownConfig, match=key):
        E.parse_hf_config(cfg)


def test_the_parser_refuses_unknown_layer_kinds_and_model_types():
    with pytest.raises(E.UnknownConfig, match="linear_attention"):
        E.parse_hf_config({**PUBLISHED["Llama-3-8B"][0], "layer_types": ["linear_attention", "full_attention"]})
    with pytest.raises(E.UnknownConfig, match="'falcon'"):
        E.parse_hf_config({**PUBLISHED["Llama-3-8B"][0], "model_type": "falcon"})


def test_cli_parser_fallback_refuses_mixtral(tmp_path, capsys):
    from memsweep.estimator.cli import main

    (tmp_path / "config.json").write_text(json.dumps(MIXTRAL_8X7B))
    assert main(["--config", str(tmp_path), "--count-with", "parser"]) == 2
    assert "num_local_experts" in capsys.readouterr().err


def test_kv_conventions_per_layer_kind():
    """gpt-oss-20b: 12 sliding layers of window 128 and 12 full layers, 8 KV heads x 64, bf16,
    8192 tokens. window: 12 x 128 + 12 x 8192 tokens; full: 24 x 8192."""
    # the attention of gpt-oss-20b on a dense llama-style body (the parser refuses the experts)
    model = E.parse_hf_config({**PUBLISHED["gpt-oss-20b"][0], "model_type": "llama", "num_local_experts": None})
    per_token_layer = 2 * 8 * 64 * 2
    window = E.estimate_transformer(model, kv_tokens=8192)
    full = E.estimate_transformer(model, kv_tokens=8192, kv_convention="full")
    assert window.kv_cache == (12 * 128 + 12 * 8192) * per_token_layer
    assert full.kv_cache == 24 * 8192 * per_token_layer
    assert "window convention" in window.notes[-1] and "12 layers window 128" in window.notes[-1]
    with pytest.raises(ValueError, match="convention"):
        E.estimate_transformer(model, kv_tokens=8192, kv_convention="paged")


# 2-layer variants, measured in memsweep's generate mode on the CPU (float32, batch 2,
# 16 prompt tokens + 4 decoded): the estimate of the same config must equal the measured
# kv_cache_bytes (the storages of transformers' cache).
SHRUNK = {
    "Llama-3-8B": {"hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2},
    "Gemma-3-1B": {
        "hidden_size": 64,
        "intermediate_size": 64,
        "head_dim": 16,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    "DeepSeek-V2-Lite": {
        "hidden_size": 64,
        "intermediate_size": 64,
        "moe_intermediate_size": 16,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
    },
}


@needs_transformers
def test_kv_bytes_equal_a_measured_cpu_generate_run(tmp_path):
    paths, specs = {}, {}
    for name, shrink in SHRUNK.items():
        cfg = {**PUBLISHED[name][0], **shrink, "num_hidden_layers": 2, "vocab_size": 128}
        paths[name] = _write(tmp_path, name, cfg)
        specs[name] = RunSpec.from_dict(
            dict(
                batch=2,
                context=16,
                width=8,
                dtype="float32",
                device="cpu",
                mode="generate",
                new_tokens=4,
                warmup=0,
                repeats=1,
                timeout_s=300,
                threads=1,
                workload={"name": "hf", "config": str(paths[name] / "config.json")},
            )
        )
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = {n: pool.submit(execute, s, tmp_path / f"run_{i}") for i, (n, s) in enumerate(specs.items())}
        counts = E.count_with_transformers(list(paths.values()))
        results = {n: f.result() for n, f in runs.items()}
    for (name, path), count in zip(paths.items(), counts):
        assert results[name]["outcome"] == "ok", results[name]
        record = json.loads((path.parent / f"run_{list(paths).index(name)}" / "record.json").read_text())
        decode = next(p for p in record["phases"] if p["name"] == "cold_generate.decode")
        model = E.model_from_count(count)
        est = E.estimate_transformer(model, compute_bytes=4, kv_tokens=16 + 4, kv_sequences=2)
        assert est.kv_cache == decode["kv_cache_bytes"], name
        if name == "Gemma-3-1B":  # the sliding layer holds its 8-token window, the full one all 20
            assert model.kv_layer_tokens(20) == [8, 20]
        if name == "DeepSeek-V2-Lite":  # latent attention caches kv_lora_rank + rope dims
            assert model.cached_values_per_token == 16 + 8
