"""Device pool: concurrent runs on one node each get a device (or CPU cores) of their own.

A lease is an exclusive ``filelock`` on ``<lease_dir>/<kind>-<slot>.lock``, held by the
orchestrator process for the whole run. The lock is an OS file lock (flock), so a run whose
orchestrator is killed releases its lease with the process: no stale lease survives a crash.
The worker receives its slot through its environment: ``CUDA_VISIBLE_DEVICES`` for a GPU
(the run then sees it as cuda:0), ``MEMSWEEP_CPU_CORES`` for CPU cores (the worker pins
itself with sched_setaffinity and uses that many intra-op threads). Leases are node-local
(the default lease directory is in the node's temporary directory), as devices are.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

from worker.records import SpecError

POOLS = ("gpus", "cores", "none")


def default_lease_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"memsweep-leases-{os.getuid()}"


def gpu_slots(probe: dict) -> list[str]:
    """Physical ids of the GPUs visible to the orchestrator (honours CUDA_VISIBLE_DEVICES)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [v.strip() for v in visible.split(",") if v.strip()]
    return [str(i) for i in range(int(probe.get("device_count") or 1))]


def core_slots(cores_per_run: int) -> list[str]:
    """The node's usable cores in groups of ``cores_per_run`` (a slot is "0,1" for two cores)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if cores_per_run > len(cores):
        raise SpecError("cores_per_run", cores_per_run, f"at most the {len(cores)} usable cores")
    return [",".join(map(str, cores[i:i + cores_per_run]))
            for i in range(0, len(cores) - cores_per_run + 1, cores_per_run)]


@contextlib.contextmanager
def lease(kind: str, slots: list[str], lease_dir: Path | None = None, poll_s: float = 0.2) -> Iterator[str]:
    """Hold one free slot of ``slots`` for the duration of the block; waits while all are taken."""
    lease_dir = Path(lease_dir or default_lease_dir())
    lease_dir.mkdir(parents=True, exist_ok=True)
    while True:
        for slot in slots:
            lock = FileLock(lease_dir / f"{kind}-{slot.replace(',', '_')}.lock")
            try:
                lock.acquire(timeout=0)
            except Timeout:
                continue
            try:
                yield slot
            finally:
                lock.release()
            return
        time.sleep(poll_s)


@contextlib.contextmanager
def placement(pool: str, device: str, cores_per_run: int, probe: dict | None,
              lease_dir: Path | None = None) -> Iterator[dict]:
    """The worker's extra environment for one run under ``pool`` (empty when nothing is leased).

    ``gpus``: on a CUDA device, lease one visible GPU; ``cores``: on the CPU, lease
    ``cores_per_run`` cores; ``none``: no lease (runs may share a device).

    Raises:
        SpecError: an unknown pool, or more cores per run than the node has.
    """
    if pool not in POOLS:
        raise SpecError("pool", pool, "one of " + ", ".join(POOLS))
    if pool == "gpus" and device.startswith("cuda"):
        if device != "cuda:0":
            raise SpecError("device", device, "device=cuda or auto with pool=gpus (the pool picks the GPU, "
                                              "seen as cuda:0 by the run), or pool=none to name one")
        with lease("gpu", gpu_slots(probe or {}), lease_dir) as slot:
            yield {"CUDA_VISIBLE_DEVICES": slot, "MEMSWEEP_LEASE": f"gpu:{slot}"}
    elif pool == "cores" and device == "cpu":
        with lease("cores", core_slots(cores_per_run), lease_dir) as slot:
            yield {"MEMSWEEP_CPU_CORES": slot, "MEMSWEEP_LEASE": f"cores:{slot}"}
    else:
        yield {}
