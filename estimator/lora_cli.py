"""``memsweep estimate --lora-rank``: the LoRA / QLoRA options and their estimate (``lora.py``)."""

from __future__ import annotations

import argparse

from .breakdown import Breakdown
from .cli_args import activation_options, step_tensor_rule
from .errors import UsageError
from .formats import storage_format
from .lora import ADAPTER_BYTES, ALL_LINEAR, LoraSettings, estimate_lora
from .transformer import TransformerConfig


def add_lora_options(parser: argparse.ArgumentParser) -> None:
    """Add the LoRA / QLoRA option group to ``memsweep estimate``'s parser.

    Args:
        parser: the parser (``cli.build_parser``).
    """
    lo = parser.add_argument_group("LoRA / QLoRA fine-tuning (--lora-rank, with --config)")
    lo.add_argument("--lora-rank", type=int, help="adapters of rank R: trainable r x (in + out) per adapted Linear")
    lo.add_argument(
        "--lora-targets",
        help=f"comma-separated module names (q_proj,v_proj) or {ALL_LINEAR}; default: peft's default for the "
        "architecture",
    )
    lo.add_argument("--lora-alpha", type=int, help="peft lora_alpha (scaling only, no memory; default 8)")
    lo.add_argument("--lora-dropout", type=float, help="peft lora_dropout (default 0.0)")
    lo.add_argument(
        "--adapter-bytes",
        type=int,
        choices=ADAPTER_BYTES,
        help="bytes per adapter value: 4 (default: peft casts adapters to fp32) or 2 (16-bit adapters, with the fp32 "
        "master copy)",
    )
    lo.add_argument(
        "--base-format",
        help="storage of the frozen base: bf16, fp16, fp32, int8, nf4, fp4 (with --double-quant: QLoRA); "
        "default the config's dtype",
    )


def lora_from_args(args: argparse.Namespace, model: TransformerConfig, default: str) -> tuple[Breakdown, str]:
    """The LoRA / QLoRA estimate ``args`` ask for (``--lora-rank``), and its title.

    Args:
        args: ``memsweep estimate``'s parsed options.
        model: the described model (``counted.describe_config``).
        default: the base's storage format when neither --base-format nor --format is given.

    Returns:
        (Breakdown, title).

    Raises:
        UsageError: options that do not combine with --lora-rank.
        ValueError: what ``estimate_lora`` rejects (unknown targets, no peft default).
    """
    if args.fmt is not None and args.base_format is not None:
        raise UsageError("give --base-format or --format, not both")
    if args.bits is not None:
        raise UsageError("--bits does not apply to --lora-rank: give --base-format")
    if args.zero_stage:
        raise UsageError("ZeRO partitioning of LoRA training is not estimated")
    if args.activations and (args.batch is None or args.seq_len is None):
        raise UsageError("--activations needs --batch and --seq-len")
    name = args.base_format or args.fmt or default
    fmt = storage_format(name, block_size=args.block_size, double_quant=args.double_quant)
    targets = None
    if args.lora_targets:
        targets = tuple(t.strip() for t in args.lora_targets.split(",") if t.strip())
    lora = LoraSettings(
        rank=args.lora_rank,
        alpha=args.lora_alpha,
        targets=targets,
        dropout=args.lora_dropout or 0.0,
        adapter_bytes=4 if args.adapter_bytes is None else args.adapter_bytes,
    )
    steps, steps_note = step_tensor_rule(args)
    b = estimate_lora(
        model,
        lora,
        base_format=fmt,
        compute_bytes=4 if fmt.name == "fp32" else 2,
        optimizer=args.optimizer,
        activations=activation_options(args),
        step_tensors=steps,
    )
    if steps_note:
        b = b.with_note(steps_note)
    kind = "QLoRA" if fmt.bits == 4 else "LoRA"
    return b, (
        f"{args.config}: {kind} fine-tuning of {model.parameters} parameters, counted by {model.source}; "
        f"frozen base {fmt.name}"
        + (" with double quantization" if fmt.double_quant else "")
        + (f"; on {args.device}" if args.device else "")
    )
