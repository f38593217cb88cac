"""A DDP or FSDP run's model states per rank, as the estimator calculates them (ZeRO stages).

A run of ``parallel=ddp`` keeps a whole replica of the parameters, gradients and optimizer
states on every rank: ZeRO stage 0. ``parallel=fsdp`` (FSDP2 ``fully_shard``, full sharding)
partitions all three over the ranks: ZeRO stage 3 (``P_os+g+p``), whatever its
``reshard_after_forward`` (that choice only decides whether the gathered parameters are freed
between forward and backward; between steps every rank holds its shards). Source: Rajbhandari
et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", Sec. 5;
https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping

from .breakdown import Breakdown
from .training import zero_partition

PARALLEL_ZERO_STAGE = {"ddp": 0, "fsdp": 3}
"""The ZeRO stage whose per-device model states each ``parallel`` choice matches."""

MODEL_STATE_COMPONENTS = ("weights", "gradients", "optimizer_states")
"""The estimate's components that make up the model states (ZeRO's term: parameters, gradients,
optimizer states; Rajbhandari et al. 2020, Sec. 3.1)."""


def estimated_model_states(estimate: Mapping | None, parallel: str | None, world_size: int | None) -> int | None:
    """Per-rank model states of a DDP/FSDP run, calculated: the spec's estimate partitioned.

    The spec's ``estimate`` (``analysis.estimate.estimate_run``) describes one whole replica in
    the run's dtype and optimizer; ``zero_partition`` at ``PARALLEL_ZERO_STAGE[parallel]`` over
    ``world_size`` ranks gives each rank's share (``ceil(x / world_size)`` per partitioned
    component). What the formula does not model, and a rank does hold: FSDP2 pads each
    parameter's first dimension to a multiple of ``world_size`` before sharding it, and an
    optimizer's per-tensor scalars (Adam's ``step``, counted in ``optimizer_states`` on the CPU,
    ``ADAM_STEP_BYTES`` each) stay whole on every rank.

    Args:
        estimate: the spec's ``estimate`` (``Breakdown.to_dict``: bytes by component), or None.
        parallel: the spec's ``parallel`` (``ddp``, ``fsdp``; anything else has no figure).
        world_size: the run's rank count (>= 1).

    Returns:
        bytes (int): weights + gradients + optimizer states per rank; None when the run is not
        a DDP/FSDP run, or the estimate lacks one of the three (or is corrupt).
    """
    stage = PARALLEL_ZERO_STAGE.get(str(parallel))
    if stage is None or not isinstance(estimate, Mapping):
        return None
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        return None
    try:
        whole = Breakdown(**{name: estimate.get(name) for name in MODEL_STATE_COMPONENTS})
    except (TypeError, ValueError):  # a corrupt spec: no figure, never an exception
        return None
    if any(getattr(whole, name) is None for name in MODEL_STATE_COMPONENTS):
        return None
    return zero_partition(whole, stage, world_size).peak
