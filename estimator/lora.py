"""LoRA / QLoRA training: trainable adapters on a frozen base stored in its own format.

A LoRA adapter on a ``Linear(in, out)`` adds ``A`` (r x in) and ``B`` (out x r): ``r * (in +
out)`` trainable parameters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
Models", Sec. 4.1; peft ``tuners/lora/layer.py``, ``LoraLayer.update_layer``, no bias by
default). Only the adapters have gradients and optimizer states; the base is frozen in its
storage format: bf16/fp16/fp32, LLM.int8() or 4-bit NF4 with double quantization (Dettmers et
al. 2023, "QLoRA", Sec. 3; ``formats``). The base's activations are still counted.

Adapted modules: a list of module names, ``all-linear`` (peft: every Linear but the output
layer), or peft's default for the architecture (``PEFT_DEFAULT_TARGETS``, from peft's
``utils/constants.py`` ``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .activations import NO_ACTIVATIONS, ActivationSettings
from .breakdown import Breakdown, check_int
from .formats import StorageFormat, storage_format, weights_from_shapes
from .training import training_state
from .transformer import LinearModule, ParamTensor, TransformerConfig, training_activations

PEFT_DEFAULT_TARGETS = {
    "gpt2": ("c_attn",),
    "gpt_bigcode": ("c_attn",),
    "gpt_neox": ("query_key_value",),
    "gptj": ("q_proj", "v_proj"),
    "opt": ("q_proj", "v_proj"),
    "bloom": ("query_key_value",),
    "falcon": ("query_key_value",),
    "llama": ("q_proj", "v_proj"),
    "llama4": ("q_proj", "v_proj"),
    "mistral": ("q_proj", "v_proj"),
    "mixtral": ("q_proj", "v_proj"),
    "stablelm": ("q_proj", "v_proj"),
    "phi": ("q_proj", "v_proj", "fc1", "fc2"),
    "gemma": ("q_proj", "v_proj"),
    "gemma2": ("q_proj", "v_proj"),
    "gemma3_text": ("q_proj", "v_proj"),
    "qwen2": ("q_proj", "v_proj"),
    "qwen3": ("q_proj", "v_proj"),
}
"""peft's default ``target_modules`` per ``model_type`` for the decoder architectures (peft 0.21
``utils/constants.py``, ``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``). An
architecture peft has no default for (phi3, qwen3_moe, gpt_oss, deepseek_v2, ...) needs
explicit targets, as peft itself requires."""

ADAPTER_BYTES = (2, 4)
"""Bytes per adapter value estimated: 4 (fp32, peft's default cast) or 2 (fp16/bf16 adapters,
``autocast_adapter_dtype=False``, with the fp32 master copy)."""

ALL_LINEAR = "all-linear"
"""peft's shorthand for every Linear (and GPT-2 Conv1D) module except the output layer."""


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """A LoRA / QLoRA fine-tuning setup.

    Attributes:
        rank: r, the adapters' rank (peft ``r``, default 8).
        alpha: peft ``lora_alpha``; scales the update by alpha / r, no memory of its own
            (recorded in the notes); ``None``: peft's default, 8.
        targets: module names to adapt (a suffix of the module's name, as peft's
            ``target_modules``), ``("all-linear",)``, or ``None`` for peft's default.
        dropout: peft ``lora_dropout`` (default 0.0: an identity, nothing stored).
        adapter_bytes: bytes per adapter value: 4 (fp32) by default, since peft's
            ``get_peft_model(autocast_adapter_dtype=True)`` casts bf16/fp16 adapters to fp32
            (peft ``tuners_utils.cast_adapter_dtype``); 2 with that option off (``ADAPTER_BYTES``).

    Raises:
        ValueError: a rank below 1, adapter bytes other than 2 or 4, a dropout outside [0, 1).
    """

    rank: int = 8
    alpha: int | None = None
    targets: tuple[str, ...] | None = None
    dropout: float = 0.0
    adapter_bytes: int = 4

    def __post_init__(self) -> None:
        check_int("LoRA rank", self.rank, 1)
        if self.adapter_bytes not in ADAPTER_BYTES:
            raise ValueError(f"adapter bytes must be 2 or 4 (16-bit or fp32 adapters), got {self.adapter_bytes!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoRA dropout must be in [0, 1), got {self.dropout!r}")


