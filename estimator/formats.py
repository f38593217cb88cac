"""Weights by storage format: dtype sizes, block-scaled formats (int8, NF4/FP4, int4), kept modules.

Sources: PyTorch element sizes; bitsandbytes docs; Dettmers et al. 2022 (LLM.int8());
Dettmers et al. 2023 (QLoRA, double quantization).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from .breakdown import ceil_div, check_int

if TYPE_CHECKING:
    from .transformer import ParamTensor

DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float16": 2,
    "fp16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float8": 1,
    "fp8": 1,
    "int8": 1,
}
"""Bytes of one value of a dense floating or integer dtype, by name (aliases included):
PyTorch element sizes (``torch.Tensor.element_size()``, ``torch.dtype.itemsize``)."""

DTYPE_FORMATS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
"""memsweep's floating dtypes (a RunSpec's ``dtype``) -> the storage format of weights held in them."""


def dtype_bytes(dtype: str | int) -> int:
    """Bytes per value of ``dtype`` (``"float32"``, ``"bf16"``, ... or an int taken as bytes).

    Args:
        dtype: a name of ``DTYPE_BYTES`` (case-insensitive), or a byte count (int >= 1).

    Returns:
        bytes per value (int), from ``DTYPE_BYTES`` (PyTorch element sizes).

    Raises:
        ValueError: unknown dtype name, or an int below 1.
    """
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return check_int("bytes per value", dtype, 1)
    try:
        return DTYPE_BYTES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}: expected one of {', '.join(DTYPE_BYTES)}") from None


@dataclasses.dataclass(frozen=True)
class StorageFormat:
    """How one tensor's values are stored.

    Attributes:
        name: format name (``fp32``, ``bf16``, ``int8``, ``nf4``, ...).
        bits: bits per stored value (packed: two 4-bit values per byte).
        block_size: values sharing one scale; ``None`` for formats without scales.
        scale_bytes: bytes of one block scale (fp32 absmax: 4).
        double_quant: QLoRA's double quantization: the block scales are themselves stored
            in 8 bits, with one fp32 scale per ``DOUBLE_QUANT_BLOCK`` of them.
    """

    name: str
    bits: int
    block_size: int | None = None
    scale_bytes: int = 0
    double_quant: bool = False

    def tensor_bytes(self, n: int, row: int | None = None) -> int:
        """Bytes to store one tensor of ``n`` values in this format.

        Args:
            n: number of values in the tensor.
            row: for ``int8`` (LLM.int8(), one scale per output row), the row length
                (in_features), used as the block size when known; ignored by other formats.

        Returns:
            bytes (int): packed values plus block scales.

        Raises:
            ValueError: ``n`` is not an integer >= 0.

        Formula: ``ceil(n * bits / 8)`` packed values, plus ``ceil(n / block) * scale_bytes``
        block scales; with double quantization, ``ceil(n / block)`` one-byte scales plus
        ``ceil(ceil(n / block) / 256) * 4`` second-level fp32 scales (Dettmers et al. 2023,
        QLoRA, Sec. 3: 32/64 = 0.5 bits/param of scales become 8/64 + 32/(64*256) = 0.127).
        Per-tensor constants (the 16-entry NF4 code book, the nested offset: under 100 bytes
        a tensor) are not counted.
        """
        check_int("number of values", n)
        values = ceil_div(n * self.bits, 8)
        block = row if (row and self.name == "int8") else self.block_size
        if not block or n == 0:
            return values
        blocks = ceil_div(n, block)
        if self.double_quant:
            return values + blocks + ceil_div(blocks, DOUBLE_QUANT_BLOCK) * 4
        return values + blocks * self.scale_bytes


DOUBLE_QUANT_BLOCK = 256
"""QLoRA double quantization: fp32 second-level scale per 256 8-bit first-level scales."""

FORMATS = {
    "fp32": StorageFormat("fp32", 32),
    "float32": StorageFormat("fp32", 32),
    "fp16": StorageFormat("fp16", 16),
    "float16": StorageFormat("fp16", 16),
    "bf16": StorageFormat("bf16", 16),
    "bfloat16": StorageFormat("bf16", 16),
    # bitsandbytes LLM.int8() (Dettmers et al. 2022): int8 values, one fp32 absmax per row
    # (``SCB``); with only a parameter count the row length is the block_size (default 4096).
    "int8": StorageFormat("int8", 8, block_size=4096, scale_bytes=4),
    # bitsandbytes 4-bit (Linear4bit, QLoRA): blocks of 64 values, fp32 absmax per block.
    "nf4": StorageFormat("nf4", 4, block_size=64, scale_bytes=4),
    "fp4": StorageFormat("fp4", 4, block_size=64, scale_bytes=4),
    # A generic 4-bit integer format with fp16 group scales (e.g. GPTQ/AWQ group size 128);
    # their zero points (4 bits per group) are not counted.
    "int4": StorageFormat("int4", 4, block_size=128, scale_bytes=2),
}
"""Storage formats by name (aliases included). Defaults follow bitsandbytes' own defaults."""


