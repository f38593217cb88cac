"""Dry run (fake tensors) against the measured run of the same spec, per phase, with the split
of each predicted peak by category; then a dry run of Llama-2-7B's shape in train mode against
the estimator (estimator/); then the predicted edge of an mlp against the edge a
real frontier sweep measures at an emulated CPU capacity, with and without the dry-run seed.
Real worker processes; ``make bench BENCH=dryrun`` (about 2 to 3 minutes on 2 cores).

Predicted = peak of live fake-tensor storage bytes; measured = the CPU worker's tracked
allocated (LiveTensorTracker): the same tensor-level accounting, so the two should agree.
Error = (predicted - measured) / measured of each phase's peak. The split (params, grads,
opt states, act+tmp) is what was live at the predicted peak, by the categories of
torch.distributed._tools.mem_tracker; the four sum to the predicted peak. Sizes in bytes.
"""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from memsweep.conf.contract import PEAK_SPLIT_FIELDS, RunSpec, bytes_text
from memsweep.sweeper.process import execute
from tests.bench.bench_frontier import REAL_LOAD, REAL_RANGE

BASE = dict(context=64, width=128, device="cpu", warmup=1, repeats=1, timeout_s=1800, threads=1)
LM = {"name": "transformer", "layers": 4, "heads": 4, "kv_heads": 2, "vocab": 1000}
LOADS = {
    "mlp inference b=16": dict(BASE, batch=16, mode="inference", workload={"name": "mlp"}),
    "mlp train b=16": dict(BASE, batch=16, mode="train", workload={"name": "mlp"}),
    "mlp train bf16 b=8 w=256": dict(
        BASE, batch=8, width=256, dtype="bfloat16", mode="train", workload={"name": "mlp"}
    ),
    "lm inference b=4": dict(BASE, batch=4, mode="inference", workload=LM),
    "lm train b=4 micro=2": dict(BASE, batch=4, mode="train", workload=LM, micro_steps=2),
    "lm train checkpointing": dict(BASE, batch=4, mode="train", workload=LM, checkpointing=True),
    "lm generate b=4": dict(BASE, batch=4, mode="generate", workload=LM, new_tokens=8),
    "lm generate static": dict(BASE, batch=4, mode="generate", workload=LM, new_tokens=8, kv_cache="static"),
}
# The Llama-2-7B config.json fields the estimator reads (meta-llama/Llama-2-7b-hf), the same
# shape as LLAMA2_7B's workload.
LLAMA2_7B_CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "intermediate_size": 11008,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def replaced(overrides: list[str], values: dict[str, object]) -> list[str]:
    """Hydra overrides (``key=value``) with the value of each key in ``values`` replaced, in place."""
    return [f"{key}={values[key]}" if (key := o.split("=", 1)[0]) in values else o for o in overrides]


# The frontier load of tests/bench/bench_frontier.py (REAL_LOAD, REAL_RANGE) with one warmup
# step, one warm step, one thread and no confirmation runs, to keep the bench short.
EDGE_LOAD = replaced(REAL_LOAD, {"threads": 1, "warmup": 1, "repeats": 1})
EDGE_RANGE = replaced(REAL_RANGE, {"hydra.sweeper.confirm": 0})
LLAMA2_7B = dict(
    batch=1,
    context=128,
    width=4096,
    dtype="bfloat16",
    mode="train",
    device="cpu",
    warmup=0,
    repeats=1,
    timeout_s=1800,
    threads=1,
    dry_run=True,
    workload={
        "name": "transformer",
        "layers": 32,
        "heads": 32,
        "kv_heads": 32,
        "ffn_hidden": 11008,
        "vocab": 32000,
        "ffn": "swiglu",
        "norm": "rmsnorm",
    },
)


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
            print(
                f"  {'phase':<26} {'measured peak':>13} {'predicted peak':>14} {'error':>8} | predicted peak = "
                f"{'params':>9} + {'grads':>9} + {'opt states':>10} + {'act+tmp':>9}"
            )
            for m, p in zip(measured["phases"], predicted["phases"]):
                mp, pp = m["max_memory_allocated"], p["max_memory_allocated"]
                err = (pp - mp) / mp if mp else 0.0
                worst = max(worst, abs(err))
                split = [p.get(k) for k in PEAK_SPLIT_FIELDS]
                sums = "" if None not in split and sum(split) == pp else "  (SPLIT DOES NOT SUM TO THE PEAK)"
                print(
                    f"  {m['name']:<26} {mp:>13} {pp:>14} {err:>+8.3%} | {'':>16}"
                    f"{split[0]!s:>9}   {split[1]!s:>9}   {split[2]!s:>10}   {split[3]!s:>9}{sums}"
                )
        print(f"\nlargest |error| of a phase peak over all loads: {worst:.3%}")

        train_cpu = llama_vs_estimator(root)
        llama_cuda_vs_cpu(root, train_cpu)
        predicted_vs_measured_edge(root)
    return 0


