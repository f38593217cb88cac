"""The four memory counters, per device kind, read by the phase protocol.

Every counter returns an integer number of bytes, or ``None`` when it cannot be read; every
kind follows one protocol, ``Counters`` (``base.py``):

* ``cuda.py``: CUDA and ROCm (``CudaCounters``, ``MultiDeviceCounters``, ``outside_allocator``);
* ``cuda_capacity.py``: the CUDA capacity (``cuda_capacity``, ``memory_fraction_for``);
* ``cpu.py``: CPU: live tensor storage bytes as "allocated", the resident set as "reserved"
  (``CpuCounters``), and the CPU capacities;
* ``dryrun.py`` and ``fake.py``: dry runs (``DryRunCounters``): predicted allocated bytes on
  fake tensors, each phase's peak split into ``conf.contract.PEAK_CATEGORIES``.

``extra()`` gives the extra counters at the end of every phase (``conf.contract.EXTRA_COUNTERS``),
null where the backend has none. A CPU figure is labelled as such (``counter_sources``).
"""

from __future__ import annotations

import torch

from .base import NO_EXTRA, NO_PEAK_SPLIT, Counters
from .cpu import CpuCounters, LiveTensorTracker, apply_cpu_allocator_capacity, apply_cpu_process_capacity
from .cuda import CudaCounters, MultiDeviceCounters, outside_allocator
from .cuda_capacity import DeviceNotFree, allocator_limit, backend_warning, cuda_capacity, memory_fraction_for
from .dryrun import (
    CUDA_BLOCK_BYTES,
    CUDA_ROUNDING,
    EXACT_ROUNDING,
    REAL_STORAGE_BYTES,
    DryRunCounters,
    FakeLiveTensorTracker,
    cuda_block_bytes,
)
from .fake import dry_run_unsupported, ensure_fake_cuda_guard, fake_cuda_autograd_available, fake_mode

__all__ = [
    "CUDA_BLOCK_BYTES",
    "CUDA_ROUNDING",
    "EXACT_ROUNDING",
    "NO_EXTRA",
    "NO_PEAK_SPLIT",
    "REAL_STORAGE_BYTES",
    "Counters",
    "CpuCounters",
    "CudaCounters",
    "DryRunCounters",
    "FakeLiveTensorTracker",
    "LiveTensorTracker",
    "MultiDeviceCounters",
    "apply_cpu_allocator_capacity",
    "apply_cpu_process_capacity",
    "DeviceNotFree",
    "allocator_limit",
    "backend_warning",
    "cuda_capacity",
    "memory_fraction_for",
    "outside_allocator",
    "cuda_block_bytes",
    "dry_run_unsupported",
    "ensure_fake_cuda_guard",
    "fake_cuda_autograd_available",
    "fake_mode",
    "make_counters",
]


def make_counters(device: torch.device, devices: int = 1) -> CpuCounters | CudaCounters | MultiDeviceCounters:
    """The counters of a run on ``device``; with ``devices`` > 1 (CUDA only), a
    ``MultiDeviceCounters`` over cuda:index .. cuda:index+devices-1, ``device`` first.

    Args:
        device: the run's device (``cpu`` or ``cuda[:N]``).
        devices: how many devices the run uses (spec ``devices``).

    Returns:
        ``CpuCounters``, ``CudaCounters`` or ``MultiDeviceCounters``, not started (nothing is
        asked of the device yet).

    Raises:
        ValueError: an unsupported device type, or devices > 1 on a non-CUDA device.
    """
    if devices > 1:
        if device.type != "cuda":
            raise ValueError(f"devices={devices} needs a CUDA device, not {device.type!r}")
        first = device.index if device.index is not None else 0
        return MultiDeviceCounters([CudaCounters(torch.device("cuda", first + i)) for i in range(devices)])
    if device.type == "cuda":
        return CudaCounters(device)
    if device.type == "cpu":
        return CpuCounters()
    raise ValueError(f"unsupported device type {device.type!r}")
