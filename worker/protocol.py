"""The per-phase measurement protocol, and the faults memsweep's own tests inject into it.

Each phase (and sub-phase) of a run:

1. synchronize the device; read ``memory_allocated`` and ``memory_reserved`` (start);
2. ``reset_peak_memory_stats`` on that device;
3. run the phase;
4. synchronize; read ``max_memory_allocated``, ``max_memory_reserved`` and both
   current values; save success or the error. A value that cannot be read is null.

No torch import at the top: the worker's command line imports this module before it knows
whether torch is installed (the injected ``oom`` fault imports it).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from memsweep.conf.contract import PER_DEVICE_EXTRAS, SUB_PHASE_FIELDS

from .classify import classify_failure, parse_oom

if TYPE_CHECKING:  # worker.counters imports torch; this module must not (see above)
    from .counters import Counters


class PhaseResult(NamedTuple):
    """What ``run_phase`` returns: the phase record (JSON-able, as record.json holds it) and the
    exception that ended a failed phase (None when it succeeded)."""

    record: dict[str, Any]
    error: Exception | None


def _inject_fault(kind: str, phase: str, record_path: Path) -> None:
    """Failures on demand, for memsweep's own fault tests (spec.fault)."""
    if kind == "raise":
        raise ValueError(f"injected fault in phase {phase}")
    if kind == "oom":
        import torch

        # torch's own OOM type (classified oom by type), worded as no allocator: the fault is the
        # same on every device, and a CPU run's record must not quote a CUDA message
        raise torch.OutOfMemoryError(f"out of memory (injected fault in phase {phase}: no allocator refused a request)")
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "segfault":
        ctypes.string_at(0)
    if kind == "hang":
        while True:
            time.sleep(3600)
    if kind == "garbage":
        record_path.write_text('{"schema_version": 1, "phases": [{"name": "mod')
        os._exit(0)
    if kind == "orphans":  # children that outlive their worker unless whoever waits for it kills them
        subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL)
        subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL, start_new_session=True)  # beyond its session
        if os.fork() == 0:
            time.sleep(3600)
            os._exit(0)
        os.kill(os.getpid(), signal.SIGKILL)


