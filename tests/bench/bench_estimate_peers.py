"""memsweep's calculated figures beside accelerate's ``estimate-memory`` and DeepSpeed's ZeRO
model-state estimators, on the same local configs (tests/data/published_configs.py; nothing
downloaded). Part of ``make bench BENCH=estimate`` (``bench_estimate.main`` calls ``main``).

Accounting of each, as their source states it:

* memsweep: transformers' causal LM built on the meta device (``python -m memsweep.worker
  --count-params``), tied weights once; mixed-precision AdamW = 2 (bf16 weights) + 2 (bf16
  gradients) + 4 (fp32 master) + 8 (m, v) = 16 B/param (ZeRO paper); ZeRO stage 2 partitions
  gradients and optimizer states (2P + 14P/N), stage 3 also the weights (16P/N).
* accelerate ``estimate-memory`` needs the Hub (``verify_on_hub``); offline, its calculation is
  run through its Python API exactly as ``accelerate/commands/estimate.py`` does: the model
  from ``AutoModel.from_config(config, torch_dtype=float32)`` under ``init_empty_weights`` (the
  base model: no LM head unless the config's ``auto_map`` names one), ``calculate_maximum_sizes``
  (parameters and buffers, fp32 bytes) and ``estimate_training_usage`` (Adam at batch size 1:
  "step" = the peak it reports: fp32 4x model, bf16 mixed 2x model). Also shown: the same
  calculation on the causal LM (``AutoModelForCausalLM``), the class memsweep counts.
* DeepSpeed ``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_...`` (the functions
  behind ``..._all_cold``) per GPU without offload: ZeRO-2 2P + 18P/N (18 = 2 bf16 gradients +
  4 fp32 gradients + 4 fp32 weights + 8 Adam states), ZeRO-3 4 x largest layer + 18P/N; the
  largest layer as ``model_to_params`` computes it (its total uses ``data_ptr``, 0 for every
  meta tensor, so ``..._all_live`` cannot run on a meta model).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import tempfile
from pathlib import Path

import memsweep.estimator as E
from memsweep.conf.contract import GiB
from tests.data.published_configs import PUBLISHED

DEVICES = 8
"""Data-parallel GPUs of the ZeRO columns."""
SEQ, KV_TOKENS, LORA_RANK = 2048, 4096, 16


def _peer(name: str) -> str | None:
    return None if importlib.util.find_spec(name) else f"{name} is not installed (pip install 'memsweep[bench]')"


def _accelerate_sizes(cfg: dict) -> tuple[int, int, int]:
    """(fp32 bytes of AutoModel, of AutoModelForCausalLM), by accelerate's calculate_maximum_sizes,
    and the causal LM's buffer bytes (which that total includes)."""
    import torch
    import transformers
    from accelerate import init_empty_weights
    from accelerate.utils import calculate_maximum_sizes

    config = transformers.AutoConfig.for_model(**cfg)
    out = []
    for constructor in (transformers.AutoModel, transformers.AutoModelForCausalLM):
        with init_empty_weights():
            model = constructor.from_config(config, torch_dtype=torch.float32)
        out.append(int(calculate_maximum_sizes(model)[0]))
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return out[0], out[1], buffers


def _largest_layer(cfg: dict) -> int:
    """DeepSpeed's ``model_to_params`` largest layer: the most parameters one module holds itself."""
    import torch
    import transformers

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    return max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())


def _deepspeed(total: int, largest: int) -> tuple[int, int]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    z2 = estimate_zero2_model_states_mem_needs(total, num_gpus_per_node=DEVICES, cpu_offload=False)[1]
    z3 = estimate_zero3_model_states_mem_needs(total, largest, num_gpus_per_node=DEVICES, cpu_offload=False)[1]
    return int(z2), int(z3)


def _g(n: int | None) -> str:
    return "-" if n is None else f"{n / GiB:.2f}"


