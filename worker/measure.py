"""One run measured: the record (``Recorder``) and the orchestration of a run (``measure``):
set-up (device, counters, capacity), the workload, then every phase of the plan under the
per-phase protocol (``worker.protocol``).

The record (record.json beside the spec) is rewritten atomically before every phase (its
``current_phase`` names the phase about to run) and after it, so a process killed mid-run
leaves its complete phases and the phase it died in. The run stops at the first failed phase.

torch, ``worker.counters`` and ``worker.workloads`` (which import torch) are imported inside
``measure``: a worker whose PyTorch is missing still writes a record that says so (exit 2).
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from memsweep.conf.contract import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_OOM,
    EXIT_UNAVAILABLE,
    SCHEMA_VERSION,
    RunSpec,
    empty_throughput,
    measured_throughput,
    needs_dynamo,
    process_identity,
    write_json_atomic,
)

from .environment import bf16_supported, device_memory, environment, resolve_device
from .plan import MODEL_LOAD, plan
from .protocol import PhaseResult, run_phase
from .snapshot import enable_history, save_oom_then_dump

if TYPE_CHECKING:  # imports torch
    from .rank import RankHooks


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


class Recorder:
    """Holds the run record and rewrites record.json atomically on every change.

    Args:
        path: the record's path (record.json in the run directory).
        spec: the spec as read from spec.json (a dict), or None until it is read.
    """

    def __init__(self, path: Path, spec: dict | None):
        self.path = path
        self.data: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "spec": spec,
            "pid": os.getpid(),
            "pid_identity": process_identity(),  # a resume tells this process from one that reused its pid
            "started_at": _now(),
            "updated_at": None,
            "complete": False,
            "outcome": None,
            "exit_code": None,
            "failed_phase": None,
            "error_type": None,
            "error_message": None,
            "device": None,
            "device_kind": None,
            "counter_sources": None,
            "capacity_bytes": None,
            "capacity": None,
            "device_total_memory": None,
            "device_free_memory_start": None,
            "device_index": None,
            "environment": None,
            "model": None,
            "train_step": None,  # mode=train: memsweep or user (RunSpec.train_step, set once the spec is read)
            "current_phase": None,
            "phases": [],
            # measured: the counters of a real run; predicted: a dry run on fake tensors (spec.dry_run)
            "source": "measured",
            # a dry run's accounting of storage bytes (counters.CUDA_ROUNDING / EXACT_ROUNDING); null if measured
            "prediction_rounding": None,
            # torch.cuda.is_initialized() when the record was finished (null: torch not imported)
            "cuda_initialized": None,
            # the warm phases' rates, filled in when the run is finished (conf.contract.throughput)
            "throughput": empty_throughput(),
        }

    def save(self) -> None:
        """Stamp ``updated_at`` and write the record atomically (``conf.contract.write_json_atomic``)."""
        self.data["updated_at"] = _now()
        write_json_atomic(self.path, self.data)

    def finish(
        self,
        outcome: str,
        exit_code: int,
        phase: str | None = None,
        exc: BaseException | None = None,
        error_type: str | None = None,
        message: str | None = None,
    ) -> int:
        """Complete the record with the run's outcome and save it.

        Args:
            outcome: ``ok``, ``oom`` or ``error``.
            exit_code: the worker's exit code (``conf.contract.EXIT_*``).
            phase: the phase that failed (``setup`` for the set-up), or None.
            exc: the exception that ended the run; its type name and message (at most 4000
                characters) are recorded unless ``error_type`` / ``message`` are given.
            error_type: the recorded error type, instead of ``exc``'s.
            message: the recorded error message, instead of ``exc``'s.

        Returns:
            ``exit_code``.
        """
        self.data.update(
            outcome=outcome,
            exit_code=exit_code,
            failed_phase=phase,
            complete=True,
            error_type=error_type or (type(exc).__name__ if exc else None),
            error_message=message or (str(exc)[:4000] if exc else None),
        )
        self.data["throughput"] = measured_throughput(self.data)
        torch = sys.modules.get("torch")
        if torch is not None:
            self.data["cuda_initialized"] = bool(torch.cuda.is_initialized())
        self.save()
        return exit_code


def run_shape(spec: RunSpec) -> dict[str, Any]:
    """The record's ``world_size``, ``parallel`` and ``global_batch`` of ``spec``, written in every
    record (a run without ``parallel`` is one rank: ``world_size`` 1, ``parallel`` ``none``).

    Args:
        spec: the run's spec.

    Returns:
        ``world_size`` (rank processes), ``parallel`` (none, ddp or fsdp) and ``global_batch``:
        samples of one optimizer step over every rank, ``RunSpec.global_batch`` (batch *
        world_size * micro_steps), in mode=train; None in other modes (no optimizer step).
    """
    return {
        "world_size": spec.world_size,
        "parallel": spec.parallel,
        "global_batch": spec.global_batch if spec.mode == "train" else None,
    }


BALLAST_ENV = "MEMSWEEP_BALLAST_BYTES"


def _ballast_bytes() -> int | None:
    """``MEMSWEEP_BALLAST_BYTES`` (for memsweep's own tests and benches): bytes of non-tensor
    memory the worker holds, touched, from the end of its set-up to its end; None when unset."""
    text = os.environ.get(BALLAST_ENV)
    return int(text) if text and text.isdigit() else None


class _SetUp(NamedTuple):
    """A run's set-up, once it succeeded: what the phases read and what a failure needs."""

    counters: Any  # the Counters protocol (worker.counters)
    dry_counters: Any  # the DryRunCounters of a dry run, else None
    snapshot_off: dict | None  # the record's oom_snapshot when history could not start, or None
    ballast: bytes  # MEMSWEEP_BALLAST_BYTES of touched memory, held while the run's frame lives


def measure(spec: RunSpec, rec: Recorder, rank: RankHooks | None = None) -> int:
    """Run every phase of ``spec``, recording each in ``rec``; torch is imported here.

    Args:
        spec: the run's spec.
        rec: the run's recorder (record.json saved before and after every phase).
        rank: in a rank of a DDP/FSDP run (worker/rank.py), its device, process group, model
            wrapping and phase barriers; None in a one-process run.

    Returns:
        The worker's exit code: ``EXIT_OK``; ``EXIT_UNAVAILABLE`` (PyTorch, the device, the
        dtype on it, or an optional package missing: nothing measured); ``EXIT_OOM`` (a phase
        ran out of memory); ``EXIT_ERROR`` (set-up or a phase raised something else). Every
        failure is recorded, never raised.
    """
    try:
        import torch
    except ImportError as exc:
        return rec.finish(
            "error", EXIT_UNAVAILABLE, error_type="TorchUnavailable", message=f"PyTorch is not installed: {exc}"
        )
    if torch.cuda.is_initialized():  # isolation: nothing may have touched a device before this run
        return rec.finish(
            "error",
            EXIT_ERROR,
            phase="setup",
            error_type="IsolationError",
            message="a CUDA context existed before the worker started",
        )
    _prepare_process(torch, spec)
    device = _device(torch, spec, rec, rank)
    if isinstance(device, int):
        return device
    setup = _set_up(torch, spec, rec, rank, device)
    if isinstance(setup, int):
        return setup
    workload = _build(spec, device, rec, rank, setup.dry_counters)
    if isinstance(workload, int):
        return workload
    return _run_phases(torch, spec, rec, rank, workload, setup)


def _prepare_process(torch: Any, spec: RunSpec) -> None:
    """Import ``torch._dynamo`` when the run needs it, and take the sweeper's lease of CPU cores."""
    if needs_dynamo(spec):
        # PyTorch would import it lazily (see needs_dynamo): time and host memory
        # that belong to no phase (and, on the CPU, before the capacity limit), so they are spent
        # here. Free when the fork server imported it already.
        import torch._dynamo  # noqa: F401
    cores = os.environ.get("MEMSWEEP_CPU_CORES")
    if cores:  # a lease of CPU cores from the sweeper's pool
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
        if not spec.threads:
            torch.set_num_threads(len(cores.split(",")))


def _device(torch: Any, spec: RunSpec, rec: Recorder, rank: RankHooks | None) -> Any:
    """The run's ``torch.device``, or the exit code of a run that cannot have it (recorded)."""
    from .counters import fake_cuda_autograd_available

    reason: str | None = None
    if spec.dry_run:  # fake tensors of the spec's device (cpu or cuda:N): nothing is asked of it
        device = torch.device(spec.device)
        if device.type == "cuda" and spec.mode == "train" and not fake_cuda_autograd_available():
            rec.data.update(device=str(device), device_kind=device.type, device_index=device.index)
            return rec.finish(
                "error",
                EXIT_UNAVAILABLE,
                error_type="DryRunUnsupported",
                message=(
                    f"dry run: mode=train on {device} records an autograd graph on fake CUDA tensors, whose "
                    f"backward pass needs a PyTorch built with CUDA (no GPU needed); this one "
                    f"({torch.__version__}) is CPU-only (pytorch/pytorch#92627). Inference and generate "
                    f"dry runs on {device} work here; device=cpu predicts train mode on the CPU"
                ),
            )
    else:
        device, reason = resolve_device(spec.device) if rank is None else rank.resolve()
    if not reason and spec.devices > 1 and device.index + spec.devices > torch.cuda.device_count():
        reason = (
            f"devices={spec.devices}: cuda:{device.index}..cuda:{device.index + spec.devices - 1} asked, "
            f"only {torch.cuda.device_count()} device(s) visible"
        )
    if reason:
        return rec.finish("error", EXIT_UNAVAILABLE, error_type="DeviceUnavailable", message=reason)
    if spec.dtype == "bfloat16" and not spec.dry_run and not bf16_supported(device):
        return rec.finish(
            "error",
            EXIT_UNAVAILABLE,
            error_type="DtypeUnsupported",
            message=f"{device} does not support bfloat16 natively",
        )
    return device


def _set_up(torch: Any, spec: RunSpec, rec: Recorder, rank: RankHooks | None, device: Any) -> _SetUp | int:
    """The counters, the device's memory, the capacity and the OOM snapshot, recorded; a failure
    here is an error of the run attributed to no phase (its exit code is returned)."""
    from .counters import DeviceNotFree, DryRunCounters, make_counters

    try:
        if spec.threads:
            torch.set_num_threads(spec.threads)
        dry_counters = DryRunCounters(device) if spec.dry_run else None
        counters = dry_counters if dry_counters is not None else make_counters(device, spec.devices)
        counters.start()
        total = _record_device(spec, rec, device, counters, dry_counters)
        capacity = _apply_capacity(torch, spec, rec, device, counters)
        if rank is not None:  # the run's process group, once this rank's capacity holds
            rank.start(counters)
        rec.data.update(
            capacity_bytes=spec.capacity_bytes if spec.capacity_bytes is not None else total, capacity=capacity
        )
        ballast = b"\x01" * (_ballast_bytes() or 0)  # a process that holds other memory too (touched pages)
        rec.data["environment"]["ballast_bytes"] = len(ballast) or None  # held until the worker ends
        snapshot_off = None
        if spec.snapshot_on_oom:  # in its own guard: a failure is noted, the run goes on (worker/snapshot.py)
            snapshot_off = enable_history(torch.cuda.memory)
            if snapshot_off is not None:
                rec.data["oom_snapshot"] = snapshot_off
        rec.save()
    except DeviceNotFree as exc:
        return rec.finish("error", EXIT_UNAVAILABLE, phase="setup", exc=exc)
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        return rec.finish("error", EXIT_ERROR, phase="setup", exc=exc)
    return _SetUp(counters, dry_counters, snapshot_off, ballast)


def _record_device(spec: RunSpec, rec: Recorder, device: Any, counters: Any, dry_counters: Any) -> int | None:
    """Record the device, its counters' sources, its memory and its environment.

    Returns:
        The device's total memory (bytes), or None in a dry run (nothing of it belongs).
    """
    memory = None
    total: int | None
    free: int | None
    if dry_counters is not None:  # a prediction: nothing of the host's (nor the device's) memory belongs
        total = free = None
        rec.data["prediction_rounding"] = dry_counters.rounding
    else:
        memory = device_memory(device)
        total, free, _ = memory
    rec.data.update(
        device=str(device),
        device_kind=device.type,
        counter_sources=counters.sources,
        device_index=device.index if device.type == "cuda" else None,
        device_total_memory=total,
        device_free_memory_start=free,
        environment=environment(device, dry_run=spec.dry_run, memory=memory),
    )
    if dry_counters is not None and device.type == "cuda":
        rec.data["environment"]["fake_cuda_guard"] = dry_counters.cuda_guard
    return total


def _apply_capacity(torch: Any, spec: RunSpec, rec: Recorder, device: Any, counters: Any) -> dict:
    """Apply the spec's capacity to the device (or the CPU process) and return the record's
    ``capacity`` (how it is held)."""
    from .counters import CpuCounters, apply_cpu_allocator_capacity, apply_cpu_process_capacity, cuda_capacity

    if spec.dry_run:
        return {"capacity_method": "none (dry run: fake tensors use no memory; nothing is limited)"}
    if device.type == "cuda":  # the footprint outside the allocator, then the capacity on every device
        return cuda_capacity(counters, spec.capacity_bytes, rec.data["environment"].get("allocator_backend"))
    if spec.capacity_bytes is None:
        return {"capacity_method": "device total_memory"}
    if spec.capacity_mode == "process":
        torch.ones(64, 64) @ torch.ones(64, 64)  # start the intra-op thread pool before the limit
        return apply_cpu_process_capacity(spec.capacity_bytes)
    assert isinstance(counters, CpuCounters)  # make_counters: the CPU
    return apply_cpu_allocator_capacity(counters, spec.capacity_bytes)


def _build(spec: RunSpec, device: Any, rec: Recorder, rank: RankHooks | None, dry_counters: Any) -> Any:
    """Build and prepare the workload (imports the spec needs: transformers, bitsandbytes, the
    user's modules; no phase yet), or return the exit code of a failure (recorded)."""
    from .workloads import DependencyMissing, build_workload

    try:
        workload = build_workload(spec, device, rec.path.parent)
        workload.prepare()
        if rank is not None:
            rank.prepare(workload)
        if dry_counters is not None:  # the roles that split each phase's predicted peak
            dry_counters.roles = workload.storage_roles
    except DependencyMissing as exc:
        return rec.finish("error", EXIT_UNAVAILABLE, error_type="DependencyMissing", message=str(exc))
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        return rec.finish("error", EXIT_ERROR, phase="setup", exc=exc)
    return workload


class _DynamoWatch:
    """Notes in the record whether ``torch._dynamo`` was imported before the phases, and warns
    when a phase imported it (``needs_dynamo`` said no, wrongly)."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.loaded = "torch._dynamo" in sys.modules
        # On the CPU, memory_reserved is the resident set, which counts imported code: more
        # with Dynamo (a train run, or a fork server that had imported it for an earlier run).
        rec.data["environment"]["torch_dynamo_imported"] = self.loaded

    def check(self, until: str) -> None:
        """Record and warn if Dynamo was imported since the last check (before phase ``until``)."""
        if not self.loaded and "torch._dynamo" in sys.modules:
            self.loaded = True
            self.rec.data["environment"]["imported_during_phases"] = f"torch._dynamo (before {until})"
            print(
                f"memsweep worker: warning: torch._dynamo was imported inside a phase before {until} "
                f"(conf.contract.needs_dynamo missed this run); its host memory is in that phase's "
                f"readings",
                file=sys.stderr,
            )


def _run_phases(torch: Any, spec: RunSpec, rec: Recorder, rank: RankHooks | None, workload: Any, setup: _SetUp) -> int:
    """Run the plan's phases in order, record.json saved before and after each; stop at the first
    failed phase. Returns the worker's exit code."""
    dynamo = _DynamoWatch(rec)
    for step in plan(spec, workload):
        name = step.name
        dynamo.check(name)
        rec.data["current_phase"] = name
        rec.save()
        if rank is not None:  # every rank ended the previous phase: this one starts together
            rank.barrier()
        result = run_phase(
            setup.counters, name, step.body, step.iterations, spec.fault, rec.path, step.meta, step.after
        )
        rec.data["phases"].append(result.record)
        if result.error is not None:
            return _phase_failed(torch, spec, rec, workload, setup, result)
        if name == MODEL_LOAD:
            rec.data["model"] = workload.model_info()
        if step.release is not None:
            step.release()
        rec.data["current_phase"] = None
        rec.save()
    dynamo.check("the end")
    return rec.finish("ok", EXIT_OK)


def _phase_failed(torch: Any, spec: RunSpec, rec: Recorder, workload: Any, setup: _SetUp, result: PhaseResult) -> int:
    """Finish the record of a run whose phase ``result`` failed (a dry run's unsupported
    operator, an OOM with its snapshot, or an error); returns the worker's exit code."""
    from .counters import dry_run_unsupported

    failure, phase, name = result.error, result.record, result.record["name"]
    assert failure is not None
    traceback.print_exception(type(failure), failure, failure.__traceback__, file=sys.stderr)
    dry = setup.dry_counters
    unsupported = dry_run_unsupported(failure, dry.where(workload.model)) if dry is not None else None
    if unsupported:
        phase.update(status="error", error_type="DryRunUnsupported", error_message=unsupported)
        return rec.finish("error", EXIT_ERROR, phase=name, error_type="DryRunUnsupported", message=unsupported)
    code = EXIT_OOM if phase["status"] == "oom" else EXIT_ERROR
    if phase["status"] == "oom" and spec.snapshot_on_oom and setup.snapshot_off is None:
        finish = functools.partial(rec.finish, "oom", code, phase=name, exc=failure)
        return save_oom_then_dump(rec, finish, rec.path.parent, torch.cuda.memory)
    return rec.finish(phase["status"], code, phase=name, exc=failure)
