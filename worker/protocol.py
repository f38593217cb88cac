"""The per-phase protocol of seed 003 (``seeds/003_*.txt``), and the faults memsweep's own
tests inject into it.

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
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from memsweep.conf.contract import PER_DEVICE_EXTRAS, SUB_PHASE_FIELDS

from .classify import classify_failure, parse_oom

if TYPE_CHECKING:  # worker.counters imports torch; this module must not (see above)
    from .counters import Counters


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


def run_phase(
    counters: Counters,
    name: str,
    body: Callable[[], object],
    iterations: int,
    fault: dict | None,
    record_path: Path,
    meta: dict | None = None,
    after: Callable[[], dict] | None = None,
) -> dict:
    """Run one phase under the seed-003 protocol and return its phase record (bytes, seconds).

    ``meta``: parent, sub_phase, step, micro_step of a sub-phase (null otherwise). ``after``:
    a callable returning sizes by construction to add to a successful phase's record
    (``kv_cache_bytes``, ``optimizer_state_bytes``...), read after the counters.
    Then the extra counters (``counters.extra()``: allocator retries and OOMs, inactive
    split bytes, device free/total), null where the backend has none.

    ``devices``: when ``counters`` offers ``per_device()`` (a run on several devices,
    ``counters.MultiDeviceCounters``), a list with one entry per device, in order:
    ``device_index`` and the six counters of ``conf.contract.DEVICE_COUNTERS`` (bytes, read at the
    same protocol points as the main counters; null when one cannot be read, never 0), and that
    device's ``conf.contract.PER_DEVICE_EXTRAS`` from its ``extra()``. Null otherwise.

    Args:
        counters: the run's counters (the ``Counters`` protocol).
        name: the phase's name (``model_load``, ``cold_step.forward``...).
        body: the phase body, called ``iterations`` times, the device synchronized after each.
        iterations: how many times ``body`` runs (0 for an empty warmup).
        fault: spec ``fault`` (``{"phase", "kind"}``), injected when it names this phase or its
            parent; None for none.
        record_path: the run's record.json (the ``garbage`` fault overwrites it).
        meta: see above.
        after: see above; an exception it raises is printed and its sizes left out.

    Returns:
        The phase record: name, the meta fields, status (``ok``, ``oom`` or ``error``, by
        ``classify_failure``), iterations, the counters at start and end (bytes or None),
        duration_s and iteration_s (seconds), ``dynamo_graphs_compiled`` (graphs torch.compile
        compiled during the phase: ``dynamo_graphs``' growth; null when Dynamo is not imported),
        devices, the extra counters, error_type and
        error_message (at most 4000 characters), and for an OOM the counters' ``oom_detail()``.
        A failed phase's record also holds the exception under ``_exception``, for the caller
        to pop (it is not part of the record).

    Raises:
        Nothing the body raises: every ``Exception`` is classified and recorded (a
        ``BaseException`` such as KeyboardInterrupt propagates).
    """

    def read(fn):
        try:
            value = fn()
            return None if value is None else int(value)
        except Exception:  # a counter we cannot read is missing, not zero
            return None

    # per_device() is offered only by counters of several devices (MultiDeviceCounters)
    per_device = counters.per_device() if hasattr(counters, "per_device") else None
    counters.synchronize()
    meta = meta or {}
    phase = {
        "name": name,
        **{k: meta.get(k) for k in SUB_PHASE_FIELDS},
        "status": None,
        "iterations": iterations,
        "memory_allocated_start": read(counters.memory_allocated),
        "memory_reserved_start": read(counters.memory_reserved),
    }
    devices = (
        None
        if per_device is None
        else [
            {
                "device_index": d.index,
                "memory_allocated_start": read(d.memory_allocated),
                "memory_reserved_start": read(d.memory_reserved),
            }
            for d in per_device
        ]
    )
    graphs_start = dynamo_graphs()
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
    graphs_end = dynamo_graphs()  # Dynamo imported inside the phase: it had compiled nothing before
    phase["dynamo_graphs_compiled"] = None if graphs_end is None else graphs_end - (graphs_start or 0)
    phase.update(
        memory_allocated=read(counters.memory_allocated),
        memory_reserved=read(counters.memory_reserved),
        max_memory_allocated=read(counters.max_memory_allocated),
        max_memory_reserved=read(counters.max_memory_reserved),
    )
    for entry, d in zip(devices or (), per_device or ()):
        entry.update(
            memory_allocated=read(d.memory_allocated),
            memory_reserved=read(d.memory_reserved),
            max_memory_allocated=read(d.max_memory_allocated),
            max_memory_reserved=read(d.max_memory_reserved),
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
    if error is None:
        phase.update(status="ok", error_type=None, error_message=None)
        if after is not None:
            try:
                phase.update(after())
            except Exception:  # noqa: BLE001 - a size we cannot compute is missing, not a failed phase
                traceback.print_exc()
    else:
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
        phase["_exception"] = error
    return phase
