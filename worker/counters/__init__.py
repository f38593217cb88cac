"""The four memory counters, per device kind, read by the phase protocol.

Every counter returns an integer number of bytes, or ``None`` when it cannot be read; every
kind follows one protocol, ``Counters`` (``base.py``):

* ``cuda.py``: CUDA (and ROCm builds, which reuse ``torch.cuda``): the caching allocator's
  counters (``CudaCounters``; ``MultiDeviceCounters`` for a run on several devices) and the
  memory outside the allocator (``outside_allocator``);
* ``cuda_capacity.py``: the CUDA capacity (torch.cuda.set_per_process_memory_fraction for the
  capacity minus the footprint outside the allocator, rounded up: ``memory_fraction_for``);
* ``cpu.py``: CPU: "allocated" = live tensor storage bytes (``LiveTensorTracker``, a
  ``TorchDispatchMode``), "reserved" = the process resident set (/proc/self/status VmRSS,
  VmHWM) (``CpuCounters``), and the CPU capacities;
* ``dryrun.py`` and ``fake.py``: dry run (spec ``dry_run``, ``DryRunCounters``): the same
  tracker on fake tensors gives the *predicted* allocated bytes, each phase's predicted peak
  split into parameters, gradients, optimizer states and activations/temporaries
  (``conf.contract.PEAK_CATEGORIES``, the categories of ``torch.distributed._tools.mem_tracker``).
  These fields are null on real runs.

Extra counters, read at the end of every phase (``extra()``), null where the backend has
none: ``num_alloc_retries``, ``num_ooms``, ``inactive_split_bytes``, ``device_free_memory``,
``device_total_memory``, ``outside_allocator_bytes`` (see ``cuda.py`` and ``cpu.py`` for their sources).

A CPU figure is labelled as such in the record (``counter_sources``) and is never a GPU
measurement.
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
