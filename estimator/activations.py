"""Transformer activations kept for backward (Korthikanti et al. 2022), with recomputation.

Sources: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models"; Dao et al. 2022 (FlashAttention); Chen et al. 2016 (full recomputation).
"""

from __future__ import annotations

import dataclasses

from .breakdown import check_int
from .kv_cache import resolve_head_dim

RECOMPUTE = ("none", "selective", "full")
"""Activation recomputation strategies (Korthikanti et al. 2022, Sec. 5; Chen et al. 2016),
see ``transformer_layer_activation_bytes``."""


@dataclasses.dataclass(frozen=True)
class ActivationSettings:
    """Which training activations an estimate counts, and how (``training_activations``).

    Attributes:
        batch: sequences per micro-batch (b); activations are counted only with ``batch`` and
            ``seq_len`` both set (``counted``).
        seq_len: tokens per sequence (s).
        recompute: one of ``RECOMPUTE`` (Korthikanti et al. 2022, Sec. 5; Chen et al. 2016).
        fused_attention: FlashAttention-style attention, no s x s scores stored (Dao et al. 2022).
        dropout: count the dropout masks and outputs (the base model's dropout, not LoRA's).
        include_head: add the output layer's activations (Korthikanti et al. 2022, Sec. 4.2).
    """

    batch: int | None = None
    seq_len: int | None = None
    recompute: str = "none"
    fused_attention: bool = False
    dropout: bool = True
    include_head: bool = True

    @property
    def counted(self) -> bool:
        """Whether activations are counted: ``batch`` and ``seq_len`` both given (non-zero)."""
        return bool(self.batch and self.seq_len)


NO_ACTIVATIONS = ActivationSettings()
"""No batch or sequence length: activations not counted (the estimators' default)."""


def run_activations(
    batch: int | None, seq_len: int | None, checkpointing: bool | None, attention
) -> ActivationSettings:
    """The activation settings of a memsweep training run (a transformer or hf workload's spec).

    Args:
        batch: the run's micro-batch (spec ``batch``).
        seq_len: its tokens per sequence (spec ``context``).
        checkpointing: spec ``checkpointing`` (every block: full recomputation).
        attention: the workload's ``attention`` (``sdpa``: fused, no s x s scores stored).

    Returns:
        The settings; no dropout (memsweep's workloads have none), the output layer included.
    """
    return ActivationSettings(
        batch, seq_len, "full" if checkpointing else "none", fused_attention=attention == "sdpa", dropout=False
    )


def korthikanti_layer_bytes(seq: int, batch: int, hidden: int, heads: int) -> int:
    """Activation bytes stored by one transformer layer for backward: ``sbh(34 + 5as/h)``.

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
    Models", Sec. 4.1, Eq. (1): 16-bit activations, 1-byte dropout masks, a 4h MLP, no
    tensor parallelism. Shapes: s = ``seq``, b = ``batch``, h = ``hidden``, a = ``heads``.
    Equal to ``34*s*b*h + 5*a*s*s*b`` (exact integer).

    Args:
        seq: tokens per sequence (s).
        batch: sequences per micro-batch (b).
        hidden: hidden size (h).
        heads: attention heads (a).

    Returns:
        bytes (int).

    Raises:
        ValueError: a size that is not an integer >= 1.
    """
    for name, v in (("seq", seq), ("batch", batch), ("hidden", hidden), ("heads", heads)):
        check_int(name, v, 1)
    return 34 * seq * batch * hidden + 5 * heads * seq * seq * batch


