"""One rank of a DDP or FSDP run (spec ``parallel``): its process group, its device, its model
wrapping, and the barriers that line its phases up with the other ranks'.

A rank is a process forked by ``worker/ranks.py``. It runs ``worker.measure.measure`` as a
one-process run does (its own counters, capacity and record ``ranks/rank_N.json``) with a
``RankHooks`` that picks its device (``cpu`` with gloo, or ``cuda:<local rank>`` with nccl),
joins the process group once the capacity is applied (a ``file://`` rendezvous in the run
directory, ``env://`` for SLURM tasks; collectives bounded by ``COLLECTIVE_TIMEOUT_S``), wraps
the model at the end of ``model_load`` (``DistributedDataParallel``, or FSDP2 ``fully_shard`` on
each block then the root) and waits at a barrier before every phase.

References: https://pytorch.org/docs/stable/distributed.html,
https://pytorch.org/docs/stable/notes/ddp.html,
https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from memsweep.conf.contract import RunSpec

from .environment import ResolvedDevice
from .lifecycle import die_with_parent
from .measure import Recorder, measure, run_shape
from .ranks import RANKS_DIR
from .workloads import Workload, make_optimizer

COLLECTIVE_TIMEOUT_S = 300.0
"""Upper bound (seconds) of any collective, barriers included, when the spec's ``timeout_s`` is
larger: a rank waiting for a dead peer fails instead of hanging (the launcher normally stops it
first, within a second of the peer's death)."""


def rank_record_path(run_dir: Path, rank: int) -> Path:
    """The record of ``rank`` in ``run_dir`` (``ranks/rank_N.json``)."""
    return Path(run_dir) / RANKS_DIR / f"rank_{rank}.json"


def local(t: torch.Tensor) -> torch.Tensor:
    """The rank's own part of ``t``: a DTensor's local shard (FSDP2), else ``t`` itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def local_bytes(tensors) -> int:
    """Bytes of the distinct storages behind the local parts of ``tensors`` (a view once)."""
    seen, total = set(), 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        storage = local(t).untyped_storage()
        key = (storage.device, storage.data_ptr(), storage.nbytes())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


class RankHooks:
    """What ``worker.measure.measure`` does differently in a rank (see the module docstring).

    Args:
        rank: this rank (0-based).
        spec: the run's spec (``parallel`` ddp or fsdp, ``world_size``).
        init_method: the process group's rendezvous: ``file://<run dir>/ranks/rendezvous``, or
            ``env://`` (MASTER_ADDR... set from SLURM's environment).
        local_rank: the rank among those of its machine (None: ``rank``, all ranks are local).
    """

    def __init__(self, rank: int, spec: RunSpec, init_method: str, local_rank: int | None = None):
        self.rank, self.spec, self.init_method = rank, spec, init_method
        self.local_rank = rank if local_rank is None else local_rank
        self.device: torch.device | None = None

    def resolve(self) -> ResolvedDevice:
        """The rank's device and why it is unavailable (None when it is).

        Returns:
            (``cpu``, None) on the CPU; (``cuda:<rank>``, None) when that many GPUs are visible,
            else a reason.
        """
        if self.spec.device == "cpu":
            self.device = torch.device("cpu")
            if not self.spec.threads and not os.environ.get("MEMSWEEP_CPU_CORES"):
                # the ranks share the cores the run may use instead of each taking all of them
                cores = len(os.sched_getaffinity(0))
                torch.set_num_threads(max(1, cores // self.spec.world_size))
            return ResolvedDevice(self.device, None)
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        bound = self.spec.tasks_per_node is not None and n == 1  # a SLURM task bound to its own GPU
        index = 0 if bound else self.local_rank
        if n < self.spec.ranks_per_node and not bound:
            return ResolvedDevice(
                torch.device("cuda", index),
                f"{self.spec.ranks_per_node} rank(s) on this machine: one GPU per rank asked, {n} visible",
            )
        self.device = torch.device("cuda", index)
        torch.cuda.set_device(self.device)
        return ResolvedDevice(self.device, None)

    def start(self, counters: Any) -> None:
        """Join the run's process group (gloo on the CPU, nccl on CUDA), collectives bounded.

        (On the CPU, the live tensor tracker itself sees the storage resizes with which FSDP2
        frees and re-gathers parameters, and counts DTensors by their local shards:
        ``worker.counters.cpu.LiveTensorTracker``.)
        """
        timeout = datetime.timedelta(seconds=min(float(self.spec.timeout_s), COLLECTIVE_TIMEOUT_S))
        kwargs: dict[str, Any] = {}
        if self.device is not None and self.device.type == "cuda":
            kwargs["device_id"] = self.device
        dist.init_process_group(
            "nccl" if self.device is not None and self.device.type == "cuda" else "gloo",
            init_method=self.init_method,
            rank=self.rank,
            world_size=self.spec.world_size,
            timeout=timeout,
            **kwargs,
        )

    def barrier(self) -> None:
        """Wait until every rank is here (bounded by the process group's timeout)."""
        if self.device is not None and self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def prepare(self, w: Workload) -> None:
        """Make ``w``'s model_load wrap the model, and its sizes read the rank's local parts.

        The instance's ``model_load``, ``model_info``, ``gradient_bytes`` and
        ``optimizer_state_bytes`` are replaced (the phase plan reads them from the instance).
        """
        build = w.model_load
        spec = self.spec

        def model_load() -> None:
            build()  # the whole model on this rank's device, as without parallelism
            model = w.model
            assert model is not None
            if spec.parallel == "ddp":
                ids = [self.device.index] if self.device is not None and self.device.type == "cuda" else None
                w.model = nn.parallel.DistributedDataParallel(model, device_ids=ids)
                return
            from torch.distributed.fsdp import fully_shard

            for block in model.blocks:  # type: ignore[union-attr]  # PARALLEL_WORKLOADS have blocks
                fully_shard(block, reshard_after_forward=spec.reshard_after_forward)
            fully_shard(model, reshard_after_forward=spec.reshard_after_forward)
            w.optimizer = None  # it held the full parameters, now replaced by their shards
            gc.collect()  # an optimizer sits in reference cycles (its step hooks): free them now
            w.optimizer = make_optimizer(spec.optimizer, [p for p in model.parameters() if p.requires_grad])

        def model_info() -> dict:
            assert w.model is not None
            params = list(w.model.parameters())
            return {
                "parameters": sum(p.numel() for p in params),
                "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
                "parameter_bytes": sum(p.numel() * p.element_size() for p in params),
                "local_parameter_bytes": local_bytes(params),
                "buffer_bytes": local_bytes(w.model.buffers()),
                "param_dtype": str(w.param_dtype).replace("torch.", ""),
                "compute_dtype": str(w.compute_dtype).replace("torch.", ""),
            }

        def gradient_bytes() -> dict:
            assert w.model is not None
            return {"gradient_bytes": local_bytes(p.grad for p in w.model.parameters() if p.grad is not None)}

        def optimizer_state_bytes() -> dict:
            assert w.optimizer is not None and self.device is not None
            tensors = [
                local(v)
                for state in w.optimizer.state.values()
                for v in state.values()
                if isinstance(v, torch.Tensor) and local(v).device.type == self.device.type
            ]
            return {"optimizer_state_bytes": local_bytes(tensors)}

        w.model_load = model_load  # type: ignore[method-assign]
        w.model_info = model_info  # type: ignore[method-assign]
        w.gradient_bytes = gradient_bytes  # type: ignore[method-assign]
        w.optimizer_state_bytes = optimizer_state_bytes  # type: ignore[method-assign]

    def close(self) -> None:
        """Leave the process group (after a run every rank finished)."""
        if dist.is_initialized():
            dist.destroy_process_group()


def rank_main(
    rank: int, spec_data: dict, run_dir: str, launcher: int, init_method: str, local_rank: int | None = None
) -> None:
    """Body of rank ``rank``'s process (``torch.multiprocessing.start_processes``' target).

    Its output goes to ``ranks/rank_N.log``; its record to ``ranks/rank_N.json``. A spec
    ``fault`` with a ``rank`` reaches that rank only. Never returns: the process exits with the
    rank's ``measure`` exit code (``conf.contract.EXIT_*``).

    Args:
        rank: this rank (0-based), given first by ``start_processes``.
        spec_data: the run's spec (``RunSpec.to_dict``).
        run_dir: the run directory.
        launcher: the launching worker's pid: the rank dies with it.
        init_method: the process group's rendezvous (``RankHooks``).
        local_rank: the rank among its machine's (None: ``rank``).
    """
    die_with_parent(launcher)
    path = rank_record_path(Path(run_dir), rank)
    log = os.open(path.with_suffix(".log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd in (1, 2):
        os.dup2(log, fd)
    os.close(log)
    spec = RunSpec.from_dict(spec_data)
    if spec.fault is not None and spec.fault.get("rank", rank) != rank:
        spec = dataclasses.replace(spec, fault=None)
    rec = Recorder(path, spec_data)
    rec.data.update(run_shape(spec))
    rec.save()
    hooks = RankHooks(rank, spec, init_method, local_rank)
    code = measure(spec, rec, rank=hooks)
    if code == 0:
        hooks.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
