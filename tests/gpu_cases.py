"""The cases of `make gpu-check` that run single workers on cuda:0 (tests/gpu_check.py runs them).

* ``check_modes``: a transformer training step under bf16 autocast with checkpointing, gradient
  accumulation, eval and export; a generation with a static KV cache; a Llama-style hf generation
  when transformers is installed. Checked: every phase ok with CUDA counters, the extra counters
  present (``outside_allocator_bytes`` included), the KV cache bytes equal to 2 x layers x
  kv_heads x head_dim x tokens x bytes x batch, the optimizer states in the first step only, and a
  phase peak lower than the one before it (the peak is reset between phases, never carried).
* ``check_dry_run``: a CUDA dry run (fake tensors) against the measured run of the same spec,
  per phase (model_load exact, the rest printed with its error).
* ``check_throughput``: a batch sweep of the mlp on the device's own memory, each run's measured
  samples per second printed (median over the warm iterations, the noise beside it); checked: every
  ok run timed over its repeats, no rate on a run that did not end ok.
* ``check_pool``, ``check_devices`` and ``check_ranks`` (2 DDP/FSDP ranks on cuda:0 and cuda:1,
  nccl): with 2+ GPUs only; with one GPU each says it skipped.

Each returns a list of failures (str) and prints what it measured.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpu_env import memsweep


def check_modes(out: Path) -> list[str]:
    """Run the train, generate (and hf) modes on cuda:0 and check their records; returns failures."""
    import importlib.util

    from memsweep.conf.contract import EXTRA_COUNTERS, PEAK_COUNTERS, RunSpec
    from memsweep.sweeper.process import execute

    lm = {"name": "transformer", "layers": 4, "heads": 8, "kv_heads": 2, "vocab": 32000}
    base = dict(batch=4, context=512, width=512, device="cuda:0", warmup=1, repeats=2, timeout_s=120)
    specs = {
        "train": dict(
            base,
            mode="train",
            dtype="bfloat16",
            precision="autocast",
            workload=lm,
            checkpointing=True,
            micro_steps=2,
            eval_batch=8,
            export=True,
        ),
        "generate": dict(base, mode="generate", dtype="bfloat16", workload=lm, new_tokens=32, kv_cache="static"),
    }
    if importlib.util.find_spec("transformers") is not None:
        specs["hf_generate"] = dict(
            base,
            mode="generate",
            dtype="bfloat16",
            new_tokens=32,
            workload={
                "name": "hf",
                "config": "LlamaConfig",
                "overrides": {
                    "num_hidden_layers": 4,
                    "hidden_size": 512,
                    "intermediate_size": 1376,
                    "num_attention_heads": 8,
                    "num_key_value_heads": 2,
                    "vocab_size": 32000,
                },
            },
        )
    failures, carried = [], []
    for name, spec in specs.items():
        result = execute(RunSpec.from_dict(spec), out / name)
        record = json.loads((out / name / "record.json").read_text())
        print(f"gpu-check {name}: {result['outcome']} ({len(record['phases'])} phases)")
        if result["outcome"] != "ok":
            failures.append(f"{name}: {result['outcome']} in {result['failed_phase']}: {result['error_message']}")
            continue
        for p in record["phases"]:
            for key in (*PEAK_COUNTERS, *EXTRA_COUNTERS):
                if not isinstance(p.get(key), int):
                    failures.append(f"{name} {p['name']}: {key} missing ({p.get(key)!r})")
            if p.get("kv_cache_bytes") is not None:
                d = record["model"]["dims"]
                tokens = spec["context"] + spec["new_tokens"]  # static cache (and a full dynamic one after decode)
                if spec.get("kv_cache") == "static" or p["sub_phase"] == "decode":
                    expected = 2 * d["layers"] * d["kv_heads"] * d["head_dim"] * tokens * 2 * spec["batch"]
                    if p["kv_cache_bytes"] != expected:
                        failures.append(f"{name} {p['name']}: kv_cache_bytes {p['kv_cache_bytes']} != {expected}")
        if name == "train":
            opt = [p for p in record["phases"] if p["sub_phase"] == "optimizer_step"]
            grew = [p["memory_allocated"] - p["memory_allocated_start"] for p in opt]
            states = opt[0]["optimizer_state_bytes"]  # storage bytes; the allocator rounds to 512 B
            if not (
                states > 0 and states <= grew[0] - grew[1] <= 1.01 * states + 512 * 64 and all(g <= 0 for g in grew[1:])
            ):
                failures.append(f"train: optimizer states ({states} B) should appear in the first step only: {grew}")
        peaks = [p["max_memory_allocated"] for p in record["phases"]]
        carried.append(any(b < a for a, b in zip(peaks, peaks[1:])))
    if carried and not any(carried):
        failures.append("no phase peaked below the phase before it: is the peak reset between phases?")
    return failures


def check_pool(info: dict, out: Path) -> list[str]:
    """With several GPUs: one concurrent worker per GPU (joblib + pool=gpus), never two on one GPU."""
    n = int(info.get("device_count") or 1)
    if n < 2:
        print("gpu-check: one GPU visible, the concurrent pool check needs two or more (skipped)")
        return []
    batches = ",".join(str(b) for b in range(1, 2 * n + 1))
    args = [
        "sweep",
        "device=cuda",
        "pool=gpus",
        "hydra/launcher=joblib",
        f"hydra.launcher.n_jobs={n}",
        f"batch={batches}",
        "context=512",
        "width=1024",
        "sweep=none",
        f"hydra.sweep.dir={out}/pool",
    ]
    proc = memsweep(args, timeout=240)
    if proc.returncode != 0:
        return [f"pool sweep failed: {proc.stderr[-2000:]}"]
    runs = []
    for path in (out / "pool").glob("*/record.json"):
        rec = json.loads(path.read_text())
        runs.append((rec["started_at"], rec["updated_at"], rec["environment"]["cuda_visible_devices"], rec["outcome"]))
    failures = [f"pool run not ok: {r}" for r in runs if r[3] != "ok"]
    for i, a in enumerate(runs):
        failures += [
            f"two concurrent runs on GPU {a[2]}" for b in runs[i + 1 :] if a[0] < b[1] and b[0] < a[1] and a[2] == b[2]
        ]
    used = sorted({r[2] for r in runs})
    print(f"gpu-check pool: {len(runs)} runs over GPUs {used}")
    return failures


def check_devices(info: dict, out: Path) -> list[str]:
    """With 2+ GPUs: `memsweep run devices=2 pool=gpus` (mlp, small) leases two GPUs and records,
    per phase, two device entries (cuda:0, cuda:1), cuda:0's max_memory_allocated > 0 and equal
    to the phase's main counter (the run's counters are cuda:0's)."""
    if int(info.get("device_count") or 1) < 2:
        print("gpu-check: one GPU visible, the devices=2 check needs two or more (skipped)")
        return []
    run_dir = out / "devices"
    args = [
        "run",
        "device=cuda",
        "devices=2",
        "pool=gpus",
        "batch=4",
        "context=128",
        "width=256",
        "warmup=1",
        "repeats=1",
        f"hydra.run.dir={run_dir}",
    ]
    proc = memsweep(args, timeout=240)
    record_path = run_dir / "record.json"
    if proc.returncode != 0 or not record_path.is_file():
        return [f"devices=2 run failed ({proc.returncode}): {proc.stderr[-2000:]}"]
    record = json.loads(record_path.read_text())
    failures = [] if record["outcome"] == "ok" else [f"devices=2 run: {record['outcome']}: {record['error_message']}"]
    visible = (record["environment"]["cuda_visible_devices"] or "").split(",")
    if len(visible) != 2:
        failures.append(f"devices=2 run leased {visible}, not two GPUs")
    for p in record["phases"]:
        devices = p.get("devices") or []
        if [d.get("device_index") for d in devices] != [0, 1]:
            failures.append(f"devices=2 {p['name']}: device entries {devices}")
            continue
        peak0 = devices[0]["max_memory_allocated"]
        if not (isinstance(peak0, int) and peak0 > 0 and peak0 == p["max_memory_allocated"]):
            failures.append(
                f"devices=2 {p['name']}: cuda:0 max_memory_allocated {peak0} vs main {p['max_memory_allocated']}"
            )
    print(f"gpu-check devices=2: {record['outcome']}, GPUs {visible}, {len(record['phases'])} phases")
    return failures


