"""memsweep's formula parser of a local Hugging Face config.json: the fallback when
transformers is not installed (``counted.describe_config`` prefers the library's own count).

It knows a short list of dense decoder layouts (``PARSER_MODEL_TYPES``) and refuses, naming
them, the config keys that change the model's shape in ways it does not model (experts,
latent attention, other layer kinds...) rather than return a wrong number. Sources: the
``modeling_*.py`` / ``configuration_*.py`` files of llama, mistral, qwen2, qwen3, gemma,
gemma2, gemma3, phi3 and gpt2 in Hugging Face transformers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memsweep.conf.contract import RecordError, bounded_bytes

from .attention import UnknownAttention, read_attention
from .kv_cache import resolve_head_dim
from .transformer import TransformerConfig

PARSER_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "gpt2")
"""The model types whose parameter layout the parser writes out (dense decoders)."""

TIED_BY_DEFAULT = ("gpt2", "gemma", "gemma2", "gemma3_text")
"""Model types whose config class ties ``lm_head`` to the embedding when the key is absent."""

REFUSED_KEYS = {
    "num_local_experts": "mixture of experts",
    "num_experts": "mixture of experts",
    "n_routed_experts": "mixture of experts",
    "moe_num_experts": "mixture of experts",
    "moe_intermediate_size": "mixture of experts",
    "n_shared_experts": "shared experts",
    "shared_expert_intermediate_size": "shared experts",
    "kv_lora_rank": "multi-head latent attention",
    "q_lora_rank": "multi-head latent attention",
    "attention_chunk_size": "chunked attention",
    "linear_num_value_heads": "linear attention layers",
    "mamba_d_state": "state-space layers",
    "ssm_state_size": "state-space layers",
    "altup_num_inputs": "AltUp layers",
    "num_kv_shared_layers": "KV sharing between layers",
}
"""Config keys that change the shape of a model in ways the parser does not model; a config
holding one (with a value other than null/0/false) is refused, naming the key."""

KNOWN_LAYER_TYPES = ("full_attention", "sliding_attention")


class UnknownConfig(ValueError):
    """The formula parser does not understand a config: the message names the keys."""


def _get(cfg: Mapping, *keys: str, default: Any = None) -> Any:
    """The value of the first of ``keys`` that ``cfg`` holds and is not null, else ``default``."""
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def refused_keys(cfg: Mapping) -> list[str]:
    """The keys of ``cfg`` the parser cannot count (``REFUSED_KEYS``, unknown ``layer_types``).

    Args:
        cfg: a parsed config.json.

    Returns:
        ``"key (what it means)"`` texts, empty when the parser understands the config.
    """
    found = [f"{k} ({why})" for k, why in REFUSED_KEYS.items() if cfg.get(k) not in (None, 0, False, [], "")]
    kinds = sorted({t for t in cfg.get("layer_types") or () if t not in KNOWN_LAYER_TYPES})
    if kinds:
        found.append(f"layer_types {kinds} (layer kinds other than {' / '.join(KNOWN_LAYER_TYPES)})")
    return found


def _layer_types(cfg: Mapping, model_type: str, layers: int) -> tuple[str, ...] | None:
    """Per-layer attention kinds: the config's, else its class's default (gemma2: alternate,
    gemma3: every ``sliding_window_pattern``-th layer full; configuration_gemma2/3.py)."""
    if cfg.get("layer_types"):
        return tuple(cfg["layer_types"])
    if model_type == "gemma2":
        return tuple("sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers))
    if model_type == "gemma3_text":
        pattern = cfg.get("sliding_window_pattern", 6)
        return tuple("sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers))
    return None


def parse_hf_config(cfg: Mapping) -> TransformerConfig:
    """A Hugging Face style config of a dense decoder -> TransformerConfig, by formula.

    Keys read: ``num_hidden_layers``/``n_layer``, ``hidden_size``/``n_embd``,
    ``num_attention_heads``/``n_head``, the K/V heads by ``attention.read_attention``
    (``num_key_value_heads``, ``multi_query``...; none: the attention heads), ``head_dim``
    (explicit value wins over hidden/heads),
    ``intermediate_size``/``n_inner`` (gpt2 default 4h), ``vocab_size``,
    ``tie_word_embeddings`` (default: the config class's, true for gpt2 and the gemmas),
    ``sliding_window`` (ignored when ``use_sliding_window`` is false), ``layer_types``,
    ``attention_bias``, ``mlp_bias``, ``torch_dtype``/``dtype``. Per model type: qwen3 and
    gemma3 add per-head query/key RMSNorms (``q_norm``, ``k_norm``, head_dim each), gemma2
    and gemma3 two more norms per layer; gpt2 (``model_type`` gpt2, or ``n_embd`` keys):
    learned positions (``n_positions``), LayerNorm with bias, biases on every Linear, a 4h
    GELU MLP.

    Args:
        cfg: the parsed config.json (a mapping).

    Returns:
        a TransformerConfig (``source`` names the parser).

    Raises:
        UnknownConfig: a key the parser does not model (``REFUSED_KEYS``), an unknown layer
            kind, or a ``model_type`` outside ``PARSER_MODEL_TYPES``: the message names them
            and says that transformers counts them.
        ValueError: not a mapping, a required key is missing, or hidden/heads that do not
            divide without an explicit ``head_dim``.
    """
    if not isinstance(cfg, Mapping):
        raise ValueError("a config must be a JSON object")
    model_type = str(cfg.get("model_type") or ("gpt2" if "n_embd" in cfg else "llama"))
    refused = refused_keys(cfg)
    if refused or model_type not in PARSER_MODEL_TYPES:
        what = "; ".join(refused) if refused else f"model_type {model_type!r}"
        raise UnknownConfig(
            f"memsweep's formula parser does not model {what} (it knows dense {', '.join(PARSER_MODEL_TYPES)}); "
            "install transformers (pip install 'memsweep[hf]') to count the model itself"
        )
    shape = _common_shape(cfg, model_type)
    if model_type == "gpt2":
        return TransformerConfig(
            **shape,
            ffn_hidden=_get(cfg, "n_inner", "intermediate_size", default=4 * shape["hidden"]),
            gated_mlp=False,
            learned_positions=_get(cfg, "n_positions", "max_position_embeddings", default=0),
            norm="layernorm",
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
        )
    return _gated_decoder(cfg, model_type, shape)


def _common_shape(cfg: Mapping, model_type: str) -> dict[str, Any]:
    """The fields of a TransformerConfig every architecture reads the same way (sizes, vocab,
    tied embeddings, dtype), by their llama or gpt2-style keys.

    Raises:
        ValueError: a required key is missing, or hidden/heads do not divide without an
            explicit ``head_dim``.
    """
    layers = _get(cfg, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _get(cfg, "hidden_size", "n_embd", "d_model")
    heads = _get(cfg, "num_attention_heads", "n_head")
    vocab = _get(cfg, "vocab_size")
    required = (("num_hidden_layers", layers), ("hidden_size", hidden), ("num_attention_heads", heads))
    missing = [n for n, v in (*required, ("vocab_size", vocab)) if v is None]
    if missing:
        raise ValueError(f"config has no {missing[0]} (nor its gpt2-style alias)")
    head_dim = resolve_head_dim(hidden, heads, _get(cfg, "head_dim"))
    try:
        layout = read_attention(cfg, heads, head_dim)
    except UnknownAttention as exc:
        raise UnknownConfig(f"memsweep's formula parser: {exc}") from None
    return {
        "model_type": model_type,
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": layout.kv_heads,
        "kv_layout": layout.describe() + " (read from the config's flags)",
        "head_dim": head_dim,
        "vocab": vocab,
        "tie_embeddings": bool(cfg.get("tie_word_embeddings", model_type in TIED_BY_DEFAULT)),
        "dtype": _get(cfg, "torch_dtype", "dtype"),
    }


def _gated_decoder(cfg: Mapping, model_type: str, shape: dict[str, Any]) -> TransformerConfig:
    """A llama-style decoder (RMSNorm, gated MLP) of ``shape``: its biases, per-head query/key
    norms (qwen3, gemma3), extra norms (gemma2, gemma3) and sliding-window layers."""
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False:
        window = None
    attention_bias = bool(cfg.get("attention_bias", model_type == "qwen2"))
    return TransformerConfig(
        **shape,
        ffn_hidden=_get(cfg, "intermediate_size", default=4 * shape["hidden"]),
        gated_mlp=True,
        norm="rmsnorm",
        qkv_bias=attention_bias,
        o_bias=attention_bias and model_type != "qwen2",
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=model_type in ("qwen3", "gemma3_text"),
        extra_layer_norms=2 if model_type in ("gemma2", "gemma3_text") else 0,
        sliding_window=window,
        layer_types=_layer_types(cfg, model_type, shape["layers"]) if window else None,
    )


def read_config_json(path: str | Path) -> dict:
    """A local ``config.json`` (a file, or a directory holding one) as a dict. Never downloads.

    A multimodal config whose language model sits under ``text_config`` (and that has no
    ``num_hidden_layers`` of its own) is returned as that ``text_config`` (its
    ``model_type`` kept).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not JSON, not a regular file (a FIFO, a device) or larger than
            ``conf.contract.record.MAX_DOCUMENT_BYTES``.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    try:  # a regular file of at most MAX_DOCUMENT_BYTES (never a FIFO, never /dev/zero read whole)
        data = json.loads(bounded_bytes(path, "config.json"))
    except RecordError as exc:
        raise ValueError(str(exc)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply to be a config.json (refused)") from None
    if isinstance(data, dict) and "text_config" in data and "num_hidden_layers" not in data:
        data = {**data["text_config"], "model_type": data["text_config"].get("model_type", data.get("model_type"))}
    return data


def load_hf_config(path: str | Path) -> TransformerConfig:
    """Read a local config.json with the formula parser (``parse_hf_config``).

    Args:
        path: the config.json, or its directory.

    Returns:
        a TransformerConfig.

    Raises:
        FileNotFoundError: no such file.
        UnknownConfig, ValueError: see ``parse_hf_config`` and ``read_config_json``.
    """
    return parse_hf_config(read_config_json(path))
