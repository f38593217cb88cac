"""Model descriptions: a decoder-only transformer (dense or mixture of experts), and its whole
estimate (weights, training state, activations, KV cache).

A description comes from transformers' own count of a local config (``counted.py``) or from
memsweep's formula parser (``hf_config.py``). Never downloads. Sources: the other modules of
this package for each component.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple, cast

from .activations import NO_ACTIVATIONS, ActivationSettings, transformer_layer_activation_bytes
from .breakdown import Breakdown, ceil_div, check_int
from .formats import StorageFormat, storage_format, weights_from_shapes
from .kv_cache import layer_cached_tokens
from .training import training_state, zero_partition


@dataclasses.dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor of a described model: name, shape, and whether a quantized load
    (bitsandbytes) would quantize it (a Linear weight inside the decoder layers).

    Attributes:
        name: a module-style name (``layers.0.q_proj.weight``); memsweep's own naming,
            close to, not always equal to, a Hugging Face state dict's.
        shape: the tensor's shape, a Linear weight as (out_features, in_features).
        quantizable: a bitsandbytes load would quantize it (``weights_from_shapes``).
    """

    name: str
    shape: tuple[int, ...]
    quantizable: bool = False

    @property
    def numel(self) -> int:
        """Number of values, ``prod(shape)`` (a count, not bytes)."""
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True)
class LinearModule:
    """A group of equal Linear modules of a described model, by their last name component.

    Attributes:
        name: the module's attribute name (``q_proj``, ``c_attn``): what peft's
            ``target_modules`` matches (a suffix of the module's full name).
        in_features, out_features: the Linear's sizes (a GPT-2 ``Conv1D`` included).
        count: how many modules of that name and shape the model has (one per layer).
    """

    name: str
    in_features: int
    out_features: int
    count: int = 1


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """A decoder-only transformer, as read from a Hugging Face style config.json.

    Sizes are counts (not bytes). ``head_dim`` is already resolved (explicit value first).
    ``layer_types``: per layer ``"sliding_attention"`` or ``"full_attention"`` when the
    model mixes them; ``None`` = every layer uses ``sliding_window`` (if any).

    Attributes:
        model_type: the config's ``model_type`` (``llama``, ``gpt2``, ...).
        layers: decoder layers.
        hidden: hidden size.
        heads: attention (query) heads.
        kv_heads: key/value heads (``heads`` without grouped-query attention).
        head_dim: head dimension.
        ffn_hidden: MLP hidden size (``intermediate_size``).
        vocab: vocabulary size.
        gated_mlp: SwiGLU-style MLP (gate, up, down) rather than two matrices.
        tie_embeddings: ``lm_head`` shares the input embedding (counted once).
        learned_positions: rows of a learned position embedding (gpt2), 0 for none.
        norm: ``rmsnorm`` (weight only) or ``layernorm`` (weight and bias).
        qkv_bias, o_bias, mlp_bias: whether those Linears have a bias.
        sliding_window: tokens a sliding-window layer keeps, or ``None``.
        layer_types: see above.
        dtype: the config's ``torch_dtype``/``dtype``, or ``None``.
        qk_norm: per-head RMSNorms of queries and keys (qwen3, gemma3), head_dim each.
        extra_layer_norms: norms per layer beyond the two (gemma2/3: pre/post feed-forward).
        layer_windows: per layer, the window its cache keeps (``None``: full), as
            transformers' DynamicCache builds it; wins over ``layer_types``/``sliding_window``.
        kv_values_per_token: values one layer caches per token, K and V together (default
            ``2 x kv_heads x head_dim``; multi-head latent attention caches its compressed
            latent and rope key, ``kv_lora_rank + qk_rope_head_dim``).
        cache_layers: per cache layer, (values one token adds, K and V together; its window or
            ``None``), as the defining library's cache holds them (``counted.py``); wins over
            the per-layer fields above. A layer that shares another's cache adds 0.
        kv_layout: the attention layout in words, as the KV figure names it.
        kv_unknown: why the KV cache is not estimated (a layout not understood), or ``None``.
        counted: the tensors as the defining library built them (``counted.py``); when
            set, ``tensors()`` returns them instead of the formula's.
        experts, experts_per_token: routed experts per MoE layer and the top-k each token
            uses (0 for a dense model).
        active_parameters: parameters one token uses (MoE), ``None`` = all of them.
        active_ffn_hidden: MLP width one token passes through (MoE: top-k x expert width,
            plus shared experts), for the activation formula; ``None`` = ``ffn_hidden``.
        linears: the Linear modules as the defining library built them (``counted.py``),
            the output embedding excluded; ``None``: derived from ``tensors()``.
        source: who counted the parameters.
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
    qk_norm: bool = False
    extra_layer_norms: int = 0
    layer_windows: tuple[int | None, ...] | None = None
    kv_values_per_token: int | None = None
    cache_layers: tuple[tuple[int, int | None], ...] | None = None
    kv_layout: str | None = None
    kv_unknown: str | None = None
    counted: tuple[ParamTensor, ...] | None = None
    experts: int = 0
    experts_per_token: int = 0
    active_parameters: int | None = None
    active_ffn_hidden: int | None = None
    linears: tuple[LinearModule, ...] | None = None
    source: str = "memsweep's formula parser"

    def tensors(self) -> list[ParamTensor]:
        """Every parameter tensor (shapes as PyTorch stores them: Linear (out, in)).

        Per layer: the norms, q/k/v/o projections (q and o with ``heads x head_dim``, k and
        v with ``kv_heads x head_dim`` rows), the MLP's two or three matrices and the biases
        the config asks for; around them the token embedding, learned positions if any, the
        final norm and, unless tied, ``lm_head`` (the llama/gpt2 layouts of Hugging Face
        transformers' modeling files).

        Returns:
            the ParamTensors, in that order (``counted`` instead when set).
        """
        if self.counted is not None:
            return list(self.counted)
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
            out += [ParamTensor(p + f"extra_norm.{j}", (h,)) for j in range(self.extra_layer_norms)]
            if self.qk_norm:
                out += [ParamTensor(p + "q_norm.weight", (d,)), ParamTensor(p + "k_norm.weight", (d,))]
            mlp = (
                (("gate_proj", f, h), ("up_proj", f, h), ("down_proj", h, f))
                if self.gated_mlp
                else (("fc_in", f, h), ("fc_out", h, f))
            )
            for name, rows, cols in mlp:
                out.append(ParamTensor(p + name + ".weight", (rows, cols), True))
                if self.mlp_bias:
                    out.append(ParamTensor(p + name + ".bias", (rows,)))
        out += [ParamTensor(f"final_norm.{j}", s) for j, s in enumerate(norm)]
        if not self.tie_embeddings:
            out.append(ParamTensor("lm_head.weight", (v, h)))
        return out

    def linear_modules(self) -> list[LinearModule]:
        """The model's Linear modules other than the output embedding, grouped by name and shape.

        Returns:
            ``linears`` when the defining library listed them; else, from ``tensors()``, each
            quantizable 2-D weight ``...<name>.weight`` of shape (out, in) (the parser's names:
            ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, ``gate_proj``, ``up_proj``,
            ``down_proj``, or ``fc_in``/``fc_out``).
        """
        if self.linears is not None:
            return list(self.linears)
        groups: dict[tuple[str, int, int], int] = {}
        for t in self.tensors():
            if t.quantizable and len(t.shape) == 2 and t.name.endswith(".weight"):
                key = (t.name.rsplit(".", 2)[-2], t.shape[1], t.shape[0])
                groups[key] = groups.get(key, 0) + 1
        return [LinearModule(n, i, o, c) for (n, i, o), c in groups.items()]

    @property
    def parameters(self) -> int:
        """Total parameter count (tied embeddings counted once)."""
        return sum(t.numel for t in self.tensors())

    @property
    def active(self) -> int:
        """Parameters one token uses: ``active_parameters`` for a MoE, else all of them."""
        return self.active_parameters if self.active_parameters is not None else self.parameters

    @property
    def cached_values_per_token(self) -> int:
        """Values one layer caches per token, K and V together (see ``kv_values_per_token``)."""
        return self.kv_values_per_token or 2 * self.kv_heads * self.head_dim

    def windows(self) -> list[int | None]:
        """Per layer, the window its cache keeps, ``None`` for a full-attention layer."""
        if self.cache_layers is not None:
            return [w for _, w in self.cache_layers]
        if self.layer_windows is not None:
            return list(self.layer_windows)
        return [
            self.sliding_window if (self.layer_types is None or self.layer_types[i] == "sliding_attention") else None
            for i in range(self.layers)
        ]

    def kv_layer_tokens(self, tokens: int, static_capacity: int | None = None, convention: str = "window") -> list[int]:
        """Tokens each layer's cache holds for one sequence (see ``layer_cached_tokens``).

        Args:
            tokens: tokens of the sequence so far.
            static_capacity: a static cache's preallocated length, or ``None``.
            convention: what a sliding layer keeps, one of ``kv_cache.KV_CONVENTIONS``.

        Returns:
            one token count per layer.

        Raises:
            ValueError: as ``layer_cached_tokens``.
        """
        return [layer_cached_tokens(tokens, w, convention, static_capacity) for w in self.windows()]

    def with_sliding_window(self, window: int) -> TransformerConfig:
        """This model with ``window`` as the window of its sliding layers (every layer when none
        slides), in whichever per-layer description it carries (``cache_layers``,
        ``layer_windows``, ``sliding_window``).

        Args:
            window: tokens a sliding layer keeps at most (>= 1).

        Raises:
            ValueError: a window < 1.
        """
        check_int("sliding_window", window, 1)
        slides = [w is not None for w in self.windows()]
        keep = slides if any(slides) else [True] * len(slides)
        windows = tuple(window if k else None for k in keep)
        if self.cache_layers is not None:
            cache = tuple((v, w) for (v, _), w in zip(self.cache_layers, windows))
            return dataclasses.replace(self, cache_layers=cache)
        return dataclasses.replace(self, sliding_window=window, layer_windows=windows)

    def layer_values(self) -> list[int]:
        """Per layer (per cache layer with ``cache_layers``), the values one token adds."""
        if self.cache_layers is not None:
            return [v for v, _ in self.cache_layers]
        return [self.cached_values_per_token] * self.layers


class _TrainingOptions(NamedTuple):
    """The training options of ``estimate_transformer``, as ``training_state`` takes them."""

    optimizer: str
    mixed_precision: bool
    grad_bytes: int | None
    state_bytes: int | None
    step_tensors: bool


def estimate_transformer(
    model: TransformerConfig,
    *,
    weight_format: StorageFormat | str = "bf16",
    compute_bytes: int = 2,
    train: bool = False,
    optimizer: str = "adamw",
    mixed_precision: bool = True,
    grad_bytes: int | None = None,
    state_bytes: int | None = None,
    zero_stage: int = 0,
    devices: int = 1,
    activations: ActivationSettings = NO_ACTIVATIONS,
    kv_tokens: int | None = None,
    kv_sequences: int | None = None,
    kv_bytes: int | None = None,
    static_capacity: int | None = None,
    kv_convention: str = "window",
    reserve: int = 0,
    step_tensors: bool = False,
) -> Breakdown:
    """Estimate a described decoder-only transformer: its weights and, as asked, training
    state, training activations and KV cache; a component not asked for stays ``None``.

    Args:
        model: the described transformer (a mixture of experts: every expert stored and
            trained, activations from what a token passes through, ``active_ffn_hidden``).
        weight_format: storage of the weights (a ``StorageFormat`` or a name): a quantized
            format quantizes the decoder Linear weights only (``weights_from_shapes``).
        compute_bytes: bytes per activation value: 2 (what a format leaves kept in bf16), 4 (fp32).
        train: add ``training_state``, ``training_activations`` (``activations.counted``;
            inference activations are not estimated), then ``zero_partition``.
        optimizer, mixed_precision, grad_bytes, state_bytes, step_tensors, zero_stage,
            devices: as ``training_state`` and ``zero_partition`` (gradients default to
            the weight's bytes, ``ceil(bits / 8)``).
        activations: the training activations to count (``ActivationSettings``).
        kv_tokens, kv_sequences, kv_bytes, static_capacity, kv_convention: the KV cache as
            ``kv_cache_estimate`` (None tokens: no cache; sequences default to
            ``activations.batch`` or 1, bytes per value to ``compute_bytes``).
        reserve: the planning reserve, bytes (an assumption, not in ``peak``).

    Returns:
        a Breakdown, bytes, with notes saying what was assumed.

    Raises:
        ValueError: an unknown format, optimizer or recompute, a bad size or ZeRO stage, or
            more ``kv_tokens`` than ``static_capacity``.
    """
    fmt = storage_format(weight_format) if isinstance(weight_format, str) else weight_format
    tensors = model.tensors()
    b = _stored_weights(model, tensors, fmt, compute_bytes, reserve)
    if train:
        options = _TrainingOptions(optimizer, mixed_precision, grad_bytes, state_bytes, step_tensors)
        b = _with_training(b, model, tensors, fmt, options, activations, compute_bytes)
        b = zero_partition(b, zero_stage, devices)
    if kv_tokens is not None:
        seqs = kv_sequences if kv_sequences is not None else (activations.batch or 1)
        kv, note = kv_cache_estimate(model, kv_tokens, seqs, kv_bytes or compute_bytes, static_capacity, kv_convention)
        b = b.replace(kv_cache=kv).with_note(note)
    return b


def _stored_weights(
    model: TransformerConfig, tensors: list[ParamTensor], fmt: StorageFormat, compute_bytes: int, reserve: int
) -> Breakdown:
    """The weights of ``tensors`` (``model``'s) stored in ``fmt`` (what it does not quantize in
    bf16 when ``compute_bytes`` is 2, else fp32), with ``reserve`` and notes naming the model."""
    params = sum(t.numel for t in tensors)
    keep = "bf16" if compute_bytes == 2 else "fp32"
    b = Breakdown(
        weights=weights_from_shapes(tensors, fmt, keep_format=keep),
        reserve=reserve,
        notes=(
            f"{model.model_type}: {params} parameters ({model.source}), {model.layers} layers, hidden "
            f"{model.hidden}, {model.heads} heads / {model.kv_heads} KV heads x head_dim {model.head_dim}",
        ),
    )
    if model.experts:
        b = b.with_note(
            f"mixture of experts: {model.experts} routed experts, {model.experts_per_token} per token; "
            f"{params} parameters in total (weights, gradients, optimizer states), {model.active} active per token "
            "(activations)"
        )
    return b


def _with_training(
    b: Breakdown,
    model: TransformerConfig,
    tensors: list[ParamTensor],
    fmt: StorageFormat,
    options: _TrainingOptions,
    activations: ActivationSettings,
    compute_bytes: int,
) -> Breakdown:
    """``b`` with the gradients and optimizer states of training every tensor (``training_state``)
    and, when ``activations.counted``, the training activations, whole (before ZeRO).
    The gradient default is the stored weight's bytes, ``ceil(bits / 8)``.
    """
    state = training_state(
        sum(t.numel for t in tensors),
        param_bytes=max(1, ceil_div(fmt.bits, 8)),
        optimizer=options.optimizer,
        mixed_precision=options.mixed_precision,
        grad_bytes=options.grad_bytes,
        state_bytes=options.state_bytes,
        shapes=[t.shape for t in tensors],
        step_tensors=options.step_tensors,
    )
    b = b.replace(gradients=state.gradients, optimizer_states=state.optimizer_states, notes=b.notes + state.notes)
    if activations.counted:
        acts, note = training_activations(model, activations, compute_bytes=compute_bytes)
        b = b.replace(activations=acts).with_note(note)
    return b


def training_activations(
    model: TransformerConfig, settings: ActivationSettings, *, compute_bytes: int = 2
) -> tuple[int, str]:
    """Activations a training step of ``model`` keeps for backward, and a note saying how.

    ``layers x transformer_layer_activation_bytes`` (Korthikanti et al. 2022, Sec. 4.1,
    generalised to GQA and gated MLPs; a MoE passes a token through ``active_ffn_hidden``),
    with full recomputation plus one layer's activations while it is recomputed, and with
    ``include_head`` the paper's output-layer terms (Sec. 4.2: final-norm input 2sbh, output
    projection input 2sbh, fp32 logits for the loss 4sbv, embedding dropout mask sbh).

    Args:
        model: the described transformer.
        settings: ``batch`` (b) and ``seq_len`` (s), both required, and how to count
            (``recompute``, ``fused_attention``, ``dropout`` as ``transformer_layer_activation_bytes``;
            ``include_head``).
        compute_bytes: bytes per activation value.

    Returns:
        (bytes, note).

    Raises:
        ValueError: as ``transformer_layer_activation_bytes`` (a missing batch or seq_len too).
    """
    # a missing batch or seq_len is refused by transformer_layer_activation_bytes (ValueError)
    batch, seq_len, recompute = cast(int, settings.batch), cast(int, settings.seq_len), settings.recompute
    kw: dict[str, Any] = dict(
        kv_heads=model.kv_heads,
        head_dim=model.head_dim,
        ffn_hidden=model.active_ffn_hidden or model.ffn_hidden,
        gated_mlp=model.gated_mlp,
        act_bytes=compute_bytes,
        dropout=settings.dropout,
        fused_attention=settings.fused_attention,
    )
    layer = transformer_layer_activation_bytes(seq_len, batch, model.hidden, model.heads, recompute=recompute, **kw)
    acts = model.layers * layer
    if recompute == "full":
        acts += transformer_layer_activation_bytes(seq_len, batch, model.hidden, model.heads, **kw)
    if settings.include_head:
        sbh = seq_len * batch * model.hidden
        acts += 2 * sbh * compute_bytes + 4 * seq_len * batch * model.vocab + (sbh if settings.dropout else 0)
    note = (
        f"activations: Korthikanti et al. 2022, recompute={recompute}, "
        f"{'fused attention (no s x s scores)' if settings.fused_attention else 'scores materialised'}, "
        f"{'with' if settings.dropout else 'without'} dropout"
    )
    return acts, note


def kv_cache_estimate(
    model: TransformerConfig,
    tokens: int,
    sequences: int,
    bytes_per_value: int,
    static_capacity: int | None = None,
    convention: str = "window",
) -> tuple[int | None, str]:
    """KV cache bytes of ``sequences`` sequences of ``tokens`` tokens, and a note per layer kind.

    Per layer ``layer_cached_tokens`` (its window under ``convention``, a static capacity) x
    its values per token (``layer_values``: 2 x kv_heads x head_dim; MLA: its latent; the
    library's cache layers when counted) x ``bytes_per_value`` x ``sequences`` (Hugging Face
    docs, "KV cache strategies").

    Args:
        model: the described transformer.
        tokens: tokens per sequence in the cache (prompt + generated).
        sequences: sequences cached at once.
        bytes_per_value: bytes per cached value.
        static_capacity: a static cache's preallocated length, or ``None``.
        convention: what a sliding layer's cache keeps (``kv_cache.KV_CONVENTIONS``).

    Returns:
        (bytes, note), or (``None``, the reason) when the model's layout is not understood.

    Raises:
        ValueError: as ``layer_cached_tokens``.
    """
    if model.kv_unknown:
        return None, f"KV cache not estimated: {model.kv_unknown}"
    per_layer = model.kv_layer_tokens(tokens, static_capacity, convention)
    values = model.layer_values()
    kv = sum(t * v * bytes_per_value * sequences for t, v in zip(per_layer, values))
    windows = model.windows()
    kinds = sorted(set(zip(windows, per_layer, values)), key=lambda x: (x[0] is None, x[0] or 0, x[2]))
    by_kind = ", ".join(
        f"{sum(1 for k in zip(windows, per_layer, values) if k == kind)} layers "
        f"{'full' if kind[0] is None else f'window {kind[0]}'}: "
        + (f"{kind[1]} tokens x {kind[2]} values" if kind[2] else "a cache shared with another layer")
        for kind in kinds
    )
    layout = f"; {model.kv_layout}" if model.kv_layout else ""
    return kv, f"KV cache ({convention} convention){layout}, {sequences} sequence(s); " + by_kind
