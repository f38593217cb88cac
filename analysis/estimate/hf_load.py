"""The estimator's figures for a memsweep ``hf`` load: weights, gradients, optimizer states.

What ``memsweep predict`` prints beside a dry run's split (calculated, never measured): the
model described by its Hugging Face config (``parse_hf_config``), stored as the run stores it.
Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping

from .breakdown import Breakdown
from .formats import DTYPE_BYTES, DTYPE_FORMATS
from .hf_config import parse_hf_config
from .transformer import estimate_transformer


def estimate_hf_load(
    config: Mapping,
    *,
    mode: str,
    dtype: str,
    precision: str = "pure",
    optimizer: str = "adamw",
    device: str = "cpu",
) -> Breakdown:
    """Weights, and in train mode gradients and optimizer states, of an hf load (bytes).

    As memsweep's worker stores them: under ``precision="pure"`` the weights, gradients and
    optimizer states are in ``dtype`` (``torch.optim.AdamW`` allocates its states with
    ``zeros_like(param)``); under ``"autocast"`` the weights (and so the gradients and states)
    are float32 and the compute is in ``dtype``. No fp32 master copy is kept in either (the
    weights are the master). AdamW's per-tensor ``step`` (4 B, float32) is counted on the CPU,
    where it is device memory, and not on CUDA, where the default AdamW keeps it on the host
    (torch/optim/adamw.py ``_init_group``).

    Activations, the KV cache and temporaries are not asked for (``None``): the dry run
    predicts them.

    Args:
        config: a Hugging Face config as a mapping (config.json, or ``to_dict()`` of a config).
        mode: memsweep's mode (``train`` adds gradients and optimizer states).
        dtype: memsweep's ``dtype`` (float32, float16, bfloat16).
        precision: ``pure`` or ``autocast``.
        optimizer: memsweep's optimizer (adamw, sgd, adafactor, adamw8bit).
        device: the run's device (``cpu``, ``cuda``, ``cuda:N``).

    Returns:
        A Breakdown with ``weights`` (and ``gradients``, ``optimizer_states`` in train mode).

    Raises:
        ValueError: a config ``parse_hf_config`` cannot read, an unknown dtype or optimizer.
    """
    if dtype not in DTYPE_FORMATS:
        raise ValueError(f"dtype {dtype!r}: one of {', '.join(DTYPE_FORMATS)}")
    stored = "float32" if precision == "autocast" else dtype
    train = mode == "train"
    return estimate_transformer(
        parse_hf_config(config),
        weight_format=DTYPE_FORMATS[stored],
        compute_bytes=DTYPE_BYTES[dtype],
        train=train,
        optimizer=optimizer,
        mixed_precision=False,
        step_tensors=train and optimizer == "adamw" and not device.startswith("cuda"),
    )


def estimate_hf_batch_edge(
    config: Mapping,
    capacity_bytes: int,
    *,
    context: int,
    dtype: str,
    precision: str = "pure",
    optimizer: str = "adamw",
    device: str = "cpu",
    checkpointing: bool = False,
    fused_attention: bool = True,
    upper: int = 2**20,
) -> int | None:
    """The estimator's largest training batch whose estimate fits ``capacity_bytes``.

    The estimate is ``estimate_hf_load``'s weights, gradients and optimizer states plus the
    activations of Korthikanti et al. 2022 (``estimate_transformer`` with ``batch`` and
    ``seq_len``; full recomputation under ``checkpointing``, no dropout: Hugging Face decoders
    train with ``attention_dropout`` 0 by default), which grow with the batch.

    Args:
        config: a Hugging Face config as a mapping.
        capacity_bytes: the capacity (bytes).
        context: tokens per sequence.
        dtype, precision, optimizer, device: as ``estimate_hf_load``.
        checkpointing: activation checkpointing of every layer.
        fused_attention: attention without the score matrix (SDPA's fused kernels).
        upper: the largest batch tried.

    Returns:
        The batch (int >= 1), or None when batch 1 does not fit.

    Raises:
        ValueError: as ``estimate_hf_load``.
    """
    model = parse_hf_config(config)
    stored = "float32" if precision == "autocast" else dtype

    def total(batch: int) -> int:
        est = estimate_transformer(
            model,
            weight_format=DTYPE_FORMATS[stored],
            compute_bytes=DTYPE_BYTES[dtype],
            train=True,
            optimizer=optimizer,
            mixed_precision=False,
            step_tensors=optimizer == "adamw" and not device.startswith("cuda"),
            batch=batch,
            seq_len=context,
            recompute="full" if checkpointing else "none",
            fused_attention=fused_attention,
            dropout=False,
        )
        return est.peak

    if total(1) > capacity_bytes:
        return None
    low, high = 1, upper + 1  # total(low) fits; high is past the range or does not fit
    while high - low > 1:
        mid = (low + high) // 2
        if total(mid) <= capacity_bytes:
            low = mid
        else:
            high = mid
    return low