def dynamo_graphs() -> int | None:
    """How many graphs Dynamo (``torch.compile``'s front end) has compiled in this process so far.

    Returns:
        ``torch._dynamo.utils.counters["stats"]["unique_graphs"]`` (incremented once per FX graph
        Dynamo captures and hands to its backend, torch/_dynamo/output_graph.py), or None when
        ``torch._dynamo`` is not imported (nothing can have been compiled; importing it here would
        change the process being measured).
    """
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return None
    try:
        return int(dynamo.utils.counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - a counter we cannot read is missing, not zero
        return None


def _read(fn: Callable[[], object]) -> int | None:
    """``fn()`` as an integer (bytes), or None when it returns None or raises (missing, not zero)."""
    try:
        value = fn()
        return None if value is None else int(value)  # type: ignore[call-overload]
    except Exception:  # noqa: BLE001 - a counter we cannot read is missing, not zero
        return None


def _read_start(counters: Counters, per_device: list | None, phase: dict) -> list[dict] | None:
    """Protocol step 1: fill ``phase``'s start counters; return the per-device entries (or None)."""
    phase["memory_allocated_start"] = _read(counters.memory_allocated)
    phase["memory_reserved_start"] = _read(counters.memory_reserved)
    if per_device is None:
        return None
    return [
        {
            "device_index": d.index,
            "memory_allocated_start": _read(d.memory_allocated),
            "memory_reserved_start": _read(d.memory_reserved),
        }
        for d in per_device
    ]


def _run_body(
    counters: Counters,
    name: str,
    body: Callable[[], object],
    iterations: int,
    fault: dict | None,
    record_path: Path,
    parent: str | None,
) -> tuple[list[float], Exception | None]:
    """Protocol step 3: inject ``fault`` when it names this phase or ``parent``, run ``body``
    ``iterations`` times, synchronizing after each.

    Returns:
        The seconds of each completed iteration, and the exception the phase raised (or None).
    """
    durations: list[float] = []
    try:
        if fault and fault["phase"] in (name, parent):
            _inject_fault(fault["kind"], name, record_path)
        for _ in range(iterations):
            ti = time.perf_counter()
            body()
            counters.synchronize()
            durations.append(time.perf_counter() - ti)
        counters.synchronize()
    except Exception as exc:  # noqa: BLE001 - every failure is classified and recorded
        try:
            counters.synchronize()
        except Exception:  # noqa: BLE001
            pass
        return durations, exc
    return durations, None


def _read_end(counters: Counters, per_device: list | None, phase: dict, devices: list[dict] | None) -> None:
    """Protocol step 4: the peaks and current values, per device too, then the extra counters."""
    phase.update(
        memory_allocated=_read(counters.memory_allocated),
        memory_reserved=_read(counters.memory_reserved),
        max_memory_allocated=_read(counters.max_memory_allocated),
        max_memory_reserved=_read(counters.max_memory_reserved),
    )
    for entry, d in zip(devices or (), per_device or ()):
        entry.update(
            memory_allocated=_read(d.memory_allocated),
            memory_reserved=_read(d.memory_reserved),
            max_memory_allocated=_read(d.max_memory_allocated),
            max_memory_reserved=_read(d.max_memory_reserved),
        )
        try:  # the extras that differ by device
            extra = d.extra()
            entry.update({name: extra.get(name) for name in PER_DEVICE_EXTRAS})
        except Exception:  # noqa: BLE001 - missing, never 0
            entry.update(dict.fromkeys(PER_DEVICE_EXTRAS))
    phase["devices"] = devices
    try:
        phase.update(counters.extra())
    except Exception:  # noqa: BLE001 - extra counters are best effort: missing, never 0
        pass


def _record_outcome(counters: Counters, phase: dict, error: Exception | None, after: Callable[[], dict] | None) -> None:
    """Save success (and ``after``'s sizes) or the classified error into ``phase``."""
    if error is None:
        phase.update(status="ok", error_type=None, error_message=None)
        if after is not None:
            try:
                phase.update(after())
            except Exception:  # noqa: BLE001 - a size we cannot compute is missing, not a failed phase
                traceback.print_exc()
        return
    failure_class = classify_failure(error)
    _, wording, said = parse_oom(str(error))
    phase.update(
        status="oom" if failure_class == "oom" else "error",
        failure_class=failure_class,
        failure_wording=wording,
        error_type=type(error).__name__,
        error_message=str(error)[:4000],
    )
    detail = counters.oom_detail()
    if phase["status"] == "oom":  # what the OOM said, apart from the peak it never reached
        phase.update(said)
        phase.update(detail or {})  # the CPU capacity tracker's exact bytes over the message's rounded ones


def run_phase(
    counters: Counters,
    name: str,
    body: Callable[[], object],
    iterations: int,
    fault: dict | None,
    record_path: Path,
    meta: dict | None = None,
    after: Callable[[], dict] | None = None,
) -> PhaseResult:
    """Run one phase under the per-phase protocol (module docstring) and return its record.

    Args:
        counters: the run's counters (the ``Counters`` protocol). When it offers
            ``per_device()`` (``counters.MultiDeviceCounters``), the record's ``devices`` lists
            one entry per device: ``device_index``, the six ``conf.contract.DEVICE_COUNTERS``
            (bytes, null when unreadable) and its ``conf.contract.PER_DEVICE_EXTRAS``.
        name: the phase's name (``model_load``, ``cold_step.forward``...).
        body: the phase body, called ``iterations`` times, the device synchronized after each.
        iterations: how many times ``body`` runs (0 for an empty warmup).
        fault: spec ``fault`` (``{"phase", "kind"}``), injected when it names this phase or its
            parent; None for none.
        record_path: the run's record.json (the ``garbage`` fault overwrites it).
        meta: parent, sub_phase, step, micro_step of a sub-phase; None otherwise.
        after: returns sizes by construction (``kv_cache_bytes``, ``optimizer_state_bytes``...,
            bytes) to add to a successful phase's record, read after the counters; an exception
            it raises is printed and its sizes left out.

    Returns:
        A ``PhaseResult``: the phase record (name, the meta fields, status ``ok``, ``oom`` or
        ``error`` by ``classify_failure``, iterations, the counters at start and end in bytes or
        None, duration_s and iteration_s in seconds, ``dynamo_graphs_compiled``, devices, the
        extra counters, error_type, error_message of at most 4000 characters, and for an OOM the
        counters' ``oom_detail()``) and the exception of a failed phase.

    Raises:
        Nothing the body raises: every ``Exception`` is classified and recorded (a
        ``BaseException`` such as KeyboardInterrupt propagates).
    """
    # per_device() is offered only by counters of several devices (MultiDeviceCounters)
    per_device = counters.per_device() if hasattr(counters, "per_device") else None
    counters.synchronize()
    meta = meta or {}
    phase: dict[str, Any] = {"name": name, **{k: meta.get(k) for k in SUB_PHASE_FIELDS}, "status": None}
    phase["iterations"] = iterations
    devices = _read_start(counters, per_device, phase)
    graphs_start = dynamo_graphs()
    counters.reset_peak_memory_stats()
    t0 = time.perf_counter()
    durations, error = _run_body(counters, name, body, iterations, fault, record_path, meta.get("parent"))
    phase["duration_s"] = time.perf_counter() - t0
    phase["iteration_s"] = durations
    graphs_end = dynamo_graphs()  # Dynamo imported inside the phase: it had compiled nothing before
    phase["dynamo_graphs_compiled"] = None if graphs_end is None else graphs_end - (graphs_start or 0)
    _read_end(counters, per_device, phase, devices)
    _record_outcome(counters, phase, error, after)
    return PhaseResult(phase, error)