def check_ranks(info: dict, out: Path) -> list[str]:
    """With 2+ GPUs: a DDP and an FSDP run of 2 ranks (`memsweep run parallel=ddp|fsdp world_size=2
    pool=gpus`, nccl: rank r on cuda:r of the two leased GPUs), each checked: outcome ok, the ranks
    on cuda:0 and cuda:1, every phase recorded by both ranks with a CUDA peak > 0, DDP ranks holding
    the whole model each, FSDP ranks about half of it (an even split, padded). One GPU: skipped,
    saying so (returns no failure)."""
    if int(info.get("device_count") or 1) < 2:
        print("gpu-check: one GPU visible, the 2-rank DDP/FSDP check (cuda:0 and cuda:1, nccl) needs two (skipped)")
        return []
    failures = []
    for parallel in ("ddp", "fsdp"):
        run_dir = out / f"ranks_{parallel}"
        args = [
            "run",
            "device=cuda",
            "pool=gpus",
            "mode=train",
            f"parallel={parallel}",
            "world_size=2",
            "batch=4",
            "context=128",
            "width=256",
            "workload.depth=4",
            "warmup=1",
            "repeats=1",
            "timeout_s=180",
            f"hydra.run.dir={run_dir}",
        ]
        proc = memsweep(args, timeout=300)
        record_path = run_dir / "record.json"
        if not record_path.is_file():
            failures.append(f"{parallel} 2 ranks: no record ({proc.returncode}): {proc.stderr[-2000:]}")
            continue
        record = json.loads(record_path.read_text())
        if record.get("outcome") != "ok":
            failures.append(f"{parallel} 2 ranks: {record.get('outcome')}: {record.get('error_message')}")
            continue
        ranks = record.get("ranks") or []
        devices = [r.get("device") for r in ranks]
        if devices != ["cuda:0", "cuda:1"]:
            failures.append(f"{parallel} 2 ranks on {devices}, not cuda:0 and cuda:1")
        for p in record["phases"]:
            entries = p.get("ranks") or []
            peaks = [e.get("max_memory_allocated") for e in entries]
            if [e.get("rank") for e in entries] != [0, 1] or not all(isinstance(v, int) and v > 0 for v in peaks):
                failures.append(
                    f"{parallel} {p['name']}: rank entries {[e.get('rank') for e in entries]}, peaks {peaks}"
                )
        whole = (record.get("model") or {}).get("parameter_bytes")
        held = [r.get("local_parameter_bytes") for r in ranks]
        share = whole if parallel == "ddp" else (whole or 0) / 2
        if not whole or not all(isinstance(h, int) and share <= h <= share * 1.01 for h in held):
            failures.append(
                f"{parallel}: ranks hold {held} B of the model's {whole} B (expected about {share:.0f} each)"
            )
        print(
            f"gpu-check ranks {parallel}: {record['outcome']}, ranks on {devices}, "
            f"parameters held {held} of {whole} B, "
            f"peaks {[r.get('max_memory_allocated') for r in ranks]} B"
        )
    return failures


