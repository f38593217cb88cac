"""Fine-tuning loads (issue #19): LoRA through peft, a local checkpoint through from_pretrained,
QLoRA's 4-bit base through bitsandbytes, and the refusals of every bad combination before any
worker starts. Tiny Llama (2 layers, hidden 64) on the CPU; nothing is downloaded: checkpoints are
written with save_pretrained into tmp_path.
"""

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from memsweep.conf.contract import RunSpec, SpecError
from memsweep.sweeper.spec import spec_from_config
from memsweep.worker.workloads import build_workload
from tests.data.loads import MEMSWEEP
from tests.data.optional import needs_bnb, needs_peft

HIDDEN, HEADS, KV_HEADS, LAYERS, VOCAB = 64, 4, 2, 2, 256
OVERRIDES = {
    "num_hidden_layers": LAYERS,
    "hidden_size": HIDDEN,
    "intermediate_size": 128,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "vocab_size": VOCAB,
    "max_position_embeddings": 64,
}
LLAMA = {"name": "hf", "config": "LlamaConfig", "overrides": OVERRIDES}
BASE = {"batch": 2, "context": 16, "width": 64, "device": "cpu", "warmup": 1, "repeats": 1}


def _config(**kw):
    """A composed config as spec_from_config reads it (a plain mapping)."""
    return {**BASE, "mode": "train", "workload": dict(LLAMA), **kw}


def _step(workload, **kw):
    """A workload after model_load, inputs and one whole training step (in-process)."""
    spec = RunSpec.from_dict({**BASE, "mode": "train", "workload": workload, **kw})
    w = build_workload(spec, torch.device("cpu"))
    w.prepare()
    w.model_load()
    w.inputs()
    w.train_step()
    return w


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Llama saved with save_pretrained (config.json + model.safetensors) and its state."""
    import transformers

    torch.manual_seed(123)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**OVERRIDES))
    directory = tmp_path_factory.mktemp("ckpt")
    model.save_pretrained(directory)
    return directory, {k: v.clone() for k, v in model.state_dict().items()}


# ----- refused before any worker starts, naming the field ------------------------------------
@pytest.mark.parametrize(
    "kw, field",
    [
        ({"mode": "inference", "workload": {**LLAMA, "lora_rank": 8}}, "workload.lora_rank"),
        ({"mode": "generate", "workload": {**LLAMA, "lora_rank": 8}}, "workload.lora_rank"),
        ({"workload": {**LLAMA, "pretrained": "/nonexistent/checkpoint"}}, "workload.pretrained"),
        ({"workload": {**LLAMA, "quantization": "nf4", "lora_rank": 8}}, "workload.quantization"),
        ({"workload": {**LLAMA, "lora_alpha": 16}}, "workload.lora_alpha"),
        ({"workload": {**LLAMA, "lora_rank": 0}}, "workload.lora_rank"),
        ({"workload": {**LLAMA, "lora_dropout": 1.0, "lora_rank": 8}}, "workload.lora_dropout"),
        ({"workload": {**LLAMA, "lora_targets": "q_proj", "lora_rank": 8}}, "workload.lora_targets"),
        ({"workload": {**LLAMA, "quantization": "int3"}}, "workload.quantization"),
        ({"mode": "generate", "compile": "default"}, "compile"),
        ({"compile": True}, "compile"),
        ({"compile": "fast"}, "compile"),
    ],
)
def test_bad_combinations_name_the_field(kw, field):
    with pytest.raises(SpecError) as err:
        spec_from_config(_config(**kw))
    assert err.value.field == field, str(err.value)


def test_dry_runs_take_lora_and_refuse_a_4bit_base_or_a_checkpoint():
    """LoRA dry-runs (tests/test_dry_run_hf.py compares it with the measured run); QLoRA's 4-bit
    base and a checkpoint are refused, each naming its field and why."""
    spec = RunSpec.from_dict({**BASE, "mode": "train", "dry_run": True, "workload": {**LLAMA, "lora_rank": 8}})
    assert spec.dry_run and spec.workload["lora_rank"] == 8
    qlora = {**LLAMA, "lora_rank": 8, "quantization": "nf4", "pretrained": "/some/checkpoint"}
    with pytest.raises(SpecError, match="Params4bit, cannot wrap a fake tensor") as err:
        RunSpec.from_dict({**BASE, "mode": "train", "precision": "pure", "dry_run": True, "workload": qlora})
    assert err.value.field == "workload.quantization"
    with pytest.raises(SpecError, match="build from a config") as err:
        RunSpec.from_dict({**BASE, "mode": "train", "dry_run": True, "workload": {**LLAMA, "pretrained": "/some/ckpt"}})
    assert err.value.field == "workload.pretrained"


def test_checkpoint_directory_without_weights_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SpecError, match="safetensors") as err:
        spec_from_config(_config(workload={**LLAMA, "pretrained": str(tmp_path)}))
    assert err.value.field == "workload.pretrained"


def test_compile_without_a_cpu_compiler_is_refused(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/bin/g++")
    with pytest.raises(SpecError, match="C\\+\\+ compiler") as err:
        spec_from_config(_config(workload={"name": "mlp", "depth": 1}, compile="default"))
    assert err.value.field == "compile"


def test_missing_peft_is_refused_with_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    with pytest.raises(SpecError, match=r"memsweep\[lora\]") as err:
        spec_from_config(_config(workload={**LLAMA, "lora_rank": 8}))
    assert err.value.field == "workload.lora_rank"


@pytest.mark.parametrize(
    "args, message, env",
    [
        (["mode=inference", "workload.lora_rank=8"], "invalid workload.lora_rank=8", {}),
        (["workload.pretrained=/nonexistent/ckpt"], "invalid workload.pretrained='/nonexistent/ckpt'", {}),
        (["compile=default"], "invalid compile='default'", {"CXX": "/nonexistent/g++"}),
    ],
)
def test_cli_refuses_before_any_worker(tmp_path, args, message, env):
    results = tmp_path / "res"
    proc = subprocess.run(
        [MEMSWEEP, "run", "workload=hf", "workload.config=LlamaConfig", "mode=train", "device=cpu"]
        + [f"results_dir={results}", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr, proc.stderr[-2000:]
    assert not list(results.rglob("spec.json")), "no worker may start on bad input"


# ----- LoRA: only the adapters train ---------------------------------------------------------
def _adapter_parameters(rank, targets):
    """r * (in + out) per adapted Linear (Hu et al. 2021), from the config's shapes."""
    head_dim = HIDDEN // HEADS
    shapes = {"q_proj": (HIDDEN, HEADS * head_dim), "v_proj": (HIDDEN, KV_HEADS * head_dim)}
    shapes.update(k_proj=shapes["v_proj"], o_proj=(HEADS * head_dim, HIDDEN))
    return LAYERS * sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets)


