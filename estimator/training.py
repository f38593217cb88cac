"""Training state: gradients, mixed precision's fp32 master copy, optimizer states, ZeRO.

Sources: Rajbhandari et al. 2020 (ZeRO), Micikevicius et al. 2018 (mixed precision),
Loshchilov & Hutter 2019 (AdamW), Shazeer & Stern 2018 (Adafactor), Dettmers et al. 2022
(8-bit optimizers), PyTorch torch.optim docs and source.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .bnb import BnbSettings, bnb_settings
from .breakdown import Breakdown, ceil_div, check_int

OPTIMIZERS = ("adamw", "adam", "adamw8bit", "sgd", "sgd-momentum", "adafactor", "adafactor-momentum")
"""The optimizers whose state is estimated (``optimizer_state_bytes`` says what each keeps)."""

TRAINING_RECIPES = {
    "bf16-mixed": ("bf16", True),
    "16-mixed": ("fp16", True),
    "bf16-true": ("bf16", False),
    "16-true": ("fp16", False),
    "32-true": ("fp32", False),
}
"""The training precision recipes in Lightning's words (``Trainer(precision=...)``): the stored
weights' format and whether ``training_state`` keeps mixed precision's fp32 master copy and fp32
optimizer states (``*-mixed``: 16 B/param of AdamW model states) or none (``*-true``: every value
in the weights' format)."""


def gradient_bytes(parameters: int, grad_bytes: int = 2) -> int:
    """Parameter gradients: one value per trainable parameter, ``grad_bytes`` each.

    Gradients have the parameter's dtype in PyTorch autograd (``param.grad``), or fp32 when
    a framework accumulates them in fp32. Source: PyTorch autograd docs (``Tensor.grad``).

    Args:
        parameters: trainable parameter count.
        grad_bytes: bytes per gradient value (>= 1).

    Returns:
        bytes (int): ``parameters * grad_bytes``.

    Raises:
        ValueError: ``parameters`` < 0 or ``grad_bytes`` < 1 (or not integers).
    """
    return check_int("parameters", parameters) * check_int("grad_bytes", grad_bytes, 1)


def master_weight_bytes(parameters: int) -> int:
    """Mixed precision's fp32 master copy of the weights: 4 bytes/param (Micikevicius et al.
    2018, "Mixed Precision Training"; ZeRO counts it with the optimizer states).

    Args:
        parameters: trainable parameter count.

    Returns:
        bytes (int): ``4 * parameters``.

    Raises:
        ValueError: ``parameters`` is not an integer >= 0.
    """
    return 4 * check_int("parameters", parameters)


def optimizer_state_bytes(
    parameters: int,
    optimizer: str = "adamw",
    state_bytes: int = 4,
    shapes: Sequence[Sequence[int]] | None = None,
    bnb: BnbSettings | None = None,
) -> int:
    """Bytes of the optimizer's own state (without the master copy).

    Args:
        parameters: trainable parameter count (ignored when ``shapes`` is given).
        optimizer: one of ``OPTIMIZERS``:
            * ``adamw``/``adam``: first and second moments ``exp_avg``, ``exp_avg_sq`` ->
              2 values/param (Kingma & Ba 2015; Loshchilov & Hutter 2019; torch.optim.AdamW).
            * ``adamw8bit``: both moments in 8 bits, one fp32 absmax per block of ``bnb.block``
              values: 2 x (n + ceil(n/block) x 4) bytes per tensor; tensors under
              ``bnb.min_8bit_size`` values stay 32-bit (bitsandbytes; Dettmers et al. 2022).
              ``state_bytes`` is ignored.
            * ``sgd``: none. ``sgd-momentum``: one momentum buffer, 1 value/param.
            * ``adafactor``: factored second moment (Shazeer & Stern 2018): a tensor of
              shape (..., r, c) keeps a row vector and a column vector, prod(...) x (r + c)
              values; a 1-D tensor keeps its full second moment; no first moment.
              ``adafactor-momentum`` adds a full first moment (beta1 set). Needs ``shapes``.
        state_bytes: bytes per state value: 4 for fp32 states (mixed precision), or the
            parameter's bytes (torch.optim creates its state with ``zeros_like(param)``).
        shapes: the parameter tensors' shapes; when given, the count is per tensor.
        bnb: the 8-bit settings; default ``bnb_settings()`` (the installed bitsandbytes, or
            its current defaults: block 256, min_8bit_size 4096).

    Returns:
        bytes (int). Per-tensor scalars (Adam's ``step``) are not counted.

    Raises:
        ValueError: unknown optimizer, or Adafactor without ``shapes``.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}: expected one of {', '.join(OPTIMIZERS)}")
    check_int("state_bytes", state_bytes, 1)
    sizes = [math.prod(s) for s in shapes] if shapes is not None else [check_int("parameters", parameters)]
    n = sum(sizes)
    if optimizer in ("adamw", "adam"):
        return 2 * n * state_bytes
    if optimizer == "sgd":
        return 0
    if optimizer == "sgd-momentum":
        return n * state_bytes
    if optimizer == "adamw8bit":
        return _adamw8bit_bytes(sizes, shapes is not None, bnb or bnb_settings())
    if shapes is None:
        raise ValueError(
            "Adafactor's factored state depends on each matrix's shape: give the "
            "parameter shapes (a config.json or a workload), not just a count"
        )
    values = _adafactor_second_moment_values(shapes)
    if optimizer == "adafactor-momentum":
        values += n
    return values * state_bytes


def _adamw8bit_bytes(sizes: Sequence[int], per_tensor: bool, bnb: BnbSettings) -> int:
    """bitsandbytes' 8-bit AdamW states of tensors of ``sizes`` values: two 8-bit moments and
    one fp32 absmax per block of ``bnb.block`` each; with ``per_tensor`` (real tensor sizes) a
    tensor under ``bnb.min_8bit_size`` values keeps two fp32 moments (Dettmers et al. 2022)."""
    total = 0
    for size in sizes:
        if per_tensor and size < bnb.min_8bit_size:
            total += 2 * size * 4
        else:
            total += 2 * (size + ceil_div(size, bnb.block) * 4)
    return total


def _adafactor_second_moment_values(shapes: Sequence[Sequence[int]]) -> int:
    """Values of Adafactor's factored second moment (Shazeer & Stern 2018): a tensor of shape
    (..., r, c) keeps prod(...) x (r + c), a 1-D tensor its full second moment."""
    values = 0
    for shape in shapes:
        if len(shape) >= 2:
            values += math.prod(shape[:-2]) * (shape[-2] + shape[-1])
        else:
            values += math.prod(shape)
    return values


ADAM_STEP_BYTES = 4
"""torch.optim.Adam(W) ``state["step"]``: a 0-dim float32 tensor per parameter tensor."""


ADAM_STEP_NOTE = (
    "AdamW's per-tensor step (4 B each) is not counted: on CUDA PyTorch keeps it on the host unless "
    "capturable or fused (torch/optim/adam.py Adam._init_group, which AdamW inherits)"
)
"""The note of an estimate for a CUDA device that leaves Adam(W)'s ``step`` tensors out."""


def counts_step_tensors(optimizer: str, device: str) -> bool:
    """Whether Adam(W)'s ``step`` tensors are device memory for ``optimizer`` on ``device``.

    torch/optim/adam.py ``Adam._init_group`` (AdamW inherits it) makes ``state["step"]`` a
    0-dim float32 tensor on the parameter's device when ``capturable`` or ``fused``, else on
    the host (``device="cpu"``): so it is device memory on the CPU, not on CUDA with the default
    AdamW, which the worker uses. The run estimates (``hf_load``, ``finetune``) and ``memsweep
    estimate --device`` share this rule.

    Args:
        optimizer: the spec's optimizer (``adamw``: only AdamW is asked for by a run).
        device: ``cpu``, ``cuda`` or ``cuda:N``.

    Returns:
        True for AdamW on a device other than CUDA.
    """
    return optimizer == "adamw" and not device.startswith("cuda")


def training_state(
    parameters: int,
    *,
    param_bytes: int = 2,
    optimizer: str = "adamw",
    mixed_precision: bool = True,
    grad_bytes: int | None = None,
    state_bytes: int | None = None,
    shapes: Sequence[Sequence[int]] | None = None,
    step_tensors: bool = False,
) -> Breakdown:
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
            parameter tensor (``len(shapes)``): device memory on the CPU, not on CUDA with
            the default AdamW (``counts_step_tensors``), hence off by default.

    Returns:
        a Breakdown with ``gradients`` and ``optimizer_states`` set (others ``None``).

    Raises:
        ValueError: ``step_tensors`` without ``shapes`` (the tensor count is needed), a
            negative count, or what ``optimizer_state_bytes`` rejects (an unknown optimizer,
            Adafactor without ``shapes``).

    Example (ZeRO Sec. 3.1): mixed-precision AdamW = 2 (fp16 weights) + 2 (fp16 gradients)
    + 4 (fp32 master) + 4 (m) + 4 (v) = 16 bytes/param; this function returns the last 14.
    """
    check_int("parameters", parameters)
    grad_bytes = param_bytes if grad_bytes is None else grad_bytes
    state_bytes = (4 if mixed_precision else param_bytes) if state_bytes is None else state_bytes
    opt = optimizer_state_bytes(parameters, optimizer, state_bytes, shapes)
    notes = []
    if optimizer == "adamw8bit":
        bnb = bnb_settings()
        notes.append(f"8-bit states: blocks of {bnb.block} values, min_8bit_size {bnb.min_8bit_size} ({bnb.source})")
    extra, extra_notes = _extra_state_bytes(parameters, optimizer, mixed_precision, shapes, step_tensors)
    return Breakdown(
        gradients=gradient_bytes(parameters, grad_bytes), optimizer_states=opt + extra, notes=(*notes, *extra_notes)
    )


def _extra_state_bytes(
    parameters: int,
    optimizer: str,
    mixed_precision: bool,
    shapes: Sequence[Sequence[int]] | None,
    step_tensors: bool,
) -> tuple[int, list[str]]:
    """Adam(W)'s step tensors (when asked) and the fp32 master copy (mixed precision) that
    ``training_state`` counts in the optimizer states: (bytes, a note for each).

    Raises:
        ValueError: ``step_tensors`` for Adam(W) without ``shapes``.
    """
    opt, notes = 0, []
    if step_tensors and optimizer in ("adamw", "adam"):
        if shapes is None:
            raise ValueError("step_tensors: give the parameter shapes (one step tensor per parameter tensor)")
        opt += ADAM_STEP_BYTES * len(shapes)
        notes.append(
            f"optimizer states include {len(shapes)} step tensors of {ADAM_STEP_BYTES} B "
            "(Adam's per-tensor step, in device memory on the CPU)"
        )
    if mixed_precision:
        opt += master_weight_bytes(parameters)
        notes.append(
            "optimizer states include the fp32 master copy of the weights (4 B/param, "
            "mixed precision; ZeRO's convention)"
        )
    return opt, notes


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

    Args:
        b: the whole model's breakdown (bytes), as on one device without ZeRO.
        stage: ZeRO stage, 0 (no partitioning) to 3.
        devices: data-parallel devices (>= 1).

    Returns:
        a new Breakdown with the per-device bytes, and a note when ``stage`` > 0.

    Raises:
        ValueError: stage not in 0..3 or devices < 1.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}")
    check_int("devices", devices, 1)

    def part(value: int | None, from_stage: int) -> int | None:
        return None if value is None else (ceil_div(value, devices) if stage >= from_stage else value)

    note = f"ZeRO stage {stage} over {devices} devices: per-device figures"
    return b.replace(
        optimizer_states=part(b.optimizer_states, 1),
        gradients=part(b.gradients, 2),
        weights=part(b.weights, 3),
        notes=b.notes + ((note,) if stage else ()),
    )