def check_dry_run(out: Path) -> list[str]:
    """The same mlp inference and train specs on cuda:0, measured and dry-run (fake CUDA tensors,
    512 B blocks): model_load's memory_allocated must agree exactly (weights: their bytes in 512 B
    blocks on both sides); every other phase's predicted max_memory_allocated is printed next to
    the measured one with the relative error (library workspaces, e.g. cuBLAS's, are in the
    measured bytes only: printed, not failed)."""
    from memsweep.conf.contract import RunSpec
    from memsweep.sweeper.process import execute

    failures = []
    for mode in ("inference", "train"):
        base = dict(
            batch=8,
            context=256,
            width=512,
            device="cuda:0",
            mode=mode,
            warmup=1,
            repeats=1,
            workload={"name": "mlp", "depth": 2},
            timeout_s=120,
        )
        records = {}
        for kind, extra in (("measured", {}), ("predicted", {"dry_run": True})):
            run_dir = out / f"{mode}-{kind}"
            result = execute(RunSpec.from_dict({**base, **extra}), run_dir)
            if result["outcome"] != "ok":
                failures.append(f"dry-run check {mode} {kind}: {result['outcome']}: {result['error_message']}")
                break
            records[kind] = json.loads((run_dir / "record.json").read_text())
        if len(records) < 2:
            continue
        if records["predicted"].get("cuda_initialized") is not False:
            failures.append(f"dry-run check {mode}: the dry run initialised CUDA")
        print(f"gpu-check dry run vs measured, mlp {mode} (bytes, max_memory_allocated per phase):")
        for m, p in zip(records["measured"]["phases"], records["predicted"]["phases"]):
            mp, pp = m["max_memory_allocated"], p["max_memory_allocated"]
            err = (pp - mp) / mp if mp else float("nan")
            print(f"  {m['name']:<28} measured {mp:>12} predicted {pp:>12} ({err:+.2%})")
            if m["name"] == "model_load" and m["memory_allocated"] != p["memory_allocated"]:
                failures.append(
                    f"dry-run check {mode}: model_load memory_allocated measured "
                    f"{m['memory_allocated']} != predicted {p['memory_allocated']}"
                )
    return failures


