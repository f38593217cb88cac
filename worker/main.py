"""The worker process: ``python -m worker SPEC.json`` measures one condition.

Phases, in order (seed 003, "IteraGPU"): ``model_load``, ``inputs``, then

* inference: ``cold_forward``, ``warmup``, ``warm_forward`` (under torch.inference_mode);
* train: the first step ``cold_step``, ``warmup`` (whole steps), then ``repeats`` steps
  ``warm_step``, each step split into the sub-phases ``forward``, ``loss``, ``backward``
  (once per micro-step) and ``optimizer_step``, recorded as ``cold_step.forward``, ...;
* generate: ``cold_generate``, ``warmup`` (whole generations), ``repeats`` generations
  ``warm_generate``, each split into ``prefill`` and ``decode``;

then, when asked, ``eval`` (train mode) and ``export``. A sub-phase's record also names its
``parent`` (cold_step, ...), ``sub_phase``, ``step`` (0-based, within the parent) and
``micro_step``; these are null on the other phases. Each phase (and sub-phase) follows the
per-phase protocol of seed 003:

1. synchronize the device; read ``memory_allocated`` and ``memory_reserved`` (start);
2. ``reset_peak_memory_stats`` on that device;
3. run the phase;
4. synchronize; read ``max_memory_allocated``, ``max_memory_reserved`` and both
   current values; save success or the error. A value that cannot be read is null.

The record (record.json beside the spec) is rewritten atomically before every phase (its
``current_phase`` names the phase about to run) and after it, so a process killed mid-run
leaves its complete phases and the phase it died in. The run stops at the first failed phase.

Exit codes: 0 ok, 2 PyTorch or the asked-for device (or dtype on it) unavailable, nothing
measured; 3 a phase ran out of memory; 4 a phase raised another error; 5 bad spec.

``python -m worker --probe DEVICE`` prints a JSON description of DEVICE (``auto``
resolves to cuda:0 when a GPU is visible, else cpu) and exits; the sweeper uses it so
that its own process never initialises CUDA.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket
import sys
import time
import traceback
from pathlib import Path

from conf.contract import (EXIT_BAD_SPEC, EXIT_ERROR, EXIT_OK, EXIT_OOM, EXIT_UNAVAILABLE, ISOLATION_ENV,
                           ISOLATION_SPAWN, RECORD_FILE, SCHEMA_VERSION, RecordError, RunSpec, SpecError,
                           meminfo_bytes, needs_dynamo, read_json, write_json_atomic)

from .classify import classify_failure


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


class Recorder:
    """Holds the run record and rewrites record.json atomically on every change."""

    def __init__(self, path: Path, spec: dict | None):
        self.path = path
        self.data = {
            "schema_version": SCHEMA_VERSION, "spec": spec, "pid": os.getpid(),
            "started_at": _now(), "updated_at": None, "complete": False, "outcome": None,
            "exit_code": None, "failed_phase": None, "error_type": None, "error_message": None,
            "device": None, "device_kind": None, "counter_sources": None, "capacity_bytes": None,
            "capacity": None, "device_total_memory": None, "device_free_memory_start": None,
            "device_index": None, "environment": None, "model": None, "current_phase": None, "phases": [],
            # measured: the counters of a real run; predicted: a dry run on fake tensors (spec.dry_run)
            "source": "measured",
            # a dry run's accounting of storage bytes (counters.CUDA_ROUNDING / EXACT_ROUNDING); null if measured
            "prediction_rounding": None,
            # torch.cuda.is_initialized() when the record was finished (null: torch not imported)
            "cuda_initialized": None,
        }

    def save(self) -> None:
        self.data["updated_at"] = _now()
        write_json_atomic(self.path, self.data)

    def finish(self, outcome: str, exit_code: int, phase: str | None = None,
               exc: BaseException | None = None, error_type: str | None = None,
               message: str | None = None) -> int:
        self.data.update(outcome=outcome, exit_code=exit_code, failed_phase=phase, complete=True,
                         error_type=error_type or (type(exc).__name__ if exc else None),
                         error_message=message or (str(exc)[:4000] if exc else None))
        torch = sys.modules.get("torch")
        if torch is not None:
            self.data["cuda_initialized"] = bool(torch.cuda.is_initialized())
        self.save()
        return exit_code


def _resolve(requested: str):
    """(torch.device or None, reason-if-unavailable) for ``requested``; imports torch."""
    import torch

    if requested == "auto":
        requested = "cuda:0" if torch.cuda.is_available() else "cpu"
    device = torch.device(requested)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return device, "no CUDA/ROCm device is visible to this PyTorch build"
        index = device.index if device.index is not None else 0
        if index >= torch.cuda.device_count():
            return device, f"{requested}: only {torch.cuda.device_count()} device(s) visible"
        device = torch.device("cuda", index)
    return device, None


def _bf16_supported(device) -> bool:
    import torch

    if device.type != "cuda":
        return True
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # older PyTorch without the argument
        return bool(torch.cuda.is_bf16_supported())


def _device_memory(device) -> tuple[int | None, int | None, str | None]:
    """(total_memory, free_memory, device_name) in bytes for ``device``."""
    import torch

    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(total), int(free), torch.cuda.get_device_name(device)
    return meminfo_bytes("MemTotal"), meminfo_bytes("MemAvailable"), platform.processor() or platform.machine()


def _driver_version() -> str | None:
    try:
        with open("/proc/driver/nvidia/version") as f:
            return f.readline().strip() or None
    except OSError:
        return None


def environment(device, dry_run: bool = False) -> dict:
    """The run's environment: versions, device, allocator settings, host.

    ``dry_run`` on a CUDA device: nothing is asked of the device (no CUDA call, no context), so
    its total memory, name, driver, allocator backend and capability are null (unknown), never
    invented."""
    import torch

    from .counters import env_alloc_conf

    no_device = dry_run and device.type == "cuda"
    total, _, name = (None, None, None) if no_device else _device_memory(device)
    env = {
        "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
        "backend": ("hip" if torch.version.hip else "cuda") if device.type == "cuda" else "cpu",
        "device": str(device), "device_name": name, "total_memory": total,
        "driver": _driver_version() if device.type == "cuda" and not no_device else None,
        "allocator_backend": torch.cuda.get_allocator_backend() if device.type == "cuda" and not no_device else None,
        "alloc_conf": env_alloc_conf(), "host": socket.gethostname(), "platform": platform.platform(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "isolation": os.environ.get(ISOLATION_ENV, ISOLATION_SPAWN),  # (unset: started by hand, a new interpreter)
        "lease": os.environ.get("MEMSWEEP_LEASE"),
    }
    if device.type == "cuda":
        env["capability"] = None if no_device else ".".join(map(str, torch.cuda.get_device_capability(device)))
    return env


BALLAST_ENV = "MEMSWEEP_BALLAST_BYTES"


def _ballast_bytes() -> int | None:
    """``MEMSWEEP_BALLAST_BYTES`` (for memsweep's own tests and benches): bytes of non-tensor
    memory the worker holds, touched, from the end of its set-up to its end; None when unset."""
    text = os.environ.get(BALLAST_ENV)
    return int(text) if text and text.isdigit() else None


def probe(requested: str) -> dict:
    """Describe a device without measuring anything (runs in its own short process)."""
    try:
        import torch
    except ImportError as exc:
        return {"requested": requested, "available": False, "reason": f"PyTorch is not installed ({exc})"}
    device, reason = _resolve(requested)
    out = {"requested": requested, "device": str(device), "device_kind": device.type,
           "available": reason is None, "reason": reason, "torch": torch.__version__}
    if reason is None:
        total, free, name = _device_memory(device)
        out.update(total_memory=total, free_memory=free, device_name=name,
                   bf16_supported=_bf16_supported(device),
                   device_count=torch.cuda.device_count() if device.type == "cuda" else 1)
    return out


SNAPSHOT_MAX_ENTRIES = 100_000  # allocator events kept: bounds the snapshot's size
SNAPSHOT_MAX_BYTES = 256 * 2**20


def dump_snapshot(run_dir: Path) -> dict:
    """Write the CUDA allocator snapshot of an OOM run to run_dir/oom_snapshot.pickle.

    The file is PyTorch's own format (torch.cuda.memory._dump_snapshot), meant for
    pytorch.org/memory_viz; memsweep writes it and never loads it. A snapshot above
    SNAPSHOT_MAX_BYTES is deleted and the record says so.
    """
    import torch

    path = run_dir / "oom_snapshot.pickle"
    try:
        torch.cuda.memory._dump_snapshot(str(path))
    except Exception as exc:  # noqa: BLE001 - a failed snapshot must not hide the OOM
        return {"file": None, "bytes": None, "problem": f"{type(exc).__name__}: {exc}"}
    size = path.stat().st_size
    if size > SNAPSHOT_MAX_BYTES:
        path.unlink()
        return {"file": None, "bytes": size, "problem": f"larger than {SNAPSHOT_MAX_BYTES} B: deleted"}
    return {"file": path.name, "bytes": size, "max_entries": SNAPSHOT_MAX_ENTRIES, "problem": None}


def env_report(requested: str) -> dict:
    """Seed 003's environment report for a device: probe() plus environment() when it is there."""
    info = probe(requested)
    if info.get("available"):
        device, _ = _resolve(requested)
        env = environment(device)
        for run_only in ("isolation", "lease"):  # facts of a run, not of the machine
            env.pop(run_only, None)
        info["environment"] = env
    return info


def _inject_fault(kind: str, phase: str, record_path: Path) -> None:
    """Failures on demand, for memsweep's own fault tests (spec.fault)."""
    import signal

    if kind == "raise":
        raise ValueError(f"injected fault in phase {phase}")
    if kind == "oom":
        import torch
        raise torch.OutOfMemoryError(f"CUDA out of memory. (injected fault in phase {phase})")
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "segfault":
        import ctypes
        ctypes.string_at(0)
    if kind == "hang":
        while True:
            time.sleep(3600)
    if kind == "garbage":
        record_path.write_text('{"schema_version": 1, "phases": [{"name": "mod')
        os._exit(0)


def run_phase(counters, name: str, body, iterations: int, fault: dict | None, record_path: Path,
              meta: dict | None = None, after=None) -> dict:
    """Run one phase under the seed-003 protocol and return its phase record (bytes, seconds).

    ``meta``: parent, sub_phase, step, micro_step of a sub-phase (null otherwise). ``after``:
    a callable returning sizes by construction to add to a successful phase's record
    (``kv_cache_bytes``, ``optimizer_state_bytes``...), read after the counters.
    Then the extra counters (``counters.extra()``: allocator retries and OOMs, inactive
    split bytes, device free/total), null where the backend has none.

    ``devices``: when ``counters`` offers ``per_device()`` (a run on several devices,
    ``counters.MultiDeviceCounters``), a list with one entry per device, in order:
    ``device_index`` and the six counters of ``records.DEVICE_COUNTERS`` (bytes, read at the
    same protocol points as the main counters; null when one cannot be read, never 0).
    Null otherwise.
    """

    def read(fn):
        try:
            value = fn()
            return None if value is None else int(value)
        except Exception:  # a counter we cannot read is missing, not zero
            return None

    per_device = counters.per_device() if hasattr(counters, "per_device") else None
    counters.synchronize()
    meta = meta or {}
    phase = {"name": name, **{k: meta.get(k) for k in ("parent", "sub_phase", "step", "micro_step")},
             "status": None, "iterations": iterations,
             "memory_allocated_start": read(counters.memory_allocated),
             "memory_reserved_start": read(counters.memory_reserved)}
    devices = None if per_device is None else [
        {"device_index": d.index, "memory_allocated_start": read(d.memory_allocated),
         "memory_reserved_start": read(d.memory_reserved)} for d in per_device]
    counters.reset_peak_memory_stats()
    durations: list[float] = []
    t0 = time.perf_counter()
    error = None
    try:
        if fault and fault["phase"] in (name, meta.get("parent")):
            _inject_fault(fault["kind"], name, record_path)
        for _ in range(iterations):
            ti = time.perf_counter()
            body()
            counters.synchronize()
            durations.append(time.perf_counter() - ti)
        counters.synchronize()
    except Exception as exc:  # noqa: BLE001 - every failure is classified and recorded
        error = exc
        try:
            counters.synchronize()
        except Exception:
            pass
    phase["duration_s"] = time.perf_counter() - t0
    phase["iteration_s"] = durations
    phase.update(
        memory_allocated=read(counters.memory_allocated),
        memory_reserved=read(counters.memory_reserved),
        max_memory_allocated=read(counters.max_memory_allocated),
        max_memory_reserved=read(counters.max_memory_reserved),
    )
    for entry, d in zip(devices or (), per_device or ()):
        entry.update(memory_allocated=read(d.memory_allocated), memory_reserved=read(d.memory_reserved),
                     max_memory_allocated=read(d.max_memory_allocated),
                     max_memory_reserved=read(d.max_memory_reserved))
    phase["devices"] = devices
    try:
        phase.update(counters.extra())
    except Exception:  # noqa: BLE001 - extra counters are best effort: missing, never 0
        pass
    if error is None:
        phase.update(status="ok", error_type=None, error_message=None)
        if after is not None:
            try:
                phase.update(after())
            except Exception:  # noqa: BLE001 - a size we cannot compute is missing, not a failed phase
                traceback.print_exc()
    else:
        phase.update(status=classify_failure(error), error_type=type(error).__name__,
                     error_message=str(error)[:4000])
        detail = counters.oom_detail() if hasattr(counters, "oom_detail") else None
        if phase["status"] == "oom" and detail:  # the refused request, apart from the peak it never reached
            phase.update(detail)
        phase["_exception"] = error
    return phase


def measure(spec: RunSpec, rec: Recorder) -> int:
    """Run every phase of ``spec``; returns the exit code. Torch is imported here."""
    try:
        import torch
    except ImportError as exc:
        return rec.finish("error", EXIT_UNAVAILABLE, error_type="TorchUnavailable",
                          message=f"PyTorch is not installed: {exc}")
    from .counters import (DryRunCounters, apply_cpu_allocator_capacity, apply_cpu_process_capacity, apply_cuda_capacity,
                           apply_cuda_capacity_per_device, dry_run_unsupported, make_counters)
    from .workloads import DependencyMissing, build_workload

    if torch.cuda.is_initialized():  # isolation: nothing may have touched a device before this run
        return rec.finish("error", EXIT_ERROR, phase="setup", error_type="IsolationError",
                          message="a CUDA context existed before the worker started")
    if needs_dynamo(spec):
        # PyTorch would import it lazily (see needs_dynamo): seconds and ~70 MB of host memory
        # that belong to no phase (and, on the CPU, before the capacity limit), so they are spent
        # here. Free when the fork server imported it already.
        import torch._dynamo  # noqa: F401
    cores = os.environ.get("MEMSWEEP_CPU_CORES")
    if cores:  # a lease of CPU cores from the sweeper's pool
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
        if not spec.threads:
            torch.set_num_threads(len(cores.split(",")))
    if spec.dry_run:  # fake tensors of the spec's device (cpu or cuda:N): nothing is asked of it
        device, reason = torch.device(spec.device), None
        if device.type == "cuda" and spec.mode == "train":
            from .counters import fake_cuda_autograd_available

            if not fake_cuda_autograd_available():
                rec.data.update(device=str(device), device_kind=device.type, device_index=device.index)
                return rec.finish("error", EXIT_UNAVAILABLE, error_type="DryRunUnsupported", message=(
                    f"dry run: mode=train on {device} records an autograd graph on fake CUDA tensors, whose "
                    f"backward pass needs a PyTorch built with CUDA (no GPU needed); this one "
                    f"({torch.__version__}) is CPU-only (pytorch/pytorch#92627). Inference and generate "
                    f"dry runs on {device} work here; device=cpu predicts train mode on the CPU"))
    else:
        device, reason = _resolve(spec.device)
    if not reason and spec.devices > 1 and device.index + spec.devices > torch.cuda.device_count():
        reason = (f"devices={spec.devices}: cuda:{device.index}..cuda:{device.index + spec.devices - 1} asked, "
                  f"only {torch.cuda.device_count()} device(s) visible")
    if reason:
        return rec.finish("error", EXIT_UNAVAILABLE, error_type="DeviceUnavailable", message=reason)
    if spec.dtype == "bfloat16" and not spec.dry_run and not _bf16_supported(device):
        return rec.finish("error", EXIT_UNAVAILABLE, error_type="DtypeUnsupported",
                          message=f"{device} does not support bfloat16 natively")
    try:  # set-up: a failure here is an error of the run, attributed to no phase
        if spec.threads:
            torch.set_num_threads(spec.threads)
        counters = DryRunCounters(device) if spec.dry_run else make_counters(device, spec.devices)
        counters.start()
        if spec.dry_run:  # a prediction: nothing of the host's (nor the device's) memory belongs in the record
            total = free = None
            rec.data["prediction_rounding"] = counters.rounding
        else:
            total, free, _ = _device_memory(device)
        rec.data.update(device=str(device), device_kind=device.type, counter_sources=counters.sources,
                        device_index=device.index if device.type == "cuda" else None,
                        device_total_memory=total, device_free_memory_start=free,
                        environment=environment(device, dry_run=spec.dry_run))
        if spec.dry_run and device.type == "cuda":
            rec.data["environment"]["fake_cuda_guard"] = counters.cuda_guard
        capacity = {"capacity_method": "device total_memory"}
        if spec.dry_run:
            capacity = {"capacity_method": "none (dry run: fake tensors use no memory; nothing is limited)"}
        elif spec.capacity_bytes is not None:
            if device.type == "cuda" and spec.devices > 1:  # the same emulated capacity on every device
                capacity = apply_cuda_capacity_per_device(counters, spec.capacity_bytes)
            elif device.type == "cuda":
                capacity = apply_cuda_capacity(counters, spec.capacity_bytes, total)
            elif spec.capacity_mode == "process":
                torch.ones(64, 64) @ torch.ones(64, 64)  # start the intra-op thread pool before the limit
                capacity = apply_cpu_process_capacity(spec.capacity_bytes)
            else:
                capacity = apply_cpu_allocator_capacity(counters, spec.capacity_bytes)
        rec.data.update(capacity_bytes=spec.capacity_bytes if spec.capacity_bytes is not None else total,
                        capacity=capacity)
        ballast = bytes(b"\x01" * (_ballast_bytes() or 0))  # a process that holds other memory too
        rec.data["environment"]["ballast_bytes"] = len(ballast) or None  # held until the worker ends
        if spec.snapshot_on_oom:
            # PyTorch doc, "Understanding CUDA Memory Usage": record the allocator's history so
            # that an OOM can be dumped as a snapshot (viewable at pytorch.org/memory_viz).
            torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_MAX_ENTRIES)
        rec.save()
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        return rec.finish("error", EXIT_ERROR, phase="setup", exc=exc)

    try:  # imports the spec needs (transformers, bitsandbytes, the user's modules): no phase yet
        workload = build_workload(spec, device, rec.path.parent)
        workload.prepare()
        if spec.dry_run:  # the roles that split each phase's predicted peak
            counters.roles = workload.storage_roles
    except DependencyMissing as exc:
        return rec.finish("error", EXIT_UNAVAILABLE, error_type="DependencyMissing", message=str(exc))
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        return rec.finish("error", EXIT_ERROR, phase="setup", exc=exc)

    dynamo_loaded = "torch._dynamo" in sys.modules
    # On the CPU, memory_reserved is the resident set, which counts imported code: ~65 MiB more
    # with Dynamo (a train run, or a fork server that had imported it for an earlier run).
    rec.data["environment"]["torch_dynamo_imported"] = dynamo_loaded

    def late_import(until: str) -> None:  # needs_dynamo said no, wrongly: say so in the record
        nonlocal dynamo_loaded
        if not dynamo_loaded and "torch._dynamo" in sys.modules:
            dynamo_loaded = True
            rec.data["environment"]["imported_during_phases"] = f"torch._dynamo (before {until})"
            print(f"memsweep worker: warning: torch._dynamo was imported inside a phase before {until} "
                  f"(worker.records.needs_dynamo missed this run); its host memory is in that phase's "
                  f"readings", file=sys.stderr)

    for step in plan(spec, workload):
        name, body, iterations, meta, after = step
        late_import(name)
        rec.data["current_phase"] = name
        rec.save()
        phase = run_phase(counters, name, body, iterations, spec.fault, rec.path, meta, after)
        exc = phase.pop("_exception", None)
        rec.data["phases"].append(phase)
        if exc is not None:
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
            unsupported = dry_run_unsupported(exc) if spec.dry_run else None
            if unsupported:
                phase.update(status="error", error_type="DryRunUnsupported", error_message=unsupported)
                return rec.finish("error", EXIT_ERROR, phase=name, error_type="DryRunUnsupported",
                                  message=unsupported)
            code = EXIT_OOM if phase["status"] == "oom" else EXIT_ERROR
            if phase["status"] == "oom" and spec.snapshot_on_oom:
                rec.data["oom_snapshot"] = dump_snapshot(rec.path.parent)
            return rec.finish(phase["status"], code, phase=name, exc=exc)
        if name == "model_load":
            rec.data["model"] = workload.model_info()
        if meta and meta.get("release"):
            meta["release"]()
        rec.data["current_phase"] = None
        rec.save()
    late_import("the end")
    return rec.finish("ok", EXIT_OK)


