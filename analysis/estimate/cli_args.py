"""``memsweep estimate``'s parsed options as arguments of the estimators."""

from __future__ import annotations

import argparse

from .activations import ActivationSettings


def activation_options(args: argparse.Namespace) -> ActivationSettings:
    """The activation options of a ``--config`` estimate (``estimate_transformer``, ``estimate_lora``).

    Args:
        args: ``memsweep estimate``'s parsed options.

    Returns:
        ``batch`` and ``seq_len`` (None unless ``--activations``), ``recompute``,
        ``fused_attention``, ``dropout`` and ``include_head`` (not ``--no-head``).
    """
    return ActivationSettings(
        batch=args.batch if args.activations else None,
        seq_len=args.seq_len if args.activations else None,
        recompute=args.recompute,
        fused_attention=args.fused_attention,
        dropout=args.dropout,
        include_head=not args.no_head,
    )
