"""`make gpu-check`: the CUDA path, checked on a machine with a GPU (not part of `make test`).

Runs a small batch sweep of the mlp on cuda:0 through the real `memsweep sweep` command at an
emulated capacity (set_per_process_memory_fraction) chosen so that the list holds fitting and
OOM values, then checks every recorded phase:

* the counters come from torch.cuda / torch.accelerator (never the CPU tracker);
* memory_allocated <= memory_reserved, at the start and at the end of each phase;
* max_memory_allocated >= memory_allocated, max_memory_reserved >= memory_reserved;
* max_memory_allocated <= max_memory_reserved;
* the emulated capacity produced at least one `oom`, classified from torch.OutOfMemoryError,
  and the frontier's max_ok and min_oom are runs that happened.

Exit 0 when every check passes, 1 when one fails, 2 when no GPU is visible (nothing checked).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> int:
    probe = subprocess.run([sys.executable, "-m", "worker", "--probe", "cuda:0"], capture_output=True, text=True)
    info = json.loads(probe.stdout.strip().splitlines()[-1])
    if not info.get("available"):
        print(f"gpu-check: no GPU visible ({info.get('reason')}); nothing checked")
        return 2
    print(f"gpu-check: {info['device_name']}, total_memory {info['total_memory']} B")
    out = Path(tempfile.mkdtemp(prefix="memsweep-gpu-check-"))
    # width 1024, context 512: the (batch, 512, 4096) fp32 hidden activation is 8 MiB per batch element.
    cmd = [sys.executable, "-m", "sweeper.cli", "sweep", "device=cuda:0", "capacity=1GiB", "context=512",
           "width=1024", "batch=1,8,32,64,128,256", f"hydra.sweep.dir={out}/sweep", "sweep=none"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    print(proc.stdout[-4000:])
    if proc.returncode != 0:
        print(proc.stderr[-4000:])
        return 1
    failures, outcomes = [], {}
    for record_path in sorted((out / "sweep").glob("*/record.json")):
        record = json.loads(record_path.read_text())
        batch = record["spec"]["batch"]
        outcomes[batch] = record["outcome"]
        if not record["counter_sources"]["memory_allocated"].startswith(("cuda:", "hip:")):
            failures.append(f"batch={batch}: counters not from the CUDA allocator: {record['counter_sources']}")
        for p in record["phases"]:
            where = f"batch={batch} {p['name']}"
            a0, r0 = p["memory_allocated_start"], p["memory_reserved_start"]
            a, r, ma, mr = p["memory_allocated"], p["memory_reserved"], p["max_memory_allocated"], p["max_memory_reserved"]
            if None in (a0, r0, a, r, ma, mr):
                failures.append(f"{where}: a counter is missing: {p}")
                continue
            checks = {"allocated_start <= reserved_start": a0 <= r0, "allocated <= reserved": a <= r,
                      "max_allocated >= allocated": ma >= a, "max_reserved >= reserved": mr >= r,
                      "max_allocated <= max_reserved": ma <= mr}
            failures += [f"{where}: {name} fails ({p})" for name, ok in checks.items() if not ok]
        if record["outcome"] == "oom" and "out of memory" not in (record["error_message"] or ""):
            failures.append(f"batch={batch}: oom without the CUDA OOM message: {record['error_message']}")
    print("gpu-check outcomes by batch:", dict(sorted(outcomes.items())))
    failures += check_pool(info, out)
    if "oom" not in outcomes.values() or "ok" not in outcomes.values():
        failures.append(f"expected both ok and oom at capacity=1GiB, got {outcomes}")
    for f in failures:
        print("FAIL", f)
    print("gpu-check:", "all checks passed" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


def check_pool(info: dict, out: Path) -> list[str]:
    """With several GPUs: one concurrent worker per GPU (joblib + pool=gpus), never two on one GPU."""
    n = int(info.get("device_count") or 1)
    if n < 2:
        print("gpu-check: one GPU visible, the concurrent pool check needs two or more (skipped)")
        return []
    batches = ",".join(str(b) for b in range(1, 2 * n + 1))
    cmd = [sys.executable, "-m", "sweeper.cli", "sweep", "device=cuda", "pool=gpus", "hydra/launcher=joblib",
           f"hydra.launcher.n_jobs={n}", f"batch={batches}", "context=512", "width=1024", "sweep=none",
           f"hydra.sweep.dir={out}/pool"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        return [f"pool sweep failed: {proc.stderr[-2000:]}"]
    runs = []
    for path in (out / "pool").glob("*/record.json"):
        rec = json.loads(path.read_text())
        runs.append((rec["started_at"], rec["updated_at"], rec["environment"]["cuda_visible_devices"], rec["outcome"]))
    failures = [f"pool run not ok: {r}" for r in runs if r[3] != "ok"]
    for i, a in enumerate(runs):
        failures += [f"two concurrent runs on GPU {a[2]}" for b in runs[i + 1:]
                     if a[0] < b[1] and b[0] < a[1] and a[2] == b[2]]
    used = sorted({r[2] for r in runs})
    print(f"gpu-check pool: {len(runs)} runs over GPUs {used}")
    return failures


if __name__ == "__main__":
    sys.exit(main())
