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


def check_parallel(spec: Any) -> None:
    """``parallel``, ``world_size``, ``reshard_after_forward`` of a ``RunSpec`` (see its docstring).

    Args:
        spec: the ``RunSpec`` being built.

    Raises:
        SpecError: an unknown parallel, a world_size out of range or above 1 without ddp or
            fsdp, or ddp/fsdp with another mode, a dry run, devices > 1 or another workload.
    """
    choice("parallel", spec.parallel, PARALLELS)
    n = spec.world_size
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_WORLD_SIZE:
        raise SpecError("world_size", n, f"an integer from 1 to {MAX_WORLD_SIZE}")
    if not isinstance(spec.reshard_after_forward, bool):
        raise SpecError("reshard_after_forward", spec.reshard_after_forward, "true or false")
    if spec.fault is not None and "rank" in spec.fault:
        int_in_range("fault.rank", spec.fault["rank"], 0, n - 1)
    check_nodes(spec)
    if spec.parallel == "none":
        if n != 1:
            raise SpecError("world_size", n, "1 with parallel=none (several ranks need parallel=ddp or fsdp)")
        return
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
        SpecError: nodes or tasks_per_node not an integer >= 1, several nodes without
            tasks_per_node, or nodes * tasks_per_node other than world_size.
    """
    positive_int("nodes", spec.nodes, MAX_WORLD_SIZE)
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
