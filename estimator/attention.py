"""A config's attention layout read from its flags: how many K/V values one layer caches per token.

The reading used where the library that defines the model cannot build it here (the formula
parser, and a count whose cache could not be probed), and the name of the layout in every KV
figure. Each flag and its meaning is from the ``configuration_*.py`` / ``modeling_*.py`` files
of Hugging Face transformers (falcon, gpt_bigcode, llama, mpt, chatglm, deepseek_v2/v3,
gemma3n); a flag outside ``KNOWN_FLAGS`` that names an attention layout is not guessed at.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "n_kv_heads")
"""Config keys giving the K/V heads per layer directly (llama-style, falcon, RW falcon, others);
the first one set wins. ``num_key_value_heads: null`` means one per query head. chatglm's
``multi_query_group_num`` counts only with its ``multi_query_attention``."""

KNOWN_FLAGS = (
    *KV_HEAD_KEYS,
    "multi_query_group_num",
    "multi_query",
    "multi_query_attention",
    "new_decoder_architecture",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "q_lora_rank",
    "sliding_window",
    "use_sliding_window",
    "sliding_window_pattern",
    "max_window_layers",
    "layer_types",
    "num_kv_shared_layers",
    "attn_config",
)
"""The attention flags this reading understands (any other is refused by ``read_attention``)."""

LAYOUT_FLAG = re.compile(r"(^|_)(kv|key_value|query_group|multi_query|latent|kv_shared|attention_chunk|local_attn)")
"""A config key that names an attention layout (what a key outside ``KNOWN_FLAGS`` must not match)."""


class UnknownAttention(ValueError):
    """The config's attention flags do not say how many K/V values a layer caches."""


class AttentionLayout(NamedTuple):
    """One layer's cache layout: its ``kind``, K/V heads, values per token and the flags read.

    Attributes:
        kind: ``multi-head``, ``grouped-query``, ``multi-query`` or ``latent``.
        kv_heads: K/V heads per layer (1 for a latent cache: one shared latent).
        values_per_token: values one layer caches per token, K and V together.
        flags: the config flags that decided it, as ``key: value`` text.
    """

    kind: str
    kv_heads: int
    values_per_token: int
    flags: str

    def describe(self) -> str:
        """The layout in words, e.g. ``multi-query (multi_query: true): 1 K/V head``."""
        if self.kind == "latent":
            return f"latent ({self.flags}): {self.values_per_token} values per token and layer"
        heads = f"{self.kv_heads} K/V head{'s' if self.kv_heads != 1 else ''}"
        return f"{self.kind} ({self.flags}): {heads}"


def _flag(value: object) -> str:
    return "true" if value is True else "false" if value is False else "null" if value is None else str(value)


def _kind(kv_heads: int, heads: int) -> str:
    return "multi-query" if kv_heads == 1 else "multi-head" if kv_heads == heads else "grouped-query"


def _kv_heads(cfg: Mapping, heads: int) -> tuple[int, str]:
    """(K/V heads, the flags read) of a non-latent config (see ``read_attention``)."""
    model_type = cfg.get("model_type")
    if model_type == "falcon" and cfg.get("new_decoder_architecture"):
        # modeling_falcon.py: the new architecture's K/V are repeated to every query head before the cache
        return heads, "falcon new_decoder_architecture: true, K/V repeated to num_attention_heads"
    if cfg.get("multi_query") or (cfg.get("multi_query_attention") and model_type != "chatglm"):
        key = "multi_query" if cfg.get("multi_query") else "multi_query_attention"
        return 1, f"{key}: true"
    if model_type == "chatglm" and cfg.get("multi_query_attention"):
        return int(cfg["multi_query_group_num"]), f"multi_query_group_num: {cfg['multi_query_group_num']}"
    attn = cfg.get("attn_config")
    if isinstance(attn, Mapping) and attn.get("kv_n_heads"):
        return int(attn["kv_n_heads"]), f"attn_config.kv_n_heads: {attn['kv_n_heads']}"
    for key in KV_HEAD_KEYS:
        if cfg.get(key) is not None:
            value = cfg[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1 or heads % value:
                raise UnknownAttention(f"{key}: {_flag(value)} is not a head count dividing {heads} query heads")
            return value, f"{key}: {value}"
    if "num_key_value_heads" in cfg:
        return heads, "num_key_value_heads: null, one per query head"
    return heads, "no K/V head flag, one per query head"


def read_attention(cfg: Mapping, heads: int, head_dim: int) -> AttentionLayout:
    """One layer's cache layout from a config's flags.

    * ``kv_lora_rank`` set: multi-head latent attention (DeepSeek-V2/V3) caches its compressed
      latent and the rope key, ``kv_lora_rank + qk_rope_head_dim`` values per token
      (transformers ``DeepseekV2Attention``: ``cache.update(kv_nope, k_rot)``);
    * Falcon's ``new_decoder_architecture``: every query head (transformers repeats the
      ``num_kv_heads`` K/V heads before its cache);
    * ``multi_query: true`` (Falcon, GPT-BigCode) or ``multi_query_attention`` (not chatglm): 1;
    * chatglm's ``multi_query_attention``: ``multi_query_group_num``; MPT's
      ``attn_config.kv_n_heads``;
    * else the first of ``KV_HEAD_KEYS`` set; ``num_key_value_heads: null`` or no flag: one
      per query head (multi-head).

    Args:
        cfg: the config (a mapping of its keys).
        heads: query heads.
        head_dim: the head dimension.

    Returns:
        the layout; values per token = 2 x kv_heads x head_dim unless latent.

    Raises:
        UnknownAttention: a key naming an attention layout outside ``KNOWN_FLAGS``, or a K/V
            head count that is not one (the message names the key).
    """
    unknown = sorted(k for k in cfg if LAYOUT_FLAG.search(k) and k not in KNOWN_FLAGS and cfg[k] not in (None, False))
    if unknown:
        raise UnknownAttention(
            f"attention flags {', '.join(unknown)} are not understood: the KV cache is not estimated"
        )
    rank = cfg.get("kv_lora_rank")
    if rank:
        rope = cfg.get("qk_rope_head_dim") or 0
        return AttentionLayout("latent", 1, rank + rope, f"kv_lora_rank: {rank} + qk_rope_head_dim: {rope}")
    kv_heads, flags = _kv_heads(cfg, heads)
    return AttentionLayout(_kind(kv_heads, heads), kv_heads, 2 * kv_heads * head_dim, flags)


def shared_cache_layers(cfg: Mapping, layers: int) -> int:
    """Decoder layers that reuse an earlier layer's cache (Gemma 3n ``num_kv_shared_layers``:
    the last N layers read the cache of the last non-shared layer of their kind).

    Raises:
        UnknownAttention: a shared count that is not in [0, layers).
    """
    shared = cfg.get("num_kv_shared_layers") or 0
    if not isinstance(shared, int) or not 0 <= shared < layers:
        raise UnknownAttention(f"num_kv_shared_layers: {_flag(shared)} is not a count of layers below {layers}")
    return shared
