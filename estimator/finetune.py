"""The estimate of an ``hf`` run's fine-tuning options: LoRA adapters and a 4-bit base.

The workload's ``lora_rank``, ``lora_alpha``, ``lora_dropout``, ``lora_targets`` and
``quantization``, as the worker applies them (``worker/workloads/lora.py``,
``worker/workloads/pretrained.py``), described to the estimator: the base in the run's
``dtype`` (float32 under ``precision=autocast``), or with ``quantization`` (nf4/fp4) in
bitsandbytes' 4-bit format with transformers' ``BitsAndBytesConfig`` defaults (blocks of 64
values, an fp32 absmax per block, no double quantization), the other tensors in ``dtype`` and
in train mode upcast to fp32 by peft's ``prepare_model_for_kbit_training``; with
``lora_rank``, ``lora.estimate_lora`` (fp32 adapters: peft's ``autocast_adapter_dtype``).
"""

from __future__ import annotations

from collections.abc import Mapping

from memsweep.conf.contract.spec import resolve_precision

from .activations import ActivationSettings
from .breakdown import Breakdown
from .formats import DTYPE_BYTES, DTYPE_FORMATS, StorageFormat, storage_format
from .lora import ALL_LINEAR, LoraSettings, estimate_lora
from .training import counts_step_tensors
from .transformer import TransformerConfig

PEFT_ADAPTER_BYTES = 4
"""Bytes of an adapter value as the worker's peft keeps it: float32, on a 16-bit base too
(``get_peft_model(autocast_adapter_dtype=True)``, peft ``tuners_utils.cast_adapter_dtype``)."""


def lora_settings(workload: Mapping) -> LoraSettings | None:
    """The adapters of an hf workload as the worker gives them to peft (``lora_config``).

    Args:
        workload: the spec's ``workload`` mapping (``lora_rank``: null = no LoRA,
            ``lora_alpha``: null = peft's default, ``lora_dropout``, ``lora_targets``: null =
            peft's default for the architecture, ``all-linear`` or a list of module names).

    Returns:
        a ``LoraSettings`` with fp32 adapters (``PEFT_ADAPTER_BYTES``), or ``None`` without
        ``lora_rank``.

    Raises:
        ValueError: a rank or dropout ``LoraSettings`` rejects.
    """
    rank = workload.get("lora_rank")
    if rank is None:
        return None
    targets = workload.get("lora_targets")
    if targets is not None:
        targets = (ALL_LINEAR,) if targets == ALL_LINEAR else tuple(targets)
    return LoraSettings(
        rank=rank,
        alpha=workload.get("lora_alpha"),
        targets=targets,
        dropout=float(workload.get("lora_dropout") or 0.0),
        adapter_bytes=PEFT_ADAPTER_BYTES,
    )


def base_formats(data: Mapping) -> tuple[StorageFormat, StorageFormat]:
    """How a run stores its model's weights: (the decoder Linear weights, the other tensors).

    Args:
        data: the spec's fields (``RunSpec.to_dict``): ``dtype``, ``precision``, ``mode``,
            ``workload`` (``quantization``, ``lora_rank``).

    Returns:
        two ``StorageFormat``: both the stored dtype's (fp32 under autocast) without
        ``quantization``; else the 4-bit format (bitsandbytes' defaults, no double
        quantization) and ``dtype``'s format, fp32 with LoRA (``prepare_model_for_kbit_training``).

    Raises:
        KeyError: a dtype outside ``DTYPE_FORMATS``.
        ValueError: an unknown quantization.
    """
    dtype = data.get("dtype", "float32")
    workload = data.get("workload") or {}
    precision = resolve_precision(data.get("precision", "auto"), data.get("mode", "inference"), dtype, workload)
    stored = storage_format("fp32" if precision == "autocast" else DTYPE_FORMATS[dtype])
    quantization = workload.get("quantization")
    if quantization is None:
        return stored, stored
    lora = workload.get("lora_rank") is not None and data.get("mode") == "train"
    return storage_format(quantization), storage_format("fp32") if lora else stored


def estimate_lora_run(model: TransformerConfig, data: Mapping, activations: ActivationSettings) -> Breakdown:
    """A LoRA / QLoRA training run of ``model`` (``lora.estimate_lora`` with the run's settings).

    Args:
        model: the run's model (``counted.model_from_count`` or ``hf_config.parse_hf_config``).
        data: the spec's fields (``RunSpec.to_dict``), its workload with ``lora_rank``.
        activations: the base's training activations (``activations.run_activations``).

    Returns:
        a Breakdown (bytes): weights (the frozen base, ``base_formats``, plus the adapters),
        gradients and optimizer states of the adapters only (AdamW's 4-byte step per adapter
        tensor on the CPU, as ``training.training_state``), activations, and the 4-bit
        dequantization temporaries.

    Raises:
        KeyError: a dtype outside ``DTYPE_FORMATS``.
        ValueError: no ``lora_rank``; targets that name no Linear module or an architecture
            without a peft default (``lora.lora_targets``); an unknown optimizer.
    """
    lora = lora_settings(data.get("workload") or {})
    if lora is None:
        raise ValueError("a LoRA estimate needs workload.lora_rank")
    base, keep = base_formats(data)
    optimizer = data.get("optimizer", "adamw")
    return estimate_lora(
        model,
        lora,
        base_format=base,
        keep_format=keep,
        compute_bytes=DTYPE_BYTES[data.get("dtype", "float32")],
        optimizer=optimizer,
        activations=activations,
        step_tensors=counts_step_tensors(optimizer, str(data.get("device", "cpu"))),
    )