def llama_vs_estimator(root: Path) -> dict:
    """The Llama-2-7B dry run's split at the optimizer step's peak against the estimator
    (estimator.estimate_transformer, pure bf16 AdamW: states in the parameter dtype as
    torch.optim.AdamW's zeros_like, no fp32 master copy, no ZeRO)."""
    from memsweep.estimator import estimate_transformer, parse_hf_config

    record, wall = run(root, "llama2-7b", LLAMA2_7B)
    model = record["model"] or {}
    params = model.get("parameters")
    by_name = {p["name"]: p for p in record["phases"]}
    step = by_name.get("cold_step.optimizer_step", {})
    print(f"\nLlama-2-7B shape, train, bf16, AdamW, batch 1 x 128 tokens, dry run: {record['outcome']} in {wall:.1f} s")
    peak = max(p["max_memory_allocated"] for p in record["phases"])
    print(f"  predicted peak of live tensor bytes: {bytes_text(peak)}")
    if not step:
        return record
    config = parse_hf_config(LLAMA2_7B_CONFIG)
    # The dry run is a CPU one: AdamW's per-tensor `step` (0-dim float32) lives in that device's
    # memory, so the estimator counts it too (step_tensors=True; on CUDA it is on the host).
    est = estimate_transformer(
        config,
        weight_format="bf16",
        compute_bytes=2,
        train=True,
        optimizer="adamw",
        mixed_precision=False,
        step_tensors=True,
    )
    print(f"  parameters: dry run {params}, estimator {config.parameters} ({params == config.parameters})")
    print(
        f"  at the peak of cold_step.optimizer_step ({step['max_memory_allocated']} B), dry run vs estimator "
        f"(AdamW's {len(config.tensors())} step tensors of 4 B counted by both):"
    )
    rows = (
        ("parameters", step["predicted_parameter_bytes"], est.weights),
        ("gradients", step["predicted_gradient_bytes"], est.gradients),
        ("optimizer states", step["predicted_optimizer_state_bytes"], est.optimizer_states),
    )
    for label, dry, calc in rows:
        same = "agree exactly" if dry == calc else f"DIFFER by {dry - calc:+d} B"
        print(f"    {label:<18} {dry:>14} B {calc:>14} B  {same}")
    print(
        f"  the rest of that peak, activations and temporaries: {step['predicted_activation_bytes']} B "
        f"(AdamW's per-tensor scratch on the CPU; the estimator's temporaries are not estimated for a transformer:"
        f" {est.temporaries})"
    )
    return record


def llama_cuda_vs_cpu(root: Path, train_cpu: dict) -> None:
    """The Llama-2-7B shape's dry run for cuda:0 (fake CUDA tensors, each storage rounded up to
    the caching allocator's 512 B blocks, CUDA storages only) next to its CPU dry run, per phase:
    both are PREDICTIONS (no GPU is used). Inference at batch 1 x 128 tokens, and train (the
    run of llama_vs_estimator) where this PyTorch can (a CUDA build; a CPU-only one refuses it)."""
    infer = dict(LLAMA2_7B, mode="inference")
    pairs = [
        (
            "inference",
            run(root, "llama2-7b-infer-cpu", infer),
            run(root, "llama2-7b-infer-cuda", dict(infer, device="cuda:0")),
        )
    ]
    pairs.append(("train", (train_cpu, None), run(root, "llama2-7b-train-cuda", dict(LLAMA2_7B, device="cuda:0"))))
    for mode, (cpu, _), (cuda, wall) in pairs:
        print(
            f"\nLlama-2-7B shape, {mode}, bf16, batch 1 x 128 tokens: PREDICTED peaks (dry runs, no GPU), "
            f"cpu (exact storage bytes) vs cuda:0 (fake CUDA tensors, 512 B blocks; {wall:.1f} s)"
        )
        if cuda["outcome"] != "ok":
            print(f"  cuda:0 dry run: {cuda['outcome']} {cuda['error_type']}: {cuda['error_message']}")
            continue
        print(f"  {'phase':<28} {'cpu predicted':>15} {'cuda predicted':>15} {'cuda - cpu':>12}")
        for c, g in zip(cpu["phases"], cuda["phases"]):
            a, b = c["max_memory_allocated"], g["max_memory_allocated"]
            print(f"  {c['name']:<28} {a:>15} {b:>15} {b - a:>+12}")
        a = max(p["max_memory_allocated"] for p in cpu["phases"])
        b = max(p["max_memory_allocated"] for p in cuda["phases"])
        print(
            f"  largest phase peak: cpu {bytes_text(a)}, cuda {bytes_text(b)} "
            f"(predictions of max_memory_allocated, not of reserved memory)"
        )