@needs_peft
@pytest.mark.parametrize("rank", [8, 16, 64])
def test_lora_rank_sweep_counts_and_optimizer_states(rank):
    w = _step({**LLAMA, "lora_rank": rank})
    info = w.model_info()
    lora = info["lora"]
    trainable, total = w.model.get_nb_trainable_parameters()  # peft's own count
    assert info["trainable_parameters"] == lora["peft_trainable_parameters"] == trainable
    assert info["parameters"] == total
    assert lora["targets"] == ["q_proj", "v_proj"]  # peft's default for Llama
    assert info["trainable_parameters"] == _adapter_parameters(rank, ["q_proj", "v_proj"])
    assert info["frozen_parameters"] == info["parameters"] - info["trainable_parameters"]
    assert info["trainable_parameter_bytes"] == 4 * info["trainable_parameters"]
    assert info["frozen_parameter_bytes"] + info["trainable_parameter_bytes"] == info["parameter_bytes"]
    # AdamW's fp32 states: exp_avg and exp_avg_sq for every adapter weight, 2 x 4 B x r(in + out)
    # per adapted Linear (the hand formula), plus a 4-byte step counter per adapter tensor.
    states = w.optimizer_state_bytes()["optimizer_state_bytes"]
    formula = 2 * 4 * _adapter_parameters(rank, ["q_proj", "v_proj"])
    assert abs(states - formula) / formula < 0.01
    assert states - formula == 4 * 2 * lora["adapted_modules"]  # the step counters of A and B
    grads = w.gradient_bytes()["gradient_bytes"]
    assert grads == 4 * info["trainable_parameters"]  # gradients of the adapters only (fp32), none of the base
    frozen = [p for n, p in w.model.named_parameters() if "lora_" not in n]
    assert frozen and not any(p.requires_grad for p in frozen)


