"""A measured run's answer in words: its peaks, its capacity and the headroom left, and the load
it answered for. One formatter for ``memsweep run``'s console and the Python API's ``RunResult``.

Bytes stay integers; each figure is printed once in bytes and in GiB (2^30 B), the unit named.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsweep.conf.contract import (
    GiB,
    device_kind_of,
    phase_peak,
    record_phases,
    run_peak,
    run_throughput,
    throughput_words,
    timed_on,
)
from memsweep.estimator.labels import verdict_words


def size_words(value: int | None) -> str:
    """``"N B (x GiB)"`` for a byte count; ``"not recorded"`` for None (never 0)."""
    return "not recorded" if value is None else f"{value} B ({value / GiB:.3f} GiB)"


def load_terms(spec: Mapping[str, Any]) -> str:
    """The load a verdict answered for, in the field's words (``estimator.labels.verdict_words``, the
    words of every verdict line): mode, the axes, dtype, what is set, the precision recipe, in train
    mode the optimizer and activation checkpointing, and the capacity.

    Args:
        spec: the run's spec (``RunSpec.to_dict()`` or spec.json).

    Returns:
        e.g. ``"mode=train batch=4 context=128 width=256 dtype=bfloat16 precision=bf16-mixed
        optimizer=adamw checkpointing=false capacity=256MiB"``; ``capacity=device`` without one.
    """
    return " ".join(verdict_words(spec, spec.get("capacity_bytes")))


def run_answer(spec: Mapping[str, Any], record: Mapping[str, Any] | None) -> list[str]:
    """The answer of a measured run, as console lines: both peaks, the capacity and the headroom.

    The headroom is the capacity minus the peak the capacity applies to, the counter the run's
    outcome is decided on (``conf.contract.run_peak``): ``max_memory_reserved`` on CUDA/ROCm (the
    caching allocator's bytes, which the per-process memory fraction caps), ``max_memory_allocated``
    on the CPU (the worker's live tensor bytes, which the emulated capacity caps). A CPU figure is
    labelled as the CPU's: its reserved peak is the process's resident memory, not a GPU one.

    Args:
        spec: the run's spec (a mapping).
        record: its record.json, or None when it left none.

    A run that did not end ok (``oom``, ``error``, ``crash``, ``timeout``, or no outcome recorded)
    gets no headroom: its peaks are partial, up to the failure, so capacity minus them says nothing
    of the load's fit; the lines say so instead.

    Returns:
        Three lines (peaks, capacity and headroom, load), the measured throughput before the load
        when the run was timed (``conf.contract.throughput_words``, naming the device); only the
        load when there is no record.
    """
    load = f"  answered for: {load_terms(spec)}"
    if not record:
        return ["  peak: not recorded (no record.json)", load]
    kind = device_kind_of(record.get("device_kind"), record.get("device") or spec.get("device"))
    where = "the CPU (reserved = the process's resident memory; not a GPU figure)" if kind == "cpu" else kind
    phases = record_phases(record)
    alloc, resv = phase_peak(phases, "max_memory_allocated"), phase_peak(phases, "max_memory_reserved")
    peak, counter = run_peak(record)
    capacity = record.get("capacity_bytes") or spec.get("capacity_bytes")
    ended = failure_words(record)
    partial = "" if ended is None else ", up to the failure"
    lines = [
        f"  peak on {where}{partial}: max_memory_allocated {size_words(alloc)}, max_memory_reserved {size_words(resv)}"
    ]
    if capacity is None:
        lines.append("  capacity: not recorded; headroom: unknown")
    elif ended is not None:
        lines.append(f"  capacity {size_words(capacity)}; headroom: none ({ended})")
    else:
        headroom = None if peak is None else capacity - peak
        lines.append(
            f"  capacity {size_words(capacity)}; headroom = capacity - {counter} = {size_words(headroom)}"
            + (" (above the capacity)" if headroom is not None and headroom < 0 else "")
        )
    environment = record.get("environment")
    name = environment.get("device_name") if isinstance(environment, Mapping) else None
    rate = throughput_words(run_throughput(record, record.get("outcome")), timed_on(kind, name))
    return [*lines, *([f"  {rate}"] if rate else []), load]


def failure_words(record: Mapping[str, Any]) -> str | None:
    """Why a run that did not end ok has no headroom, in words, for its answer; None for an ``ok`` run.

    Args:
        record: the run's record.json.

    Returns:
        ``"ran out of memory in cold_forward: the load does not fit"`` for an ``oom``; ``"ended
        error in cold_forward: its peaks are partial, up to the failure, and say nothing of the
        load's fit"`` for another outcome; ``"did not complete: ..."`` without one.
    """
    outcome, phase = record.get("outcome"), record.get("failed_phase")
    if outcome == "ok":
        return None
    where = f" in {phase}" if phase else ""
    if outcome == "oom":
        return f"ran out of memory{where}: the load does not fit"
    ended = f"ended {outcome}{where}" if outcome else "did not complete"
    return f"{ended}: its peaks are partial, up to the failure, and say nothing of the load's fit"