def transformer_layer_activation_bytes(
    seq: int,
    batch: int,
    hidden: int,
    heads: int,
    *,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    ffn_hidden: int | None = None,
    gated_mlp: bool = False,
    act_bytes: int = 2,
    dropout: bool = True,
    fused_attention: bool = False,
    recompute: str = "none",
) -> int:
    """Bytes one decoder layer keeps for backward, by the per-tensor count of Korthikanti
    et al. 2022 (Sec. 4.1), generalised to GQA, gated MLPs, any activation width.

    The attention's tensors (``_attention_bytes``), the MLP's (``_mlp_bytes``) and the two
    norms' inputs, 2 x sbh values (s seq, b batch, h hidden). With kv_heads = heads, head_dim
    = hidden/heads, ffn_hidden = 4h, 2-byte values and dropout this is the paper's
    ``sbh(34 + 5as/h)``. ``recompute``: ``none``; ``selective`` (the paper's Sec. 5: the
    attention core is recomputed, its as^2b terms are not stored: 34sbh per layer); ``full``
    (only the layer input, sbh values, is kept; Chen et al. 2016, the paper's 2sbhL).

    Args:
        seq: tokens per sequence (s).
        batch: sequences per micro-batch (b).
        hidden: hidden size (h).
        heads: attention (query) heads (a).
        kv_heads: key/value heads (k), grouped-query attention; default ``heads``.
        head_dim: head dimension (d); default ``hidden // heads`` (``resolve_head_dim``).
        ffn_hidden: MLP hidden size (f); default 4h.
        gated_mlp: a SwiGLU-style MLP (three matrices) instead of the 4h GELU MLP.
        act_bytes: bytes per activation value (2 for 16-bit activations).
        dropout: count the dropout masks and outputs.
        fused_attention: FlashAttention-style attention (no s x s scores stored).
        recompute: one of ``RECOMPUTE``.

    Returns:
        bytes (int).

    Raises:
        ValueError: a non-positive size, an unknown ``recompute``, or hidden/heads that
            do not divide without an explicit ``head_dim``.
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    s, b, h, a = (check_int(n, v, 1) for n, v in (("seq", seq), ("batch", batch), ("hidden", hidden), ("heads", heads)))
    k = a if kv_heads is None else check_int("kv_heads", kv_heads, 1)
    d = resolve_head_dim(h, a, head_dim)
    f = 4 * h if ffn_hidden is None else check_int("ffn_hidden", ffn_hidden, 1)
    e = check_int("act_bytes", act_bytes, 1)
    if recompute == "full":
        return s * b * h * e
    attn = _attention_bytes(s, b, h, a, k, d, e, dropout=dropout, fused=fused_attention, recompute=recompute)
    norms = 2 * s * b * h * e
    return attn + _mlp_bytes(s * b, h, f, e, gated=gated_mlp, dropout=dropout) + norms


def _attention_bytes(
    s: int, b: int, h: int, a: int, k: int, d: int, e: int, *, dropout: bool, fused: bool, recompute: str
) -> int:
    """Bytes the attention block keeps (Korthikanti et al. 2022, Sec. 4.1), values of ``e`` bytes.

    QKV input sbh; Q sbad; K and V sbkd each; softmax output as^2b; with dropout a 1-byte
    mask as^2b and the dropout output as^2b; output-projection input sbad; with dropout a
    1-byte mask sbh (s seq, b batch, h hidden, a heads, k kv heads, d head dim). ``fused``
    (FlashAttention: the s x s scores are never materialised) drops every as^2b term and
    keeps the fp32 softmax log-sum-exp, 4 bytes x bas (Dao et al. 2022); ``recompute``
    ``selective`` drops the as^2b terms too.
    """
    sbh = s * b * h
    attn = (sbh + s * b * a * d + 2 * s * b * k * d + s * b * a * d) * e + (sbh if dropout else 0)
    if fused:
        attn += 4 * b * a * s
    elif recompute == "none":
        scores = a * s * s * b
        attn += scores * e + ((scores + scores * e) if dropout else 0)
    return attn


def _mlp_bytes(tokens: int, h: int, f: int, e: int, *, gated: bool, dropout: bool) -> int:
    """Bytes the MLP block keeps for ``tokens`` = sb tokens (Korthikanti et al. 2022, Sec. 4.1).

    Input sbh; a 4h-style MLP: activation input sbf and second-linear input sbf; gated
    (SwiGLU): gate sbf, up sbf, activation output sbf, product sbf; with dropout a 1-byte
    mask sbh; values of ``e`` bytes (h hidden, f MLP hidden).
    """
    sbh = tokens * h
    return sbh * e + (4 if gated else 2) * tokens * f * e + (sbh if dropout else 0)
