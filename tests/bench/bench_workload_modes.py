"""GPT-2 small's shape (12 layers x 768 hidden x 12 heads, vocab 50257, tied embeddings) in every
mode, then eager vs sdpa attention as the context grows: real worker processes, printed side by side.

Not a test (``make bench BENCH=workload_modes``): it takes minutes and a few GiB on the CPU.
Sizes in MiB (2^20 bytes); on the CPU "allocated" is the worker's live-tensor tracker.
"""

import json
import sys
import tempfile
from pathlib import Path

from memsweep.conf.contract import RunSpec
from memsweep.sweeper.process import execute

GPT2_SMALL = {
    "name": "transformer",
    "layers": 12,
    "heads": 12,
    "vocab": 50257,
    "norm": "layernorm",
    "tie_embeddings": True,
}
BASE = dict(batch=1, context=32, width=768, device="cpu", warmup=1, repeats=1, timeout_s=1800)
MiB = 2**20


def run(root: Path, name: str, **spec) -> dict:
    result = execute(RunSpec.from_dict({**BASE, **spec}), root / name)
    record = json.loads((root / name / "record.json").read_text())
    if result["outcome"] != "ok":
        print(f"{name}: {result['outcome']} in {result['failed_phase']}: {result['error_message']}")
    return record


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="memsweep-bench-modes-"))
    print(f"GPT-2 small shape, batch 1, context 32, float32, CPU ({root})")
    print(f"{'mode':<10} {'phase':<28} {'start MiB':>10} {'end MiB':>9} {'peak MiB':>9}  sizes")
    for mode, extra in (
        ("inference", {}),
        ("train", {"eval_batch": 2, "export": True}),
        ("generate", {"new_tokens": 8}),
    ):
        record = run(root, mode, mode=mode, workload=GPT2_SMALL, **extra)
        seen = set()
        for p in record["phases"]:
            if p["name"] in seen or p["name"].startswith("warm"):
                continue
            seen.add(p["name"])
            sizes = {
                k: round(p[k] / MiB, 2)
                for k in ("gradient_bytes", "optimizer_state_bytes", "kv_cache_bytes", "export_bytes")
                if p.get(k) is not None
            }
            print(
                f"{mode:<10} {p['name']:<28} {p['memory_allocated_start'] / MiB:>10.1f} "
                f"{p['memory_allocated'] / MiB:>9.1f} {p['max_memory_allocated'] / MiB:>9.1f}  {sizes or ''}"
            )
        if record.get("model"):
            print(
                f"{'':<10} parameters {record['model']['parameters']:,} = "
                f"{record['model']['parameter_bytes'] / MiB:.1f} MiB"
            )
    print("\nAttention peak over the forward pass (cold_forward max_memory_allocated - start), 4 layers x 256:")
    print(f"{'context':>8} {'sdpa MiB':>9} {'eager MiB':>10} {'eager/sdpa':>10}")
    small = {"name": "transformer", "layers": 4, "heads": 4, "vocab": 1024}
    for context in (128, 512, 1024):
        peaks = {}
        for attention in ("sdpa", "eager"):
            record = run(
                root,
                f"{attention}-{context}",
                context=context,
                width=256,
                warmup=0,
                workload={**small, "attention": attention},
            )
            p = next(p for p in record["phases"] if p["name"] == "cold_forward")
            peaks[attention] = (p["max_memory_allocated"] - p["memory_allocated_start"]) / MiB
        print(f"{context:>8} {peaks['sdpa']:>9.1f} {peaks['eager']:>10.1f} {peaks['eager'] / peaks['sdpa']:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
