"""The KV cache of every attention layout: transformers' own cache (a meta-device forward in the
counting worker) against a measured CPU ``generate`` run of tiny configs, to the byte; the
config-flag reading and its refusals; Falcon-7B's published per-token figure."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

import memsweep.estimator as E
from memsweep.conf.contract import RunSpec
from memsweep.estimator.attention import UnknownAttention, read_attention
from memsweep.estimator.cli import main as estimate_main
from memsweep.sweeper.process import execute
from tests.data.kv_layouts import FALCON_7B, FALCON_7B_KV_BYTES_PER_TOKEN, QWEN3_NEXT_TINY, TINY_LAYOUTS
from tests.data.optional import needs_transformers

EAGER = {"gemma2 hybrid": "eager"}
"""Layouts whose transformers model has no sdpa attention here."""


def _write(root, name, cfg):
    d = root / name.replace(" ", "_")
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _spec(path, attention="sdpa"):
    return RunSpec.from_dict(
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
            workload={"name": "hf", "config": str(path / "config.json"), "attention": attention},
        )
    )


@needs_transformers
def test_every_layout_equals_a_measured_cpu_generate_run(tmp_path):
    """batch 2, 16 prompt tokens + 4 decoded, float32: the estimate of each tiny config equals
    the storages of transformers' cache measured after the decode, and names its layout."""
    paths = {name: _write(tmp_path, name, cfg) for name, (cfg, _) in TINY_LAYOUTS.items()}
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = {
            n: pool.submit(execute, _spec(p, EAGER.get(n, "sdpa")), tmp_path / f"run_{i}")
            for i, (n, p) in enumerate(paths.items())
        }
        counts = E.count_with_transformers(list(paths.values()))
        results = {n: f.result() for n, f in runs.items()}
    for i, (name, count) in enumerate(zip(paths, counts)):
        assert results[name]["outcome"] == "ok", (name, results[name])
        record = json.loads((tmp_path / f"run_{i}" / "record.json").read_text())
        decode = next(p for p in record["phases"] if p["name"] == "cold_generate.decode")
        model = E.model_from_count(count)
        est = E.estimate_transformer(model, compute_bytes=4, kv_tokens=16 + 4, kv_sequences=2)
        assert est.kv_cache == decode["kv_cache_bytes"], name
        attention = EAGER.get(name, "sdpa")
        assert E.estimate_run(_spec(paths[name], attention), count)[0].kv_cache == est.kv_cache  # the sweeper's
        assert model.kv_layout.startswith(TINY_LAYOUTS[name][1]), (name, model.kv_layout)
        assert est.notes[-1].count(TINY_LAYOUTS[name][1]) == 1
    multi_query = E.model_from_count(counts[0])
    assert multi_query.layer_values() == [2 * 1 * 16] * 2
    assert "multi-query (multi_query: true): 1 K/V head" in multi_query.kv_layout
    shared = E.model_from_count(counts[list(paths).index("gemma3n shared cache")])
    assert shared.layer_values().count(0) == 2  # the last 2 layers read an earlier layer's cache


@needs_transformers
def test_falcon_7b_equals_the_published_per_token_figure(tmp_path):
    model = E.describe_config(_write(tmp_path, "falcon-7b", FALCON_7B), "transformers")
    assert E.kv_cache_estimate(model, 1, 1, 2)[0] == FALCON_7B_KV_BYTES_PER_TOKEN
    assert E.kv_cache_estimate(model, 4096, 3, 2)[0] == 3 * 4096 * FALCON_7B_KV_BYTES_PER_TOKEN


@needs_transformers
def test_a_cache_with_layers_other_than_kv_has_no_kv_figure(tmp_path, capsys):
    """Linear-attention layers keep a recurrent state, not K/V per token: null, with the reason."""
    path = _write(tmp_path, "qwen3-next", QWEN3_NEXT_TINY)
    out = ["--config", str(path), "--count-with", "transformers", "--kv-tokens", "64", "--json"]
    assert estimate_main(out) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["estimate"]["kv_cache"] is None
    assert any("LinearAttentionLayer" in n and "not K/V only" in n for n in answer["notes"])


def test_the_flags_reading_of_falcon_7b_equals_the_published_figure():
    layout = read_attention(FALCON_7B, 71, 64)
    assert layout.describe() == "multi-query (multi_query: true): 1 K/V head"
    assert 32 * layout.values_per_token * 2 == FALCON_7B_KV_BYTES_PER_TOKEN


@pytest.mark.parametrize(
    ("cfg", "kind", "kv_heads", "values"),
    [
        ({"num_key_value_heads": 8}, "grouped-query", 8, 2 * 8 * 64),
        ({"num_key_value_heads": None}, "multi-head", 32, 2 * 32 * 64),
        ({}, "multi-head", 32, 2 * 32 * 64),
        ({"num_kv_heads": 4}, "grouped-query", 4, 2 * 4 * 64),
        ({"n_head_kv": 1}, "multi-query", 1, 2 * 64),
        ({"multi_query": True}, "multi-query", 1, 2 * 64),
        ({"model_type": "falcon", "new_decoder_architecture": True, "num_kv_heads": 8}, "multi-head", 32, 2 * 32 * 64),
        ({"model_type": "mpt", "attn_config": {"kv_n_heads": 2}}, "grouped-query", 2, 2 * 2 * 64),
        ({"kv_lora_rank": 512, "qk_rope_head_dim": 64}, "latent", 1, 576),
    ],
)
def test_the_flags_reading_per_layout(cfg, kind, kv_heads, values):
    layout = read_attention(cfg, 32, 64)
    assert (layout.kind, layout.kv_heads, layout.values_per_token) == (kind, kv_heads, values)


@pytest.mark.parametrize(
    ("cfg", "named"),
    [
        ({"attention_chunk_size": 8192}, "attention_chunk_size"),
        ({"kv_channels": 128}, "kv_channels"),
        ({"num_key_value_heads": 5}, "num_key_value_heads"),
        ({"num_key_value_heads": 0}, "num_key_value_heads"),
    ],
)
def test_a_layout_not_understood_is_refused_by_name(cfg, named):
    with pytest.raises(UnknownAttention, match=named):
        read_attention(cfg, 32, 64)


def test_the_parser_refuses_a_layout_it_does_not_understand(tmp_path, capsys):
    cfg = {**TINY_LAYOUTS["llama grouped"][0], "num_key_value_heads": 3}
    assert (
        estimate_main(["--config", str(_write(tmp_path, "odd", cfg)), "--count-with", "parser", "--kv-tokens", "8"])
        == 2
    )
    assert "num_key_value_heads" in capsys.readouterr().err


def test_a_counted_model_without_a_cache_probe_or_known_flags_has_no_kv_figure():
    count = {
        "config": {**TINY_LAYOUTS["llama grouped"][0], "num_hidden_layers": 2, "local_attn_blocks": 4},
        "kv_layout": {"error": "the meta-device forward failed: NotImplementedError"},
        "tensors": [],
        "source": "test",
    }
    model = E.model_from_count(count)
    kv, note = E.kv_cache_estimate(model, 8, 1, 2)
    assert kv is None and "local_attn_blocks" in note and "NotImplementedError" in note
    b = E.estimate_transformer(model, kv_tokens=8)
    assert b.kv_cache is None
