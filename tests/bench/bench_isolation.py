"""Cost of isolation, measured side by side in one run.

1. 20 isolated trivial runs (a tiny mlp, warmup 0, 1 repeat) with isolation=spawn and with
   isolation=forkserver, each as a ratio to 20 bare `python -c "import torch"` starts
   (goal for forkserver: at most 0.3).
2. A 16-run CPU sweep with 1 and with 2 concurrent workers (hydra/launcher=joblib,
   pool=cores so the two never share a core), as a ratio of parallel to serial wall time
   (goal: at most 0.6 on 2 cores), with runs of about 1.3, 2.6 and 5 s (context 128, 256,
   512). The sweep's main process starts one fork server for both joblib workers
   (``share_fork_server``); the ovat sweeper launches the largest conditions first. What
   does not halve is fixed per sweep (Hydra's start, the fork server's ``import torch``,
   the analysis at the end, joblib starting its workers), so the ratio falls towards 0.5
   as runs get longer. Run it on an otherwise idle machine: with the cores busy elsewhere,
   two workers have nothing to run side by side on.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from memsweep.conf.contract import RunSpec
from memsweep.sweeper.process import execute
from tests.data.loads import MEMSWEEP

N = 20
TRIVIAL = RunSpec(
    batch=1, context=4, width=8, device="cpu", workload={"name": "mlp", "depth": 1}, warmup=0, repeats=1, threads=1
)


def bare_imports(n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - t0


def isolated_runs(n: int, isolation: str) -> float:
    root = Path(tempfile.mkdtemp(prefix=f"memsweep-bench-{isolation}-"))
    if isolation == "forkserver":  # start the server once, outside the timing: it is paid once per sweep
        execute(TRIVIAL, root / "warm", isolation=isolation)
    t0 = time.perf_counter()
    for i in range(n):
        result = execute(TRIVIAL, root / str(i), isolation=isolation)
        assert result["outcome"] == "ok", result
    elapsed = time.perf_counter() - t0
    shutil.rmtree(root, ignore_errors=True)
    return elapsed


def sweep(n_jobs: int, context: int) -> float:
    root = Path(tempfile.mkdtemp(prefix="memsweep-bench-sweep-"))
    batches = ",".join(str(b) for b in range(1, 17))
    t0 = time.perf_counter()
    # Compute-bound runs (one core each: pool=cores pins every run and its threads to its own core),
    # so that the sweep measures running conditions side by side, not the orchestrator's fixed costs.
    subprocess.run(
        [
            MEMSWEEP,
            "sweep",
            "sweep=none",
            f"batch={batches}",
            f"context={context}",
            "width=256",
            "warmup=2",
            "repeats=4",
            "device=cpu",
            "pool=cores",
            "hydra/launcher=joblib",
            "hydra.callbacks.analyze.report=false",
            f"hydra.launcher.n_jobs={n_jobs}",
            f"hydra.sweep.dir={root}/s",
        ],
        check=True,
        capture_output=True,
        cwd=root,
    )
    elapsed = time.perf_counter() - t0
    shutil.rmtree(root, ignore_errors=True)
    return elapsed


def main() -> None:
    bare = bare_imports(N)
    spawn = isolated_runs(N, "spawn")
    fork = isolated_runs(N, "forkserver")
    print(f"{N} bare `python -c 'import torch'`:   {bare:7.2f} s  (1.00)")
    print(f"{N} isolated runs, isolation=spawn:      {spawn:7.2f} s  ({spawn / bare:.2f} of bare imports)")
    print(
        f"{N} isolated runs, isolation=forkserver: {fork:7.2f} s  ({fork / bare:.2f} of bare imports; goal <= 0.30: "
        f"{'met' if fork / bare <= 0.3 else 'NOT met'})"
    )
    # Short runs (about 1.3 s each at context 128) leave the sweep's fixed costs in view; longer
    # runs (context 256 and 512, about 2.6 and 5 s each) are closer to a real memory sweep's.
    for context in (128, 256, 512):
        serial = sweep(1, context)
        parallel = sweep(2, context)
        print(f"16-run CPU sweep (batch 1..16 x context {context}), 1 worker:  {serial:7.2f} s  (1.00)")
        print(
            f"16-run CPU sweep (batch 1..16 x context {context}), 2 workers: {parallel:7.2f} s  "
            f"({parallel / serial:.2f} of serial; goal <= 0.60: {'met' if parallel / serial <= 0.6 else 'NOT met'})"
        )


if __name__ == "__main__":
    main()
