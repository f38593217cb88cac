"""The device a run asks for, and the run's environment: versions, device, allocator, host.

``python -m memsweep.worker --probe DEVICE`` (``probe``) and ``--env DEVICE`` (``env_report``, the
environment report) answer from here, in a short process of their own, so that the sweeper's
process never initialises CUDA.

torch is imported inside the functions, not at the top: ``probe`` must answer "PyTorch is not
installed" instead of failing to import, and the worker's command line imports this module
before it knows whether torch is there.
"""

from __future__ import annotations

import os
import platform
import socket
from typing import Any, NamedTuple

from memsweep.conf.contract import ISOLATION_ENV, ISOLATION_SPAWN, first_line, meminfo_bytes


class ResolvedDevice(NamedTuple):
    """A device asked for (``resolve_device``, ``worker.rank.RankHooks.resolve``)."""

    device: Any  # torch.device (torch is imported inside the functions)
    reason: str | None  # why it is unavailable; None when it is there


class DeviceMemory(NamedTuple):
    """A device's memory (``device_memory``): bytes, None when unreadable."""

    total: int | None
    free: int | None
    name: str | None  # the device's (or the CPU's) model name, None when unknown


def resolve_device(requested: str) -> ResolvedDevice:
    """The device of ``requested`` and why it is unavailable; imports torch.

    Args:
        requested: ``auto`` (cuda:0 when a GPU is visible, else cpu), ``cpu``, ``cuda`` or ``cuda:N``.

    Returns:
        The device and None when it is there (``cuda`` resolved to ``cuda:0``), else the device
        and a reason.

    Raises:
        RuntimeError: ``requested`` is not a device string torch.device accepts.
    """
    import torch

    if requested == "auto":
        requested = "cuda:0" if torch.cuda.is_available() else "cpu"
    device = torch.device(requested)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return ResolvedDevice(device, "no CUDA/ROCm device is visible to this PyTorch build")
        index = device.index if device.index is not None else 0
        if index >= torch.cuda.device_count():
            return ResolvedDevice(device, f"{requested}: only {torch.cuda.device_count()} device(s) visible")
        device = torch.device("cuda", index)
    return ResolvedDevice(device, None)


def bf16_supported(device) -> bool:
    """Whether ``device`` (torch.device) runs bfloat16 natively, read from that device itself.

    torch.cuda.is_bf16_supported (torch/cuda/__init__.py) asks the *current* device: ROCm builds
    are True, else ``get_device_properties(current_device()).major >= 8`` (without emulation).
    The same test is made here on ``device``'s own properties, so a run on cuda:1 is not judged
    by cuda:0. Always True on the CPU.
    """
    import torch

    if device.type != "cuda":
        return True
    if torch.version.hip:
        return True
    if not torch.cuda.is_available():
        return False
    index = device.index if device.index is not None else 0
    return bool(torch.cuda.get_device_properties(index).major >= 8)


def device_memory(device) -> DeviceMemory:
    """Total and free memory (bytes) and the name of ``device``.

    CUDA: torch.cuda.mem_get_info (PyTorch doc; creates the CUDA context) and
    torch.cuda.get_device_name. CPU: MemTotal and MemAvailable of /proc/meminfo (None when
    unreadable) and the processor's model name (``cpu_name``, None when unknown).
    """
    import torch

    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return DeviceMemory(int(total), int(free), torch.cuda.get_device_name(device))
    return DeviceMemory(meminfo_bytes("MemTotal"), meminfo_bytes("MemAvailable"), cpu_name())


def cpu_name(path: str = "/proc/cpuinfo") -> str | None:
    """The CPU's model name: the first ``model name`` line of /proc/cpuinfo (proc(5); x86 and
    others that report one), e.g. ``Intel(R) Xeon(R) ...``.

    Args:
        path: the cpuinfo file (tests pass another).

    Returns:
        The name, stripped; None when the file cannot be read or has no such line (never the
        architecture, ``platform.processor()``'s ``x86_64``, passed off as a name).
    """
    try:
        with open(path) as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        return None
    return None


