"""``memsweep estimate``'s parsed options as arguments of the estimators."""

from __future__ import annotations

import argparse
import dataclasses

from memsweep.conf.contract import RunSpec, validate_workload

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
    from memsweep.conf.contract import SpecError, validate_device

    try:
        if validate_device(text) != "auto":
            return text
    except SpecError:
        pass
    raise argparse.ArgumentTypeError(f"invalid device {text!r}: expected {ESTIMATE_DEVICES}")


MLP_DEFAULTS = {
    **{k: v for k, v in validate_workload({"name": "mlp"}).items() if k in ("depth", "activation")},
    **{f.name: f.default for f in dataclasses.fields(RunSpec) if f.name in ("dtype", "mode", "warmup", "repeats")},
}
"""``--workload mlp``'s options with a default (argparse leaves them None, so that one given
elsewhere is seen and refused): the worker's mlp defaults, read from ``conf.contract``
(``validate_workload``'s mlp parameters, ``RunSpec``'s fields)."""

MLP_ONLY = ("context", "width", "hidden", *MLP_DEFAULTS)
"""``memsweep estimate``'s options (argparse destinations) that apply to ``--workload mlp`` only."""

_ELSEWHERE = {
    "dtype": "; the weights' storage is --format (--base-format with --lora-rank)",
    "mode": "; elsewhere ask for training with --train",
    "hidden": "; a transformer's MLP is --ffn-hidden",
}


def check_applicable(args: argparse.Namespace) -> None:
    """Refuse an option given that the estimate asked for would ignore.

    * the mlp's options (``MLP_ONLY``) apply to ``--workload mlp`` only;
    * ``--device`` applies to ``--workload mlp`` and to a training estimate of a ``--config``
      (``--train`` or ``--lora-rank``), where it decides whether AdamW's step tensors are
      device memory (``training.counts_step_tensors``);
    * the LoRA options need ``--lora-rank`` (the rule of the hf workload's settings,
      ``conf.contract.lora_settings_without_rank``; ``--adapter-bytes`` too).

    Args:
        args: ``memsweep estimate``'s parsed options (the mlp's defaults still None).

    Raises:
        UsageError: naming the option and what it applies to.
    """
    from memsweep.conf.contract import lora_settings_without_rank

    from .errors import UsageError

    if args.workload is None:
        for name in MLP_ONLY:
            if getattr(args, name) is not None:
                option = "--" + name.replace("_", "-")
                raise UsageError(f"{option} applies to --workload mlp{_ELSEWHERE.get(name, '')}")
        if args.device is not None and not (args.config is not None and (args.train or args.lora_rank is not None)):
            raise UsageError(
                "--device applies to --workload mlp and to training with --config (--train or --lora-rank: "
                "whether AdamW's step tensors are device memory)"
            )
    given = lora_settings_without_rank(vars(args))
    if args.lora_rank is None and args.adapter_bytes is not None:
        given.append("adapter_bytes")
    if given:
        raise UsageError(f"--{given[0].replace('_', '-')} needs --lora-rank (no LoRA adapters without it)")


def step_tensor_rule(args: argparse.Namespace) -> tuple[bool, str | None]:
    """Whether a ``--config`` training estimate counts AdamW's step tensors, and the note that says why not.

    ``--device cpu``: counted (``training.counts_step_tensors``, the run estimates' rule; the
    note comes from ``training_state``); ``--device cuda[:N]``: not counted (PyTorch keeps them
    on the host, ``training.ADAM_STEP_NOTE``); no ``--device``: not counted, and the note says
    which option counts them. Optimizers other than AdamW have none.

    Args:
        args: ``memsweep estimate``'s parsed options (``optimizer``, ``device``).

    Returns:
        (count them, a note for the output or None).
    """
    from .training import ADAM_STEP_NOTE, counts_step_tensors

    if args.optimizer != "adamw":
        return False, None
    if args.device is None:
        return False, (
            "AdamW's per-tensor step (4 B each) is not counted: no --device given (--device cpu counts it; on "
            "CUDA PyTorch keeps it on the host)"
        )
    counted = counts_step_tensors(args.optimizer, args.device)
    return counted, None if counted else ADAM_STEP_NOTE