@needs_peft
def test_lora_targets_all_linear_and_checkpointing():
    w = _step({**LLAMA, "lora_rank": 4, "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}, checkpointing=True)
    info = w.model_info()
    assert info["lora"]["adapted_modules"] == 4 * LAYERS
    assert info["trainable_parameters"] == _adapter_parameters(4, ["q_proj", "k_proj", "v_proj", "o_proj"])


# ----- a local checkpoint ----------------------------------------------------------------------
@needs_peft
def test_pretrained_loads_the_saved_weights(checkpoint):
    directory, state = checkpoint
    spec = RunSpec.from_dict({**BASE, "mode": "inference", "workload": {**LLAMA, "pretrained": str(directory)}})
    w = build_workload(spec, torch.device("cpu"))
    w.prepare()
    w.model_load()
    loaded = w.model.state_dict()
    assert set(loaded) == set(state)
    assert all(torch.equal(loaded[k], state[k]) for k in state)  # the checkpoint, not random weights
    info = w.model_info()
    files = sorted(p.name for p in Path(directory).glob("*.safetensors"))
    assert info["checkpoint"]["files"] == files
    assert info["checkpoint"]["file_bytes"] == sum((Path(directory) / f).stat().st_size for f in files)
    assert info["parameters"] == sum(v.numel() for v in state.values())  # no tied or persistent buffers here


def test_a_checkpoint_run_counts_its_weights_in_model_load(checkpoint, tmp_path):
    """The weights from_pretrained maps from safetensors are counted at the end of model_load
    (no operator made them): the measured peak holds at least the checkpoint's tensor bytes, and
    a capacity below them is an OOM of model_load."""
    from memsweep.sweeper.process import execute

    directory, state = checkpoint
    weights = sum(v.numel() * v.element_size() for v in state.values())
    base = {"batch": 1, "context": 8, "width": 16, "device": "cpu", "warmup": 0, "repeats": 1, "threads": 1}
    load = {**LLAMA, "config": None, "pretrained": str(directory)}
    spec = RunSpec(**base, workload=load)
    assert execute(spec, tmp_path / "fits")["outcome"] == "ok"
    record = json.loads((tmp_path / "fits" / "record.json").read_text())
    (model_load,) = [p for p in record["phases"] if p["name"] == "model_load"]
    assert model_load["max_memory_allocated"] >= weights > 0
    small = RunSpec(**base, workload=load, capacity_bytes=weights // 2)
    assert execute(small, tmp_path / "small")["outcome"] == "oom"
    record = json.loads((tmp_path / "small" / "record.json").read_text())
    assert record["phases"][0]["name"] == "model_load" and record["phases"][0]["status"] == "oom"


@needs_peft
def test_pretrained_path_is_made_absolute_for_the_worker(checkpoint, monkeypatch):
    directory, _ = checkpoint
    monkeypatch.chdir(directory.parent)
    spec = spec_from_config(_config(workload={**LLAMA, "config": None, "pretrained": directory.name}))
    assert spec.workload["pretrained"] == str(directory.resolve())


@needs_peft
@needs_bnb
def test_qlora_4bit_base_trains_only_the_adapters(checkpoint):
    directory, _ = checkpoint
    w = _step({**LLAMA, "pretrained": str(directory), "quantization": "nf4", "lora_rank": 8})
    info = w.model_info()
    assert info["trainable_parameters"] == info["lora"]["peft_trainable_parameters"]
    assert info["trainable_parameters"] == _adapter_parameters(8, ["q_proj", "v_proj"])
    packed = [p for p in w.model.parameters() if p.dtype == torch.uint8]
    assert packed and not any(p.requires_grad for p in packed)  # the 4-bit base: packed, frozen
    assert info["checkpoint"]["quantization"] == "nf4"
    assert w.optimizer_state_bytes()["optimizer_state_bytes"] > 0


# ----- the user's own optimizer factory --------------------------------------------------------
def test_user_optimizer_factory_builds_the_optimizer():
    workload = {
        "name": "user",
        "model": {"_target_": "memsweep.conf.examples.convnet.build_model", "blocks": 1, "classes": 4},
        "inputs": {"_target_": "memsweep.conf.examples.convnet.make_inputs", "classes": 4},
        "optimizer": {"_target_": "memsweep.conf.examples.convnet.make_optimizer", "momentum": 0.5},
    }
    spec = RunSpec.from_dict({**BASE, "context": 8, "width": 8, "mode": "train", "workload": workload})
    w = build_workload(spec, torch.device("cpu"))
    w.prepare()
    w.model_load()
    w.inputs()
    w.train_step()
    assert isinstance(w.optimizer, torch.optim.SGD) and w.optimizer.defaults["momentum"] == 0.5
    # one momentum buffer per parameter, the parameters' bytes (SGD with momentum's state)
    params = sum(p.numel() * p.element_size() for p in w.model.parameters())
    assert w.optimizer_state_bytes()["optimizer_state_bytes"] == params
    assert w.model_info()["optimizer"] == "memsweep.conf.examples.convnet.make_optimizer -> SGD"
    with pytest.raises(SpecError) as err:
        RunSpec.from_dict({**BASE, "mode": "inference", "workload": workload})
    assert err.value.field == "workload.optimizer"
