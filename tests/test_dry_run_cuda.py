"""Dry runs for a CUDA device on a machine without a GPU (spec ``dry_run`` with device cuda:N).

The worker runs the phases on fake CUDA tensors and counts each CUDA storage rounded up to the
caching allocator's 512 B blocks (worker.counters.CUDA_BLOCK_BYTES), so that the predicted
peak is the one torch.cuda.max_memory_allocated would report. Each load runs in real worker
processes (sweeper.process.execute), once for cuda:0 and once for cpu, and the two are
compared: the difference must be the rounding, byte for byte, where it can be computed by hand.
"""

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_dry_run import run_dry_worker  # noqa: E402  (the same real-process helper)

from memsweep.conf.contract import RunSpec, SpecError
from tests.data.loads import MEMSWEEP

BASE = dict(context=16, width=32, dtype="float32", warmup=1, repeats=1, timeout_s=300, threads=1, dry_run=True)
LM = {"name": "transformer", "layers": 2, "heads": 4, "kv_heads": 2, "vocab": 128}
LOADS = {
    "mlp1_inference": dict(BASE, batch=2, mode="inference", workload={"name": "mlp", "depth": 1}),
    "mlp_train": dict(BASE, batch=3, mode="train", workload={"name": "mlp", "depth": 2}),
    "lm_inference": dict(BASE, batch=3, mode="inference", workload=LM),
    "lm_generate": dict(BASE, batch=2, mode="generate", workload=LM, new_tokens=3),
    # a static KV cache is written by slice assignment: indexing fake CUDA tensors
    "lm_generate_static": dict(BASE, batch=2, mode="generate", workload=LM, new_tokens=3, kv_cache="static"),
}
SPLIT = (
    "predicted_parameter_bytes",
    "predicted_gradient_bytes",
    "predicted_optimizer_state_bytes",
    "predicted_activation_bytes",
)


