"""A real checkpoint from a local directory (hf workload ``pretrained``): ``from_pretrained`` with
the loading options people use, never a download.

``AutoModelForCausalLM.from_pretrained(dir, dtype=..., low_cpu_mem_usage=True,
device_map=<the run's device>, local_files_only=True, use_safetensors=True,
attn_implementation=...)`` and, for a 4-bit base, ``quantization_config=BitsAndBytesConfig(
load_in_4bit=True, bnb_4bit_quant_type=nf4|fp4, bnb_4bit_compute_dtype=<dtype>)``. So the
``model_load`` phase measures the transient peak of real loading (safetensors read, weights placed
on the device, quantized as they arrive), not that of random initialisation.

Sources: https://huggingface.co/docs/transformers/main_classes/model (``from_pretrained``:
``dtype``, ``low_cpu_mem_usage``, ``device_map``, ``local_files_only``, ``use_safetensors``),
https://huggingface.co/docs/transformers/main_classes/quantization (``BitsAndBytesConfig``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..counters.cpu import adopt_storages
from .errors import DependencyMissing

SAFETENSORS_SUFFIX = ".safetensors"


def checkpoint_files(directory: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint directory (sorted), what ``from_pretrained`` reads.

    Args:
        directory: a directory written by ``save_pretrained``.

    Returns:
        Its ``*.safetensors`` files (an empty list when there are none).
    """
    return sorted(Path(directory).glob("*" + SAFETENSORS_SUFFIX))


def quantization_config(tf: Any, quantization: str, compute_dtype: torch.dtype) -> Any:
    """transformers' ``BitsAndBytesConfig`` of a 4-bit base (QLoRA's), or raise what is missing.

    Args:
        tf: the transformers module.
        quantization: ``nf4`` or ``fp4`` (bnb_4bit_quant_type).
        compute_dtype: the dtype the 4-bit layers compute in (the spec's dtype).

    Raises:
        DependencyMissing: bitsandbytes is not installed.
    """
    try:
        import bitsandbytes  # noqa: F401  - optional: imported only for workload.quantization
    except ImportError as exc:
        raise DependencyMissing(
            f"workload.quantization needs bitsandbytes, which is not installed ({exc}): pip install 'memsweep[lora]'"
        ) from None
    return tf.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type=quantization, bnb_4bit_compute_dtype=compute_dtype
    )


def load_pretrained(
    tf: Any, workload: dict, config: Any, param_dtype: torch.dtype, compute_dtype: torch.dtype, device: torch.device
) -> nn.Module:
    """Load the checkpoint of ``workload["pretrained"]`` onto ``device``; nothing is downloaded.

    Args:
        tf: the transformers module.
        workload: the hf workload's validated settings (``pretrained``, ``attention``,
            ``quantization``).
        config: the checkpoint's config with ``workload.overrides`` applied (``AutoConfig.from_pretrained``).
        param_dtype: the dtype of the weights that are not quantized.
        compute_dtype: the compute dtype of 4-bit layers.
        device: the run's device (``device_map``).

    Returns:
        The loaded causal LM, in eval or train mode as ``from_pretrained`` leaves it.

    Raises:
        FileNotFoundError: the directory holds no safetensors file (checked by the sweeper too).
        DependencyMissing: a 4-bit base without bitsandbytes.
    """
    directory = Path(workload["pretrained"]).expanduser()
    if not checkpoint_files(directory):
        raise FileNotFoundError(f"workload.pretrained={str(directory)!r}: no *.safetensors file there")
    kwargs: dict[str, Any] = {
        "dtype": param_dtype,
        "low_cpu_mem_usage": True,
        "device_map": str(device),
        "local_files_only": True,
        "use_safetensors": True,
        "attn_implementation": workload["attention"],
        "config": config,
    }
    if workload["quantization"] is not None:
        kwargs["quantization_config"] = quantization_config(tf, workload["quantization"], compute_dtype)
    model = tf.AutoModelForCausalLM.from_pretrained(str(directory), **kwargs)
    # On the CPU the weights read from safetensors are file pages mapped as tensors by no operator:
    # the live-tensor tracker counts them here, at the end of loading (worker.counters.cpu).
    adopt_storages([*model.parameters(), *model.buffers()], f"from_pretrained({str(directory)!r})")
    return model


def is_quantized(model: nn.Module) -> bool:
    """True when transformers loaded ``model`` quantized (``model.is_quantized``; a PeftModel
    forwards the attribute to its base): ``Module.to(dtype)`` is refused on such a model."""
    return bool(getattr(model, "is_quantized", False))


def checkpoint_info(workload: dict) -> dict:
    """What the record says of the checkpoint: its directory, files and their bytes.

    Args:
        workload: the hf workload's validated settings.

    Returns:
        ``path`` (absolute), ``files`` (safetensors file names), ``file_bytes`` (their total size
        on disk, bytes), ``quantization`` (null, nf4 or fp4).
    """
    directory = Path(workload["pretrained"]).expanduser().resolve()
    files = checkpoint_files(directory)
    return {
        "path": str(directory),
        "files": [f.name for f in files],
        "file_bytes": sum(f.stat().st_size for f in files),
        "quantization": workload["quantization"],
    }
