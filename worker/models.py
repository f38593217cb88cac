"""The built-in models, in plain PyTorch, with random weights (nothing is downloaded).

``MLP``: a small dense network. ``Transformer``: a decoder-only language model
(embedding, ``layers`` pre-norm blocks of attention + feed-forward, a final norm, a
vocabulary head) with grouped-query attention, rotary position embedding and a KV cache
(``KVCache``) for generation.

Shapes: token ids (batch, tokens) int64 -> logits (batch, tokens, vocab); inside a block,
hidden states (batch, tokens, hidden); queries (batch, heads, tokens, head_dim); keys and
values (batch, kv_heads, tokens, head_dim).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from memsweep.conf.contract import KV_CACHES

ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU, "tanh": nn.Tanh}


class MLP(nn.Module):
    """``depth`` blocks Linear(width, hidden) -> activation -> Linear(hidden, width).

    Input and output shape: (batch, context, width).
    """

    def __init__(self, width: int, hidden: int, depth: int, activation: str = "gelu"):
        super().__init__()
        self.blocks = nn.Sequential(
            *[
                nn.Sequential(nn.Linear(width, hidden), ACTIVATIONS[activation](), nn.Linear(hidden, width))
                for _ in range(depth)
            ]
        )
        self.checkpointing = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (batch, context, width) through every block (each one checkpointed, non-reentrant
        torch.utils.checkpoint, when ``checkpointing`` is on in training with grad enabled)."""
        for block in self.blocks:
            if self.checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return x


class KVCache:
    """Keys and values of every layer, each (batch, kv_heads, tokens, head_dim).

    ``dynamic``: each update concatenates the new tokens (the cache grows token by token,
    and a concatenation briefly holds the old and the new tensor). ``static``: the first
    update allocates room for ``capacity`` tokens per layer and later updates write into it
    (Hugging Face calls this a static cache). The tensors take the dtype of the first keys
    (the compute dtype, also under autocast).

    Size (bytes): 2 * layers * kv_heads * head_dim * tokens * bytes_per_value * batch, with
    tokens = ``length`` (dynamic) or ``capacity`` (static); ``nbytes()`` measures it from the
    tensors themselves.
    """

    def __init__(self, layers: int, kind: str = "dynamic", capacity: int | None = None):
        if kind not in KV_CACHES:
            raise ValueError(f"kv cache kind {kind!r}: expected dynamic or static")
        if kind == "static" and not capacity:
            raise ValueError("a static KV cache needs its capacity in tokens")
        self.kind, self.capacity = kind, capacity
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers
        self.length = 0  # tokens held (the same in every layer)

    def update(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k``, ``v`` (batch, kv_heads, new, head_dim) at positions start..start+new-1;
        return all keys and values held for this layer (batch, kv_heads, start+new, head_dim)."""
        end = start + k.shape[2]
        keys, values = self.keys[layer], self.values[layer]
        if self.kind == "dynamic":
            if keys is None or values is None:
                out_k, out_v = k, v
            else:
                out_k, out_v = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
            self.keys[layer], self.values[layer] = out_k, out_v
        else:
            capacity = self.capacity
            assert capacity is not None  # a static cache is built with its capacity (__init__)
            if end > capacity:
                raise ValueError(f"static KV cache full: {end} tokens > capacity {capacity}")
            if keys is None or values is None:
                shape = (k.shape[0], k.shape[1], capacity, k.shape[3])
                keys = torch.zeros(shape, dtype=k.dtype, device=k.device)
                values = torch.zeros(shape, dtype=v.dtype, device=v.device)
                self.keys[layer], self.values[layer] = keys, values
            keys[:, :, start:end] = k
            values[:, :, start:end] = v
            out_k, out_v = keys[:, :, :end], values[:, :, :end]
        if layer == len(self.keys) - 1:
            self.length = end
        return out_k, out_v

    def tensors(self) -> list[torch.Tensor]:
        """The keys and values held (every layer's keys, then every layer's values; none before the first update)."""
        return [t for t in self.keys + self.values if t is not None]

    def nbytes(self) -> int:
        """Bytes of the cache's tensors (their storages: a static cache counts its capacity)."""
        return sum(t.untyped_storage().nbytes() for t in self.tensors())


def rotary(positions: torch.Tensor, head_dim: int, theta: float = 10000.0):
    """float32 cos and sin tables (tokens, head_dim) for rotary position embedding (Su et al.
    2021, RoFormer, arXiv:2104.09864), in the half-split layout used by Llama and GPT-NeoX."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = torch.outer(positions.to(torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def _causal_mask(tokens: int, keys: int, device) -> torch.Tensor:
    """Boolean (tokens, keys), True where query i may attend key j: j <= i + keys - tokens."""
    q = torch.arange(tokens, device=device).unsqueeze(1)
    k = torch.arange(keys, device=device).unsqueeze(0)
    return k <= q + (keys - tokens)


class Attention(nn.Module):
    """Multi-head attention with ``kv_heads`` K/V heads shared by groups of query heads.

    ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch picks a fused
    kernel when it can: the (tokens, keys) score matrix need not exist in memory).
    ``eager``: the textbook computation, softmax(Q K^T / sqrt(head_dim)) V, which materialises
    the (batch, heads, tokens, keys) score matrix (and its float32 softmax), with K and V
    repeated to every query head, as Hugging Face's eager attention does.
    """

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, attention: str):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.attention = heads, kv_heads, head_dim, attention
        self.q = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, hidden, bias=False)

    def forward(self, x, cos, sin, cache: KVCache | None = None, layer: int = 0, start: int = 0):
        """Hidden states x (batch, tokens, hidden) at positions start..start+tokens-1 -> (batch,
        tokens, hidden); ``cos``, ``sin`` (tokens, head_dim) from ``rotary``; keys and values
        stored in ``cache`` under ``layer`` when given. Causal: position i attends keys <= i."""
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _apply_rotary(q, cos, sin), _apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.update(layer, start, k, v)
        s = k.shape[2]
        groups = self.heads // self.kv_heads
        if self.attention == "sdpa":
            mask, causal = None, t > 1 and t == s
            if t > 1 and t != s:
                mask = _causal_mask(t, s, x.device)
            if groups > 1:
                try:
                    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
                except TypeError:  # PyTorch < 2.5: no enable_gqa
                    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
                    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        else:
            if groups > 1:
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            if t > 1:
                scores = scores.masked_fill(~_causal_mask(t, s, x.device), float("-inf"))
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            y = torch.matmul(probs, v)
        return self.o(y.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class FeedForward(nn.Module):
    """``gelu``: Linear(hidden, ffn) -> GELU -> Linear(ffn, hidden) (GPT-2);
    ``swiglu``: Linear(ffn, hidden)(silu(Linear(hidden, ffn) x) * Linear(hidden, ffn) x)
    (Shazeer 2020, arXiv:2002.05202; Llama)."""

    def __init__(self, hidden: int, ffn_hidden: int, kind: str):
        super().__init__()
        self.kind = kind
        self.up = nn.Linear(hidden, ffn_hidden, bias=False)
        self.gate = nn.Linear(hidden, ffn_hidden, bias=False) if kind == "swiglu" else None
        self.down = nn.Linear(ffn_hidden, hidden, bias=False)

    def forward(self, x):
        """x (..., hidden) -> (..., hidden)."""
        if self.gate is not None:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Pre-norm block: x + attention(norm(x)), then x + feed_forward(norm(x))."""

    def __init__(self, hidden, heads, kv_heads, head_dim, ffn_hidden, attention, norm, ffn):
        super().__init__()
        make_norm = (lambda: nn.RMSNorm(hidden, eps=1e-6)) if norm == "rmsnorm" else (lambda: nn.LayerNorm(hidden))
        self.norm1, self.norm2 = make_norm(), make_norm()
        self.attn = Attention(hidden, heads, kv_heads, head_dim, attention)
        self.ffn = FeedForward(hidden, ffn_hidden, ffn)

    def forward(self, x, cos, sin, cache: KVCache | None = None, layer: int = 0, start: int = 0):
        """x (batch, tokens, hidden) -> (batch, tokens, hidden); arguments as ``Attention.forward``."""
        x = x + self.attn(self.norm1(x), cos, sin, cache, layer, start)
        return x + self.ffn(self.norm2(x))