def plan(spec: RunSpec, w) -> list[tuple]:
    """The run's phases in order: (name, body, iterations, meta, after) for ``run_phase``.

    ``meta`` may hold ``release``, called once the phase is recorded (outside any window):
    the end of a generation releases its KV cache there, after its bytes are read.
    """
    steps: list[tuple] = [("model_load", w.model_load, 1, None, None), ("inputs", w.inputs, 1, None, None)]

    def train_step(parent: str, index: int) -> list[tuple]:
        out = []
        for m in range(spec.micro_steps):
            meta = lambda sub: {"parent": parent, "sub_phase": sub, "step": index, "micro_step": m}  # noqa: E731
            out += [(f"{parent}.forward", lambda m=m: w.step_forward(m), 1, meta("forward"), None),
                    (f"{parent}.loss", lambda m=m: w.step_loss(m), 1, meta("loss"), None),
                    (f"{parent}.backward", lambda m=m: w.step_backward(m), 1, meta("backward"), w.gradient_bytes)]
        out.append((f"{parent}.optimizer_step", w.step_optimizer, 1,
                    {"parent": parent, "sub_phase": "optimizer_step", "step": index, "micro_step": None},
                    w.optimizer_state_bytes))
        return out

    def generation(parent: str, index: int) -> list[tuple]:
        return [(f"{parent}.prefill", w.gen_prefill, 1,
                 {"parent": parent, "sub_phase": "prefill", "step": index}, w.kv_cache_info),
                (f"{parent}.decode", w.gen_decode, 1,
                 {"parent": parent, "sub_phase": "decode", "step": index, "release": w.end_generation},
                 w.kv_cache_info)]

    if spec.mode == "train":
        steps += train_step("cold_step", 0)
        steps.append(("warmup", w.train_step, spec.warmup, None, None))
        for i in range(spec.repeats):
            steps += train_step("warm_step", i)
    elif spec.mode == "generate":
        steps += generation("cold_generate", 0)
        steps.append(("warmup", w.generate, spec.warmup, None, None))
        for i in range(spec.repeats):
            steps += generation("warm_generate", i)
    else:
        steps += [("cold_forward", w.forward, 1, None, None), ("warmup", w.forward, spec.warmup, None, None),
                  ("warm_forward", w.forward, spec.repeats, None, None)]
    if spec.eval_batch is not None:
        steps.append(("eval", w.evaluate, 1, None, None))
    if spec.export:
        steps.append(("export", w.export, 1, None, w.export_info))
    return steps


