"""The fine-tuning cases of `make gpu-check` (issue #19), run by tests/gpu_check.py on cuda:0.

* ``compile``: an mlp inference run with ``compile=default`` (Inductor's Triton kernels): the cold
  phase holds the compilation, both the cold and the warm peaks are recorded from CUDA's counters.
  Skipped, saying so, where Triton is not installed (the sweeper refuses such a run).
* ``lora``: a small Llama (transformers' LlamaForCausalLM from a config) trained with peft LoRA
  adapters (rank 8) in bf16: only the adapters train, memsweep's trainable count equals peft's.
* ``qlora``: the same model saved with ``save_pretrained``, loaded back with a 4-bit nf4 base
  (bitsandbytes), LoRA rank 8 and ``optimizer=adamw8bit``: the packed base is frozen, the run ok.

Each part is skipped, saying which package is missing, when its extra is not installed (the GPU
machine's image may have none of them). ``check_finetune`` returns ``(failures, summary)``.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

LLAMA = {
    "name": "hf",
    "config": "LlamaConfig",
    "overrides": {
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 32000,
    },
}
BASE = dict(batch=4, context=256, width=256, device="cuda:0", warmup=1, repeats=2, timeout_s=300)


def _has(*names: str) -> list[str]:
    """The names among ``names`` that cannot be imported here."""
    return [n for n in names if importlib.util.find_spec(n) is None]


def _run(name: str, spec: dict, out: Path) -> tuple[dict | None, list[str]]:
    """Execute one spec in a fresh worker; returns (its record, failures)."""
    from memsweep.conf.contract import PEAK_COUNTERS, RunSpec
    from memsweep.sweeper.process import execute

    result = execute(RunSpec.from_dict(spec), out / name)
    path = out / name / "record.json"
    record = json.loads(path.read_text()) if path.is_file() else None
    print(f"gpu-check {name}: {result['outcome']}")
    if result["outcome"] != "ok" or record is None:
        return record, [f"{name}: {result['outcome']} in {result['failed_phase']}: {result['error_message']}"]
    failures = []
    if not str(record["counter_sources"]["memory_allocated"]).startswith(("cuda:", "hip:")):
        failures.append(f"{name}: counters not from the CUDA allocator")
    for p in record["phases"]:
        for key in PEAK_COUNTERS:
            if not isinstance(p.get(key), int):
                failures.append(f"{name} {p['name']}: {key} missing ({p.get(key)!r})")
    return record, failures


def check_compile(out: Path) -> tuple[list[str], str]:
    """compile=default on cuda:0: cold and warm forward peaks both recorded, Inductor code generated."""
    missing = _has("triton")
    if missing:
        return [], "compile skipped: triton not installed"
    cache = out / "inductor"
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)  # a real compilation, not a cache hit
    spec = dict(BASE, mode="inference", compile="default", workload={"name": "mlp", "depth": 2})
    record, failures = _run("compile", spec, out)
    if record is not None and not failures:
        phases = {p["name"]: p for p in record["phases"]}
        if not {"cold_forward", "warm_forward"} <= phases.keys():
            failures.append(f"compile: cold/warm forward missing: {sorted(phases)}")
        if not any(cache.rglob("*.py")):
            failures.append("compile: Inductor generated no code (nothing in its cache)")
        cold, warm = phases.get("cold_forward", {}), phases.get("warm_forward", {})
        return failures, (
            f"compile cold {cold.get('max_memory_allocated')} B / warm {warm.get('max_memory_allocated')} B, "
            f"{cold.get('duration_s')} s / {warm.get('duration_s')} s"
        )
    return failures, "compile failed"


def check_lora(out: Path) -> tuple[list[str], str]:
    """LoRA (peft) on a small Llama in bf16: memsweep's trainable count equals peft's."""
    missing = _has("transformers", "peft")
    if missing:
        return [], f"lora skipped: {', '.join(missing)} not installed"
    spec = dict(BASE, mode="train", dtype="bfloat16", workload={**LLAMA, "lora_rank": 8})
    record, failures = _run("lora", spec, out)
    if record is None or failures:
        return failures, "lora failed"
    model = record["model"]
    lora = model.get("lora") or {}
    if model.get("trainable_parameters") != lora.get("peft_trainable_parameters"):
        failures.append(f"lora: trainable {model.get('trainable_parameters')} != peft's {lora}")
    return failures, f"lora trainable {model.get('trainable_parameters')} of {model.get('parameters')}"


def check_qlora(out: Path) -> tuple[list[str], str]:
    """QLoRA: a saved tiny Llama loaded back with an nf4 base, LoRA rank 8 and adamw8bit."""
    missing = _has("transformers", "peft", "bitsandbytes")
    if missing:
        return [], f"qlora skipped: {', '.join(missing)} not installed"
    import torch
    import transformers

    directory = out / "qlora-checkpoint"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA["overrides"])).save_pretrained(directory)
    workload = {**LLAMA, "pretrained": str(directory), "quantization": "nf4", "lora_rank": 8}
    spec = dict(BASE, mode="train", dtype="bfloat16", optimizer="adamw8bit", workload=workload)
    record, failures = _run("qlora", spec, out)
    if record is None or failures:
        return failures, "qlora failed"
    quant = (record["model"].get("checkpoint") or {}).get("quantization")
    if quant != "nf4":
        failures.append(f"qlora: checkpoint quantization {quant!r}, expected nf4")
    return failures, f"qlora ok, base {quant}, optimizer {record['model'].get('optimizer')}"


def check_finetune(out: Path) -> tuple[list[str], str]:
    """All three parts; returns (failures, one line summing up what ran and what was skipped)."""
    failures, lines = [], []
    for case in (check_compile, check_lora, check_qlora):
        found, line = case(out)
        failures += found
        lines.append(line)
    return failures, "; ".join(lines)
