"""KV cache: the head dimension, the tokens a cache holds, and its bytes.

Source: Hugging Face transformers docs, "KV cache strategies" / "Caching"; Ainslie et
al. 2023 (grouped-query attention).
"""

from __future__ import annotations

from .breakdown import check_int


def resolve_head_dim(hidden_size: int | None, num_attention_heads: int | None, head_dim: int | None = None) -> int:
    """The attention head dimension: an explicit ``head_dim`` takes precedence.

    Models such as Gemma set ``head_dim`` (256) different from hidden/heads (3072/16 =
    192); using hidden/heads there would be wrong. Otherwise ``hidden_size //
    num_attention_heads``, which must divide exactly.

    Args:
        hidden_size: the model's hidden size, or ``None``.
        num_attention_heads: query heads, or ``None``.
        head_dim: the explicit head dimension (a config's ``head_dim``), or ``None``.

    Returns:
        the head dimension (int >= 1), a count, not bytes.

    Raises:
        ValueError: no head_dim and hidden/heads missing or not dividing.
    """
    if head_dim is not None:
        return check_int("head_dim", head_dim, 1)
    if not hidden_size or not num_attention_heads:
        raise ValueError("head_dim needs either an explicit head_dim or hidden_size and num_attention_heads")
    if hidden_size % num_attention_heads:
        raise ValueError(
            f"hidden_size {hidden_size} is not divisible by num_attention_heads "
            f"{num_attention_heads}: give head_dim explicitly"
        )
    return hidden_size // num_attention_heads


def cached_tokens(tokens: int, *, sliding_window: int | None = None, static_capacity: int | None = None) -> int:
    """Tokens one sequence holds in one layer's cache.

    * dynamic cache (Hugging Face ``DynamicCache``): every token so far, ``tokens``;
    * sliding window: at most ``sliding_window`` tokens are kept (older ones dropped);
    * static cache (``StaticCache``, ``cache_implementation="static"``): the whole
      ``static_capacity`` (``max_cache_len``) is preallocated, however few tokens are used;
      with a sliding window, ``min(static_capacity, sliding_window)``.

    Source: Hugging Face transformers docs, "KV cache strategies" / "Caching".

    Args:
        tokens: tokens of the sequence so far (prompt + generated).
        sliding_window: tokens a sliding-window layer keeps at most, or ``None``.
        static_capacity: a static cache's preallocated length (``max_cache_len``), or
            ``None`` for a dynamic cache.

    Returns:
        tokens held (int), a count, not bytes.

    Raises:
        ValueError: more tokens than the static capacity, ``tokens`` < 0, or a static
            capacity < 1.
    """
    check_int("tokens", tokens)
    if static_capacity is not None:
        check_int("static_capacity", static_capacity, 1)
        if tokens > static_capacity:
            raise ValueError(f"{tokens} tokens do not fit a static cache of {static_capacity}")
        return min(static_capacity, sliding_window) if sliding_window else static_capacity
    return min(tokens, sliding_window) if sliding_window else tokens


KV_CONVENTIONS = ("window", "full")
"""What a sliding-window (or chunked-attention) layer's cache holds, named in every KV figure:

* ``window`` (default): at most ``sliding_window`` tokens. That is what the storages of Hugging
  Face transformers' ``DynamicCache`` hold after a decode step (``DynamicSlidingWindowLayer
  .update`` in ``transformers/cache_utils.py``, 5.x, keeps a view of the last
  ``sliding_window - 1`` tokens of the step's concatenation of ``sliding_window`` tokens), and
  so what memsweep's ``generate`` mode measures for an ``hf`` model
  (tests/test_estimate_counts.py); a prefill alone still holds the whole prompt, until the
  first decode step;
* ``full``: every token in every layer, as a paged server that does not special-case
  sliding layers allocates.
"""


def layer_cached_tokens(
    tokens: int, window: int | None, convention: str = "window", static_capacity: int | None = None
) -> int:
    """Tokens one sequence holds in one layer's cache under a ``KV_CONVENTIONS`` convention.

    Args:
        tokens: tokens of the sequence so far (prompt + generated).
        window: the layer's sliding window (or attention chunk), ``None`` for a full layer.
        convention: one of ``KV_CONVENTIONS``.
        static_capacity: a static cache's preallocated length, or ``None``
            (``cached_tokens``; a static sliding layer holds ``min(capacity, window)``).

    Returns:
        tokens held (int), a count.

    Raises:
        ValueError: an unknown convention, or as ``cached_tokens``.
    """
    if convention not in KV_CONVENTIONS:
        raise ValueError(f"unknown KV cache convention {convention!r}: expected one of {', '.join(KV_CONVENTIONS)}")
    window = None if convention == "full" else window
    return cached_tokens(tokens, sliding_window=window, static_capacity=static_capacity)


def kv_cache_bytes(
    *, layers: int, kv_heads: int, head_dim: int, tokens: int, bytes_per_value: int = 2, sequences: int = 1
) -> int:
    """Bytes of a dense, uniform KV cache: ``2 x layers x kv_heads x head_dim x tokens x
    bytes_per_value x sequences`` (the 2 is K and V).

    Use the model's KV heads (``num_key_value_heads``), not its query heads: with
    grouped-query attention (Ainslie et al. 2023) several query heads share one KV head.
    ``tokens`` is what one sequence keeps per layer (see ``cached_tokens``).

    Source: Hugging Face transformers docs ("KV cache strategies"). For example 32 layers x 8
    KV heads x 128 x 8192 tokens x 2 bytes x 1 sequence = 1_073_741_824 B = 1 GiB.

    Args:
        layers: decoder layers.
        kv_heads: key/value heads per layer.
        head_dim: head dimension.
        tokens: tokens one sequence keeps per layer.
        bytes_per_value: bytes per cached value (>= 1; 2 for fp16/bf16).
        sequences: sequences cached at once.

    Returns:
        bytes (int).

    Raises:
        ValueError: a negative count, or ``bytes_per_value`` < 1.
    """
    return (
        2
        * check_int("layers", layers)
        * check_int("kv_heads", kv_heads)
        * check_int("head_dim", head_dim)
        * check_int("tokens", tokens)
        * check_int("bytes_per_value", bytes_per_value, 1)
        * check_int("sequences", sequences)
    )
