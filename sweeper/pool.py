"""Device pool: concurrent runs on one node each get a device (or CPU cores) of their own.

A lease is an exclusive ``filelock`` on ``<lease_dir>/<kind>-<id>.lock`` for every device or
core of its slot, held by the orchestrator process for the whole run. The lock is an OS file
lock (flock), so a run whose orchestrator is killed releases its lease with the process: no
stale lease survives a crash. The worker receives its slot through its environment:
``CUDA_VISIBLE_DEVICES`` for GPUs (one GPU, seen by the run as cuda:0; a run with
``devices=N`` leases N GPUs at once, seen as cuda:0..N-1), ``MEMSWEEP_CPU_CORES`` for CPU cores
(the worker pins itself with sched_setaffinity and uses that many intra-op threads). Leases are
node-local (the default lease directory is in the node's temporary directory), as devices are.
The lease's lock files are named to the run too (``conf.contract.LEASE_LOCKS_ENV``): a forked
run whose launcher worker dies goes on, and its fork-server handler takes its lease over until
it ends (``worker.forkserver``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from memsweep.conf.contract import LEASE_LOCKS_ENV, SpecError, usable_core_ids

POOLS = ("gpus", "cores", "none")


def default_lease_dir() -> Path:
    """The directory of the lease files (one lock file per slot) shared by every orchestrator
    of this user on this host: ``<tmp>/memsweep-leases-<uid>``."""
    return Path(tempfile.gettempdir()) / f"memsweep-leases-{os.getuid()}"


def gpu_slots(probe: dict, devices: int = 1) -> list[str]:
    """Slots of ``devices`` GPUs each, from the GPUs visible to the orchestrator (honours
    CUDA_VISIBLE_DEVICES, else ``probe["device_count"]``): physical ids, "0" for one GPU per run,
    "0,1", "2,3" for two (like ``core_slots``); GPUs left over after the last full group are unused.

    Raises:
        SpecError: ``devices`` exceeds the visible GPUs.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
    else:
        ids = [str(i) for i in range(int(probe.get("device_count") or 1))]
    if devices > len(ids):
        raise SpecError("devices", devices, f"at most the {len(ids)} GPU(s) visible to the pool ({','.join(ids)})")
    return [",".join(ids[i : i + devices]) for i in range(0, len(ids) - devices + 1, devices)]


def core_slots(cores_per_run: int) -> list[str]:
    """The node's usable cores in groups of ``cores_per_run`` (a slot is "0,1" for two cores)."""
    cores = usable_core_ids()
    if cores_per_run > len(cores):
        raise SpecError("cores_per_run", cores_per_run, f"at most the {len(cores)} usable cores")
    return [
        ",".join(map(str, cores[i : i + cores_per_run]))
        for i in range(0, len(cores) - cores_per_run + 1, cores_per_run)
    ]


def lease_locks(kind: str, slot: str, lease_dir: Path | None = None) -> list[Path]:
    """The lock files of one slot: ``<lease_dir>/<kind>-<member>.lock`` for each of its members.

    Args:
        kind: ``gpu`` or ``cores``.
        slot: the slot (``"0"``, ``"0,1"``).
        lease_dir: the lease directory (``default_lease_dir()`` when None).

    Returns:
        One path per member, in the slot's order.
    """
    lease_dir = Path(lease_dir or default_lease_dir())
    return [lease_dir / f"{kind}-{member.strip()}.lock" for member in slot.split(",")]


@contextlib.contextmanager
def lease(kind: str, slots: list[str], lease_dir: Path | None = None, poll_s: float = 0.2) -> Iterator[str]:
    """Hold one free slot of ``slots`` for the duration of the block; waits while all are taken.

    A slot of several members ("0,1") holds one lock per member (``<kind>-0.lock``,
    ``<kind>-1.lock``), all or none (taken without waiting, released if one is busy), so that
    slots of different sizes that share a member ("0,1" and "1") are never held at once.
    """
    lease_dir = Path(lease_dir or default_lease_dir())
    lease_dir.mkdir(parents=True, exist_ok=True)
    while True:
        for slot in slots:
            held = []
            for path in lease_locks(kind, slot, lease_dir):
                lock = FileLock(path)
                try:
                    lock.acquire(timeout=0)
                except Timeout:
                    break
                held.append(lock)
            else:
                try:
                    yield slot
                finally:
                    for lock in reversed(held):
                        lock.release()
                return
            for lock in reversed(held):
                lock.release()
        time.sleep(poll_s)


@contextlib.contextmanager
def placement(
    pool: str, device: str, cores_per_run: int, probe: dict | None, lease_dir: Path | None = None, devices: int = 1
) -> Iterator[dict]:
    """The worker's extra environment for one run under ``pool`` (empty when nothing is leased).

    ``gpus``: on a CUDA device, lease ``devices`` visible GPUs at once (one slot of
    ``gpu_slots``), passed as ``CUDA_VISIBLE_DEVICES`` ("2,3": the run sees cuda:0, cuda:1);
    ``cores``: on the CPU, lease ``cores_per_run`` cores; ``none``: no lease (runs may share a
    device). A lease's lock files are named in ``LEASE_LOCKS_ENV`` (see the module docstring).

    Raises:
        SpecError: an unknown pool, more cores per run than the node has, or more ``devices``
            than visible GPUs.
    """
    if pool not in POOLS:
        raise SpecError("pool", pool, "one of " + ", ".join(POOLS))
    if pool == "gpus" and device.startswith("cuda"):
        if device != "cuda:0":
            raise SpecError(
                "device",
                device,
                "device=cuda or auto with pool=gpus (the pool picks the GPU, "
                "seen as cuda:0 by the run), or pool=none to name one",
            )
        with lease("gpu", gpu_slots(probe or {}, devices), lease_dir) as slot:
            yield {"CUDA_VISIBLE_DEVICES": slot, "MEMSWEEP_LEASE": f"gpu:{slot}", **_locks_env("gpu", slot, lease_dir)}
    elif pool == "cores" and device == "cpu":
        with lease("cores", core_slots(cores_per_run), lease_dir) as slot:
            yield {
                "MEMSWEEP_CPU_CORES": slot,
                "MEMSWEEP_LEASE": f"cores:{slot}",
                **_locks_env("cores", slot, lease_dir),
            }
    else:
        yield {}


def _locks_env(kind: str, slot: str, lease_dir: Path | None) -> dict[str, str]:
    return {LEASE_LOCKS_ENV: os.pathsep.join(str(p) for p in lease_locks(kind, slot, lease_dir))}


def pool_size(pool: str, device: str, cores_per_run: int, probe: dict | None, devices: int = 1) -> int:
    """How many runs the pool lets run at once on this node: the bound of a launcher that would
    otherwise start every job at once (submitit_local).

    Args:
        pool: ``gpus``, ``cores`` or ``none``.
        device: the runs' device (``cpu``, ``cuda:0``).
        cores_per_run: cores per run (``pool=cores``).
        probe: the device probe (``sweeper.spec.probe_device``), for the GPUs visible.
        devices: GPUs per run.

    Returns:
        The GPU slots (``pool=gpus`` on CUDA), the core slots (``pool=cores`` on the CPU), else
        the usable cores of this node (CPU runs, one per core), at least 1.
    """
    if pool == "gpus" and device.startswith("cuda"):
        return max(1, len(gpu_slots(probe or {}, devices)))
    if pool == "cores" and device == "cpu":
        return max(1, len(core_slots(cores_per_run)))
    return max(1, len(core_slots(1)))
