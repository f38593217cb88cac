"""The built-in transformer, its KV cache and the workloads' step code, in-process (no worker).

Memory is read with the worker's own CPU tracker (live tensor storage bytes), so these tests
check the same numbers a run records, without a process per case.
"""

import pytest
import torch

from memsweep.conf.contract import RunSpec
from memsweep.worker.counters import LiveTensorTracker
from memsweep.worker.models import KVCache, Transformer
from memsweep.worker.workloads import DependencyMissing, build_workload, default_loss, make_optimizer

TINY_LM = dict(layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8, ffn_hidden=64, vocab=128)


def _model(**kw):
    torch.manual_seed(0)
    return Transformer(**{**TINY_LM, **kw}).eval()


@pytest.mark.parametrize("ffn, norm", [("gelu", "rmsnorm"), ("swiglu", "layernorm")])
def test_transformer_shapes_and_parameter_count(ffn, norm):
    model = _model(ffn=ffn, norm=norm)
    logits = model(torch.randint(0, 128, (3, 16)))
    assert logits.shape == (3, 16, 128)
    h, q, kv, f, v = 32, 4 * 8, 2 * 8, 64, 128
    norm_params = h if norm == "rmsnorm" else 2 * h
    per_layer = 2 * norm_params + h * q * 2 + h * kv * 2 + (3 if ffn == "swiglu" else 2) * h * f
    assert sum(p.numel() for p in model.parameters()) == v * h + 2 * per_layer + norm_params + h * v


def test_tied_embeddings_share_one_tensor():
    model = _model(tie_embeddings=True)
    assert model.head.weight is model.embed.weight