def _r512(n: int) -> int:
    return -(-n // 512) * 512


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cudadry")
    with ThreadPoolExecutor(2) as pool:
        jobs = {
            (name, device): pool.submit(
                run_dry_worker, root, f"{name}-{device.replace(':', '')}", dict(data, device=device)
            )
            for name, data in LOADS.items()
            for device in ("cuda:0", "cpu")
        }
        return {key: job.result() for key, job in jobs.items()}


def _cuda_build() -> bool:
    import torch

    return bool(torch.cuda._is_compiled())


def _ok(run: dict) -> dict:
    record = run["record"]
    assert run["result"]["outcome"] == "ok" and record["outcome"] == "ok", record.get("error_message")
    return record


# ----- the rounding --------------------------------------------------------------------------
def test_cuda_block_bytes_rounds_up_to_512():
    from memsweep.worker.counters import cuda_block_bytes

    assert [cuda_block_bytes(n) for n in (0, 1, 511, 512, 513, 1024, 4 * 10**6 + 1)] == [
        0,
        512,
        512,
        512,
        1024,
        1024,
        7813 * 512,
    ]
    with pytest.raises(ValueError):
        cuda_block_bytes(-1)


def test_the_tracker_counts_cuda_storages_only_in_512_byte_blocks():
    """In-process, fake tensors: a 12 B CUDA tensor counts 512 B, a 2048 B one 2048 B, a view
    nothing more, a host tensor nothing (it is not in the CUDA allocator's counters)."""
    import torch

    from memsweep.worker.counters import FakeLiveTensorTracker, fake_mode

    tracker = FakeLiveTensorTracker(device_type="cuda", block_bytes=512)
    with fake_mode("cuda"), tracker:
        a = torch.empty(3, device="cuda:0")  # 12 B -> 512 B
        b = torch.empty(512, device="cuda:0")  # 2048 B
        view = b.narrow(0, 0, 10)  # a view: same storage
        host = torch.empty(1000)  # on the host: not counted
        live = tracker.live
        del a
        after = tracker.live
    assert live == 512 + 2048 and after == 2048
    assert view.device.type == "cuda" and host.device.type == "cpu"


def test_a_host_constant_moved_to_cuda_in_inference_mode_stays_fake():
    """In-process, fake tensors: ``torch.tensor(..., device="cuda")`` inside inference_mode (as
    transformers' DynamicLayer.lazy_initialization makes its empty KV cache in a generate phase)
    is a fake CUDA tensor counted in 512 B blocks; FakeTensorMode alone would copy the constant
    with the real CUDA kernel (none on a CPU-only PyTorch; a CUDA context on a GPU machine)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    from memsweep.worker.counters import FakeLiveTensorTracker, fake_mode

    tracker = FakeLiveTensorTracker(device_type="cuda", block_bytes=512)
    with fake_mode("cuda"), tracker, torch.inference_mode():
        empty = torch.tensor([], dtype=torch.bfloat16, device="cuda:0")
        pair = torch.tensor([1.0, 2.0], device="cuda:0")
        same = pair.to("cuda:0")
        cast = pair.to(torch.float16)
        live = tracker.live
    assert all(isinstance(t, FakeTensor) and t.device.type == "cuda" for t in (empty, pair, cast))
    assert empty.numel() == 0 and empty.dtype == torch.bfloat16
    assert same is pair  # Tensor.to of nothing to change is the tensor itself, as on real tensors
    assert live == 512 + 512  # pair (8 B) and cast (4 B), one block each; the empty one none
    assert not torch.cuda.is_initialized()


# ----- the worker's CUDA dry run -------------------------------------------------------------
@pytest.mark.parametrize("load", ["mlp1_inference", "lm_inference", "lm_generate", "lm_generate_static"])
def test_a_cuda_dry_run_completes_without_a_gpu_and_never_initialises_cuda(runs, load):
    import torch

    assert not torch.cuda.is_available()  # this machine: a real CUDA call would fail the run
    record = _ok(runs[(load, "cuda:0")])
    assert record["source"] == "predicted" and record["device"] == "cuda:0" and record["device_kind"] == "cuda"
    assert record["cuda_initialized"] is False
    assert "512 B" in record["prediction_rounding"]
    assert runs[(load, "cpu")]["record"]["prediction_rounding"].startswith("none")
    # what a real run reads from the device is unknown on a dry run: null, never invented
    assert record["device_total_memory"] is None and record["device_free_memory_start"] is None
    env = record["environment"]
    assert env["total_memory"] is None and env["capability"] is None and env["device_name"] is None
    assert all(v is None or v.startswith("predicted") for v in record["counter_sources"].values())
    assert env["fake_cuda_guard"].startswith("pytorch" if _cuda_build() else "installed")
    for p in record["phases"]:
        assert p["memory_reserved"] is None and p["max_memory_reserved"] is None
        assert all(isinstance(p[k], int) for k in SPLIT), p["name"]
        assert sum(p[k] for k in SPLIT) == p["max_memory_allocated"], p["name"]  # the split sums to the peak
        assert p["max_memory_allocated"] % 512 == 0 and p["memory_allocated"] % 512 == 0, p["name"]


def test_one_block_mlp_inference_by_hand(runs):
    """mlp depth 1, width 32, hidden 128, batch 2, context 16, float32. Parameters: W1 (128, 32)
    16384 B, b1 512 B, W2 (32, 128) 16384 B, b2 128 B -> 512 B on CUDA: 33792 B (CPU: 33408 B).
    Inputs x (2, 16, 32): 4096 B. Forward peak: parameters + x + the hidden activation (2, 16,
    128) and its GELU, 16384 B each. Every CUDA phase is the CPU one plus 384 B (b2's rounding)."""
    cuda, cpu = _ok(runs[("mlp1_inference", "cuda:0")]), _ok(runs[("mlp1_inference", "cpu")])
    params, params_exact, x, h = 16384 + 512 + 16384 + 512, 16384 + 512 + 16384 + 128, 4096, 16384
    assert cuda["model"]["parameter_bytes"] == cpu["model"]["parameter_bytes"] == params_exact  # by construction
    by_name = {p["name"]: p for p in cuda["phases"]}
    assert by_name["model_load"]["max_memory_allocated"] == params  # the host copy the mlp is built in: not CUDA
    assert by_name["inputs"]["memory_allocated"] == params + x
    for name in ("cold_forward", "warmup", "warm_forward"):
        assert by_name[name]["max_memory_allocated"] == params + x + 2 * h, name
        assert by_name[name]["predicted_parameter_bytes"] == params
    for c, p in zip(cuda["phases"], cpu["phases"]):
        assert c["name"] == p["name"]
        assert c["max_memory_allocated"] - p["max_memory_allocated"] == params - params_exact == 384, c["name"]
        assert c["memory_allocated"] - p["memory_allocated"] == 384, c["name"]


def _transformer_parameter_sizes(load: dict) -> list[int]:
    """Bytes of each parameter tensor of the transformer workload (built on the meta device)."""
    import torch

    from memsweep.worker.models import Transformer
    from memsweep.worker.workloads import transformer_dims

    with torch.device("meta"):
        model = Transformer(**transformer_dims(RunSpec.from_dict(dict(load, device="cpu"))))
    return [p.numel() * p.element_size() for p in model.parameters()]


@pytest.mark.parametrize("load", ["lm_inference", "lm_generate", "lm_generate_static"])
def test_lm_parameters_are_the_sum_of_512_byte_blocks_and_peaks_cover_the_cpu_ones(runs, load):
    cuda, cpu = _ok(runs[(load, "cuda:0")]), _ok(runs[(load, "cpu")])
    sizes = _transformer_parameter_sizes(LOADS[load])
    assert cuda["model"]["parameter_bytes"] == cpu["model"]["parameter_bytes"] == sum(sizes)
    rounded = sum(_r512(n) for n in sizes)
    assert rounded > sum(sizes)  # the norms' weights (32 floats) are smaller than a block
    for c, p in zip(cuda["phases"], cpu["phases"]):
        assert c["predicted_parameter_bytes"] == rounded and p["predicted_parameter_bytes"] == sum(sizes), c["name"]
        # every CUDA storage is at least its CPU size: the peak can only grow
        assert c["max_memory_allocated"] >= p["max_memory_allocated"], c["name"]
        assert c["max_memory_allocated"] - p["max_memory_allocated"] < 512 * 200, c["name"]


def test_mlp_train_on_cuda_completes_with_a_cuda_build_and_is_refused_cleanly_on_a_cpu_only_one(runs):
    """Train records an autograd graph on fake CUDA tensors, whose backward pass needs a CUDA
    accelerator: a CPU-only PyTorch (this machine) refuses it before the first phase, with a
    record and exit code 2, never a crashed process; a CUDA build (no GPU needed) runs it."""
    run, cpu = runs[("mlp_train", "cuda:0")], _ok(runs[("mlp_train", "cpu")])
    record = run["record"]
    assert record["cuda_initialized"] is False
    if _cuda_build():
        _ok(run)
        w, h, depth = 32, 128, 2
        sizes = [h * w * 4, h * 4, w * h * 4, w * 4] * depth
        by_name = {p["name"]: p for p in record["phases"]}
        split = by_name["cold_step.optimizer_step"]
        assert split["predicted_parameter_bytes"] == sum(_r512(n) for n in sizes)
        assert split["predicted_gradient_bytes"] == sum(_r512(n) for n in sizes)
        for p in record["phases"]:
            assert sum(p[k] for k in SPLIT) == p["max_memory_allocated"], p["name"]
    else:
        assert run["result"]["outcome"] == "error" and record["outcome"] == "error"
        assert record["exit_code"] == 2 and record["error_type"] == "DryRunUnsupported"
        assert "mode=train" in record["error_message"] and "CPU-only" in record["error_message"]
        assert record["phases"] == []
    assert cpu["source"] == "predicted"  # the CPU dry run of the same load is unchanged


# ----- the spec ----------------------------------------------------------------------------
def test_a_cuda_dry_run_spec_needs_no_gpu_but_a_valid_device(monkeypatch):
    from hydra import compose, initialize_config_module

    from memsweep.sweeper import spec as spec_module

    def no_probe(device):
        raise AssertionError(f"a CUDA dry run must not probe {device}")

    monkeypatch.setattr(spec_module, "probe_device", no_probe)
    with initialize_config_module(config_module="memsweep.conf", version_base="1.3"):
        for device, resolved in (("cuda", "cuda:0"), ("cuda:3", "cuda:3")):
            spec = spec_module.spec_from_config(
                compose(
                    config_name="config",
                    overrides=[f"device={device}", "dry_run=true", "dtype=bfloat16", "capacity=80GB"],
                )
            )
            assert (spec.device, spec.dry_run, spec.capacity_bytes) == (resolved, True, 80 * 10**9)
        with pytest.raises(SpecError, match="device"):
            spec_module.spec_from_config(compose(config_name="config", overrides=["device=gpu", "dry_run=true"]))
        with pytest.raises(SpecError, match="invalid devices=2"):
            spec_module.spec_from_config(
                compose(config_name="config", overrides=["device=cuda", "devices=2", "dry_run=true"])
            )
    with pytest.raises(SpecError, match="invalid device='cuda'"):  # a run spec holds a resolved device
        RunSpec.from_dict(dict(LOADS["mlp1_inference"], device="cuda"))


def test_a_real_run_on_a_missing_gpu_is_still_refused(tmp_path):
    proc = subprocess.run(
        [MEMSWEEP, "run", "device=cuda", "workload=mlp", "context=8", "width=16", f"results_dir={tmp_path}/res"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "invalid device='cuda'" in proc.stderr and "visible device" in proc.stderr
    assert not list(tmp_path.rglob("spec.json"))


def test_a_cuda_dry_run_leases_no_gpu(tmp_path):
    """A CUDA dry run holds no device memory: `memsweep run` leases no GPU for it (under the
    default pool) and its record names no lease and no visible device it did not use."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    run_dir = tmp_path / "dry"
    proc = subprocess.run(
        [MEMSWEEP, "run", "device=cuda", "dry_run=true", "capacity=64MiB", *PREDICT_LOAD, "batch=2"]
        + [f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    environment = json.loads((run_dir / "record.json").read_text())["environment"]
    assert environment["lease"] is None and environment["cuda_visible_devices"] is None, environment


# ----- memsweep predict device=cuda ----------------------------------------------------------
PREDICT_LOAD = ["workload=mlp", "workload.depth=1", "mode=inference", "context=16", "width=32", "threads=1"]


def test_predict_for_a_cuda_device_on_the_cpu(tmp_path):
    """capacity = the CPU dry run's peak at batch 5: on the CPU batch 5 fits; on CUDA, with
    b2's 384 B of rounding, it does not, and the predicted edge is batch 4."""
    import io

    from memsweep.sweeper.cli import predict_command as predict
    from memsweep.sweeper.predict import Predictor

    base = dict(BASE, batch=5, mode="inference", workload={"name": "mlp", "depth": 1})
    cpu = Predictor(RunSpec.from_dict(dict(base, device="cpu")), "batch", 10**12, tmp_path / "cpu", "forkserver")
    gpu = Predictor(RunSpec.from_dict(dict(base, device="cuda:0")), "batch", 10**12, tmp_path / "gpu", "forkserver")
    capacity = cpu.run(5)["peak"]
    assert gpu.run(5)["peak"] == capacity + 384 and gpu.run(4)["peak"] < capacity

    results = {}
    for device in ("cpu", "cuda"):
        out = io.StringIO()
        code = predict(
            PREDICT_LOAD + [f"device={device}", "batch=2", f"capacity={capacity}B", f"results_dir={tmp_path / device}"],
            out=out,
        )
        results[device] = (code, out.getvalue())
    code, text = results["cuda"]
    assert code == 0, text
    assert "PREDICTED edge: max fit batch=4, min miss batch=5 (exact)" in text
    assert "PREDICTION for a CUDA device (cuda:0)" in text and "fake CUDA tensors" in text
    assert "512 B" in text and "max_memory_reserved" in text and "CUDA context" in text
    assert "prediction of live tensor bytes, not a measurement" in text
    summary = json.loads(next((tmp_path / "cuda" / "predict").glob("*/predict.json")).read_text())
    assert summary["device"] == "cuda:0" and "512 B" in summary["prediction_rounding"]
    assert summary["source"] == "predicted" and summary["max_fit"] == 4
    code, text = results["cpu"]
    assert code == 0 and "max fit batch=5, min miss batch=6" in text and "CUDA device" not in text, text


def test_predict_on_cuda_still_requires_a_capacity(tmp_path, capsys):
    from memsweep.sweeper.cli import predict_command as predict

    assert predict(PREDICT_LOAD + ["device=cuda", f"results_dir={tmp_path}"]) == 2
    assert "capacity" in capsys.readouterr().err
