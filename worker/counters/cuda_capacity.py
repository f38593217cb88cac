"""The CUDA capacity of a run: an emulated smaller card, and what lives outside the allocator.

An emulated capacity (spec ``capacity``) is applied with
torch.cuda.set_per_process_memory_fraction(fraction, device) (torch/cuda/memory.py). The caching
allocator then refuses an allocation past
``allowed_memory_maximum = static_cast<size_t>(fraction * static_cast<double>(total))``
(c10/cuda/CUDACachingAllocator.cpp, ``setMemoryFraction``); ``memory_fraction_for`` rounds the
fraction up so that the floor is not 1 B under the limit.

The fraction caps only what the caching allocator reserves; the CUDA context, library handles,
lazily loaded kernels and NCCL buffers live outside it. The footprint outside is measured once
the context exists (total - free - reserved, ``cuda.outside_allocator``) and the fraction is
computed for ``capacity - footprint``; the record's ``capacity`` gives both fractions.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch

from memsweep.conf.contract import DEVICE_NOT_FREE_BYTES

from .cuda import outside_allocator

NATIVE_BACKEND = "native"
"""torch.cuda.get_allocator_backend() of PyTorch's own caching allocator."""


class DeviceNotFree(Exception):
    """The device cannot give the run its capacity: not enough of it is free at the start."""


def memory_fraction_for(limit_bytes: int, total_memory: int) -> float:
    """The smallest fraction whose allocator limit is not under ``limit_bytes``.

    The caching allocator's limit is ``int(fraction * float(total_memory))``
    (c10/cuda/CUDACachingAllocator.cpp, ``setMemoryFraction``: static_cast<size_t> of a double
    product, a truncation); ``limit_bytes / total_memory`` rounded to a double can make that
    1 B short, so the fraction is raised one ulp at a time (math.nextafter) until the limit is
    at least ``limit_bytes``.

    Args:
        limit_bytes: what the allocator must be allowed to reserve, bytes (> 0).
        total_memory: the device's total memory (torch.cuda.mem_get_info), bytes.

    Returns:
        A fraction in (0, 1] with ``allocator_limit(fraction, total_memory) >= limit_bytes``.

    Raises:
        ValueError: ``limit_bytes`` is not in (0, total_memory].
    """
    if not 0 < limit_bytes <= total_memory:
        raise ValueError(f"allocator limit {limit_bytes} B must be in (0, {total_memory}] B")
    fraction = limit_bytes / total_memory
    while allocator_limit(fraction, total_memory) < limit_bytes:
        fraction = math.nextafter(fraction, math.inf)
    return min(fraction, 1.0)


def allocator_limit(fraction: float, total_memory: int) -> int:
    """The caching allocator's limit for ``fraction`` of ``total_memory`` bytes, as
    c10/cuda/CUDACachingAllocator.cpp computes it: static_cast<size_t>(fraction * double(total))."""
    return int(fraction * float(total_memory))


def backend_warning(backend: str | None) -> str | None:
    """What a non-native allocator backend changes in the measurement, or None for the native one.

    With ``PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync`` (torch.cuda.get_allocator_backend,
    torch/cuda/memory.py) the per-process fraction caps the bytes in use, while memory_reserved is
    the pool's, which CUDA grows and trims on its own: the frontier's reserved peak is not what the
    fraction capped.

    Args:
        backend: torch.cuda.get_allocator_backend(), or None when unknown.

    Returns:
        The warning text, or None.
    """
    if backend in (None, NATIVE_BACKEND):
        return None
    return (
        f"allocator backend {backend!r}, not PyTorch's native caching allocator: set_per_process_memory_fraction "
        f"caps the bytes in use, and memory_reserved is the CUDA pool's; compare max_memory_allocated with the "
        f"capacity, not max_memory_reserved"
    )


def _cap_device(index: int, capacity_bytes: int, total: int, free: int, outside: int | None) -> float:
    """Cap cuda:``index``'s allocator at ``capacity_bytes`` minus the memory ``outside`` it (bytes).

    Returns:
        The memory fraction applied (torch.cuda.set_per_process_memory_fraction).

    Raises:
        ValueError: ``capacity_bytes`` exceeds ``total``.
        DeviceNotFree: the capacity is not larger than ``outside``, or the allocator's share
            exceeds ``free``.
    """
    if capacity_bytes > total:
        raise ValueError(f"capacity {capacity_bytes} B exceeds the device's total_memory {total} B")
    limit = capacity_bytes - max(outside or 0, 0)
    if limit <= 0:
        raise DeviceNotFree(
            f"cuda:{index}: capacity {capacity_bytes} B is not larger than the memory used "
            f"outside the allocator ({outside} B)"
        )
    if limit > free:
        raise DeviceNotFree(
            f"cuda:{index}: the allocator's share of the capacity ({limit} B) exceeds the "
            f"device's free memory ({free} B): another process holds it"
        )
    fraction = memory_fraction_for(limit, total)
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return fraction


