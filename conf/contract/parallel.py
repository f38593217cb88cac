"""The checks of a run's ranks (``RunSpec`` fields ``parallel``, ``world_size``,
``reshard_after_forward``, ``nodes``, ``tasks_per_node``), apart from the spec itself.

Standard library only.
"""

from __future__ import annotations

from typing import Any

from .checks import choice, int_in_range, positive_int
from .errors import SpecError
from .vocabulary import PARALLEL_WORKLOADS, PARALLELS

MAX_WORLD_SIZE = 4096
"""Upper bound of ``RunSpec.world_size`` (rank processes of one run)."""


def ranks_are_tasks(spec: Any) -> bool:
    """Whether ``spec``'s ranks are the tasks of a SLURM job (each task runs one rank) rather than
    processes the worker forks: ``tasks_per_node`` set on a ddp/fsdp run, whatever its world_size.
    The one rule the sweeper (it refuses such a run outside a SLURM job, ``sweeper.inputs``) and
    the worker (it takes the rendezvous from SLURM's environment, ``worker.ranks``) both follow.

    Args:
        spec: a ``RunSpec``.

    Returns:
        True when the run's ranks are SLURM tasks.
    """
    return spec.tasks_per_node is not None and spec.parallel != "none"


def check_parallel(spec: Any) -> None:
    """``parallel``, ``world_size``, ``reshard_after_forward`` of a ``RunSpec`` (see its docstring).

    Args:
        spec: the ``RunSpec`` being built.

    Raises:
        SpecError: an unknown parallel, a world_size out of range or above 1 without ddp or
            fsdp, reshard_after_forward=false without fsdp, or ddp/fsdp with another mode, a dry
            run, devices > 1 or another workload.
    """
    choice("parallel", spec.parallel, PARALLELS)
    n = positive_int("world_size", spec.world_size, MAX_WORLD_SIZE)
    if not isinstance(spec.reshard_after_forward, bool):
        raise SpecError("reshard_after_forward", spec.reshard_after_forward, "true or false")
    if spec.fault is not None and "rank" in spec.fault:
        int_in_range("fault.rank", spec.fault["rank"], 0, n - 1)
    check_nodes(spec)
    if spec.parallel == "none":
        if n != 1:
            raise SpecError("world_size", n, "1 with parallel=none (several ranks need parallel=ddp or fsdp)")
        if spec.reshard_after_forward is not True:
            raise SpecError("reshard_after_forward", spec.reshard_after_forward, "true with parallel=none (fsdp only)")
        return
    if spec.parallel != "fsdp" and spec.reshard_after_forward is not True:
        raise SpecError(
            "reshard_after_forward",
            spec.reshard_after_forward,
            f"true with parallel={spec.parallel} (resharding is FSDP's choice: parallel=fsdp)",
        )
    if spec.mode != "train":
        raise SpecError("parallel", spec.parallel, f"none with mode={spec.mode} (ddp and fsdp train)")
    if spec.dry_run:
        raise SpecError("parallel", spec.parallel, "none with dry_run=true (a dry run predicts one process)")
    if spec.devices != 1:
        raise SpecError("devices", spec.devices, f"1 with parallel={spec.parallel} (one device per rank)")
    if spec.workload_name not in PARALLEL_WORKLOADS:
        raise SpecError(
            "parallel",
            spec.parallel,
            f"none for workload={spec.workload_name} (ddp, fsdp: workload " + " or ".join(PARALLEL_WORKLOADS) + ")",
        )
    if spec.device.startswith("cuda") and spec.device != "cuda:0":
        raise SpecError(
            "device",
            spec.device,
            f"cuda:0 with parallel={spec.parallel} (rank r runs on cuda:r; choose the GPUs with pool=gpus "
            "or CUDA_VISIBLE_DEVICES)",
        )


def check_nodes(spec: Any) -> None:
    """``nodes`` and ``tasks_per_node`` of a ``RunSpec`` (see its docstring).

    Args:
        spec: the ``RunSpec`` being built.

    Raises:
        SpecError: nodes or tasks_per_node not an integer >= 1, several nodes without ddp/fsdp
            and world_size > 1 (field ``nodes``) or without tasks_per_node, or
            nodes * tasks_per_node other than world_size.
    """
    positive_int("nodes", spec.nodes, MAX_WORLD_SIZE)
    if spec.nodes != 1 and (spec.parallel == "none" or spec.world_size == 1):
        raise SpecError(
            "nodes",
            spec.nodes,
            f"1 with parallel={spec.parallel} world_size={spec.world_size} (several nodes run the ranks of one "
            f"run: parallel=ddp or fsdp, world_size = nodes x tasks_per_node, e.g. nodes={spec.nodes} "
            f"tasks_per_node=1 world_size={spec.nodes})",
        )
    tasks = spec.tasks_per_node
    if tasks is None:
        if spec.nodes != 1:
            raise SpecError(
                "tasks_per_node",
                tasks,
                f"an integer >= 1 with nodes={spec.nodes} (nodes x tasks_per_node = world_size, one rank per task)",
            )
        return
    positive_int("tasks_per_node", tasks, MAX_WORLD_SIZE)
    if spec.nodes * tasks != spec.world_size:
        raise SpecError(
            "tasks_per_node",
            tasks,
            f"world_size / nodes = {spec.world_size}/{spec.nodes} (nodes x tasks_per_node must equal "
            f"world_size={spec.world_size})",
        )
