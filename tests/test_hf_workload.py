"""The hf workload in-process: a GPT-2 and a Llama-style config, random weights, no download.

Skipped (with the reason) where transformers is not installed: ``pip install 'memsweep[hf]'``.
The message a user gets without it is tested everywhere.
"""

import builtins
import json

import pytest
import torch

from memsweep.conf.contract import RunSpec
from memsweep.worker.workloads import DependencyMissing, build_workload
from tests.data.loads import TINY_HF_GPT2, TINY_HF_LLAMA
from tests.data.optional import needs_transformers


def _workload(workload, **kw):
    spec = RunSpec.from_dict({"batch": 2, "context": 16, "width": 32, "device": "cpu", "workload": workload, **kw})
    w = build_workload(spec, torch.device("cpu"))
    w.prepare()
    w.model_load()
    w.inputs()
    return w


def test_missing_transformers_names_the_extra(monkeypatch):
    real_import = builtins.__import__

    def no_transformers(name, *a, **k):
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError("No module named 'transformers'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    spec = RunSpec.from_dict({"batch": 1, "context": 8, "width": 8, "workload": TINY_HF_GPT2})
    with pytest.raises(DependencyMissing, match=r"pip install 'memsweep\[hf\]'"):
        build_workload(spec, torch.device("cpu")).prepare()


@needs_transformers
@pytest.mark.parametrize(
    "workload, kv_heads, kv_cache",
    [(TINY_HF_GPT2, 4, "dynamic"), (TINY_HF_LLAMA, 2, "dynamic"), (TINY_HF_LLAMA, 2, "static")],
)
def test_generate_kv_cache_bytes_follow_the_formula(workload, kv_heads, kv_cache):
    w = _workload(workload, mode="generate", new_tokens=3, kv_cache=kv_cache)
    w.gen_prefill()
    per_token = 2 * 2 * kv_heads * 8 * 4 * 2  # 2 (K, V) x layers x kv_heads x head_dim x 4 bytes x batch
    capacity = 16 + 3
    assert w.kv_cache_info() == {
        "kv_cache_bytes": per_token * (capacity if kv_cache == "static" else 16),
        "kv_cache_tokens": 16,
    }
    w.gen_decode()
    assert w.kv_cache_info() == {"kv_cache_bytes": per_token * capacity, "kv_cache_tokens": capacity}
    dims = w.model_info()["dims"]
    assert (dims["layers"], dims["kv_heads"], dims["head_dim"]) == (2, kv_heads, 8)


@needs_transformers
def test_train_step_with_checkpointing_eval_and_export(tmp_path):
    w = _workload(TINY_HF_LLAMA, mode="train", checkpointing=True, eval_batch=3, export=True)
    w.run_dir = tmp_path
    assert getattr(w.model, "is_activation_checkpointing", None) or w.model.is_gradient_checkpointing
    w.train_step()
    assert w.gradient_bytes()["gradient_bytes"] == w.model_info()["parameter_bytes"]
    assert w.optimizer_state_bytes()["optimizer_state_bytes"] > 2 * w.model_info()["parameter_bytes"]
    w.evaluate()
    w.export()
    assert w.export_bytes > w.model_info()["parameter_bytes"] and not list(tmp_path.iterdir())


@needs_transformers
def test_local_config_json_and_eager_attention(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 64}))
    w = _workload({"name": "hf", "config": str(path), "overrides": {"n_positions": 32}, "attention": "eager"})
    assert w.model.config._attn_implementation == "eager" and w.model.config.n_positions == 32
    w.forward()


@needs_transformers
def test_context_beyond_the_model_positions_is_refused_before_any_phase():
    spec = RunSpec.from_dict(
        {"batch": 1, "context": 60, "width": 8, "mode": "generate", "new_tokens": 8, "workload": TINY_HF_GPT2}
    )
    with pytest.raises(ValueError, match="68 tokens .* 64 positions"):
        build_workload(spec, torch.device("cpu")).prepare()