def _die_with_parent() -> None:
    """Linux prctl(PR_SET_PDEATHSIG, SIGKILL): if the orchestrator is killed, its worker dies
    too, instead of running on unobserved; the partial record stays for the resumed sweep."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _die_with_parent()
    if len(argv) == 2 and argv[0] == "--probe":
        info = probe(argv[1])
        print(json.dumps(info))
        return EXIT_OK if info.get("torch") else EXIT_UNAVAILABLE
    if len(argv) == 2 and argv[0] == "--env":
        info = env_report(argv[1])
        print(json.dumps(info))
        return EXIT_OK if info.get("available") else EXIT_UNAVAILABLE
    if len(argv) != 1:
        print("usage: python -m worker SPEC.json | --probe DEVICE | --env DEVICE", file=sys.stderr)
        return EXIT_BAD_SPEC
    spec_path = Path(argv[0])
    rec = Recorder(spec_path.parent / RECORD_FILE, None)
    try:
        raw = read_json(spec_path, "spec")
        rec.data["spec"] = raw
        spec = RunSpec.from_dict(raw)
        if spec.dry_run:  # the Recorder starts as "measured"
            rec.data["source"] = "predicted"
    except (RecordError, SpecError) as exc:
        print(f"memsweep worker: {exc}", file=sys.stderr)
        if spec_path.parent.is_dir() and not rec.path.exists():
            rec.finish("error", EXIT_BAD_SPEC, exc=exc)
        return EXIT_BAD_SPEC
    if rec.path.exists():
        print(f"memsweep worker: {rec.path} already exists; refusing to overwrite a record", file=sys.stderr)
        return EXIT_BAD_SPEC
    rec.save()
    return measure(spec, rec)