def cuda_capacity(counters, capacity_bytes: int | None, backend: str | None = None) -> dict:
    """Measure the footprint outside the allocator and apply the run's capacity on every device.

    Call after ``counters.start()`` (the context exists: torch.cuda.mem_get_info creates it).
    For each device (``counters.per_device()`` on a run of several devices): total and free from
    torch.cuda.mem_get_info(device), reserved from the counters; the footprint is total - free -
    reserved. A footprint above ``DEVICE_NOT_FREE_BYTES`` is flagged (``device_not_free``, also on
    stderr). With an emulated capacity the allocator gets ``capacity_bytes - footprint``
    (``memory_fraction_for``, torch.cuda.set_per_process_memory_fraction(fraction, device)).

    Args:
        counters: ``CudaCounters`` or ``MultiDeviceCounters`` (started).
        capacity_bytes: the emulated capacity of each device, bytes; None for the device's own.
        backend: torch.cuda.get_allocator_backend(); a non-native one is flagged.

    Returns:
        The record's ``capacity`` (conf.contract.CAPACITY_FIELDS): ``capacity_method``; with a
        capacity, ``capacity_mode``, ``memory_fraction`` (applied, cuda:N's of the run's device),
        ``memory_fraction_nominal`` (capacity / total), ``allocator_limit_bytes`` and, on several
        devices, ``memory_fractions``; always ``outside_allocator_start_bytes`` (the largest over
        the devices), ``device_not_free`` and ``allocator_backend_warning`` (null when fine).

    Raises:
        DeviceNotFree: the capacity is not larger than the footprint, or the allocator's share
            of it exceeds the device's free memory (another process holds it): the run would
            measure the other process, not the capacity.
        ValueError: ``capacity_bytes`` exceeds a device's total memory.
    """
    devices = counters.per_device() if hasattr(counters, "per_device") else [counters]
    fractions, limits, outside_all, busy = [], [], [], []
    nominal = None
    for device_counters in devices:
        free, total = (int(v) for v in torch.cuda.mem_get_info(device_counters.index))
        outside = outside_allocator(total, free, device_counters.memory_reserved())
        outside_all.append(outside)
        if outside is not None and outside > DEVICE_NOT_FREE_BYTES:
            busy.append(f"cuda:{device_counters.index}: {outside} B in use outside this run's allocator at the start")
        if capacity_bytes is None:
            continue
        fraction = _cap_device(device_counters.index, capacity_bytes, total, free, outside)
        fractions.append(fraction)
        limits.append(allocator_limit(fraction, total))
        nominal = nominal if nominal is not None else capacity_bytes / total
    out = _capacity_record(capacity_bytes, len(devices), fractions, limits, nominal, outside_all, busy, backend)
    for flag in (out["device_not_free"], out["allocator_backend_warning"]):
        if flag:
            print(f"memsweep worker: warning: {flag}", file=sys.stderr)
    return out


def _capacity_record(
    capacity_bytes: int | None,
    n_devices: int,
    fractions: list[float],
    limits: list[int],
    nominal: float | None,
    outside_all: list[int | None],
    busy: list[str],
    backend: str | None,
) -> dict[str, Any]:
    """``cuda_capacity``'s record from what it measured and applied on each device (bytes)."""
    known = [v for v in outside_all if v is not None]
    out: dict[str, Any] = {
        "capacity_method": "device total_memory",
        "outside_allocator_start_bytes": max(known) if known else None,
        "device_not_free": "; ".join(busy) or None,
        "allocator_backend_warning": backend_warning(backend),
    }
    if capacity_bytes is not None:
        out.update(
            capacity_mode="allocator",
            capacity_method="torch.cuda.set_per_process_memory_fraction, for capacity minus the memory outside "
            "the allocator" + (" (every device)" if n_devices > 1 else ""),
            memory_fraction=fractions[0],
            memory_fraction_nominal=nominal,
            allocator_limit_bytes=limits[0],
        )
        if n_devices > 1:
            out["memory_fractions"] = fractions
    return out
