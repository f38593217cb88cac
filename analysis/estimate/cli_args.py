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


ESTIMATE_DEVICES = "cpu (the worker's tracker), cuda or cuda:N (512-byte blocks)"
"""What ``memsweep estimate --device`` accepts: a resolved device of ``conf.contract.validate_device``."""


def device_arg(text: str) -> str:
    """``memsweep estimate --device``'s argparse type: a device the estimate knows how to count for.

    Args:
        text: the value given.

    Returns:
        ``text``, unchanged (``cpu``, ``cuda`` or ``cuda:N``).

    Raises:
        argparse.ArgumentTypeError: anything else (``auto`` too: an estimate names its device),
            with the values accepted; argparse prints it naming ``--device`` and exits 2.
    """
    from conf.contract import SpecError, validate_device

    try:
        if validate_device(text) != "auto":
            return text
    except SpecError:
        pass
    raise argparse.ArgumentTypeError(f"invalid device {text!r}: expected {ESTIMATE_DEVICES}")