def test_eager_and_sdpa_compute_the_same_attention():
    ids = torch.randint(0, 128, (2, 12))
    sdpa, eager = _model(attention="sdpa"), _model(attention="eager")
    eager.load_state_dict(sdpa.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(sdpa(ids), eager(ids), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_decoding_with_the_kv_cache_matches_the_full_forward(attention, kind):
    """Prefill of 10 tokens then 4 one-token steps gives the logits of a 14-token forward."""
    model = _model(attention=attention)
    ids = torch.randint(0, 128, (2, 14))
    with torch.no_grad():
        full = model(ids)
        cache = KVCache(2, kind, capacity=14)
        steps = [model(ids[:, :10], cache, 0, last_only=True)]
        for i in range(10, 14):
            steps.append(model(ids[:, i : i + 1], cache, i, last_only=True))
    torch.testing.assert_close(torch.cat(steps[1:], dim=1), full[:, 10:14], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(steps[0][:, 0], full[:, 9], rtol=1e-4, atol=1e-4)
    assert cache.length == 14
    # 2 (K and V) x layers x kv_heads x head_dim x tokens x 4 bytes x batch
    assert cache.nbytes() == 2 * 2 * 2 * 8 * 14 * 4 * 2


def _peak(fn) -> int:
    tracker = LiveTensorTracker()
    with tracker:
        base = tracker.live
        fn()
    return tracker.peak - base


def test_eager_attention_peak_grows_faster_with_context_than_sdpa():
    """eager materialises (batch, heads, T, T) scores: quadratic in T; sdpa's fused kernel does not."""
    growth = {}
    for attention in ("sdpa", "eager"):
        model = _model(attention=attention, kv_heads=4)
        peaks = []
        for t in (32, 128):
            ids = torch.randint(0, 128, (1, t))
            with torch.inference_mode():
                peaks.append(_peak(lambda model=model, ids=ids: model(ids)))
        growth[attention] = peaks[1] - peaks[0]
    assert growth["eager"] > 2 * growth["sdpa"], growth


def _spec(**kw):
    base = dict(
        batch=2,
        context=16,
        width=32,
        mode="train",
        device="cpu",
        warmup=0,
        repeats=1,
        workload={"name": "transformer", **{k: v for k, v in TINY_LM.items() if k != "hidden"}},
    )
    return RunSpec.from_dict({**base, **kw})


def _workload(**kw):
    w = build_workload(_spec(**kw), torch.device("cpu"))
    w.prepare()
    w.model_load()
    w.inputs()
    return w


@pytest.mark.parametrize("optimizer, states_per_param", [("adamw", 2), ("sgd", 0)])
def test_optimizer_states_appear_in_the_first_step_only(optimizer, states_per_param):
    w = _workload(optimizer=optimizer)
    param_bytes = w.model_info()["parameter_bytes"]
    assert w.optimizer_state_bytes()["optimizer_state_bytes"] == 0
    w.train_step()
    first = w.optimizer_state_bytes()["optimizer_state_bytes"]
    # AdamW: exp_avg and exp_avg_sq like each parameter, plus a 4-byte step per parameter tensor
    n_tensors = len(list(w.model.parameters()))
    expected = states_per_param * param_bytes + (4 * n_tensors if states_per_param else 0)
    assert first == expected
    w.train_step()
    assert w.optimizer_state_bytes()["optimizer_state_bytes"] == first


def test_adafactor_states_are_smaller_than_adamw():
    w = _workload(optimizer="adafactor")
    w.train_step()
    assert 0 < w.optimizer_state_bytes()["optimizer_state_bytes"] < w.model_info()["parameter_bytes"]


def test_adamw8bit_without_bitsandbytes_names_the_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_bnb(name, *a, **k):
        if name == "bitsandbytes":
            raise ImportError("No module named 'bitsandbytes'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_bnb)
    with pytest.raises(DependencyMissing, match="pip install bitsandbytes"):
        make_optimizer("adamw8bit", [torch.nn.Parameter(torch.zeros(2))])


def test_gradient_accumulation_sums_micro_step_gradients():
    """Two micro-steps of loss / 2 on the same batch give the gradient of one full step."""
    one, two = _workload(optimizer="sgd"), _workload(optimizer="sgd", micro_steps=2)
    for w in (one, two):
        for m in range(w.spec.micro_steps):
            w.step_forward(m)
            w.step_loss(m)
            w.step_backward(m)
    for p1, p2 in zip(one.model.parameters(), two.model.parameters()):
        torch.testing.assert_close(p1.grad, p2.grad, rtol=1e-5, atol=1e-6)


def test_checkpointing_keeps_gradients_and_saves_activation_memory():
    plain, ckpt = _workload(optimizer="sgd"), _workload(optimizer="sgd", checkpointing=True)
    kept = {}
    for name, w in (("plain", plain), ("ckpt", ckpt)):
        tracker = LiveTensorTracker()
        with tracker:
            before = tracker.live
            w.step_forward(0)
            kept[name] = tracker.live - before  # activations saved for backward, and the logits
            w.step_loss(0)
            w.step_backward(0)
    assert kept["ckpt"] < kept["plain"]
    for p1, p2 in zip(plain.model.parameters(), ckpt.model.parameters()):
        torch.testing.assert_close(p1.grad, p2.grad, rtol=1e-5, atol=1e-6)


def test_autocast_keeps_float32_weights_and_a_bfloat16_kv_cache():
    w = _workload(mode="generate", dtype="bfloat16", precision="autocast", new_tokens=3, kv_cache="static")
    assert {p.dtype for p in w.model.parameters()} == {torch.float32}
    w.gen_prefill()
    w.gen_decode()
    info = w.kv_cache_info()
    assert {t.dtype for t in w.cache.tensors()} == {torch.bfloat16}
    assert info == {"kv_cache_bytes": 2 * 2 * 2 * 8 * (16 + 3) * 2 * 2, "kv_cache_tokens": 19}
    w.end_generation()
    assert w.cache is None


def test_pure_bfloat16_training_keeps_everything_in_bfloat16():
    w = _workload(dtype="bfloat16", precision="pure")
    w.train_step()
    assert {p.dtype for p in w.model.parameters()} == {torch.bfloat16}
    states = [v for s in w.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert states and {t.dtype for t in states} == {torch.bfloat16}


def test_user_workload_example_runs_every_train_sub_phase():
    spec = RunSpec.from_dict(
        dict(
            batch=2,
            context=8,
            width=4,
            mode="train",
            device="cpu",
            eval_batch=3,
            workload={
                "name": "user",
                "model": {"_target_": "memsweep.conf.examples.convnet.build_model", "blocks": 2},
                "inputs": {"_target_": "memsweep.conf.examples.convnet.make_inputs"},
                "loss": {"_target_": "memsweep.conf.examples.convnet.loss"},
            },
        )
    )
    w = build_workload(spec, torch.device("cpu"))
    w.prepare()
    w.model_load()
    w.inputs()
    assert w.x.shape == (2, 3, 8, 8) and w.target.shape == (2,)
    w.train_step()
    assert w.gradient_bytes()["gradient_bytes"] == w.model_info()["parameter_bytes"]
    w.evaluate()
    assert w.model.training


def test_user_workload_with_a_bad_target_names_the_field():
    spec = RunSpec.from_dict(
        dict(
            batch=1,
            context=4,
            width=4,
            workload={
                "name": "user",
                "model": {"_target_": "memsweep.conf.examples.convnet.nothing_here"},
                "inputs": {"_target_": "memsweep.conf.examples.convnet.make_inputs"},
            },
        )
    )
    with pytest.raises(AttributeError, match="workload.model._target_"):
        build_workload(spec, torch.device("cpu")).prepare()


def test_default_loss():
    out = torch.randn(4, 5, requires_grad=True)
    assert default_loss(out.sum(), None).dim() == 0
    assert torch.isclose(
        default_loss(out, torch.tensor([0, 1, 2, 3])),
        torch.nn.functional.cross_entropy(out, torch.tensor([0, 1, 2, 3])),
    )
    assert torch.isclose(default_loss(out, torch.zeros(4, 5)), out.pow(2).mean())
    assert torch.isclose(default_loss((out,), None), out.pow(2).mean())