class Transformer(nn.Module):
    """Decoder-only language model: token ids (batch, tokens) -> logits (batch, tokens, vocab).

    Parameters (no biases): embedding vocab*hidden; per layer 2 norms, Q and O
    hidden*heads*head_dim each, K and V hidden*kv_heads*head_dim each, feed-forward
    2 (gelu) or 3 (swiglu) * hidden*ffn_hidden; final norm; head vocab*hidden (shared with
    the embedding when ``tie_embeddings``).
    """

    def __init__(
        self,
        layers: int,
        hidden: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        ffn_hidden: int,
        vocab: int,
        attention: str = "sdpa",
        norm: str = "rmsnorm",
        ffn: str = "gelu",
        tie_embeddings: bool = False,
    ):
        super().__init__()
        self.layers, self.head_dim = layers, head_dim
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(
            [Block(hidden, heads, kv_heads, head_dim, ffn_hidden, attention, norm, ffn) for _ in range(layers)]
        )
        self.norm = nn.RMSNorm(hidden, eps=1e-6) if norm == "rmsnorm" else nn.LayerNorm(hidden)
        # A tied head gets no weight of its own (not even briefly, which would show in model_load's peak).
        self.head = nn.Linear(hidden, vocab, bias=False, device="meta" if tie_embeddings else None)
        if tie_embeddings:
            self.head.weight = self.embed.weight
        self.checkpointing = False

    def forward(
        self, ids: torch.Tensor, cache: KVCache | None = None, start: int = 0, last_only: bool = False
    ) -> torch.Tensor:
        """Logits for ``ids`` at positions start..start+tokens-1 (only the last position's,
        shape (batch, 1, vocab), when ``last_only``, as a generation's prefill needs)."""
        x = self.embed(ids)
        positions = torch.arange(start, start + ids.shape[1], device=ids.device)
        cos, sin = rotary(positions, self.head_dim)
        for i, block in enumerate(self.blocks):
            if self.checkpointing and self.training and torch.is_grad_enabled() and cache is None:
                x = checkpoint(block, x, cos, sin, use_reentrant=False)
            else:
                x = block(x, cos, sin, cache, i, start)
        x = self.norm(x)
        if last_only:
            x = x[:, -1:]
        return self.head(x)
