"""Dry run (fake tensors) against the measured run of the same spec, per phase; then a dry run
of Llama-2-7B's shape in train mode. Real worker processes; ``make bench BENCH=dryrun``.

Predicted = peak of live fake-tensor storage bytes; measured = the CPU worker's tracked
allocated (LiveTensorTracker): the same tensor-level accounting, so the two should agree.
Error = (predicted - measured) / measured of each phase's peak. Sizes in bytes.
"""

import json
import sys
import tempfile
import time
from pathlib import Path

from sweeper.process import execute
from worker.records import RunSpec

BASE = dict(context=64, width=128, device="cpu", warmup=1, repeats=1, timeout_s=1800, threads=1)
LM = {"name": "transformer", "layers": 4, "heads": 4, "kv_heads": 2, "vocab": 1000}
LOADS = {
    "mlp inference b=16": dict(BASE, batch=16, mode="inference", workload={"name": "mlp"}),
    "mlp train b=16": dict(BASE, batch=16, mode="train", workload={"name": "mlp"}),
    "mlp train bf16 b=8 w=256": dict(BASE, batch=8, width=256, dtype="bfloat16", mode="train",
                                     workload={"name": "mlp"}),
    "lm inference b=4": dict(BASE, batch=4, mode="inference", workload=LM),
    "lm train b=4 micro=2": dict(BASE, batch=4, mode="train", workload=LM, micro_steps=2),
    "lm train checkpointing": dict(BASE, batch=4, mode="train", workload=LM, checkpointing=True),
    "lm generate b=4": dict(BASE, batch=4, mode="generate", workload=LM, new_tokens=8),
    "lm generate static": dict(BASE, batch=4, mode="generate", workload=LM, new_tokens=8, kv_cache="static"),
}
LLAMA2_7B = dict(batch=1, context=128, width=4096, dtype="bfloat16", mode="train", device="cpu", warmup=0,
                 repeats=1, timeout_s=1800, threads=1, dry_run=True,
                 workload={"name": "transformer", "layers": 32, "heads": 32, "kv_heads": 32,
                           "ffn_hidden": 11008, "vocab": 32000, "ffn": "swiglu", "norm": "rmsnorm"})


def run(root: Path, name: str, data: dict) -> tuple[dict, float]:
    t0 = time.perf_counter()
    result = execute(RunSpec.from_dict(data), root / name)
    wall = time.perf_counter() - t0
    record = json.loads((root / name / "record.json").read_text())
    if result["outcome"] != "ok":
        print(f"{name}: {result['outcome']} in {result['failed_phase']}: {result['error_message']}")
    return record, wall


def main() -> int:
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="bench-dryrun-") as tmp:
        root = Path(tmp)
        for i, (label, data) in enumerate(LOADS.items()):
            measured, tm = run(root, f"{i}-measured", data)
            predicted, tp = run(root, f"{i}-predicted", dict(data, dry_run=True))
            print(f"\n{label}: measured run {tm:.1f} s, dry run {tp:.1f} s (wall, incl. process start)")
            print(f"  {'phase':<30} {'measured peak':>14} {'predicted peak':>14} {'error':>8}")
            for m, p in zip(measured["phases"], predicted["phases"]):
                mp, pp = m["max_memory_allocated"], p["max_memory_allocated"]
                err = (pp - mp) / mp if mp else 0.0
                worst = max(worst, abs(err))
                print(f"  {m['name']:<30} {mp:>14} {pp:>14} {err:>+8.3%}")
        print(f"\nlargest |error| of a phase peak over all loads: {worst:.3%}")

        record, wall = run(root, "llama2-7b", LLAMA2_7B)
        model = record["model"] or {}
        params, pbytes = model.get("parameters"), model.get("parameter_bytes")
        by_name = {p["name"]: p for p in record["phases"]}
        grads = by_name.get("cold_step.backward", {}).get("gradient_bytes")
        states = by_name.get("cold_step.optimizer_step", {}).get("optimizer_state_bytes")
        print(f"\nLlama-2-7B shape, train, bf16, batch 1 x 128 tokens, dry run: {record['outcome']} in {wall:.1f} s")
        print(f"  parameters {params} ({pbytes} B); gradients {grads} B (= parameter bytes: {grads == pbytes});"
              f" AdamW states {states} B (2 x parameter bytes = {2 * pbytes if pbytes else None} B,"
              f" + 4 B step counter per parameter tensor)")
        peak = max(p["max_memory_allocated"] for p in record["phases"])
        print(f"  predicted peak of live tensor bytes: {peak} B = {peak / 1e9:.2f} GB = {peak / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