def lora_targets(model: TransformerConfig, targets: Sequence[str] | None = None) -> list[LinearModule]:
    """The Linear modules of ``model`` that LoRA adapts.

    Args:
        model: the described model (its ``linear_modules()``).
        targets: module names (the last component counts: ``self_attn.q_proj`` -> ``q_proj``),
            ``["all-linear"]``, or ``None`` for ``PEFT_DEFAULT_TARGETS[model.model_type]``.

    Returns:
        the adapted modules (grouped by name and shape, with their counts).

    Raises:
        ValueError: no default for the architecture, or a target that names no module
            (peft raises too: "Target modules ... not found in the base model"); the message
            lists the model's Linear modules.
    """
    linears = model.linear_modules()
    names = sorted({lin.name for lin in linears})
    if targets is None:
        if model.model_type not in PEFT_DEFAULT_TARGETS:
            raise ValueError(
                f"peft has no default LoRA targets for model_type {model.model_type!r}: give --lora-targets "
                f"(the model's Linear modules: {', '.join(names)}; or all-linear)"
            )
        targets = PEFT_DEFAULT_TARGETS[model.model_type]
    if list(targets) == [ALL_LINEAR]:
        return linears
    wanted = {t.rsplit(".", 1)[-1] for t in targets}
    missing = sorted(wanted - set(names))
    if missing:
        raise ValueError(
            f"LoRA target(s) {', '.join(missing)} match no Linear module of this {model.model_type} "
            f"(its Linear modules: {', '.join(names)})"
        )
    return [lin for lin in linears if lin.name in wanted]


def lora_parameters(modules: Sequence[LinearModule], rank: int) -> int:
    """Trainable parameters of rank-``rank`` adapters on ``modules``: sum of count x r x (in + out).

    Hu et al. 2021, Sec. 4.1: W0 + BA with B (out x r), A (r x in); peft creates
    ``lora_A = nn.Linear(in, r, bias=False)``, ``lora_B = nn.Linear(r, out, bias=False)``.

    Args:
        modules: the adapted modules (``lora_targets``).
        rank: r (>= 1).

    Returns:
        a parameter count (int).
    """
    check_int("LoRA rank", rank, 1)
    return sum(m.count * rank * (m.in_features + m.out_features) for m in modules)


def adapter_activation_bytes(
    modules: Sequence[LinearModule], rank: int, tokens: int, compute_bytes: int, adapter_bytes: int, dropout: float
) -> int:
    """Bytes the adapters keep for backward beyond the base's activations, per training step.

    peft ``tuners/lora/layer.py`` ``Linear.forward``: ``x = self._cast_input_dtype(x,
    lora_A.weight.dtype)`` then ``lora_B(lora_A(dropout(x)))``. Kept for backward, per adapted
    module and token: ``lora_A``'s input for its weight gradient (a new tensor only when the
    cast changes the dtype, ``in`` values of ``adapter_bytes``; with dropout, the dropped copy
    plus its 1-byte mask instead) and ``lora_A``'s output for ``lora_B``'s weight gradient
    (``r`` values of ``adapter_bytes``). Without autocast (peft's defaults).

    Args:
        modules: the adapted modules.
        rank: r.
        tokens: batch x sequence length.
        compute_bytes: bytes of the base's activations (the input's dtype).
        adapter_bytes: bytes of the adapters' values.
        dropout: peft ``lora_dropout``.

    Returns:
        bytes (int).
    """
    per_token = 0
    for m in modules:
        if dropout > 0:
            x = m.in_features * (adapter_bytes + 1)
        else:
            x = m.in_features * adapter_bytes if adapter_bytes != compute_bytes else 0
        per_token += m.count * (x + rank * adapter_bytes)
    return tokens * per_token


def estimate_lora(
    model: TransformerConfig,
    lora: LoraSettings,
    *,
    base_format: StorageFormat | str = "bf16",
    compute_bytes: int = 2,
    optimizer: str = "adamw",
    activations: ActivationSettings = NO_ACTIVATIONS,
    keep_format: StorageFormat | str | None = None,
    step_tensors: bool = False,
) -> Breakdown:
    """LoRA / QLoRA fine-tuning of ``model``: frozen base + adapters, their training state.

    Weights: the base in ``base_format`` (``weights_from_shapes``) + the adapters,
    ``lora_parameters x adapter_bytes``. Gradients and optimizer states (``training_state``):
    the adapters' only (the base is frozen); 16-bit adapters get the fp32 master copy.
    Activations: ``_with_adapter_activations``; temporaries: ``_with_dequantized_weight``.

    Args:
        model: the described model (``counted.describe_config``).
        lora: the adapters (``LoraSettings``).
        base_format: storage of the frozen base (a ``StorageFormat`` or a name; nf4 with
            ``double_quant`` for QLoRA).
        compute_bytes: bytes per activation value (2: bf16 compute).
        optimizer: the adapters' optimizer (``training.OPTIMIZERS``).
        activations: the base's training activations to count (``ActivationSettings``; its
            ``dropout`` is the base model's, not ``lora.dropout``).
        keep_format: storage of the tensors a quantized ``base_format`` does not quantize
            (embeddings, ``lm_head``, norms); ``None``: bf16 when ``compute_bytes`` is 2, else
            fp32. peft's ``prepare_model_for_kbit_training`` upcasts them to fp32.
        step_tensors: count Adam(W)'s per-tensor step (two adapter tensors per adapted
            module) in the optimizer states (``training_state``).

    Returns:
        a Breakdown (bytes) whose notes give the targets, the trainable count and the
        conventions.

    Raises:
        ValueError: as ``lora_targets``, ``storage_format``, ``training_state``.
    """
    fmt = storage_format(base_format) if isinstance(base_format, str) else base_format
    modules = lora_targets(model, lora.targets)
    trainable = lora_parameters(modules, lora.rank)
    tensors = model.tensors()
    keep = keep_format if keep_format is not None else ("bf16" if compute_bytes == 2 else "fp32")
    weights = weights_from_shapes(tensors, fmt, keep_format=keep) + trainable * lora.adapter_bytes
    state = _adapter_training_state(modules, lora, optimizer, step_tensors)
    b = Breakdown(
        weights=weights,
        gradients=state.gradients,
        optimizer_states=state.optimizer_states,
        notes=_lora_notes(model, lora, fmt, modules, optimizer) + state.notes,
    )
    if activations.counted:
        b = _with_adapter_activations(b, model, modules, lora, activations, compute_bytes)
    if fmt.bits == 4 and fmt.block_size is not None:
        b = _with_dequantized_weight(b, tensors, compute_bytes)
    return b


