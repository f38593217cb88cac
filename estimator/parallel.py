"""A DDP or FSDP run's estimate per rank, and its model states, as the estimator calculates them (ZeRO stages).

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


def rank_estimate(estimate: Mapping | None, parallel: str | None, world_size: int | None) -> dict | None:
    """What one process of a run holds, as the estimator calculates it: the spec's estimate, per rank.

    The spec's ``estimate`` (``estimate.runs.estimate_run``) describes one whole replica in
    the run's dtype and optimizer, at the spec's ``batch``. For a one-process run that is the
    run. For a DDP/FSDP run, ``zero_partition`` at ``PARALLEL_ZERO_STAGE[parallel]`` over
    ``world_size`` ranks gives each rank's share of the weights, gradients and optimizer states
    (``ceil(x / world_size)`` per partitioned component: nothing under ddp, all three under
    fsdp); activations, the KV cache and temporaries stay as estimated, per rank, since
    ``batch`` is each rank's micro-batch. What the formula does not model, and a rank does hold:
    FSDP2 pads each parameter's first dimension to a multiple of ``world_size`` before sharding
    it, and an optimizer's per-tensor scalars (Adam's ``step``, counted in ``optimizer_states``
    on the CPU, ``ADAM_STEP_BYTES`` each) stay whole on every rank; DDP's gradient buckets and
    FSDP's gathered parameters are not counted either.

    Args:
        estimate: the spec's ``estimate`` (``Breakdown.to_dict``: bytes by component), or None.
        parallel: the spec's ``parallel`` (``none``, ``ddp``, ``fsdp``; None reads as ``none``).
        world_size: the run's rank count (>= 1).

    Returns:
        ``Breakdown.to_dict`` of one rank (bytes; ``peak`` and ``total`` recomputed): ``estimate``
        itself, as given, for a run that is not DDP/FSDP; None for a DDP/FSDP run without an
        estimate, with a corrupt one, or without a valid ``world_size`` (never the whole replica
        presented as a rank's).
    """
    stage = PARALLEL_ZERO_STAGE.get(str(parallel))
    if stage is None:
        return dict(estimate) if isinstance(estimate, Mapping) else None
    if not isinstance(estimate, Mapping):
        return None
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        return None
    try:
        whole = Breakdown.from_dict(estimate)
    except (TypeError, ValueError):  # a corrupt spec: no figure, never an exception
        return None
    return zero_partition(whole, stage, world_size).to_dict()


def estimated_model_states(estimate: Mapping | None, parallel: str | None, world_size: int | None) -> int | None:
    """Per-rank model states of a DDP/FSDP run, calculated: weights + gradients + optimizer
    states of ``rank_estimate`` (the spec's whole-replica estimate partitioned at the run's ZeRO
    stage over ``world_size``; what that formula leaves out is listed there).

    Args:
        estimate: the spec's ``estimate`` (``Breakdown.to_dict``: bytes by component), or None.
        parallel: the spec's ``parallel`` (``ddp``, ``fsdp``; anything else has no figure).
        world_size: the run's rank count (>= 1).

    Returns:
        bytes (int): weights + gradients + optimizer states per rank; None when the run is not
        a DDP/FSDP run, or the estimate lacks one of the three (or is corrupt).
    """
    if str(parallel) not in PARALLEL_ZERO_STAGE:
        return None
    rank = rank_estimate(estimate, parallel, world_size)
    if rank is None or any(rank.get(name) is None for name in MODEL_STATE_COMPONENTS):
        return None
    return sum(rank[name] for name in MODEL_STATE_COMPONENTS)
