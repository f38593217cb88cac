"""`make gpu-check`: memsweep's CUDA path on a GPU machine as it is (not part of `make test`).

Runs with the interpreter that holds the machine's CUDA PyTorch (>= 2.4; no venv, nothing
installed but the missing pure-Python dependencies, unpacked from the wheels brought along in
.gpu-wheels/: tests/gpu_env.py). Says in one line which build it found, then runs the cases for
a first GPU in one go (within about 5 minutes on one GPU) and prints a compact table:

* counters protocol: every phase of a batch sweep of the mlp on cuda:0 at an emulated 1 GiB,
  allocated <= reserved, peaks >= current values, allocated peak <= reserved peak, CUDA sources;
* capacity OOM: the sweep holds ok and oom runs, each OOM CUDA's own (matched case-insensitively),
  the allocator's limit never under capacity minus the footprint, no reserved peak above it;
* cold vs warm: what the cold phase keeps of an inference run (cuBLAS workspaces and autotuning),
  with CUBLAS_WORKSPACE_CONFIG recorded;
* memory outside the allocator: measured in every phase and at set-up (total - free - reserved);
* peak reset between phases, bf16 and autocast, generation: tests/gpu_cases.py ``check_modes``;
* one snapshot for one OOM run (snapshot_on_oom on a single run, Python stacks, bounded);
* dry run vs measured per phase: ``check_dry_run``; samples/s of a batch sweep: ``check_throughput``;
  with 2+ GPUs the pool and devices=2;
* torch.compile, LoRA and QLoRA with adamw8bit: tests/gpu_finetune.py ``check_finetune`` (each
  part skipped, saying so, where its package is missing).

Exit 0 when every check passes, 1 when one fails, 2 when nothing could be checked (no GPU
visible, a CPU-only build, PyTorch too old, a dependency without its wheel).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpu_env import (
    ROOT,
    child_env,
    describe_build,
    install_finetune,
    install_missing,
    memsweep,
    package_dir,
    torch_info,
)

SWEEP_BATCHES = (1, 8, 32, 64, 128, 256)  # mlp width 1024, context 512: 8 MiB of hidden activation per item
CAPACITY = 2**30


def is_cuda_oom(message: str | None) -> bool:
    """Whether an error message is the CUDA caching allocator's OOM ("CUDA out of memory", any case)."""
    return "out of memory" in (message or "").lower()


def probe_line(out: dict) -> str:
    """The worker's --probe answer as one line; a crashed probe is said so, never an IndexError."""
    proc = subprocess.run(
        [sys.executable, "-m", "memsweep.worker", "--probe", "cuda:0"], capture_output=True, text=True, env=child_env()
    )
    lines = proc.stdout.strip().splitlines()
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        out.update(available=False, reason=f"the probe crashed (exit {proc.returncode}): {tail}")
    else:
        out.update(json.loads(lines[-1]))
    return f"{out.get('device_name')}, total_memory {out.get('total_memory')} B" if out.get("available") else ""


def check_sweep(out: Path, rows: list) -> list[str]:
    """The batch sweep at an emulated 1 GiB: protocol, capacity OOM, cold vs warm, outside memory."""
    args = ["sweep", "device=cuda:0", "capacity=1GiB", "context=512", "width=1024"]
    args += ["batch=" + ",".join(map(str, SWEEP_BATCHES)), f"hydra.sweep.dir={out}", "sweep=none"]
    proc = memsweep(args, timeout=240)
    if proc.returncode != 0:
        return [f"sweep failed ({proc.returncode}): {proc.stderr[-3000:]}"]
    failures, outcomes, records = [], {}, {}
    for path in sorted(out.glob("*/record.json")):
        rec = json.loads(path.read_text())
        batch = rec["spec"]["batch"]
        outcomes[batch], records[batch] = rec["outcome"], rec
        if not str(rec["counter_sources"]["memory_allocated"]).startswith(("cuda:", "hip:")):
            failures.append(f"batch={batch}: counters not from the CUDA allocator")
        for p in rec["phases"]:
            a0, r0, a, r = (
                p["memory_allocated_start"],
                p["memory_reserved_start"],
                p["memory_allocated"],
                p["memory_reserved"],
            )
            ma, mr = p["max_memory_allocated"], p["max_memory_reserved"]
            if None in (a0, r0, a, r, ma, mr):
                failures.append(f"batch={batch} {p['name']}: a counter is missing")
            elif not (a0 <= r0 and a <= r and ma >= a and mr >= r and ma <= mr):
                failures.append(f"batch={batch} {p['name']}: counters out of order {(a0, r0, a, r, ma, mr)}")
            if not isinstance(p.get("outside_allocator_bytes"), int):
                failures.append(f"batch={batch} {p['name']}: outside_allocator_bytes not measured")
        cap = rec.get("capacity") or {}
        start, limit = cap.get("outside_allocator_start_bytes"), cap.get("allocator_limit_bytes")
        if not isinstance(start, int) or not isinstance(limit, int) or limit < CAPACITY - start:
            failures.append(f"batch={batch}: allocator limit {limit} under capacity - footprint {start}")
        peak = max((p["max_memory_reserved"] or 0) for p in rec["phases"]) if rec["phases"] else 0
        if isinstance(limit, int) and peak > limit:
            failures.append(f"batch={batch}: reserved peak {peak} above the allocator limit {limit}")
        if rec["outcome"] == "oom" and not is_cuda_oom(rec["error_message"]):
            failures.append(f"batch={batch}: oom without CUDA's OOM message: {rec['error_message']}")
        if "cublas_workspace_config" not in (rec.get("environment") or {}):
            failures.append(f"batch={batch}: CUBLAS_WORKSPACE_CONFIG not recorded")
    ok = [b for b, o in outcomes.items() if o == "ok"]
    if not ok or "oom" not in outcomes.values():
        failures.append(f"expected ok and oom runs at {CAPACITY} B, got {outcomes}")
    rows.append(("capacity OOM", not failures, " ".join(f"{b}:{o}" for b, o in sorted(outcomes.items()))))
    if ok:
        rec = records[min(ok)]
        cold = next((p for p in rec["phases"] if p["name"] == "cold_forward"), {})
        kept = (cold.get("memory_allocated") or 0) - (cold.get("memory_allocated_start") or 0)
        outside = [p["outside_allocator_bytes"] for p in rec["phases"]]
        cfg = rec["environment"].get("cublas_workspace_config") or "unset"
        rows.append(("cold keeps (cuBLAS)", kept >= 0, f"{kept} B kept by cold_forward, CUBLAS_WORKSPACE_CONFIG {cfg}"))
        cap = rec["capacity"]
        rows.append(
            (
                "outside allocator",
                bool(outside) and all(isinstance(v, int) and v > 0 for v in outside),
                f"start {cap.get('outside_allocator_start_bytes')} B, phases {outside} B, "
                f"fraction {cap.get('memory_fraction')} (nominal {cap.get('memory_fraction_nominal')})",
            )
        )
    return failures