def _adapter_training_state(
    modules: Sequence[LinearModule], lora: LoraSettings, optimizer: str, step_tensors: bool
) -> Breakdown:
    """Gradients and optimizer states of the adapters on ``modules`` (``training_state``): an
    ``A`` (r x in) and a ``B`` (out x r) per module, ``lora.adapter_bytes`` values; 16-bit
    adapters with the fp32 master copy."""
    adapter_shapes = [
        s for m in modules for _ in range(m.count) for s in ((lora.rank, m.in_features), (m.out_features, lora.rank))
    ]
    return training_state(
        lora_parameters(modules, lora.rank),
        param_bytes=lora.adapter_bytes,
        optimizer=optimizer,
        mixed_precision=lora.adapter_bytes < 4,
        shapes=adapter_shapes,
        step_tensors=step_tensors,
    )


def _with_adapter_activations(
    b: Breakdown,
    model: TransformerConfig,
    modules: Sequence[LinearModule],
    lora: LoraSettings,
    activations: ActivationSettings,
    compute_bytes: int,
) -> Breakdown:
    """``b`` with the activations of LoRA training: the base's, as in full training
    (``training_activations``, Korthikanti et al. 2022: an upper bound, since PyTorch does not
    keep a frozen Linear's input for a weight gradient), plus ``adapter_activation_bytes``."""
    acts, note = training_activations(model, activations, compute_bytes=compute_bytes)
    tokens = (activations.batch or 0) * (activations.seq_len or 0)  # both set: activations.counted
    extra = adapter_activation_bytes(modules, lora.rank, tokens, compute_bytes, lora.adapter_bytes, lora.dropout)
    return b.replace(activations=acts + extra).with_note(
        note + f"; base activations as in full training (an upper bound for a frozen base), plus {extra} B "
        "kept by the adapters (peft's input cast, lora_A's output)"
    )


def _with_dequantized_weight(b: Breakdown, tensors: Sequence[ParamTensor], compute_bytes: int) -> Breakdown:
    """``b`` with the temporaries of a 4-bit base: the largest quantized Linear weight
    dequantized to ``compute_bytes`` values (bitsandbytes ``MatMul4Bit`` dequantizes the
    weight for each matmul, forward and backward, one layer at a time). Not counted for int8."""
    largest = max((t.numel for t in tensors if t.quantizable), default=0)
    return b.replace(temporaries=largest * compute_bytes).with_note(
        f"temporaries: the largest 4-bit weight dequantized to {compute_bytes}-byte values for its matmul "
        "(bitsandbytes MatMul4Bit), one at a time"
    )


def _lora_notes(
    model: TransformerConfig, lora: LoraSettings, fmt: StorageFormat, modules: Sequence[LinearModule], optimizer: str
) -> tuple[str, ...]:
    """The notes of ``estimate_lora``: the frozen base, the adapters and their targets, their dtype."""
    base = model.parameters
    trainable = lora_parameters(modules, lora.rank)
    alpha = 8 if lora.alpha is None else lora.alpha
    targets = ", ".join(f"{m.name} ({m.count} x {m.in_features}->{m.out_features})" for m in modules)
    return (
        f"{model.model_type}: {base} base parameters ({model.source}), frozen, stored in {fmt.name}"
        + (" with double quantization" if fmt.double_quant else ""),
        f"LoRA r={lora.rank}, alpha={alpha}, dropout={lora.dropout}: {trainable} trainable parameters "
        f"({100 * trainable / base:.4f}% of the base) on {targets}; r x (in + out) each (Hu et al. 2021)",
        f"adapters, their gradients and optimizer ({optimizer}) states in {lora.adapter_bytes}-byte values "
        "(peft casts 16-bit adapters to fp32 by default)",
    )