# Loads whose edge is measured by real frontier sweeps, with and without the dry-run seed:
# (label, load overrides, sweep range). mlp: the frontier bench's load on a lattice of step 8;
# transformer: a small GQA LM in train mode, every batch size (step 1); hf: a small Llama
# (transformers' LlamaForCausalLM from its config) in train mode, every batch size.
EDGE_CASES = [
    ("mlp train context=64 width=128 depth=2", EDGE_LOAD, EDGE_RANGE),
    (
        "transformer train context=64 width=128 layers=2 heads=4 kv_heads=2 vocab=1000",
        [
            "mode=train",
            "device=cpu",
            "capacity=128MiB",
            "context=64",
            "width=128",
            "workload=transformer",
            "workload.layers=2",
            "workload.heads=4",
            "workload.kv_heads=2",
            "workload.vocab=1000",
            "threads=1",
            "warmup=1",
            "repeats=1",
        ],
        ["hydra.sweeper.lower=1", "hydra.sweeper.upper=1024", "hydra.sweeper.multiple_of=1", "hydra.sweeper.confirm=0"],
    ),
    (
        "hf LlamaConfig train context=64 layers=2 hidden=128 heads=4 kv_heads=2 vocab=1000",
        [
            "mode=train",
            "device=cpu",
            "capacity=128MiB",
            "context=64",
            "workload=hf",
            "workload.config=LlamaConfig",
            "+workload.overrides={num_hidden_layers: 2, hidden_size: 128, intermediate_size: 256, "
            "num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 1000, max_position_embeddings: 128}",
            "threads=1",
            "warmup=1",
            "repeats=1",
        ],
        ["hydra.sweeper.lower=1", "hydra.sweeper.upper=256", "hydra.sweeper.multiple_of=1", "hydra.sweeper.confirm=0"],
    ),
]


def _sweep(root: Path, name: str, load: list[str], bounds: list[str], extra: list[str]) -> dict:
    """A real frontier sweep through the CLI; its result event, probes and wall seconds."""
    from tests.bench.frontier_cli import frontier_sweep

    s = frontier_sweep([*load, *bounds, *extra], root / name, root, dict(os.environ))
    if s["error"]:
        return s
    dry = [e for e in s["events"] if e["event"] == "dry_run"]
    return {**s, "dry": dry[0] if dry else None, "probes": [e["value"] for e in s["events"] if e["event"] == "probe"]}


def predicted_vs_measured_edge(root: Path) -> None:
    """For each load of EDGE_CASES: the edge a real frontier sweep measures (capacity_mode=allocator:
    the tracked tensor bytes, what the dry run predicts) with
    hydra.sweeper.seed_from_dry_run=true and without, the real runs each needed, and the
    dry-run prediction the seeded sweep started from (tensor bytes only). Goal (issue #9):
    the exact edge in 3 real runs or fewer with the seed."""
    worst = 0
    for i, (label, load, bounds) in enumerate(EDGE_CASES):
        options = dict(o.split("=", 1) for o in load)
        print(
            f"\nedge of batch, {label}, CPU, capacity {options['capacity']} (emulated), "
            f"{' '.join(b.split('.')[-1] for b in bounds)}:"
        )
        for name, extra in (("unseeded", []), ("seeded", ["hydra.sweeper.seed_from_dry_run=true"])):
            s = _sweep(root, f"edge{i}-{name}", load, bounds, extra)
            if s["error"]:
                print(f"  {name} sweep: {s['error']}")
                worst = None
                continue
            r = s["result"]
            seed = (
                f"; dry-run prediction max fit {s['dry']['predicted_max_ok']} from {s['dry']['dry_runs']} dry runs"
                if s["dry"]
                else ""
            )
            print(
                f"  {name:<8} frontier sweep: max_ok {r['max_ok']}, min_oom {r['min_oom']} (exact: {r['exact']}); "
                f"{s['runs']} real runs {s['probes']}, {s['wall']:.1f} s{seed}"
            )
            if name == "seeded" and worst is not None:
                worst = max(worst, s["runs"] if r["exact"] else 10**9)
    if worst is not None:
        print(
            f"\ngoal: exact edge in <= 3 real runs with the dry-run seed: "
            f"{'met' if worst <= 3 else 'NOT met'} (worst: {worst if worst < 10**9 else 'not exact'})"
        )
    print(
        "the seeded sweeps also ran their dry runs (fake tensors, a fraction of a second each), counted in their "
        "wall time, not in real runs"
    )


if __name__ == "__main__":
    sys.exit(main())
