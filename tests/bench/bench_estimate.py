"""Estimate vs measurement for the mlp workload: per load, per component, per phase.

Each load runs in a fresh worker process (``sweeper.process.execute``, as a sweep does), its
spec carrying the estimate (``sweeper.spec.with_estimate``). Printed side by side, in bytes:

* components that the counters can isolate: weights (``memory_allocated`` after model_load),
  inputs (growth over the inputs phase), persistent training state (gradients + optimizer
  states: growth over cold_step);
* every phase's ``max_memory_allocated``, and the run's (the largest), with the error
  (estimated - measured) / measured;
* the calculated breakdown at the peak (not measurable component by component).

Then the calculated figures beside accelerate's ``estimate-memory`` and DeepSpeed's ZeRO
estimators on public configs (``bench_estimate_peers.py``).

On the CPU, "allocated" is the worker's tracker of live tensor storage bytes, not a GPU
measurement. ``python -m tests.bench.run_all estimate`` (or ``make bench BENCH=estimate``).
Environment: ``MEMSWEEP_BENCH_DEVICE`` (default cpu), ``MEMSWEEP_BENCH_JOBS`` (default 2).
"""

from __future__ import annotations

import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memsweep.conf.contract import RECORD_FILE, RunSpec, read_json  # noqa: E402
from memsweep.estimator import COMPONENTS, mlp_phases  # noqa: E402
from memsweep.sweeper.process import execute  # noqa: E402
from memsweep.sweeper.spec import with_estimate  # noqa: E402

DEVICE = os.environ.get("MEMSWEEP_BENCH_DEVICE", "cpu")
JOBS = int(os.environ.get("MEMSWEEP_BENCH_JOBS", "2"))

# The loads, one row each of the RunSpec fields in LOAD_FIELDS (workload: mlp with these params).
LOAD_FIELDS = ("mode", "dtype", "batch", "context", "width", "workload")
LOADS = [
    ("inference", "float32", 8, 128, 256, {"name": "mlp"}),
    ("inference", "float32", 32, 128, 256, {"name": "mlp"}),
    ("inference", "bfloat16", 2, 64, 512, {"name": "mlp"}),
    ("train", "float32", 8, 128, 256, {"name": "mlp"}),
    ("train", "float32", 32, 64, 256, {"name": "mlp", "activation": "relu"}),
    ("train", "bfloat16", 4, 128, 384, {"name": "mlp", "depth": 2}),
]
# What every load runs with: the bench's device, a short protocol (one warm-up, two measured).
SETTINGS = {"device": DEVICE, "warmup": 1, "repeats": 2, "timeout_s": 600}


def _err(est: int | None, meas: int | None) -> str:
    if est is None or not meas:
        return "-"
    return f"{(est - meas) / meas:+.2%}"


def _row(label: str, est: int | None, meas: int | None) -> str:
    e = "-" if est is None else str(est)
    m = "-" if meas is None else str(meas)
    return f"  {label:<46} {e:>13} {m:>13} {_err(est, meas):>9}"


def report(spec: RunSpec, record: dict) -> tuple[str, float | None]:
    w = spec.workload
    est = {
        p.name: p
        for p in mlp_phases(
            spec.batch,
            spec.context,
            spec.width,
            dtype=spec.dtype,
            mode=spec.mode,
            depth=w["depth"],
            hidden=w["hidden"],
            activation=w["activation"],
            device=spec.device,
            warmup=spec.warmup,
            repeats=spec.repeats,
        )
    }
    meas = {p["name"]: p for p in record.get("phases") or []}
    lines = [
        f"load: {spec.mode} {spec.dtype} batch={spec.batch} context={spec.context} width={spec.width} "
        f"depth={w['depth']} hidden={w['hidden'] or 4 * spec.width} {w['activation']} on {spec.device} "
        f"-> {record.get('outcome')}",
        f"  {'quantity (bytes)':<46} {'estimated':>13} {'measured':>13} {'error':>9}",
    ]

    def m(phase: str, key: str) -> int | None:
        return (meas.get(phase) or {}).get(key)

    lines.append(
        _row("weights (allocated after model_load)", est["model_load"].end, m("model_load", "memory_allocated"))
    )
    mi = m("inputs", "memory_allocated")
    lines.append(
        _row(
            "inputs (growth over inputs)",
            est["inputs"].end - est["inputs"].start,
            None if mi is None else mi - m("inputs", "memory_allocated_start"),
        )
    )
    if spec.mode == "train":
        # the first step is recorded as sub-phases: cold_step.forward ... cold_step.optimizer_step
        mc = m("cold_step.optimizer_step", "memory_allocated")
        lines.append(
            _row(
                "gradients + optimizer states (growth, cold_step)",
                est["cold_step.optimizer_step"].end - est["cold_step.forward"].start,
                None if mc is None else mc - m("cold_step.forward", "memory_allocated_start"),
            )
        )
    for name, p in est.items():
        lines.append(_row(f"max_memory_allocated, {name}", p.peak, m(name, "max_memory_allocated")))
    est_peak = max(p.peak for p in est.values())
    peaks = [p.get("max_memory_allocated") for p in meas.values() if p.get("max_memory_allocated") is not None]
    meas_peak = max(peaks) if peaks and record.get("outcome") == "ok" else None
    lines.append(_row("run peak (max over phases)", est_peak, meas_peak))
    assert spec.estimate is None or spec.estimate["peak"] == est_peak
    top = max(est.values(), key=lambda p: p.peak)
    lines.append(
        f"  calculated at the peak ({top.name}): "
        + ", ".join(f"{c}={getattr(top.at_peak, c)}" for c in COMPONENTS if getattr(top.at_peak, c))
    )
    resv = [p.get("max_memory_reserved") for p in meas.values() if p.get("max_memory_reserved") is not None]
    if resv:
        lines.append(
            f"  observed max_memory_reserved ({'process RSS' if spec.device == 'cpu' else 'allocator'},"
            f" not estimated): {max(resv)}"
        )
    error = None if meas_peak is None else (est_peak - meas_peak) / meas_peak
    return "\n".join(lines), error


def main() -> int:
    specs = [with_estimate(RunSpec(**dict(zip(LOAD_FIELDS, load)), **SETTINGS)) for load in LOADS]
    print(f"estimate vs measurement, mlp workload on {DEVICE}; {len(specs)} loads, {JOBS} worker(s) at a time")
    if DEVICE == "cpu":
        print("CPU: allocated = worker-tracked live tensor storage bytes (not a GPU measurement)")
    with tempfile.TemporaryDirectory(prefix="memsweep-bench-estimate-") as tmp:
        dirs = [Path(tmp) / str(i) for i in range(len(specs))]
        with ThreadPoolExecutor(JOBS) as pool:
            list(pool.map(lambda sd: execute(*sd), zip(specs, dirs)))
        errors = []
        for spec, d in zip(specs, dirs):
            try:
                record = read_json(d / RECORD_FILE, "record")
            except Exception as exc:  # noqa: BLE001 - a bench reports and goes on
                print(f"load {spec.mode} batch={spec.batch}: no record ({exc})")
                continue
            text, error = report(spec, record)
            print(text)
            if error is not None:
                errors.append(error)
    if errors:
        print(f"run-peak error over {len(errors)} loads: max |error| {max(abs(e) for e in errors):.4%}")
    from tests.bench.bench_estimate_peers import main as peers_main

    return peers_main()


if __name__ == "__main__":
    sys.exit(main())