def main() -> int:
    """Print the side-by-side table (GiB = 2^30 B; parameter counts exact)."""
    missing = {p: _peer(p) for p in ("transformers", "accelerate", "deepspeed")}
    for why in filter(None, missing.values()):
        print(f"peer missing: {why}")
    if missing["transformers"]:
        print("no transformers: the counts cannot be compared")
        return 0
    with tempfile.TemporaryDirectory(prefix="memsweep-bench-peers-") as tmp:
        paths = []
        for i, (cfg, _, _) in enumerate(PUBLISHED.values()):
            d = Path(tmp) / str(i)
            d.mkdir()
            (d / "config.json").write_text(json.dumps(cfg))
            paths.append(d)
        models = [E.model_from_count(c) for c in E.count_with_transformers(paths)]
    print(
        f"\nparameters and training state, memsweep vs accelerate estimate-memory (its calculation, offline) vs "
        f"DeepSpeed ZeRO estimators; ZeRO over {DEVICES} GPUs, per GPU, no offload; GiB = 2^30 B (calculated)"
    )
    head = (
        f"{'model':<18} {'memsweep params':>15} {'acc. AutoModel':>15} {'acc. CausalLM':>15} {'eq':>10} "
        f"{'acc.bf16 step':>13} {'ms AdamW16B':>11} {'DS z2':>7} {'ms z2':>7} {'DS z3':>7} {'ms z3':>7} | "
        f"memsweep adds: {'act b1 s' + str(SEQ):>13} {'KV ' + str(KV_TOKENS):>8} {'LoRA r' + str(LORA_RANK):>10} "
        f"{'QLoRA':>7}"
    )
    print(head)
    for (name, (cfg, _, _)), model in zip(PUBLISHED.items(), models):
        p = model.parameters
        auto = causal = step = None
        buffers = 0
        if not missing["accelerate"]:
            auto, causal, buffers = _accelerate_sizes(cfg)
            from accelerate.commands.estimate import estimate_training_usage

            step = estimate_training_usage(auto, "bfloat16")["step"]
        full = E.estimate_transformer(model, train=True)
        z2 = E.zero_partition(full, 2, DEVICES)
        z3 = E.zero_partition(full, 3, DEVICES)
        ds2 = ds3 = None
        if not missing["deepspeed"]:
            ds2, ds3 = _deepspeed(p, _largest_layer(cfg))
        acts = E.estimate_transformer(
            model, train=True, activations=E.ActivationSettings(1, SEQ, fused_attention=True)
        ).activations
        kv = E.estimate_transformer(model, kv_tokens=KV_TOKENS).kv_cache
        try:
            lora = E.lora_parameters(E.lora_targets(model), LORA_RANK)
            qlora = E.estimate_lora(
                model, E.LoraSettings(rank=LORA_RANK), base_format=E.storage_format("nf4", double_quant=True)
            ).peak
            lora_text = str(lora)
        except ValueError:
            lora_text, qlora = "no default", None
        diff = None if causal is None else (causal - buffers) // 4 - p
        eq = "-" if diff is None else ("yes" if diff == 0 else f"{diff:+d}")
        print(
            f"{name[:18]:<18} {p:>15} {'-' if auto is None else auto // 4:>15} "
            f"{'-' if causal is None else causal // 4:>15} {eq:>10} {_g(step):>13} {_g(16 * p):>11} {_g(ds2):>7} "
            f"{_g(z2.peak):>7} {_g(ds3):>7} {_g(z3.peak):>7} | {'':14}{_g(acts):>13} {_g(kv):>8} {lora_text:>10} "
            f"{_g(qlora):>7}"
        )
    print(
        "acc. = accelerate's calculate_maximum_sizes / 4 (fp32 bytes of parameters and buffers; AutoModel is what "
        "estimate-memory builds, without the LM head); eq: the CausalLM's, buffers (rotary inv_freq) taken out, "
        "minus memsweep's count: yes = equal; a difference = a tied lm_head that accelerate's compute_module_sizes "
        "counts twice.\nacc.bf16 step: estimate_training_usage(bytes, 'bfloat16')['step'] "
        "on the AutoModel (its Adam peak at batch 1).\nDS z2/z3: DeepSpeed's 2P + 18P/N and 4 x largest layer + "
        "18P/N (fp32 gradients counted); ms z2/z3: memsweep 2P + 14P/N and 16P/N (ZeRO paper; no fp32 gradient "
        "copy; stage 3's gathered layer not counted).\nmemsweep adds: training activations at batch 1 (Korthikanti "
        "et al. 2022, fused attention), bf16 KV cache of one sequence, LoRA trainable parameters on peft's default "
        "targets, and the QLoRA (nf4 + double quantization, AdamW) sum without activations."
    )
    return 0
