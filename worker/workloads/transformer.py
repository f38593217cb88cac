"""The ``transformer`` workload (the decoder-only LM of ``worker.models``) and the inputs and
loss shared by the causal-LM workloads (``TokenWorkload``)."""

from __future__ import annotations

import torch
from torch import nn

from memsweep.conf.contract import RunSpec

from ..models import KVCache, Transformer
from .base import Workload
from .losses import lm_loss


def transformer_dims(spec: RunSpec) -> dict:
    """The transformer's resolved shape: nulls replaced by their defaults (hidden = width,
    kv_heads = heads, head_dim = hidden / heads, ffn_hidden = 4 * hidden).

    Args:
        spec: a spec of workload ``transformer`` (its ``workload`` parameters validated).

    Returns:
        The keyword arguments of ``worker.models.Transformer``: layers, hidden, heads, kv_heads,
        head_dim, ffn_hidden, vocab (ints), attention, norm, ffn (str), tie_embeddings (bool).
    """
    w = spec.workload
    hidden = w["hidden"] if w["hidden"] is not None else spec.width
    return {
        "layers": w["layers"],
        "hidden": hidden,
        "heads": w["heads"],
        "kv_heads": w["kv_heads"] if w["kv_heads"] is not None else w["heads"],
        "head_dim": w["head_dim"] if w["head_dim"] is not None else hidden // w["heads"],
        "ffn_hidden": w["ffn_hidden"] if w["ffn_hidden"] is not None else 4 * hidden,
        "vocab": w["vocab"],
        "attention": w["attention"],
        "norm": w["norm"],
        "ffn": w["ffn"],
        "tie_embeddings": w["tie_embeddings"],
    }


class TokenWorkload(Workload):
    """Inputs and loss of a causal LM: ids (batch, context) uniform in [0, vocab); target =
    ids shifted left by one (next token); next-token cross-entropy."""

    vocab = 0

    def make_inputs(self, batch, generator, with_target):
        """Token ids (batch, context) int64 and, when ``with_target``, the next-token target."""
        ids = torch.randint(0, self.vocab, (batch, self.spec.context), device=self.device, generator=generator)
        return ids, (torch.roll(ids, -1, dims=1) if with_target else None)

    def loss_fn(self, output, target):
        """``lm_loss``: next-token cross-entropy on float32 logits (batch, context, vocab)."""
        return lm_loss(output, target)


class TransformerWorkload(TokenWorkload):
    """memsweep's decoder-only LM (``worker.models.Transformer``, shape from ``transformer_dims``)
    on token ids; generation with ``worker.models.KVCache`` (dynamic or static, spec
    ``kv_cache``) of context + new_tokens tokens."""

    name = "transformer"

    def __init__(self, spec, device, run_dir=None):
        super().__init__(spec, device, run_dir)
        self.dims = transformer_dims(spec)
        self.vocab = self.dims["vocab"]

    def build_model(self) -> nn.Module:
        """``Transformer(**dims)`` with random weights."""
        return Transformer(**self.dims)

    def prefill(self, ids):
        """(logits (batch, 1, vocab) of the last prompt position, a new KVCache) for ids (batch, context)."""
        capacity = self.spec.context + self.spec.new_tokens
        cache = KVCache(self.dims["layers"], self.spec.kv_cache, capacity)
        return self._built_model()(ids, cache, 0, last_only=True), cache

    def decode(self, token, cache, position):
        """(logits (batch, 1, vocab), the cache) for one token (batch, 1) at ``position``."""
        return self._built_model()(token, cache, position, last_only=True), cache

    def cache_tensors(self, cache):
        """The KVCache's key and value tensors."""
        return cache.tensors()

    def model_info(self) -> dict:
        """``Workload.model_info`` plus ``dims`` (``transformer_dims``)."""
        return {**super().model_info(), "dims": self.dims}
