"""The estimator: memory calculated from a description of the load, before anything runs.

Standard library only (no torch, no pandas): the sweeper imports it to put the estimate of
a run into its spec, and ``memsweep estimate`` runs it without PyTorch installed.

Every figure is an integer number of **bytes**. Conversion happens only when printing,
once, in separate columns: 1 GB = 10**9 B, 1 GiB = 2**30 B (NIST binary prefixes).

What this module calculates, and from which source:

* weights by storage format (fp32, fp16/bf16, int8, 4-bit NF4/FP4 with per-block scales,
  QLoRA double quantization, modules kept in another precision): bitsandbytes docs,
  Dettmers et al. 2022 (LLM.int8(); 8-bit optimizers via block-wise quantization),
  Dettmers et al. 2023 (QLoRA);
* training state: gradients, the fp32 master copy of mixed precision, optimizer states
  (AdamW, 8-bit AdamW, SGD with/without momentum, Adafactor) and ZeRO stages 1/2/3 over
  N devices: Rajbhandari et al. 2020 (ZeRO), Loshchilov & Hutter 2019 (AdamW), Shazeer &
  Stern 2018 (Adafactor), PyTorch torch.optim docs;
* activations: exact for memsweep's built-in ``mlp`` workload (an allocation-by-allocation
  replay of the PyTorch ops of ``worker/workloads.py``, see ``mlp_phases``), and for a
  decoder-only transformer by Korthikanti et al. 2022 (``transformer_layer_activation_bytes``);
* KV cache: 2 x layers x kv_heads x head_dim x tokens x bytes x sequences (Hugging Face
  transformers docs, "KV cache strategies");
* model descriptions: a local Hugging Face ``config.json`` (``load_hf_config``; never
  downloads) and the built-in workload configs (``estimate_for_spec``).

Every estimate is a ``Breakdown``: weights, gradients, optimizer_states, activations,
kv_cache, temporaries (each bytes, or ``None`` when it was not estimated, never a silent
0), a planning ``reserve`` and the totals. What was calculated here stays apart from what
the worker observed (the counters) and from what is assumed (the reserve).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from conf.contract import ESTIMATE_KEYS, GB, GiB

COMPONENTS = ("weights", "gradients", "optimizer_states", "activations", "kv_cache", "temporaries")
"""The estimated components, in print order. ``temporaries`` are short-lived buffers at the
peak: activation gradients in backward, optimizer scratch, dtype-conversion copies."""

COMPONENT_LABELS = {"weights": "weights", "gradients": "gradients", "optimizer_states": "optimizer states",
                    "activations": "activations", "kv_cache": "KV cache", "temporaries": "temporaries"}

DTYPE_BYTES = {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2,
               "float8": 1, "fp8": 1, "int8": 1}
"""Bytes of one value of a dense floating or integer dtype (PyTorch element sizes)."""


def _check_int(name: str, value: Any, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def dtype_bytes(dtype: str | int) -> int:
    """Bytes per value of ``dtype`` (``"float32"``, ``"bf16"``, ... or an int taken as bytes).

    Raises:
        ValueError: unknown dtype name.
    """
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return _check_int("bytes per value", dtype, 1)
    try:
        return DTYPE_BYTES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}: expected one of {', '.join(DTYPE_BYTES)}") from None


# --------------------------------------------------------------------------------------
# The breakdown
# --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Breakdown:
    """Estimated memory by component, in bytes; ``None`` = not estimated (not asked for).

    Attributes:
        weights: the model's parameters as stored (after quantization, if any).
        gradients: parameter gradients.
        optimizer_states: optimizer state, including mixed precision's fp32 master copy of
            the weights (the ZeRO paper's convention: K = 12 bytes/param for Adam).
        activations: model inputs, tensors kept for backward, layer outputs, loss buffers.
        kv_cache: keys and values kept for generation.
        temporaries: short-lived buffers live at the peak (activation gradients in
            backward, optimizer scratch, dtype-conversion copies).
        reserve: a planning margin, an assumption; never part of ``peak``.
        notes: what the figures assume, in words.

    ``peak`` is the sum of the estimated components (the number to compare with
    ``max_memory_allocated``); ``total`` is ``peak + reserve``.
    """

    weights: int | None = None
    gradients: int | None = None
    optimizer_states: int | None = None
    activations: int | None = None
    kv_cache: int | None = None
    temporaries: int | None = None
    reserve: int = 0
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in COMPONENTS:
            value = getattr(self, name)
            if value is not None:
                _check_int(name, value)
        _check_int("reserve", self.reserve)
        object.__setattr__(self, "notes", tuple(self.notes))

    @property
    def peak(self) -> int:
        """Sum of the estimated components, bytes (reserve excluded)."""
        return sum(getattr(self, n) or 0 for n in COMPONENTS)

    @property
    def total(self) -> int:
        """``peak + reserve``, bytes."""
        return self.peak + self.reserve

    @property
    def not_included(self) -> tuple[str, ...]:
        """Components that were not estimated (``None``)."""
        return tuple(n for n in COMPONENTS if getattr(self, n) is None)

    def replace(self, **changes: Any) -> "Breakdown":
        return dataclasses.replace(self, **changes)

    def with_note(self, *notes: str) -> "Breakdown":
        return dataclasses.replace(self, notes=self.notes + tuple(notes))

    def __add__(self, other: "Breakdown") -> "Breakdown":
        """Component-wise sum; ``None + x = x``; reserves add; notes concatenate."""
        values = {}
        for n in COMPONENTS:
            a, b = getattr(self, n), getattr(other, n)
            values[n] = None if a is None and b is None else (a or 0) + (b or 0)
        return Breakdown(**values, reserve=self.reserve + other.reserve, notes=self.notes + other.notes)

    def to_dict(self) -> dict:
        """Plain JSON-able dict in bytes: the components, ``reserve``, ``peak``, ``total``.

        This is the ``estimate`` field of a RunSpec (keys: ``conf.contract.ESTIMATE_KEYS``).
        """
        out = {n: getattr(self, n) for n in COMPONENTS}
        out.update(reserve=self.reserve, peak=self.peak, total=self.total)
        assert set(out) == set(ESTIMATE_KEYS)
        return out

    @classmethod
    def from_dict(cls, data: Mapping) -> "Breakdown":
        return cls(**{n: data.get(n) for n in COMPONENTS}, reserve=data.get("reserve") or 0)

    def format(self, title: str | None = None, decimals: int = 2) -> str:
        """A text table: one row per estimated component, bytes, GB and GiB in separate columns.

        Ends with the peak, the reserve, the total with reserve, and a sentence naming the
        components that are not included.
        """
        rows = [(COMPONENT_LABELS[n], getattr(self, n)) for n in COMPONENTS if getattr(self, n) is not None]
        rows.append(("sum (without reserve)", self.peak))
        if self.reserve:
            rows += [("reserve (assumed)", self.reserve), ("total with reserve", self.total)]
        width = max(12, max(len(str(v)) for _, v in rows))
        gw = max(8, max(len(f"{v / GB:.{decimals}f}") for _, v in rows))
        iw = max(8, max(len(f"{v / GiB:.{decimals}f}") for _, v in rows))
        lines = [title] if title else []
        lines.append(f"{'component':<24} {'bytes (B)':>{width}} {'GB':>{gw}} {'GiB':>{iw}}")
        for i, (label, value) in enumerate(rows):
            if label == "sum (without reserve)":
                lines.append("-" * (24 + width + gw + iw + 3))
            lines.append(f"{label:<24} {value:>{width}d} {value / GB:>{gw}.{decimals}f} "
                         f"{value / GiB:>{iw}.{decimals}f}")
        lines.append("GB = 10^9 B, GiB = 2^30 B.")
        missing = [COMPONENT_LABELS[n] for n in self.not_included]
        if missing:
            lines.append("Not included (not asked for): " + ", ".join(missing) + ".")
        for note in self.notes:
            lines.append("Note: " + note)
        return "\n".join(lines)


# --------------------------------------------------------------------------------------
# Weights by storage format
# --------------------------------------------------------------------------------------

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

        ``row``: for ``int8`` (LLM.int8(), one scale per output row), the row length
        (in_features), used as the block size when known.

        Formula: ``ceil(n * bits / 8)`` packed values, plus ``ceil(n / block) * scale_bytes``
        block scales; with double quantization, ``ceil(n / block)`` one-byte scales plus
        ``ceil(ceil(n / block) / 256) * 4`` second-level fp32 scales (Dettmers et al. 2023,
        QLoRA, Sec. 3: 32/64 = 0.5 bits/param of scales become 8/64 + 32/(64*256) = 0.127).
        Per-tensor constants (the 16-entry NF4 code book, the nested offset: under 100 bytes
        a tensor) are not counted.
        """
        _check_int("number of values", n)
        values = _ceil_div(n * self.bits, 8)
        block = row if (row and self.name == "int8") else self.block_size
        if not block or n == 0:
            return values
        blocks = _ceil_div(n, block)
        if self.double_quant:
            return values + blocks + _ceil_div(blocks, DOUBLE_QUANT_BLOCK) * 4
        return values + blocks * self.scale_bytes


DOUBLE_QUANT_BLOCK = 256
"""QLoRA double quantization: fp32 second-level scale per 256 8-bit first-level scales."""

FORMATS = {
    "fp32": StorageFormat("fp32", 32), "float32": StorageFormat("fp32", 32),
    "fp16": StorageFormat("fp16", 16), "float16": StorageFormat("fp16", 16),
    "bf16": StorageFormat("bf16", 16), "bfloat16": StorageFormat("bf16", 16),
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


def storage_format(name: str, block_size: int | None = None, double_quant: bool = False,
                   scale_bytes: int | None = None) -> StorageFormat:
    """The named format, with its block size / double quantization / scale size overridden.

    Raises:
        ValueError: unknown name, a block size or double quantization on a format without
            scales, or a non-positive block size.
    """
    try:
        fmt = FORMATS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown storage format {name!r}: expected one of "
                         f"{', '.join(sorted(set(f.name for f in FORMATS.values())))}") from None
    if (block_size is not None or double_quant) and fmt.block_size is None:
        raise ValueError(f"format {fmt.name} has no block scales: block_size/double_quant do not apply")
    if block_size is not None:
        _check_int("block_size", block_size, 1)
    return dataclasses.replace(fmt, block_size=block_size or fmt.block_size, double_quant=double_quant,
                               scale_bytes=fmt.scale_bytes if scale_bytes is None else scale_bytes)


def compact_format(bits: int) -> StorageFormat:
    """``bits`` per parameter, packed, no scales: the seed's "theoretical" uniform storage."""
    _check_int("bits", bits, 1)
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

    Example: 7e9 params at 16 bits -> 14_000_000_000 B (seed 003). At 4 bits with 64-value
    blocks of fp32 scales: 3.5e9 + 7e9/64*4 = 3_937_500_000 B.

    Raises:
        ValueError: negative counts, or more kept than ``parameters``.
    """
    _check_int("parameters", parameters)
    fmt = storage_format(fmt) if isinstance(fmt, str) else fmt
    kept = dict(kept or {})
    kept_total = sum(_check_int(f"kept[{k}]", v) for k, v in kept.items())
    if kept_total > parameters:
        raise ValueError(f"{kept_total} parameters kept in other formats, more than the {parameters} in total")
    out = fmt.tensor_bytes(parameters - kept_total)
    for name, count in kept.items():
        out += storage_format(name).tensor_bytes(count)
    return out


def weights_from_shapes(tensors: Iterable["ParamTensor"], fmt: StorageFormat | str,
                        keep_format: StorageFormat | str = "bf16") -> int:
    """Bytes of a model's tensors: quantizable tensors in ``fmt``, the others in ``keep_format``.

    A tensor is quantized when ``fmt`` has block scales (a quantized load) only if it is a
    Linear weight inside the decoder layers (``ParamTensor.quantizable``); embeddings,
    ``lm_head``, norms and biases stay in ``keep_format`` (bitsandbytes replaces nn.Linear
    modules only and skips ``lm_head``; Hugging Face docs, "bitsandbytes"). Without block
    scales (fp32/fp16/bf16/compact bits) every tensor is stored in ``fmt``.
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


# --------------------------------------------------------------------------------------
# Training state: gradients, optimizer states, ZeRO
# --------------------------------------------------------------------------------------

OPTIMIZERS = ("adamw", "adam", "adamw8bit", "sgd", "sgd-momentum", "adafactor", "adafactor-momentum")

BNB_8BIT_BLOCK = 2048
"""bitsandbytes 8-bit optimizers: block-wise quantization, 2048 values per fp32 absmax
(Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization")."""
BNB_MIN_8BIT_SIZE = 4096
"""bitsandbytes keeps the state of tensors with fewer values than this in 32 bits."""


def gradient_bytes(parameters: int, grad_bytes: int = 2) -> int:
    """Parameter gradients: one value per trainable parameter, ``grad_bytes`` each.

    Gradients have the parameter's dtype in PyTorch autograd (``param.grad``), or fp32 when
    a framework accumulates them in fp32. Source: PyTorch autograd docs; seed 002.
    """
    return _check_int("parameters", parameters) * _check_int("grad_bytes", grad_bytes, 1)


def master_weight_bytes(parameters: int) -> int:
    """Mixed precision's fp32 master copy of the weights: 4 bytes/param (Micikevicius et al.
    2018, "Mixed Precision Training"; ZeRO counts it with the optimizer states)."""
    return 4 * _check_int("parameters", parameters)


def optimizer_state_bytes(parameters: int, optimizer: str = "adamw", state_bytes: int = 4,
                          shapes: Sequence[Sequence[int]] | None = None) -> int:
    """Bytes of the optimizer's own state (without the master copy).

    Args:
        parameters: trainable parameter count (ignored when ``shapes`` is given).
        optimizer: one of ``OPTIMIZERS``:
            * ``adamw``/``adam``: first and second moments ``exp_avg``, ``exp_avg_sq`` ->
              2 values/param (Kingma & Ba 2015; Loshchilov & Hutter 2019; torch.optim.AdamW).
            * ``adamw8bit``: both moments in 8 bits, one fp32 absmax per block of 2048
              values: 2 x (n + ceil(n/2048) x 4) bytes per tensor; tensors under 4096 values
              stay 32-bit (bitsandbytes; Dettmers et al. 2022). ``state_bytes`` is ignored.
            * ``sgd``: none. ``sgd-momentum``: one momentum buffer, 1 value/param.
            * ``adafactor``: factored second moment (Shazeer & Stern 2018): a tensor of
              shape (..., r, c) keeps a row vector and a column vector, prod(...) x (r + c)
              values; a 1-D tensor keeps its full second moment; no first moment.
              ``adafactor-momentum`` adds a full first moment (beta1 set). Needs ``shapes``.
        state_bytes: bytes per state value: 4 for fp32 states (mixed precision; the seed's
            "kept in fp32"), or the parameter's bytes (torch.optim creates its state with
            ``zeros_like(param)``).
        shapes: the parameter tensors' shapes; when given, the count is per tensor.

    Returns:
        bytes (int). Per-tensor scalars (Adam's ``step``) are not counted.

    Raises:
        ValueError: unknown optimizer, or Adafactor without ``shapes``.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}: expected one of {', '.join(OPTIMIZERS)}")
    _check_int("state_bytes", state_bytes, 1)
    sizes = [math.prod(s) for s in shapes] if shapes is not None else [_check_int("parameters", parameters)]
    n = sum(sizes)
    if optimizer in ("adamw", "adam"):
        return 2 * n * state_bytes
    if optimizer == "sgd":
        return 0
    if optimizer == "sgd-momentum":
        return n * state_bytes
    if optimizer == "adamw8bit":
        total = 0
        for size in sizes:
            if shapes is not None and size < BNB_MIN_8BIT_SIZE:
                total += 2 * size * 4
            else:
                total += 2 * (size + _ceil_div(size, BNB_8BIT_BLOCK) * 4)
        return total
    # Adafactor
    if shapes is None:
        raise ValueError("Adafactor's factored state depends on each matrix's shape: give the "
                         "parameter shapes (a config.json or a workload), not just a count")
    values = 0
    for shape in shapes:
        if len(shape) >= 2:
            lead = math.prod(shape[:-2])
            values += lead * (shape[-2] + shape[-1])
        else:
            values += math.prod(shape)
    if optimizer == "adafactor-momentum":
        values += n
    return values * state_bytes


ADAM_STEP_BYTES = 4  # torch.optim.Adam(W) ``state["step"]``: a 0-dim float32 tensor per parameter tensor


def training_state(parameters: int, *, param_bytes: int = 2, optimizer: str = "adamw",
                   mixed_precision: bool = True, grad_bytes: int | None = None,
                   state_bytes: int | None = None,
                   shapes: Sequence[Sequence[int]] | None = None,
                   step_tensors: bool = False) -> Breakdown:
    """Gradients and optimizer states (with the fp32 master copy when mixed precision).

    Args:
        parameters: trainable parameters.
        param_bytes: bytes of a stored weight (fp16/bf16: 2), for the gradient default.
        optimizer: see ``optimizer_state_bytes``.
        mixed_precision: keep an fp32 master copy (4 B/param) and fp32 optimizer states
            (Micikevicius et al. 2018; ZeRO, Rajbhandari et al. 2020, Sec. 3.1).
        grad_bytes: bytes per gradient value; default ``param_bytes``.
        state_bytes: bytes per optimizer-state value; default 4 with mixed precision, else
            ``param_bytes`` (torch.optim's ``zeros_like(param)``).
        shapes: parameter shapes (needed by Adafactor, refines 8-bit AdamW).
        step_tensors: count Adam(W)'s per-tensor ``step`` in the optimizer states, 4 B per
            parameter tensor (``len(shapes)``). torch/optim/adamw.py ``_init_group`` keeps it
            as a 0-dim float32 tensor on the parameter's device when ``fused`` or
            ``capturable``, else on the host: so it is device memory on the CPU, and not on
            CUDA with the default AdamW (hence off by default).

    Returns:
        a Breakdown with ``gradients`` and ``optimizer_states`` set (others ``None``).

    Raises:
        ValueError: ``step_tensors`` without ``shapes`` (the tensor count is needed).

    Example (ZeRO Sec. 3.1): mixed-precision AdamW = 2 (fp16 weights) + 2 (fp16 gradients)
    + 4 (fp32 master) + 4 (m) + 4 (v) = 16 bytes/param; this function returns the last 14.
    """
    _check_int("parameters", parameters)
    grad_bytes = param_bytes if grad_bytes is None else grad_bytes
    state_bytes = (4 if mixed_precision else param_bytes) if state_bytes is None else state_bytes
    opt = optimizer_state_bytes(parameters, optimizer, state_bytes, shapes)
    notes = []
    if step_tensors and optimizer in ("adamw", "adam"):
        if shapes is None:
            raise ValueError("step_tensors: give the parameter shapes (one step tensor per parameter tensor)")
        opt += ADAM_STEP_BYTES * len(shapes)
        notes.append(f"optimizer states include {len(shapes)} step tensors of {ADAM_STEP_BYTES} B "
                     "(Adam's per-tensor step, in device memory on the CPU)")
    if mixed_precision:
        opt += master_weight_bytes(parameters)
        notes.append("optimizer states include the fp32 master copy of the weights (4 B/param, "
                     "mixed precision; ZeRO's convention)")
    return Breakdown(gradients=gradient_bytes(parameters, grad_bytes), optimizer_states=opt, notes=tuple(notes))


def zero_partition(b: Breakdown, stage: int, devices: int) -> Breakdown:
    """Per-device model states under ZeRO data parallelism over ``devices`` devices.

    Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
    Models", Sec. 5 and Figure 1: stage 1 (P_os) partitions the optimizer states, stage 2
    (P_os+g) also the gradients, stage 3 (P_os+g+p) also the parameters; each device keeps
    ``ceil(x / devices)`` of a partitioned component. Activations, the KV cache and the
    reserve are per device and not partitioned. Stage 3's transient all-gathered layer
    and the communication buffers are not counted.

    Example (the paper's Figure 1): 7.5e9 params, K = 12, 64 devices -> 120 GB baseline,
    31.4 GB (stage 1), 16.6 GB (stage 2), 1.9 GB (stage 3).

    Raises:
        ValueError: stage not in 0..3 or devices < 1.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}")
    _check_int("devices", devices, 1)

    def part(value: int | None, from_stage: int) -> int | None:
        return None if value is None else (_ceil_div(value, devices) if stage >= from_stage else value)

    note = f"ZeRO stage {stage} over {devices} devices: per-device figures"
    return b.replace(optimizer_states=part(b.optimizer_states, 1), gradients=part(b.gradients, 2),
                     weights=part(b.weights, 3), notes=b.notes + ((note,) if stage else ()))


# --------------------------------------------------------------------------------------
# Transformer activations (Korthikanti et al. 2022)
# --------------------------------------------------------------------------------------

RECOMPUTE = ("none", "selective", "full")


def korthikanti_layer_bytes(seq: int, batch: int, hidden: int, heads: int) -> int:
    """Activation bytes stored by one transformer layer for backward: ``sbh(34 + 5as/h)``.

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
    Models", Sec. 4.1, Eq. (1): 16-bit activations, 1-byte dropout masks, a 4h MLP, no
    tensor parallelism. Shapes: s = ``seq``, b = ``batch``, h = ``hidden``, a = ``heads``.
    Equal to ``34*s*b*h + 5*a*s*s*b`` (exact integer).
    """
    for name, v in (("seq", seq), ("batch", batch), ("hidden", hidden), ("heads", heads)):
        _check_int(name, v, 1)
    return 34 * seq * batch * hidden + 5 * heads * seq * seq * batch


def transformer_layer_activation_bytes(seq: int, batch: int, hidden: int, heads: int, *,
                                       kv_heads: int | None = None, head_dim: int | None = None,
                                       ffn_hidden: int | None = None, gated_mlp: bool = False,
                                       act_bytes: int = 2, dropout: bool = True,
                                       fused_attention: bool = False, recompute: str = "none") -> int:
    """Bytes one decoder layer keeps for backward, by the per-tensor count of Korthikanti
    et al. 2022 (Sec. 4.1), generalised to GQA, gated MLPs, any activation width.

    Counted (values of ``act_bytes`` bytes unless said; s seq, b batch, h hidden, a heads,
    k kv_heads, d head_dim, f ffn_hidden):

    * attention: QKV input sbh; Q sbad; K and V sbkd each; softmax output as^2b; with
      dropout a 1-byte mask as^2b and the dropout output as^2b; output-projection input
      sbad; with dropout a 1-byte mask sbh;
    * MLP: input sbh; 4h-style: activation input sbf and second-linear input sbf; gated
      (SwiGLU): gate sbf, up sbf, activation output sbf, product sbf; with dropout a 1-byte
      mask sbh;
    * two norms: their inputs, 2 x sbh.

    With a = k, d = h/a, f = 4h, 2-byte values and dropout this is the paper's
    ``sbh(34 + 5as/h)``.

    ``fused_attention`` (FlashAttention: the s x s scores are never materialised) drops
    every as^2b term and keeps the fp32 softmax log-sum-exp, 4 bytes x bas (Dao et al.
    2022). ``recompute``: ``none``; ``selective`` (the paper's Sec. 5: the attention core
    is recomputed, its as^2b terms are not stored: 34sbh per layer); ``full`` (only the
    layer input, sbh values, is kept; Chen et al. 2016, the paper's 2sbhL).

    Returns:
        bytes (int).

    Raises:
        ValueError: a non-positive size, or an unknown ``recompute``.
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    s, b, h, a = (_check_int(n, v, 1) for n, v in (("seq", seq), ("batch", batch), ("hidden", hidden),
                                                  ("heads", heads)))
    k = a if kv_heads is None else _check_int("kv_heads", kv_heads, 1)
    d = resolve_head_dim(h, a, head_dim)
    f = 4 * h if ffn_hidden is None else _check_int("ffn_hidden", ffn_hidden, 1)
    e = _check_int("act_bytes", act_bytes, 1)
    if recompute == "full":
        return s * b * h * e
    sbh = s * b * h
    attn = (sbh + s * b * a * d + 2 * s * b * k * d + s * b * a * d) * e + (sbh if dropout else 0)
    if fused_attention:
        attn += 4 * b * a * s
    elif recompute == "none":
        scores = a * s * s * b
        attn += scores * e + ((scores + scores * e) if dropout else 0)
    mlp = sbh * e + (4 if gated_mlp else 2) * s * b * f * e + (sbh if dropout else 0)
    norms = 2 * sbh * e
    return attn + mlp + norms


# --------------------------------------------------------------------------------------
# KV cache
# --------------------------------------------------------------------------------------

def resolve_head_dim(hidden_size: int | None, num_attention_heads: int | None,
                     head_dim: int | None = None) -> int:
    """The attention head dimension: an explicit ``head_dim`` takes precedence.

    Models such as Gemma set ``head_dim`` (256) different from hidden/heads (3072/16 =
    192); using hidden/heads there would be wrong. Otherwise ``hidden_size //
    num_attention_heads``, which must divide exactly.

    Raises:
        ValueError: no head_dim and hidden/heads missing or not dividing.
    """
    if head_dim is not None:
        return _check_int("head_dim", head_dim, 1)
    if not hidden_size or not num_attention_heads:
        raise ValueError("head_dim needs either an explicit head_dim or hidden_size and num_attention_heads")
    if hidden_size % num_attention_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_attention_heads "
                         f"{num_attention_heads}: give head_dim explicitly")
    return hidden_size // num_attention_heads


def cached_tokens(tokens: int, *, sliding_window: int | None = None, static_capacity: int | None = None) -> int:
    """Tokens one sequence holds in one layer's cache.

    * dynamic cache (Hugging Face ``DynamicCache``): every token so far, ``tokens``;
    * sliding window: at most ``sliding_window`` tokens are kept (older ones dropped);
    * static cache (``StaticCache``, ``cache_implementation="static"``): the whole
      ``static_capacity`` (``max_cache_len``) is preallocated, however few tokens are used;
      with a sliding window, ``min(static_capacity, sliding_window)``.

    Source: Hugging Face transformers docs, "KV cache strategies" / "Caching".

    Raises:
        ValueError: more tokens than the static capacity.
    """
    _check_int("tokens", tokens)
    if static_capacity is not None:
        _check_int("static_capacity", static_capacity, 1)
        if tokens > static_capacity:
            raise ValueError(f"{tokens} tokens do not fit a static cache of {static_capacity}")
        return min(static_capacity, sliding_window) if sliding_window else static_capacity
    return min(tokens, sliding_window) if sliding_window else tokens


def kv_cache_bytes(*, layers: int, kv_heads: int, head_dim: int, tokens: int, bytes_per_value: int = 2,
                   sequences: int = 1) -> int:
    """Bytes of a dense, uniform KV cache: ``2 x layers x kv_heads x head_dim x tokens x
    bytes_per_value x sequences`` (the 2 is K and V).

    Use the model's KV heads (``num_key_value_heads``), not its query heads: with
    grouped-query attention (Ainslie et al. 2023) several query heads share one KV head.
    ``tokens`` is what one sequence keeps per layer (see ``cached_tokens``).

    Example (seed 003): 32 layers x 8 KV heads x 128 x 8192 tokens x 2 bytes x 1 sequence
    = 1_073_741_824 B = 1 GiB; 4 sequences = 4 GiB. Source: Hugging Face transformers docs
    ("KV cache strategies").
    """
    return (2 * _check_int("layers", layers) * _check_int("kv_heads", kv_heads)
            * _check_int("head_dim", head_dim) * _check_int("tokens", tokens)
            * _check_int("bytes_per_value", bytes_per_value, 1) * _check_int("sequences", sequences))


# --------------------------------------------------------------------------------------
# Model descriptions: a local Hugging Face config.json
# --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor of a described model: name, shape, and whether a quantized load
    (bitsandbytes) would quantize it (a Linear weight inside the decoder layers)."""

    name: str
    shape: tuple[int, ...]
    quantizable: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """A decoder-only transformer, as read from a Hugging Face style config.json.

    Sizes are counts (not bytes). ``head_dim`` is already resolved (explicit value first).
    ``layer_types``: per layer ``"sliding_attention"`` or ``"full_attention"`` when the
    model mixes them; ``None`` = every layer uses ``sliding_window`` (if any).
    """

    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_hidden: int
    vocab: int
    gated_mlp: bool = True
    tie_embeddings: bool = False
    learned_positions: int = 0
    norm: str = "rmsnorm"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    dtype: str | None = None

    def tensors(self) -> list[ParamTensor]:
        """Every parameter tensor (shapes as PyTorch stores them: Linear (out, in))."""
        h, a, k, d, f, v = self.hidden, self.heads, self.kv_heads, self.head_dim, self.ffn_hidden, self.vocab
        norm = [(h,), (h,)] if self.norm == "layernorm" else [(h,)]
        out = [ParamTensor("embed_tokens.weight", (v, h))]
        if self.learned_positions:
            out.append(ParamTensor("embed_positions.weight", (self.learned_positions, h)))
        for i in range(self.layers):
            p = f"layers.{i}."
            out += [ParamTensor(p + f"input_norm.{j}", s) for j, s in enumerate(norm)]
            for name, rows in (("q_proj", a * d), ("k_proj", k * d), ("v_proj", k * d)):
                out.append(ParamTensor(p + name + ".weight", (rows, h), True))
                if self.qkv_bias:
                    out.append(ParamTensor(p + name + ".bias", (rows,)))
            out.append(ParamTensor(p + "o_proj.weight", (h, a * d), True))
            if self.o_bias:
                out.append(ParamTensor(p + "o_proj.bias", (h,)))
            out += [ParamTensor(p + f"post_norm.{j}", s) for j, s in enumerate(norm)]
            mlp = (("gate_proj", f, h), ("up_proj", f, h), ("down_proj", h, f)) if self.gated_mlp \
                else (("fc_in", f, h), ("fc_out", h, f))
            for name, rows, cols in mlp:
                out.append(ParamTensor(p + name + ".weight", (rows, cols), True))
                if self.mlp_bias:
                    out.append(ParamTensor(p + name + ".bias", (rows,)))
        out += [ParamTensor(f"final_norm.{j}", s) for j, s in enumerate(norm)]
        if not self.tie_embeddings:
            out.append(ParamTensor("lm_head.weight", (v, h)))
        return out

    @property
    def parameters(self) -> int:
        """Total parameter count (tied embeddings counted once)."""
        return sum(t.numel for t in self.tensors())

    def kv_layer_tokens(self, tokens: int, static_capacity: int | None = None) -> list[int]:
        """Tokens each layer's cache holds for one sequence (see ``cached_tokens``)."""
        out = []
        for i in range(self.layers):
            sliding = self.sliding_window if (self.layer_types is None
                                              or self.layer_types[i] == "sliding_attention") else None
            out.append(cached_tokens(tokens, sliding_window=sliding, static_capacity=static_capacity))
        return out


def _get(cfg: Mapping, *keys: str, default: Any = None) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def parse_hf_config(cfg: Mapping) -> TransformerConfig:
    """A Hugging Face style config (llama, mistral, qwen2, gemma, gpt2-like keys) -> TransformerConfig.

    Keys read: ``num_hidden_layers``/``n_layer``, ``hidden_size``/``n_embd``,
    ``num_attention_heads``/``n_head``, ``num_key_value_heads`` (default: the attention
    heads, i.e. no GQA), ``head_dim`` (explicit value wins over hidden/heads),
    ``intermediate_size``/``n_inner`` (gpt2 default 4h), ``vocab_size``,
    ``tie_word_embeddings``, ``sliding_window`` (ignored when ``use_sliding_window`` is
    false), ``layer_types``, ``attention_bias``, ``mlp_bias``, ``torch_dtype``/``dtype``.
    gpt2 (``model_type`` gpt2, or ``n_embd`` keys): learned positions (``n_positions``),
    LayerNorm with bias, biases on every Linear, a 4h GELU MLP, tied embeddings.

    Raises:
        ValueError: a required key is missing.
    """
    if not isinstance(cfg, Mapping):
        raise ValueError("a config must be a JSON object")
    model_type = str(cfg.get("model_type") or ("gpt2" if "n_embd" in cfg else "llama"))
    gpt2_like = model_type in ("gpt2", "gpt_bigcode") or "n_embd" in cfg
    layers = _get(cfg, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _get(cfg, "hidden_size", "n_embd", "d_model")
    heads = _get(cfg, "num_attention_heads", "n_head")
    vocab = _get(cfg, "vocab_size")
    missing = [n for n, v in (("num_hidden_layers", layers), ("hidden_size", hidden),
                              ("num_attention_heads", heads), ("vocab_size", vocab)) if v is None]
    if missing:
        raise ValueError(f"config has no {missing[0]} (nor its gpt2-style alias)")
    head_dim = resolve_head_dim(hidden, heads, _get(cfg, "head_dim"))
    kv_heads = _get(cfg, "num_key_value_heads", default=heads)
    if gpt2_like:
        window = None
        return TransformerConfig(
            model_type=model_type, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
            head_dim=head_dim, ffn_hidden=_get(cfg, "n_inner", "intermediate_size", default=4 * hidden),
            vocab=vocab, gated_mlp=False, tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            learned_positions=_get(cfg, "n_positions", "max_position_embeddings", default=0),
            norm="layernorm", qkv_bias=True, o_bias=True, mlp_bias=True, sliding_window=window,
            dtype=_get(cfg, "torch_dtype", "dtype"))
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False:
        window = None
    layer_types = cfg.get("layer_types")
    attention_bias = bool(cfg.get("attention_bias", model_type == "qwen2"))
    return TransformerConfig(
        model_type=model_type, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
        head_dim=head_dim, ffn_hidden=_get(cfg, "intermediate_size", default=4 * hidden), vocab=vocab,
        gated_mlp=True, tie_embeddings=bool(cfg.get("tie_word_embeddings", False)), norm="rmsnorm",
        qkv_bias=attention_bias, o_bias=attention_bias and model_type != "qwen2",
        mlp_bias=bool(cfg.get("mlp_bias", False)), sliding_window=window,
        layer_types=tuple(layer_types) if layer_types else None, dtype=_get(cfg, "torch_dtype", "dtype"))


def load_hf_config(path: str | Path) -> TransformerConfig:
    """Read a local ``config.json`` (a file, or a directory holding one). Never downloads.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not JSON, or missing keys (see ``parse_hf_config``).
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if isinstance(data, dict) and "text_config" in data and "num_hidden_layers" not in data:
        data = {**data["text_config"], "model_type": data["text_config"].get("model_type", data.get("model_type"))}
    return parse_hf_config(data)


def estimate_transformer(model: TransformerConfig, *, weight_format: StorageFormat | str = "bf16",
                         compute_bytes: int = 2, train: bool = False, optimizer: str = "adamw",
                         mixed_precision: bool = True, grad_bytes: int | None = None,
                         state_bytes: int | None = None, zero_stage: int = 0, devices: int = 1,
                         batch: int | None = None, seq_len: int | None = None, recompute: str = "none",
                         fused_attention: bool = False, dropout: bool = True, include_head: bool = True,
                         kv_tokens: int | None = None, kv_sequences: int | None = None,
                         kv_bytes: int | None = None, static_capacity: int | None = None,
                         reserve: int = 0, step_tensors: bool = False) -> Breakdown:
    """Estimate a described decoder-only transformer.

    * weights: every tensor of ``model.tensors()`` in ``weight_format`` (a quantized format
      quantizes the decoder Linear weights only; the rest stays in 16 bits);
    * training (``train``): gradients + optimizer states (``training_state``, shapes
      known), then ZeRO partitioning (``zero_partition``);
    * activations (training with ``batch`` and ``seq_len``): ``layers x
      transformer_layer_activation_bytes`` + with ``include_head`` the paper's output-layer
      terms (Korthikanti et al. 2022, Sec. 4.1-4.2: final-norm input 2sbh, output
      projection input 2sbh, fp32 logits for the loss 4sbv, embedding dropout mask sbh);
      with full recomputation, plus one layer's activations while it is recomputed;
    * KV cache (``kv_tokens``): per layer ``cached_tokens`` (sliding window, static
      capacity) x 2 x kv_heads x head_dim x ``kv_bytes`` (default ``compute_bytes``) x
      ``kv_sequences`` (default ``batch`` or 1).

    Components not asked for stay ``None``. Inference activations are not estimated.
    ``step_tensors``: Adam(W)'s per-tensor step in the optimizer states (see ``training_state``).
    """
    fmt = storage_format(weight_format) if isinstance(weight_format, str) else weight_format
    tensors = model.tensors()
    params = sum(t.numel for t in tensors)
    keep = "bf16" if compute_bytes == 2 else "fp32"
    weights = weights_from_shapes(tensors, fmt, keep_format=keep)
    b = Breakdown(weights=weights, reserve=reserve,
                  notes=(f"{model.model_type}: {params} parameters, {model.layers} layers, hidden {model.hidden}, "
                         f"{model.heads} heads / {model.kv_heads} KV heads x head_dim {model.head_dim}",))
    if train:
        param_bytes = max(1, _ceil_div(fmt.bits, 8))
        state = training_state(params, param_bytes=param_bytes, optimizer=optimizer,
                               mixed_precision=mixed_precision, grad_bytes=grad_bytes, state_bytes=state_bytes,
                               shapes=[t.shape for t in tensors], step_tensors=step_tensors)
        b = b.replace(gradients=state.gradients, optimizer_states=state.optimizer_states,
                      notes=b.notes + state.notes)
        if batch and seq_len:
            kw = dict(kv_heads=model.kv_heads, head_dim=model.head_dim, ffn_hidden=model.ffn_hidden,
                      gated_mlp=model.gated_mlp, act_bytes=compute_bytes, dropout=dropout,
                      fused_attention=fused_attention)
            layer = transformer_layer_activation_bytes(seq_len, batch, model.hidden, model.heads,
                                                       recompute=recompute, **kw)
            acts = model.layers * layer
            if recompute == "full":
                acts += transformer_layer_activation_bytes(seq_len, batch, model.hidden, model.heads, **kw)
            if include_head:
                sbh = seq_len * batch * model.hidden
                acts += 2 * sbh * compute_bytes + 4 * seq_len * batch * model.vocab + (sbh if dropout else 0)
            b = b.replace(activations=acts).with_note(
                f"activations: Korthikanti et al. 2022, recompute={recompute}, "
                f"{'fused attention (no s x s scores)' if fused_attention else 'scores materialised'}, "
                f"{'with' if dropout else 'without'} dropout")
        b = zero_partition(b, zero_stage, devices)
    if kv_tokens is not None:
        seqs = kv_sequences if kv_sequences is not None else (batch or 1)
        per_layer = model.kv_layer_tokens(kv_tokens, static_capacity)
        kv = sum(kv_cache_bytes(layers=1, kv_heads=model.kv_heads, head_dim=model.head_dim, tokens=t,
                                bytes_per_value=kv_bytes or compute_bytes, sequences=seqs) for t in per_layer)
        b = b.replace(kv_cache=kv).with_note(
            f"KV cache: {model.kv_heads} KV heads x head_dim {model.head_dim}, {seqs} sequence(s), "
            f"{max(per_layer) if per_layer else 0} tokens kept per layer at most")
    return b


# --------------------------------------------------------------------------------------
# The built-in mlp workload, exactly: an allocation-by-allocation replay
# --------------------------------------------------------------------------------------

CUDA_BLOCK = 512
"""The CUDA caching allocator rounds every request up to a multiple of 512 bytes
(c10/cuda/CUDACachingAllocator.cpp, ``kMinBlockSize``); ``memory_allocated`` counts the
rounded sizes."""


@dataclasses.dataclass(frozen=True)
class PhaseEstimate:
    """Estimated counters of one protocol phase (bytes): ``memory_allocated`` at its start
    and end, ``max_memory_allocated`` over it (the seed-003 protocol resets the peak at the
    start, so the peak includes what was already allocated), and the breakdown at the peak."""

    name: str
    iterations: int
    start: int
    end: int
    peak: int
    at_peak: Breakdown


class _Tape:
    """Replays allocations and frees; tracks live bytes by category and the peak."""

    def __init__(self, device_kind: str):
        self.round = (lambda n: _ceil_div(n, CUDA_BLOCK) * CUDA_BLOCK if n else 0) if device_kind == "cuda" \
            else (lambda n: n)
        self.live: dict[str, tuple[int, str]] = {}
        self.by_cat = {c: 0 for c in COMPONENTS}
        self.total = 0
        self.peak = 0
        self.peak_cats = dict(self.by_cat)

    def alloc(self, name: str, nbytes: int, category: str) -> None:
        assert name not in self.live, name
        n = self.round(nbytes)
        self.live[name] = (n, category)
        self.by_cat[category] += n
        self.total += n
        if self.total > self.peak:
            self.peak, self.peak_cats = self.total, dict(self.by_cat)

    def free(self, name: str) -> None:
        n, category = self.live.pop(name)
        self.by_cat[category] -= n
        self.total -= n

    def rename(self, old: str, new: str) -> None:
        self.live[new] = self.live.pop(old)

    def has(self, name: str) -> bool:
        return name in self.live

    def reset_peak(self) -> None:
        self.peak, self.peak_cats = self.total, dict(self.by_cat)


def mlp_param_shapes(width: int, hidden: int, depth: int) -> list[tuple[int, ...]]:
    """Shapes of the mlp's parameters in ``model.parameters()`` order: per block
    (hidden, width) weight, (hidden,) bias, (width, hidden) weight, (width,) bias."""
    return [s for _ in range(depth) for s in ((hidden, width), (hidden,), (width, hidden), (width,))]


ACTIVATION_SAVES_OUTPUT = {"relu": True, "tanh": True, "gelu": False, "silu": False}
"""What autograd saves for each activation (PyTorch tools/autograd/derivatives.yaml): relu
and tanh save their output, gelu and silu their input."""


def mlp_phases(batch: int, context: int, width: int, *, dtype: str = "float32", mode: str = "inference",
               depth: int = 4, hidden: int | None = None, activation: str = "gelu", device: str = "cpu",
               warmup: int = 3, repeats: int = 5, foreach: bool | None = None) -> list[PhaseEstimate]:
    """Estimated counters of every phase of memsweep's mlp workload (worker/workloads.py).

    A replay, allocation by allocation, of the storages the PyTorch ops of the workload
    create and free, in order (PyTorch 2.13 eager mode; each rule below was read off the
    worker's CPU tracker, which counts the storage bytes every operator returns):

    * model_load: each Linear's ``empty`` weight and bias in fp32 (default dtype), in
      ``parameters()`` order; then ``.to(dtype)`` converts them one at a time (new copy,
      old storage freed). On CUDA only the device copies count (the model is built on the
      CPU and moved).
    * inputs: x (batch, context, width); in train mode also the target.
    * inference iteration (``inference_mode``): per block the first Linear's output
      (batch, context, hidden), the activation's output, then the second Linear's output;
      nn.Sequential holds the block input until the block returns.
    * train step: ``zero_grad(set_to_none=True)`` frees the gradients; forward keeps for
      backward, per block, the first Linear's output (gelu/silu save their input) and the
      activation output, and the block output; ``mse_loss`` returns a 0-dim loss whose
      storage holds (batch, context, width) values; backward (grad seed of one value, the
      MSE gradient, per Linear the input gradient, weight and bias gradients; each saved
      tensor freed once its node ran); AdamW (``torch.optim.AdamW`` defaults): on the
      first step ``step`` (fp32 scalar, on the CPU), ``exp_avg`` and ``exp_avg_sq``
      (param dtype) per parameter; single-tensor update (CPU default) with two scratch
      tensors per parameter (``sqrt``, its quotient) while the previous ``denom`` lives,
      or, with ``foreach`` (the CUDA default), one ``_foreach_sqrt`` over all parameters.

    Args:
        batch, context, width: input shape (batch, context, width).
        dtype: ``float32``, ``float16`` or ``bfloat16``.
        mode: ``inference`` or ``train``.
        depth, hidden (default 4 x width), activation: the workload's parameters.
        device: ``cpu`` (the worker's tracker) or ``cuda``/``cuda:N`` (the caching
            allocator: 512-byte rounding). The CUDA figures do not model kernel-internal
            temporaries and cuBLAS workspaces and have not been checked on a GPU yet.
        warmup, repeats: iterations of the warmup and warm phases.
        foreach: AdamW implementation; default as PyTorch's (foreach on CUDA, single-tensor
            on the CPU).

    Returns:
        one PhaseEstimate per phase, in protocol order (model_load, inputs, cold_forward,
        warmup, warm_forward; in train mode the sub-phases cold_step.forward, .loss,
        .backward, .optimizer_step, warmup, then those of each of the ``repeats`` warm_steps).

    Raises:
        ValueError: a bad size, dtype, mode or activation.
    """
    for name, v in (("batch", batch), ("context", context), ("width", width), ("depth", depth)):
        _check_int(name, v, 1)
    if dtype not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype!r}")
    if mode not in ("inference", "train"):
        raise ValueError(f"mode must be inference or train, got {mode!r}")
    if activation not in ACTIVATION_SAVES_OUTPUT:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATION_SAVES_OUTPUT)}, got {activation!r}")
    _check_int("warmup", warmup)
    _check_int("repeats", repeats, 1)
    hidden = 4 * width if hidden is None else _check_int("hidden", hidden, 1)
    kind = "cuda" if device.startswith("cuda") else "cpu"
    foreach = (kind == "cuda") if foreach is None else foreach
    e = DTYPE_BYTES[dtype]
    A, W, H = batch * context, width, hidden
    shapes = mlp_param_shapes(W, H, depth)
    numels = [math.prod(s) for s in shapes]
    t = _Tape(kind)
    phases: list[PhaseEstimate] = []

    def phase(name: str, iterations: int, body) -> None:
        t.reset_peak()
        start = t.total
        for _ in range(min(iterations, 2)):  # from the second iteration on, every one is the same
            body()
        phases.append(PhaseEstimate(name, iterations, start, t.total, t.peak,
                                    Breakdown(**{c: t.peak_cats[c] for c in COMPONENTS})))

    def model_load() -> None:
        if kind == "cuda":
            for i, n in enumerate(numels):
                t.alloc(f"p{i}", n * e, "weights")
            return
        for i, n in enumerate(numels):
            t.alloc(f"p{i}", n * 4, "weights")
        if e != 4:
            for i, n in enumerate(numels):
                t.alloc(f"p{i}.to", n * e, "weights")
                t.free(f"p{i}")
                t.rename(f"p{i}.to", f"p{i}")

    def inputs() -> None:
        t.alloc("x", A * W * e, "activations")
        if mode == "train":
            t.alloc("target", A * W * e, "activations")

    def forward_inference() -> None:
        block_in = "x"
        for k in range(depth):
            t.alloc("h", A * H * e, "activations")
            t.alloc("g", A * H * e, "activations")
            t.free("h")
            t.alloc(f"out{k}", A * W * e, "activations")
            t.free("g")
            if block_in != "x":
                t.free(block_in)
            block_in = f"out{k}"
        t.free(block_in)  # del y

    saves_output = ACTIVATION_SAVES_OUTPUT[activation]

    # The worker records a training step as four sub-phases (worker/main.py plan):
    # forward (zero_grad first), loss, backward, optimizer_step (the loss released at its end).
    def step_forward() -> None:
        for i in range(len(numels)):  # zero_grad(set_to_none=True)
            if t.has(f"grad{i}"):
                t.free(f"grad{i}")
        for k in range(depth):  # forward, keeping what autograd saves
            t.alloc(f"h{k}", A * H * e, "activations")
            t.alloc(f"g{k}", A * H * e, "activations")
            if saves_output:
                t.free(f"h{k}")
            t.alloc(f"out{k}", A * W * e, "activations")

    def step_loss() -> None:
        t.alloc("loss", A * W * e, "activations")  # mse_loss: 0-dim view of an A*W buffer

    def step_backward() -> None:
        t.alloc("seed", e, "temporaries")  # ones_like(loss)
        t.alloc("grad_out", A * W * e, "temporaries")  # mse_loss_backward
        t.free(f"out{depth - 1}")  # MseLossBackward releases y
        for k in reversed(range(depth)):
            p = 4 * k  # W1, b1, W2, b2 of block k
            # second Linear: AddmmBackward0 -> grad of its input, weight, bias (sum)
            t.alloc("grad_g", A * H * e, "temporaries")
            t.alloc(f"grad{p + 2}", numels[p + 2] * e, "gradients")
            t.alloc(f"grad{p + 3}", numels[p + 3] * e, "gradients")
            t.free("grad_out")
            if not saves_output:
                t.free(f"g{k}")
            # activation backward
            t.alloc("grad_h", A * H * e, "temporaries")
            t.free("grad_g")
            t.free(f"g{k}" if saves_output else f"h{k}")
            # first Linear
            if k > 0:
                t.alloc("grad_out", A * W * e, "temporaries")
            t.alloc(f"grad{p}", numels[p] * e, "gradients")
            t.alloc(f"grad{p + 1}", numels[p + 1] * e, "gradients")
            t.free("grad_h")
            if k > 0:
                t.free(f"out{k - 1}")
        t.free("seed")

    def step_optimizer() -> None:  # AdamW step
        first = not t.has("exp_avg0")
        if first:
            for i, n in enumerate(numels):
                if kind == "cpu":
                    t.alloc(f"step{i}", 4, "optimizer_states")
                t.alloc(f"exp_avg{i}", n * e, "optimizer_states")
                t.alloc(f"exp_avg_sq{i}", n * e, "optimizer_states")
        if foreach:
            for i, n in enumerate(numels):
                t.alloc(f"sqrt{i}", n * e, "temporaries")
            for i in range(len(numels)):
                t.free(f"sqrt{i}")
        else:
            for i, n in enumerate(numels):
                t.alloc("sqrt", n * e, "temporaries")
                t.alloc("div", n * e, "temporaries")
                t.free("sqrt")
                if i:
                    t.free("denom")
                t.rename("div", "denom")
            t.free("denom")
        t.free("loss")  # del loss

    sub_phases = (("forward", step_forward), ("loss", step_loss), ("backward", step_backward),
                  ("optimizer_step", step_optimizer))

    def train_step() -> None:
        for _, body in sub_phases:
            body()

    phase("model_load", 1, model_load)
    phase("inputs", 1, inputs)
    if mode == "train":
        for name, body in sub_phases:
            phase(f"cold_step.{name}", 1, body)
        phase("warmup", warmup, train_step)
        for _ in range(repeats):
            for name, body in sub_phases:
                phase(f"warm_step.{name}", 1, body)
    else:
        phase("cold_forward", 1, forward_inference)
        phase("warmup", warmup, forward_inference)
        phase("warm_forward", repeats, forward_inference)
    return phases


def run_peak(phases: Sequence[PhaseEstimate]) -> PhaseEstimate:
    """The phase with the largest estimated ``max_memory_allocated`` (the first of equals)."""
    return max(phases, key=lambda p: p.peak)


def estimate_mlp(batch: int, context: int, width: int, **kw: Any) -> Breakdown:
    """The mlp workload's estimated peak allocated memory, by component, at its peak.

    Same arguments as ``mlp_phases``. The breakdown is taken at the moment of the run's
    largest phase peak, so ``peak`` equals the largest estimated ``max_memory_allocated``.
    """
    phases = mlp_phases(batch, context, width, **kw)
    top = run_peak(phases)
    return top.at_peak.with_note(f"mlp workload, exact replay of its PyTorch ops; peak in phase {top.name}")


def estimate_for_spec(spec: Any) -> Breakdown | None:
    """The estimate of a RunSpec (or its dict): the built-in workloads, else ``None``.

    Only ``mlp`` with the default mode options is known exactly; anything else returns ``None``
    (not estimated).
    """
    data = spec.to_dict() if hasattr(spec, "to_dict") else dict(spec)
    workload = data.get("workload") or {"name": "mlp"}
    if workload.get("name") != "mlp":
        return None
    # Mode options the replay does not model (conf.contract.RunSpec): not estimated.
    defaults = {"precision": "pure", "optimizer": "adamw", "checkpointing": False, "micro_steps": 1,
                "eval_batch": None, "export": False}
    if any(data.get(k, v) != v for k, v in defaults.items()):
        return None
    return estimate_mlp(data["batch"], data["context"], data["width"], dtype=data.get("dtype", "float32"),
                        mode=data.get("mode", "inference"), depth=workload.get("depth", 4),
                        hidden=workload.get("hidden"), activation=workload.get("activation", "gelu"),
                        device=data.get("device", "cpu"), warmup=data.get("warmup", 3),
                        repeats=data.get("repeats", 5))


# --------------------------------------------------------------------------------------
# runs.parquet: calculated columns next to the observed ones
# --------------------------------------------------------------------------------------

ESTIMATE_COLUMNS = tuple(f"est_{n}_bytes" for n in COMPONENTS) + ("est_peak_bytes", "estimate_error")
"""Columns of runs.parquet filled from the spec's ``estimate`` (calculated before the run):
``est_<component>_bytes`` and ``est_peak_bytes`` (int64 bytes, null when not estimated),
``estimate_error`` = (est_peak_bytes - max_memory_allocated) / max_memory_allocated (float,
null unless the run is ``ok`` and both sides are known)."""


def estimate_columns(estimate: Mapping | None, max_memory_allocated: int | None,
                     outcome: str | None) -> dict:
    """The ``ESTIMATE_COLUMNS`` of one run, from its spec's estimate and its observed peak.

    A run that did not finish (``oom``, ``crash``, ...) has only a partial observed peak,
    so its ``estimate_error`` is null.
    """
    est = estimate if isinstance(estimate, Mapping) else {}

    def as_int(v: Any) -> int | None:  # a byte count that fits int64, else null (a corrupt spec)
        return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63 else None

    row = {f"est_{n}_bytes": as_int(est.get(n)) for n in COMPONENTS}
    row["est_peak_bytes"] = as_int(est.get("peak"))
    measured = as_int(max_memory_allocated)
    row["estimate_error"] = (
        (row["est_peak_bytes"] - measured) / measured
        if outcome == "ok" and row["est_peak_bytes"] is not None and measured else None)
    return row
