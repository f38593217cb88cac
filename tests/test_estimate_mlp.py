"""The mlp estimate against measurements: in-process (the worker's own CPU tracker, exact to
the byte) and in real worker processes (``python -m memsweep.worker SPEC.json``, within 5%)."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from memsweep.analysis.tables import build_tables
from memsweep.conf.contract import RECORD_FILE, SPEC_FILE, RunSpec, write_json_atomic
from memsweep.estimator import estimate_for_spec, mlp_phases
from memsweep.sweeper.spec import spec_from_config, with_estimate
from tests.data.loads import run_worker

# (mode, dtype, batch, context, width, workload params): small loads, several shapes. Each
# worker process costs seconds of CPU (the torch import, and torch._dynamo's for training),
# so there are three; test_replay_matches_tracker_in_process covers more shapes.
LOADS = [
    ("inference", "bfloat16", 4, 16, 32, {"depth": 3, "activation": "silu"}),
    ("train", "float32", 2, 8, 16, {"depth": 2}),
    ("train", "float32", 8, 16, 24, {"depth": 3, "activation": "relu", "hidden": 40}),
]


def _spec(mode, dtype, batch, context, width, params) -> RunSpec:
    return RunSpec(
        batch=batch,
        context=context,
        width=width,
        dtype=dtype,
        mode=mode,
        device="cpu",
        workload={"name": "mlp", **params},
        warmup=1,
        repeats=2,
        timeout_s=120,
        threads=1,
    )


@pytest.fixture(scope="module")
def worker_runs(tmp_path_factory):
    """Each load of LOADS measured by a real worker process (run side by side), its spec
    carrying the estimate as the sweeper writes it. Returns [(spec, record, run_dir)]."""
    root = tmp_path_factory.mktemp("estimate_runs")
    runs = []
    for i, load in enumerate(LOADS):
        run_dir = root / str(i)
        run_dir.mkdir()
        spec = with_estimate(_spec(*load))
        write_json_atomic(run_dir / SPEC_FILE, spec.to_dict())
        runs.append((spec, run_dir))

    def measure(run_dir):
        return run_worker(run_dir, timeout=180)

    with ThreadPoolExecutor(len(runs)) as pool:
        procs = list(pool.map(measure, [d for _, d in runs]))
    out = []
    for (spec, run_dir), proc in zip(runs, procs):
        assert proc.returncode == 0, proc.stderr[-2000:]
        out.append((spec, json.loads((run_dir / RECORD_FILE).read_text()), run_dir))
    return out


def test_estimated_peak_within_5_percent_of_worker(worker_runs):
    """On the CPU, max_memory_allocated is the worker tracker's peak of live tensor storage
    bytes; the run's peak is the largest phase peak. The estimate is a replay of the same ops,
    so it should be exact; the issue asks for 5%."""
    for spec, record, _ in worker_runs:
        assert record["outcome"] == "ok"
        measured = max(p["max_memory_allocated"] for p in record["phases"])
        est = spec.estimate["peak"]
        error = (est - measured) / measured
        assert abs(error) <= 0.05, (spec.mode, spec.dtype, spec.batch, est, measured, error)
        assert est == measured  # in fact byte-exact with PyTorch 2.13 on the CPU


def test_every_phase_counter_matches_worker(worker_runs):
    """Per phase: memory_allocated at start and end and max_memory_allocated, estimate vs record."""
    for spec, record, _ in worker_runs:
        w = spec.workload
        phases = mlp_phases(
            spec.batch,
            spec.context,
            spec.width,
            dtype=spec.dtype,
            mode=spec.mode,
            depth=w["depth"],
            hidden=w["hidden"],
            activation=w["activation"],
            warmup=spec.warmup,
            repeats=spec.repeats,
        )
        got = [(p.name, p.start, p.peak, p.end) for p in phases]
        want = [
            (p["name"], p["memory_allocated_start"], p["max_memory_allocated"], p["memory_allocated"])
            for p in record["phases"]
        ]
        assert got == want


def test_runs_parquet_has_calculated_next_to_observed(worker_runs, tmp_path):
    """runs.parquet: est_* (calculated, from the spec) beside max_memory_allocated (observed),
    and estimate_error = (est_peak_bytes - max_memory_allocated) / max_memory_allocated."""
    sweep = worker_runs[0][2].parent
    runs, _, problems = build_tables([sweep])
    rows = runs.to_pylist()
    assert len(rows) == len(LOADS)
    for row in rows:
        assert row["est_peak_bytes"] is not None and row["max_memory_allocated"] is not None
        assert row["estimate_error"] == pytest.approx(
            (row["est_peak_bytes"] - row["max_memory_allocated"]) / row["max_memory_allocated"]
        )
        assert abs(row["estimate_error"]) <= 0.05
    train = [r for r in rows if r["mode"] == "train"]
    assert all(r["est_optimizer_states_bytes"] > 0 and r["est_gradients_bytes"] >= 0 for r in train)


def test_replay_matches_tracker_in_process():
    """Random small loads (every activation, dtype and mode) measured in this process with the
    worker's own LiveTensorTracker: every phase's start, peak and end equal the estimate."""
    import random

    import torch

    from memsweep.worker.counters import LiveTensorTracker
    from memsweep.worker.plan import plan
    from memsweep.worker.workloads import build_workload

    rng = random.Random(1)
    for _ in range(12):
        kw = dict(
            batch=rng.randint(1, 4),
            context=rng.randint(1, 6),
            width=rng.randint(1, 12),
            dtype=rng.choice(["float32", "float16", "bfloat16"]),
            mode=rng.choice(["inference", "train"]),
            warmup=rng.randint(0, 2),
            repeats=rng.randint(1, 2),
            precision="pure",  # what the replay models (a 16-bit training run's default is autocast)
        )
        params = dict(
            depth=rng.randint(1, 3),
            hidden=rng.choice([None, rng.randint(1, 20)]),
            activation=rng.choice(["gelu", "relu", "silu", "tanh"]),
        )
        spec = RunSpec(workload={"name": "mlp", **params}, **kw)
        tracker = LiveTensorTracker()
        tracker.__enter__()
        try:
            wl = build_workload(spec, torch.device("cpu"))
            measured = []
            for step in plan(spec, wl):  # the worker's phases, sub-phases included
                tracker.reset_peak()
                start = tracker.live
                for _ in range(step.iterations):
                    step.body()
                measured.append((start, tracker.peak, tracker.live))
        finally:
            tracker.__exit__(None, None, None)
        est = [
            (p.start, p.peak, p.end)
            for p in mlp_phases(
                spec.batch,
                spec.context,
                spec.width,
                dtype=spec.dtype,
                mode=spec.mode,
                warmup=spec.warmup,
                repeats=spec.repeats,
                **params,
            )
        ]
        assert est == measured, (kw, params)


def test_sweeper_fills_the_estimate(tiny):
    """spec_from_config puts the mlp estimate into the RunSpec (bytes by component)."""
    cfg = {k: v for k, v in tiny.items() if k != "workload"}
    spec = spec_from_config({**cfg, "workload": {"name": "mlp", "depth": 2}})
    assert spec.estimate == estimate_for_spec(spec).to_dict()
    assert spec.estimate["peak"] > spec.estimate["weights"] > 0
    assert estimate_for_spec({**spec.to_dict(), "workload": {"name": "transformer"}}) is None


def test_cuda_rounding_and_foreach():
    """On CUDA every allocation is rounded up to 512 B. width 4, hidden 16, depth 4: 4 x (2 x 4 x 16
    + 16 + 4) = 592 fp32 params = 2368 B on the CPU; on CUDA its 16 tensors (each <= 256 B)
    take 16 x 512 = 8192 B."""
    cpu = mlp_phases(2, 3, 4, mode="train", device="cpu")
    cuda = mlp_phases(2, 3, 4, mode="train", device="cuda:0")
    assert cuda[0].end == 8192 and cpu[0].end == 2368
    assert max(p.peak for p in cuda) > max(p.peak for p in cpu)