def env_alloc_conf() -> dict:
    """The caching allocator's settings from the environment: PYTORCH_CUDA_ALLOC_CONF,
    PYTORCH_HIP_ALLOC_CONF and PYTORCH_ALLOC_CONF (str, or None when unset)."""
    return {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}


def environment(device, dry_run: bool = False, memory: tuple[int | None, int | None, str | None] | None = None) -> dict:
    """The run's environment: versions, device, allocator settings, host.

    ``dry_run`` on a CUDA device: nothing is asked of the device (no CUDA call, no context), so
    its total memory, name, driver, allocator backend and capability are null (unknown), never
    invented.

    Args:
        device: the run's device (torch.device).
        dry_run: the run is a dry run (spec ``dry_run``).
        memory: ``device_memory(device)`` when the caller read it already (not read again), else None.

    Returns:
        The record's ``environment`` (``total_memory`` in bytes; ``isolation`` and ``lease``:
        the sweeper's MEMSWEEP_ISOLATION and MEMSWEEP_LEASE).
    """
    import torch

    no_device = dry_run and device.type == "cuda"
    total, _, name = (None, None, None) if no_device else memory or device_memory(device)
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "backend": ("hip" if torch.version.hip else "cuda") if device.type == "cuda" else "cpu",
        "device": str(device),
        "device_name": name,
        "total_memory": total,
        "driver": first_line("/proc/driver/nvidia/version") if device.type == "cuda" and not no_device else None,
        "allocator_backend": torch.cuda.get_allocator_backend() if device.type == "cuda" and not no_device else None,
        "alloc_conf": env_alloc_conf(),
        # cuBLAS workspaces come from the caching allocator (their size: this variable, or the
        # default per handle and stream): memory the cold phase keeps, in no gradient
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "isolation": os.environ.get(ISOLATION_ENV, ISOLATION_SPAWN),  # (unset: started by hand, a new interpreter)
        "lease": os.environ.get("MEMSWEEP_LEASE"),
    }
    if device.type == "cuda":
        env["capability"] = None if no_device else ".".join(map(str, torch.cuda.get_device_capability(device)))
    return env


def probe(requested: str) -> dict:
    """Describe a device without measuring anything (runs in its own short process).

    Args:
        requested: a device string (see ``resolve_device``).

    Returns:
        ``requested``, ``available`` and ``reason`` (why not), and when torch is installed
        ``device``, ``device_kind``, ``torch``; when the device is available also
        ``total_memory`` and ``free_memory`` (bytes), ``device_name``, ``bf16_supported`` and
        ``device_count``.
    """
    try:
        import torch
    except ImportError as exc:
        return {"requested": requested, "available": False, "reason": f"PyTorch is not installed ({exc})"}
    device, reason = resolve_device(requested)
    out = {
        "requested": requested,
        "device": str(device),
        "device_kind": device.type,
        "available": reason is None,
        "reason": reason,
        "torch": torch.__version__,
    }
    if reason is None:
        total, free, name = device_memory(device)
        out.update(
            total_memory=total,
            free_memory=free,
            device_name=name,
            bf16_supported=bf16_supported(device),
            device_count=torch.cuda.device_count() if device.type == "cuda" else 1,
        )
    return out


def env_report(requested: str) -> dict:
    """The environment report of a device: probe() plus environment() when it is there.

    Args:
        requested: a device string (see ``resolve_device``).

    Returns:
        ``probe``'s description with ``environment`` (without the run-only ``isolation`` and
        ``lease``) when the device is available.
    """
    info = probe(requested)
    if info.get("available"):
        device, _ = resolve_device(requested)
        env = environment(device)
        for run_only in ("isolation", "lease"):  # facts of a run, not of the machine
            env.pop(run_only, None)
        info["environment"] = env
    return info