THROUGHPUT_LOAD = ("context=512", "width=1024", "warmup=2", "repeats=5")
"""The throughput case's load: the mlp at a size where a GPU's samples per second saturate with the batch."""
THROUGHPUT_BATCHES = (8, 32, 128, 512, 2048)
"""Its batches (no emulated capacity: the device's own memory)."""


def throughput_lines(records: list[dict]) -> tuple[list[str], list[str]]:
    """Each run's measured throughput as a line, and what is wrong with it.

    Args:
        records: the sweep's record.json documents.

    Returns:
        (one line per run in batch order: batch, outcome, samples/s, tokens/s, noise, where timed;
        failures: an ok run without rates or timed over other than its repeats, another run with one).
    """
    from memsweep.conf.contract import timed_on

    lines, failures = [], []
    for rec in sorted(records, key=lambda r: r["spec"]["batch"]):
        batch, t = rec["spec"]["batch"], rec.get("throughput") or {}
        rate, tokens, noise = t.get("samples_per_s"), t.get("tokens_per_s"), t.get("noise_rel")
        where = timed_on(rec.get("device_kind"), (rec.get("environment") or {}).get("device_name"))
        if rec["outcome"] == "ok" and not (
            isinstance(rate, float) and rate > 0 and t.get("iterations") == rec["spec"]["repeats"]
        ):
            failures.append(
                f"throughput batch={batch}: an ok run without its rates over {rec['spec']['repeats']} iterations: {t}"
            )
        if rec["outcome"] != "ok" and any(v is not None for v in t.values()):
            failures.append(f"throughput batch={batch}: a {rec['outcome']} run with rates: {t}")
        shown = "-" if rate is None else f"{rate:.4g} samples/s, {_num(tokens)} tokens/s, noise {_pct(noise)}"
        lines.append(f"  batch={batch:<6} {rec['outcome']:<5} {shown} ({where})")
    return lines, failures


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _pct(noise: float | None) -> str:
    return "-" if noise is None else f"{100 * noise:.1f} %"


def check_throughput(
    out: Path,
    device: str = "cuda:0",
    load: tuple[str, ...] = THROUGHPUT_LOAD,
    batches: tuple[int, ...] = THROUGHPUT_BATCHES,
) -> list[str]:
    """A batch sweep on ``device`` whose measured samples per second it prints; returns failures
    (the sweep failed, no run ok, a run's rates missing or where none belong)."""
    args = ["sweep", f"device={device}", "sweep=none", "batch=" + ",".join(map(str, batches)), *load]
    proc = memsweep([*args, f"hydra.sweep.dir={out}"], timeout=400)
    if proc.returncode != 0:
        return [f"throughput sweep failed ({proc.returncode}): {proc.stderr[-3000:]}"]
    records = [json.loads(p.read_text()) for p in sorted(out.glob("*/record.json"))]
    lines, failures = throughput_lines(records)
    print("throughput (measured; the median over the warm iterations):", *lines, sep="\n")
    if not any(r["outcome"] == "ok" for r in records):
        failures.append(f"throughput: no run ok of {len(records)}")
    return failures
