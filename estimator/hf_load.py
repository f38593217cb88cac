"""The estimator's figures for a memsweep ``hf`` load: weights, gradients, optimizer states.

What ``memsweep predict`` prints beside a dry run's split (calculated, never measured): the
model described by its Hugging Face config (``parse_hf_config``), stored as the run stores it.
Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping

from memsweep.conf.contract import RunSpec

from .activations import run_activations
from .breakdown import Breakdown
from .finetune import base_formats, estimate_lora_run, lora_settings
from .formats import DTYPE_BYTES, DTYPE_FORMATS
from .hf_config import parse_hf_config
from .training import counts_step_tensors
from .transformer import TransformerConfig, estimate_transformer


def estimate_hf_load(config: Mapping | TransformerConfig, spec: RunSpec, *, batch: int | None = None) -> Breakdown:
    """Weights, and in train mode gradients and optimizer states, of an hf load (bytes).

    As memsweep's worker stores them: under ``precision="pure"`` the weights, gradients and
    optimizer states are in ``dtype`` (``torch.optim.AdamW`` allocates its states with
    ``zeros_like(param)``); under ``"autocast"`` the weights (and so the gradients and states)
    are float32 and the compute is in ``dtype``. No fp32 master copy is kept in either (the
    weights are the master). AdamW's per-tensor ``step`` (4 B, float32) is counted on the CPU,
    where it is device memory, and not on CUDA, where the default AdamW keeps it on the host
    (torch/optim/adamw.py ``_init_group``).

    With ``batch`` in train mode, also the activations of Korthikanti et al. 2022
    (``estimate_transformer`` with ``batch`` and ``seq_len`` = the spec's ``context``; full
    recomputation under ``checkpointing``; fused attention when the workload's ``attention`` is
    ``sdpa``; no dropout: Hugging Face decoders train with ``attention_dropout`` 0 by default).
    The KV cache and temporaries are not asked for (``None``): the dry run predicts them.

    A LoRA load (``workload.lora_rank``, train mode) is ``finetune.estimate_lora_run``: the frozen
    base in its storage, the fp32 adapters, and the gradients and optimizer states of the
    adapters only (the full fine-tuning figures would overstate them by the base's). A 4-bit
    ``workload.quantization`` stores the decoder Linear weights as ``finetune.base_formats``.

    Args:
        config: a Hugging Face config as a mapping (config.json, or ``to_dict()`` of a config),
            or one ``parse_hf_config`` already read.
        spec: the load: its ``mode`` (``train`` adds gradients and optimizer states), ``dtype``,
            ``precision`` (``pure`` or ``autocast``), ``optimizer``, ``device``, ``context``,
            ``checkpointing`` and ``workload``'s ``attention``.
        batch: sequences per step for the activations (None: no activations).

    Returns:
        A Breakdown with ``weights`` (and ``gradients``, ``optimizer_states`` in train mode;
        ``activations`` with ``batch`` in train mode; a 4-bit LoRA base's ``temporaries``).

    Raises:
        ValueError: a config ``parse_hf_config`` cannot read, an unknown dtype or optimizer,
            LoRA targets the model does not have (``lora.lora_targets``).
    """
    if spec.dtype not in DTYPE_FORMATS:
        raise ValueError(f"dtype {spec.dtype!r}: one of {', '.join(DTYPE_FORMATS)}")
    model = config if isinstance(config, TransformerConfig) else parse_hf_config(config)
    train = spec.mode == "train"
    settings = run_activations(batch, spec.context, spec.checkpointing, spec.workload.get("attention"))
    if train and lora_settings(spec.workload) is not None:
        return estimate_lora_run(model, spec.to_dict(), settings)
    return estimate_transformer(
        model,
        weight_format=base_formats(spec.to_dict())[0],
        compute_bytes=DTYPE_BYTES[spec.dtype],
        train=train,
        optimizer=spec.optimizer,
        mixed_precision=False,
        step_tensors=train and counts_step_tensors(spec.optimizer, spec.device),
        activations=settings,
    )


def estimate_hf_batch_edge(config: Mapping, spec: RunSpec, capacity_bytes: int, *, upper: int = 2**20) -> int | None:
    """The estimator's largest training batch whose estimate fits ``capacity_bytes``.

    The estimate is ``estimate_hf_load``'s weights, gradients, optimizer states and activations
    (with ``batch``), which grow with the batch; found by bisection.

    Args:
        config: a Hugging Face config as a mapping.
        spec: the load, in train mode (its ``batch`` is the one searched, not read).
        capacity_bytes: the capacity (bytes).
        upper: the largest batch tried.

    Returns:
        The batch (int >= 1), or None when batch 1 does not fit.

    Raises:
        ValueError: as ``estimate_hf_load``; a spec not in train mode.
    """
    if spec.mode != "train":
        raise ValueError(f"mode {spec.mode!r}: a training batch edge wants mode train")
    model = parse_hf_config(config)

    def total(batch: int) -> int:
        return estimate_hf_load(model, spec, batch=batch).peak

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