def check_snapshot(out: Path, rows: list) -> list[str]:
    """One OOM run with snapshot_on_oom: the OOM recorded, the snapshot kept and bounded."""
    from memsweep.conf.contract import RunSpec
    from memsweep.sweeper.process import execute

    spec = dict(batch=max(SWEEP_BATCHES), context=512, width=1024, device="cuda:0", capacity_bytes=CAPACITY)
    result = execute(RunSpec.from_dict({**spec, "snapshot_on_oom": True, "timeout_s": 120}), out)
    rec = json.loads((out / "record.json").read_text())
    snap = rec.get("oom_snapshot") or {}
    kept = snap.get("file") and (out / snap["file"]).is_file()
    failures = [] if result["outcome"] == "oom" else [f"snapshot run: {result['outcome']}: {result['error_message']}"]
    if not kept:
        failures.append(f"snapshot_on_oom: no snapshot kept: {snap}")
    rows.append(
        ("one OOM snapshot", not failures, f"{result['outcome']}, {snap.get('bytes')} B, {snap.get('problem')}")
    )
    return failures


def main() -> int:
    t0 = time.monotonic()
    info = torch_info()
    usable, line = describe_build(info)
    print(line)
    if not usable:
        return 2
    try:
        installed = install_missing() + install_finetune()
    except RuntimeError as exc:
        print(exc)
        return 2
    print(f"gpu-check: installed from .gpu-wheels: {', '.join(installed) or 'nothing (all present)'}")
    os.environ["PYTHONPATH"] = child_env()["PYTHONPATH"]  # for the workers started from this process
    sys.path[:0] = [str(package_dir()), str(ROOT)]  # this checkout as memsweep, and tests
    probe: dict = {}
    device = probe_line(probe)
    if not probe.get("available"):
        print(f"gpu-check: no GPU visible to the worker ({probe.get('reason')}); nothing checked")
        return 2
    print(f"gpu-check: {device}")
    import gpu_cases
    import gpu_finetune

    out = Path(tempfile.mkdtemp(prefix="memsweep-gpu-check-"))
    rows: list = []
    failures = check_sweep(out / "sweep", rows)
    failures += check_snapshot(out / "snapshot", rows)
    for name, case, label in (
        ("modes", lambda: gpu_cases.check_modes(out / "modes"), "bf16 autocast, peak reset, generate"),
        ("dry run", lambda: gpu_cases.check_dry_run(out / "dry"), "dry run vs measured per phase"),
        ("throughput", lambda: gpu_cases.check_throughput(out / "throughput"), "samples/s of a batch sweep"),
        ("pool", lambda: gpu_cases.check_pool(probe, out), "one run per GPU (2+ GPUs)"),
        ("devices=2", lambda: gpu_cases.check_devices(probe, out), "per-device counters (2+ GPUs)"),
        ("ranks=2", lambda: gpu_cases.check_ranks(probe, out), "DDP/FSDP ranks on cuda:0, cuda:1, nccl (2+ GPUs)"),
    ):
        found = case()
        rows.append((name, not found, label if not found else f"{len(found)} failure(s)"))
        failures += found
    found, summary = gpu_finetune.check_finetune(out / "finetune")
    rows.append(("compile, LoRA, QLoRA", not found, summary))
    failures += found
    print(f"\n{'check':<22} {'result':<6} values")
    for name, ok, values in rows:
        print(f"{name:<22} {'ok' if ok else 'FAIL':<6} {values}")
    for f in failures:
        print("FAIL", f)
    print(f"gpu-check: {len(failures)} failure(s) in {time.monotonic() - t0:.0f} s; files in {out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
