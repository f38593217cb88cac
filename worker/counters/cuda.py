"""CUDA counters (also ROCm builds, which reuse ``torch.cuda``): the caching allocator's own.

Read through the device-generic ``torch.accelerator`` functions where this PyTorch has them,
``torch.cuda`` otherwise (PyTorch docs: torch.cuda.memory_allocated, memory_reserved,
max_memory_allocated, max_memory_reserved, reset_peak_memory_stats, synchronize).

``extra()``: ``num_alloc_retries``, ``num_ooms`` and ``inactive_split_bytes`` from
``torch.cuda.memory_stats``; ``device_free_memory`` / ``device_total_memory`` from
``torch.cuda.mem_get_info``; ``outside_allocator_bytes`` = total - free - memory_reserved (the
CUDA context, library handles, kernels, other processes). Null where the backend has none.

``MultiDeviceCounters`` (spec ``devices`` > 1) wraps one ``CudaCounters`` per device: its main
counters are cuda:0's, ``per_device()`` gives each device's. The capacities: ``cuda_capacity.py``.
"""

from __future__ import annotations

import torch

from .base import NO_EXTRA, NO_PEAK_SPLIT


def outside_allocator(total: int | None, free: int | None, reserved: int | None) -> int | None:
    """Device memory in use outside this process's caching allocator, bytes.

    torch.cuda.mem_get_info (torch/cuda/memory.py) returns cudaMemGetInfo's (free, total) for the
    whole device; torch.cuda.memory_reserved is what the caching allocator holds in segments
    (c10/cuda/CUDACachingAllocator.cpp, ``reserved_bytes``). What remains of total - free is the
    CUDA context, cuBLAS/cuDNN handles, lazily loaded kernels, NCCL buffers, and any other
    process's memory on the device.

    Args:
        total: the device's total memory, bytes.
        free: its free memory, bytes.
        reserved: this process's memory_reserved on it, bytes.

    Returns:
        total - free - reserved (bytes); None when one of them is missing (never 0 for unknown).
    """
    if total is None or free is None or reserved is None:
        return None
    return int(total) - int(free) - int(reserved)


class CudaCounters:
    """Counters of the CUDA caching allocator for one device (also ROCm/HIP builds); the
    ``Counters`` protocol.

    Args:
        device: a CUDA device (``torch.device("cuda", i)``; no index means 0). Nothing is asked
            of the device before ``start``.
    """

    kind = "cuda"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.index = device.index if device.index is not None else 0
        acc = getattr(torch, "accelerator", None)
        self._api = acc if acc is not None and hasattr(acc, "max_memory_reserved") else torch.cuda
        api_name = "torch.accelerator" if self._api is not torch.cuda else "torch.cuda"
        backend = "hip" if torch.version.hip else "cuda"
        self.sources: dict[str, str | None] = {
            name: f"{backend}: {api_name}.{name}"
            for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved")
        }
        self.sources.update(
            {
                "num_alloc_retries": f"{backend}: torch.cuda.memory_stats num_alloc_retries",
                "num_ooms": f"{backend}: torch.cuda.memory_stats num_ooms",
                "inactive_split_bytes": f"{backend}: torch.cuda.memory_stats inactive_split_bytes.all.current",
                "device_free_memory": f"{backend}: torch.cuda.mem_get_info (free)",
                "device_total_memory": f"{backend}: torch.cuda.mem_get_info (total)",
                "outside_allocator_bytes": f"{backend}: mem_get_info total - free - memory_reserved",
            }
        )

    def start(self) -> None:
        """Make the device current and initialise CUDA (torch.cuda.set_device, torch.cuda.init)."""
        torch.cuda.set_device(self.index)
        torch.cuda.init()

    def synchronize(self) -> None:
        """Wait for every kernel queued on the device (torch.cuda.synchronize(device))."""
        self._api.synchronize(self.index)

    def memory_allocated(self) -> int | None:
        """torch.cuda.memory_allocated(device): bytes occupied by tensors."""
        return int(self._api.memory_allocated(self.index))

    def max_memory_allocated(self) -> int | None:
        """torch.cuda.max_memory_allocated(device): its peak since the last reset, bytes."""
        return int(self._api.max_memory_allocated(self.index))

    def memory_reserved(self) -> int | None:
        """torch.cuda.memory_reserved(device): bytes held by the caching allocator."""
        return int(self._api.memory_reserved(self.index))

    def max_memory_reserved(self) -> int | None:
        """torch.cuda.max_memory_reserved(device): its peak since the last reset, bytes."""
        return int(self._api.max_memory_reserved(self.index))

    def reset_peak_memory_stats(self) -> None:
        """torch.cuda.reset_peak_memory_stats(device): both peaks restart from the current values."""
        self._api.reset_peak_memory_stats(self.index)

    def extra(self) -> dict:
        """``num_alloc_retries``, ``num_ooms`` (counts) and ``inactive_split_bytes`` from
        torch.cuda.memory_stats, ``device_free_memory`` / ``device_total_memory`` (bytes) from
        torch.cuda.mem_get_info, and ``outside_allocator_bytes`` (``outside_allocator``); each
        null when it cannot be read."""
        out = {**NO_EXTRA, **NO_PEAK_SPLIT}
        try:
            stats = torch.cuda.memory_stats(self.index)
            out.update(
                num_alloc_retries=stats.get("num_alloc_retries"),
                num_ooms=stats.get("num_ooms"),
                inactive_split_bytes=stats.get("inactive_split_bytes.all.current"),
            )
        except Exception:  # noqa: BLE001 - e.g. cudaMallocAsync backend without these stats
            pass
        try:
            free, total = torch.cuda.mem_get_info(self.index)
            out.update(device_free_memory=int(free), device_total_memory=int(total))
            out["outside_allocator_bytes"] = outside_allocator(int(total), int(free), self.memory_reserved())
        except Exception:  # noqa: BLE001
            pass
        return out

    def oom_detail(self) -> dict | None:
        """None: the caching allocator's OutOfMemoryError says in its message what was refused."""
        return None


