"""Model descriptions: a decoder-only transformer read from a local Hugging Face config.json,
and its whole estimate (weights, training state, activations, KV cache).

Never downloads. Sources: the Hugging Face config keys of llama, mistral, qwen2, gemma and
gpt2; the other modules of this package for each component.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .activations import transformer_layer_activation_bytes
from .breakdown import Breakdown, ceil_div
from .formats import StorageFormat, storage_format, weights_from_shapes
from .kv_cache import cached_tokens, kv_cache_bytes, resolve_head_dim
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
        """Every parameter tensor (shapes as PyTorch stores them: Linear (out, in)).

        Per layer: the norms, q/k/v/o projections (q and o with ``heads x head_dim``, k and
        v with ``kv_heads x head_dim`` rows), the MLP's two or three matrices and the biases
        the config asks for; around them the token embedding, learned positions if any, the
        final norm and, unless tied, ``lm_head`` (the llama/gpt2 layouts of Hugging Face
        transformers' modeling files).

        Returns:
            the ParamTensors, in that order.
        """
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

    @property
    def parameters(self) -> int:
        """Total parameter count (tied embeddings counted once)."""
        return sum(t.numel for t in self.tensors())

    def kv_layer_tokens(self, tokens: int, static_capacity: int | None = None) -> list[int]:
        """Tokens each layer's cache holds for one sequence (see ``cached_tokens``).

        Args:
            tokens: tokens of the sequence so far.
            static_capacity: a static cache's preallocated length, or ``None``.

        Returns:
            one token count per layer (a sliding-window layer keeps at most
            ``sliding_window``).

        Raises:
            ValueError: as ``cached_tokens``.
        """
        out = []
        for i in range(self.layers):
            sliding = (
                self.sliding_window
                if (self.layer_types is None or self.layer_types[i] == "sliding_attention")
                else None
            )
            out.append(cached_tokens(tokens, sliding_window=sliding, static_capacity=static_capacity))
        return out


def _get(cfg: Mapping, *keys: str, default: Any = None) -> Any:
    """The value of the first of ``keys`` that ``cfg`` holds and is not null, else ``default``."""
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

    Args:
        cfg: the parsed config.json (a mapping).

    Returns:
        a TransformerConfig.

    Raises:
        ValueError: not a mapping, a required key is missing, or hidden/heads that do not
            divide without an explicit ``head_dim``.
    """
    if not isinstance(cfg, Mapping):
        raise ValueError("a config must be a JSON object")
    model_type = str(cfg.get("model_type") or ("gpt2" if "n_embd" in cfg else "llama"))
    gpt2_like = model_type in ("gpt2", "gpt_bigcode") or "n_embd" in cfg
    layers = _get(cfg, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _get(cfg, "hidden_size", "n_embd", "d_model")
    heads = _get(cfg, "num_attention_heads", "n_head")
    vocab = _get(cfg, "vocab_size")
    missing = [
        n
        for n, v in (
            ("num_hidden_layers", layers),
            ("hidden_size", hidden),
            ("num_attention_heads", heads),
            ("vocab_size", vocab),
        )
        if v is None
    ]
    if missing:
        raise ValueError(f"config has no {missing[0]} (nor its gpt2-style alias)")
    head_dim = resolve_head_dim(hidden, heads, _get(cfg, "head_dim"))
    kv_heads = _get(cfg, "num_key_value_heads", default=heads)
    # what every architecture reads the same way
    shape: dict[str, Any] = {
        "model_type": model_type,
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "vocab": vocab,
        "dtype": _get(cfg, "torch_dtype", "dtype"),
    }
    if gpt2_like:
        return TransformerConfig(
            **shape,
            ffn_hidden=_get(cfg, "n_inner", "intermediate_size", default=4 * hidden),
            gated_mlp=False,
            tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            learned_positions=_get(cfg, "n_positions", "max_position_embeddings", default=0),
            norm="layernorm",
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
            sliding_window=None,
        )
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False:
        window = None
    layer_types = cfg.get("layer_types")
    attention_bias = bool(cfg.get("attention_bias", model_type == "qwen2"))
    return TransformerConfig(
        **shape,
        ffn_hidden=_get(cfg, "intermediate_size", default=4 * hidden),
        gated_mlp=True,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        norm="rmsnorm",
        qkv_bias=attention_bias,
        o_bias=attention_bias and model_type != "qwen2",
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        sliding_window=window,
        layer_types=tuple(layer_types) if layer_types else None,
    )


def load_hf_config(path: str | Path) -> TransformerConfig:
    """Read a local ``config.json`` (a file, or a directory holding one). Never downloads.

    A multimodal config whose language model sits under ``text_config`` (and that has no
    ``num_hidden_layers`` of its own) is read from that ``text_config``.

    Args:
        path: the config.json, or its directory.

    Returns:
        a TransformerConfig (``parse_hf_config``).

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
    batch: int | None = None,
    seq_len: int | None = None,
    recompute: str = "none",
    fused_attention: bool = False,
    dropout: bool = True,
    include_head: bool = True,
    kv_tokens: int | None = None,
    kv_sequences: int | None = None,
    kv_bytes: int | None = None,
    static_capacity: int | None = None,
    reserve: int = 0,
    step_tensors: bool = False,
) -> Breakdown:
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

    Args:
        model: the described transformer.
        weight_format: storage of the weights (a ``StorageFormat`` or a name); with block
            scales, the tensors that are not quantized are kept in bf16 (``compute_bytes``
            2) or fp32.
        compute_bytes: bytes per activation value (2: 16-bit, 4: fp32).
        train: add gradients, optimizer states and (with ``batch`` and ``seq_len``)
            activations.
        optimizer, mixed_precision, grad_bytes, state_bytes, step_tensors: as
            ``training_state``; the gradient default is the weight's bytes,
            ``ceil(bits / 8)``.
        zero_stage, devices: as ``zero_partition`` (applied when ``train``).
        batch, seq_len: sequences per micro-batch and tokens per sequence (activations).
        recompute, fused_attention, dropout: as ``transformer_layer_activation_bytes``.
        include_head: add the output layer's activations.
        kv_tokens: tokens per sequence in the cache (prompt + generated), or ``None`` for no
            KV cache.
        kv_sequences: sequences cached at once; default ``batch`` or 1.
        kv_bytes: bytes per cached value; default ``compute_bytes``.
        static_capacity: a static cache's preallocated length, or ``None``.
        reserve: the planning reserve, bytes (an assumption, not in ``peak``).

    Returns:
        a Breakdown, bytes, with notes saying what was assumed.

    Raises:
        ValueError: an unknown format, optimizer or recompute, a bad size or ZeRO stage, or
            more ``kv_tokens`` than ``static_capacity``.
    """
    fmt = storage_format(weight_format) if isinstance(weight_format, str) else weight_format
    tensors = model.tensors()
    params = sum(t.numel for t in tensors)
    keep = "bf16" if compute_bytes == 2 else "fp32"
    weights = weights_from_shapes(tensors, fmt, keep_format=keep)
    b = Breakdown(
        weights=weights,
        reserve=reserve,
        notes=(
            f"{model.model_type}: {params} parameters, {model.layers} layers, hidden {model.hidden}, "
            f"{model.heads} heads / {model.kv_heads} KV heads x head_dim {model.head_dim}",
        ),
    )
    if train:
        param_bytes = max(1, ceil_div(fmt.bits, 8))
        state = training_state(
            params,
            param_bytes=param_bytes,
            optimizer=optimizer,
            mixed_precision=mixed_precision,
            grad_bytes=grad_bytes,
            state_bytes=state_bytes,
            shapes=[t.shape for t in tensors],
            step_tensors=step_tensors,
        )
        b = b.replace(gradients=state.gradients, optimizer_states=state.optimizer_states, notes=b.notes + state.notes)
        if batch and seq_len:
            kw = dict(
                kv_heads=model.kv_heads,
                head_dim=model.head_dim,
                ffn_hidden=model.ffn_hidden,
                gated_mlp=model.gated_mlp,
                act_bytes=compute_bytes,
                dropout=dropout,
                fused_attention=fused_attention,
            )
            layer = transformer_layer_activation_bytes(
                seq_len, batch, model.hidden, model.heads, recompute=recompute, **kw
            )
            acts = model.layers * layer
            if recompute == "full":
                acts += transformer_layer_activation_bytes(seq_len, batch, model.hidden, model.heads, **kw)
            if include_head:
                sbh = seq_len * batch * model.hidden
                acts += 2 * sbh * compute_bytes + 4 * seq_len * batch * model.vocab + (sbh if dropout else 0)
            b = b.replace(activations=acts).with_note(
                f"activations: Korthikanti et al. 2022, recompute={recompute}, "
                f"{'fused attention (no s x s scores)' if fused_attention else 'scores materialised'}, "
                f"{'with' if dropout else 'without'} dropout"
            )
        b = zero_partition(b, zero_stage, devices)
    if kv_tokens is not None:
        seqs = kv_sequences if kv_sequences is not None else (batch or 1)
        per_layer = model.kv_layer_tokens(kv_tokens, static_capacity)
        kv = sum(
            kv_cache_bytes(
                layers=1,
                kv_heads=model.kv_heads,
                head_dim=model.head_dim,
                tokens=t,
                bytes_per_value=kv_bytes or compute_bytes,
                sequences=seqs,
            )
            for t in per_layer
        )
        b = b.replace(kv_cache=kv).with_note(
            f"KV cache: {model.kv_heads} KV heads x head_dim {model.head_dim}, {seqs} sequence(s), "
            f"{max(per_layer) if per_layer else 0} tokens kept per layer at most"
        )
    return b