def storage_format(
    name: str, block_size: int | None = None, double_quant: bool = False, scale_bytes: int | None = None
) -> StorageFormat:
    """The named format, with its block size / double quantization / scale size overridden.

    Args:
        name: a key of ``FORMATS`` (case-insensitive): fp32, fp16, bf16, int8, nf4, fp4,
            int4 or an alias.
        block_size: values sharing one scale; default the format's (bitsandbytes' defaults:
            nf4/fp4 64, int8 4096; int4 128).
        double_quant: QLoRA double quantization of the block scales (Dettmers et al. 2023).
        scale_bytes: bytes of one block scale; default the format's.

    Returns:
        a StorageFormat.

    Raises:
        ValueError: unknown name, a block size or double quantization on a format without
            scales, or a non-positive block size.
    """
    try:
        fmt = FORMATS[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown storage format {name!r}: expected one of "
            f"{', '.join(sorted(set(f.name for f in FORMATS.values())))}"
        ) from None
    if (block_size is not None or double_quant) and fmt.block_size is None:
        raise ValueError(f"format {fmt.name} has no block scales: block_size/double_quant do not apply")
    if block_size is not None:
        check_int("block_size", block_size, 1)
    return dataclasses.replace(
        fmt,
        block_size=block_size or fmt.block_size,
        double_quant=double_quant,
        scale_bytes=fmt.scale_bytes if scale_bytes is None else scale_bytes,
    )


def compact_format(bits: int) -> StorageFormat:
    """``bits`` per parameter, packed, no scales: the theoretical uniform storage of ``bits`` bits.

    Args:
        bits: bits per stored value (>= 1); values are packed, ``ceil(n * bits / 8)`` bytes.

    Returns:
        a StorageFormat named ``"<bits>-bit"`` without block scales.

    Raises:
        ValueError: ``bits`` is not an integer >= 1.
    """
    check_int("bits", bits, 1)
    return StorageFormat(f"{bits}-bit", bits)


def weight_bytes(parameters: int, fmt: StorageFormat | str, kept: Mapping[str, int] | None = None) -> int:
    """Bytes of ``parameters`` dense parameters stored in ``fmt``, some kept in other formats.

    Args:
        parameters: total number of parameters (all of them, kept ones included).
        fmt: storage format of the parameters that are not kept (a ``StorageFormat`` or name).
        kept: ``{format name: parameter count}`` stored in another precision (quantized
            loads keep e.g. the embeddings, ``lm_head`` and norms in 16 bits: bitsandbytes /
            Hugging Face ``llm_int8_skip_modules``).

    Returns:
        bytes (int). The quantized remainder is treated as one tensor (block scales over
        the whole count); with shapes, use ``weights_from_shapes`` for the per-tensor count.
        For example 7e9 parameters at 16 bits: 14_000_000_000 B; at 4 bits with 64-value
        blocks of fp32 scales: 3.5e9 + 7e9/64*4 = 3_937_500_000 B.

    Raises:
        ValueError: negative counts, or more kept than ``parameters``.
    """
    check_int("parameters", parameters)
    fmt = storage_format(fmt) if isinstance(fmt, str) else fmt
    kept = dict(kept or {})
    kept_total = sum(check_int(f"kept[{k}]", v) for k, v in kept.items())
    if kept_total > parameters:
        raise ValueError(f"{kept_total} parameters kept in other formats, more than the {parameters} in total")
    out = fmt.tensor_bytes(parameters - kept_total)
    for name, count in kept.items():
        out += storage_format(name).tensor_bytes(count)
    return out


def weights_from_shapes(
    tensors: Iterable[ParamTensor], fmt: StorageFormat | str, keep_format: StorageFormat | str = "bf16"
) -> int:
    """Bytes of a model's tensors: quantizable tensors in ``fmt``, the others in ``keep_format``.

    A tensor is quantized when ``fmt`` has block scales (a quantized load) only if it is a
    Linear weight inside the decoder layers (``ParamTensor.quantizable``); embeddings,
    ``lm_head``, norms and biases stay in ``keep_format`` (bitsandbytes replaces nn.Linear
    modules only and skips ``lm_head``; Hugging Face docs, "bitsandbytes"). Without block
    scales (fp32/fp16/bf16/compact bits) every tensor is stored in ``fmt``.

    Args:
        tensors: the model's parameter tensors (``TransformerConfig.tensors()``); a 2-D
            tensor's last dimension is its row length (int8's per-row scale).
        fmt: storage format of the quantizable tensors (a ``StorageFormat`` or a name).
        keep_format: storage format of the others when ``fmt`` has block scales.

    Returns:
        bytes (int), the sum of ``StorageFormat.tensor_bytes`` per tensor.

    Raises:
        ValueError: an unknown format name.
    """
    fmt = storage_format(fmt) if isinstance(fmt, str) else fmt
    keep = storage_format(keep_format) if isinstance(keep_format, str) else keep_format
    total = 0
    for t in tensors:
        if fmt.block_size is None or t.quantizable:
            total += fmt.tensor_bytes(t.numel, row=t.shape[-1] if len(t.shape) == 2 else None)
        else:
            total += keep.tensor_bytes(t.numel)
    return total