class MultiDeviceCounters:
    """Counters of a run that uses several devices: one per-device counter object each
    (``CudaCounters`` for cuda:0 .. cuda:N-1), the first being the run's device.

    * ``synchronize`` and ``reset_peak_memory_stats`` act on every device (PyTorch docs:
      torch.cuda.synchronize(device), torch.cuda.reset_peak_memory_stats(device) act on one
      device each), so every device's peak covers the same phase window;
    * the four main counters (``memory_allocated``, ``memory_reserved``,
      ``max_memory_allocated``, ``max_memory_reserved``, bytes) and ``extra()`` are those of the
      first device, cuda:0, the run's device: the phase record's main columns mean the same as in
      a one-device run;
    * ``per_device()`` gives the per-device counter objects, which ``run_phase`` reads into the
      phase record's ``devices`` list (one entry per device, bytes, null when unreadable).

    Args:
        devices: objects with ``index`` (int) and the methods of ``CudaCounters``.

    Raises:
        ValueError: ``devices`` is empty.
    """

    kind = "cuda"

    def __init__(self, devices: list) -> None:
        if not devices:
            raise ValueError("MultiDeviceCounters needs at least one device")
        self.devices = list(devices)
        self.main = self.devices[0]
        self.index = self.main.index
        self.device = getattr(self.main, "device", None)
        self.sources: dict[str, str | None] = dict(self.main.sources)
        self.sources["devices"] = (
            f"per device, cuda:{self.devices[0].index}..cuda:{self.devices[-1].index}: "
            f"the same counters; main counters are cuda:{self.main.index}'s"
        )

    def start(self) -> None:
        """Start every device's counters, the run's device last (so that it is current)."""
        for counters in self.devices[1:]:  # initialise every device, then make the run's device current
            counters.start()
        self.main.start()

    def per_device(self) -> list:
        """The per-device counter objects, in device order (the run's device first)."""
        return list(self.devices)

    def synchronize(self) -> None:
        """Synchronize every device."""
        for counters in self.devices:
            counters.synchronize()

    def reset_peak_memory_stats(self) -> None:
        """Reset the peaks of every device."""
        for counters in self.devices:
            counters.reset_peak_memory_stats()

    def memory_allocated(self) -> int | None:
        """The run's device's ``memory_allocated`` (bytes)."""
        return self.main.memory_allocated()

    def max_memory_allocated(self) -> int | None:
        """The run's device's ``max_memory_allocated`` (bytes)."""
        return self.main.max_memory_allocated()

    def memory_reserved(self) -> int | None:
        """The run's device's ``memory_reserved`` (bytes)."""
        return self.main.memory_reserved()

    def max_memory_reserved(self) -> int | None:
        """The run's device's ``max_memory_reserved`` (bytes)."""
        return self.main.max_memory_reserved()

    def extra(self) -> dict:
        """The run's device's ``extra()``."""
        return self.main.extra()

    def oom_detail(self) -> dict | None:
        """None, as ``CudaCounters.oom_detail``: the allocator's message says what was refused."""
        return None
