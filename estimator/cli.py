"""``memsweep estimate``: calculated memory of a load, before anything runs.

    memsweep estimate --parameters 7000000000 --bits 16 --reserve-gib 4
    memsweep estimate --parameters 7000000000 --format nf4 --double-quant
    memsweep estimate --parameters 7000000000 --bits 16 --train --zero-stage 3 --devices 8
    memsweep estimate --config path/to/config.json --kv-tokens 8192 --sequences 4
    memsweep estimate --config path/to/config.json --train --activations --batch 1 --seq-len 4096
    memsweep estimate --config path/to/config.json --lora-rank 16 --base-format nf4 --double-quant
    memsweep estimate --layers 32 --kv-heads 8 --head-dim 128 --kv-tokens 8192
    memsweep estimate --workload mlp --batch 8 --context 128 --width 256 --mode train

Prints the breakdown (weights, gradients, optimizer states, activations, KV cache, temporaries)
in bytes, GB (10^9 B) and GiB (2^30 B) columns, the reserve (an assumption) and the total with it;
a component not asked for is not in the sum, and the output says so. Exit status 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from fractions import Fraction
from typing import Any

from memsweep.conf.contract import GB, GiB

from .activations import RECOMPUTE, transformer_layer_activation_bytes
from .applicable import check_options
from .breakdown import Breakdown
from .cli_args import ESTIMATE_DEVICES, MLP_DEFAULTS, activation_options, check_applicable, device_arg, step_tensor_rule
from .cli_output import estimate_text, format_phases
from .counted import COUNTERS, CountUnavailable, describe_config
from .errors import UsageError
from .formats import DTYPE_FORMATS, StorageFormat, compact_format, storage_format, weight_bytes
from .kv_cache import KV_CONVENTIONS, kv_cache_bytes, layer_cached_tokens, resolve_head_dim
from .labels import recipe_word
from .lora_cli import add_lora_options, lora_from_args
from .training import OPTIMIZERS, TRAINING_RECIPES, training_state, zero_partition
from .transformer import estimate_transformer
from .workloads import ACTIVATION_SAVES_OUTPUT, PhaseEstimate, estimate_mlp, mlp_phases

__all__ = ["RESERVE_UNITS", "build_parser", "estimate_load", "format_phases", "main", "run"]

RESERVE_UNITS = {"reserve_gib": GiB, "reserve_gb": GB}
"""Bytes per unit of the reserve options: ``--reserve-gib`` (2^30 B), ``--reserve-gb`` (10^9 B)."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``memsweep estimate`` (its help is this module's docstring).

    Returns:
        an ``argparse.ArgumentParser`` with the model, weights, training state,
        activations, KV cache, workload and output option groups.
    """
    p = argparse.ArgumentParser(
        prog="memsweep estimate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _model_options(p)
    _weight_options(p)
    _training_options(p)
    add_lora_options(p)
    _activation_options(p)
    _kv_options(p)
    _workload_options(p)
    _output_options(p)
    return p


def _model_options(p: argparse.ArgumentParser) -> None:
    """The model description: ``--parameters``, ``--config`` or ``--workload``."""
    m = p.add_argument_group("model (one of)")
    m.add_argument("--parameters", type=int, help="dense parameter count")
    m.add_argument(
        "--config", metavar="PATH", help="a local Hugging Face config.json (or its directory); never downloads"
    )
    m.add_argument("--workload", choices=["mlp"], help="a memsweep built-in workload (exact estimate)")
    m.add_argument(
        "--count-with",
        default="auto",
        choices=COUNTERS,
        help="who counts a --config's parameters: transformers (the model built on the meta device, in a worker "
        "process), parser (memsweep's formulas; refuses keys it does not model), auto (transformers if installed)",
    )


def _weight_options(p: argparse.ArgumentParser) -> None:
    """The weights' storage: ``--bits`` or ``--format``, block scales, kept modules."""
    w = p.add_argument_group("weights")
    w.add_argument("--bits", type=int, help="compact storage, BITS per parameter, no scales")
    w.add_argument(
        "--format", dest="fmt", help="storage format with its scales: fp32, fp16, bf16, int8, nf4, fp4, int4"
    )
    w.add_argument("--block-size", type=int, help="values per block scale (nf4/fp4 default 64, int8 4096, int4 128)")
    w.add_argument("--double-quant", action="store_true", help="QLoRA double quantization of the scales")
    w.add_argument(
        "--keep",
        action="append",
        default=[],
        metavar="FORMAT:COUNT",
        help="COUNT parameters kept in FORMAT (e.g. bf16:262144000 for embeddings and lm_head)",
    )


def _training_options(p: argparse.ArgumentParser) -> None:
    """Gradients, optimizer states and ZeRO (``--train``)."""
    t = p.add_argument_group("training state (--train)")
    t.add_argument("--train", action="store_true", help="add gradients and optimizer states")
    t.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS)
    t.add_argument(
        "--mixed-precision",
        dest="mixed",
        action="store_true",
        default=None,
        help="fp32 master copy and fp32 optimizer states (default for 16-bit weights)",
    )
    t.add_argument("--no-mixed-precision", dest="mixed", action="store_false")
    t.add_argument(
        "--precision",
        choices=list(TRAINING_RECIPES),
        help="the recipe in Lightning's words, for --parameters/--config: bf16-mixed, 16-mixed (fp32 master copy "
        "and states), bf16-true, 16-true, 32-true (every value in the weights' format); sets --format and "
        "--[no-]mixed-precision",
    )
    t.add_argument("--grad-bytes", type=int, help="bytes per gradient value (default: the weight's)")
    t.add_argument(
        "--state-bytes",
        type=int,
        help="bytes per optimizer-state value (default 4 with mixed precision, else the weight's)",
    )
    t.add_argument(
        "--zero-stage", type=int, default=0, choices=[0, 1, 2, 3], help="ZeRO stage (Rajbhandari et al. 2020)"
    )
    t.add_argument("--devices", type=int, default=1, help="data-parallel devices for ZeRO")


def _activation_options(p: argparse.ArgumentParser) -> None:
    """Training activations of a described transformer (``--activations``)."""
    a = p.add_argument_group("activations (--activations: a transformer by Korthikanti et al. 2022)")
    a.add_argument(
        "--activations",
        action="store_true",
        help="add training activations (needs --batch, --seq-len and --config or --layers/--hidden-size/--heads)",
    )
    a.add_argument("--batch", type=int, help="batch (sequences per step; the mlp's batch)")
    a.add_argument("--seq-len", type=int, help="tokens per sequence")
    a.add_argument("--recompute", default="none", choices=RECOMPUTE)
    a.add_argument("--fused-attention", action="store_true", help="FlashAttention-style: no s x s scores stored")
    a.add_argument("--no-dropout", dest="dropout", action="store_false", help="no dropout masks")
    a.add_argument("--no-head", action="store_true", help="leave out the output layer and fp32 logits")
    a.add_argument("--hidden-size", type=int)
    a.add_argument("--heads", type=int, help="attention (query) heads")
    a.add_argument("--ffn-hidden", type=int, help="MLP hidden size (default 4 x hidden)")
    a.add_argument("--gated-mlp", action="store_true", help="SwiGLU-style MLP (three matrices)")
    a.add_argument("--act-bytes", type=int, default=2, help="bytes per activation value (default 2)")


def _kv_options(p: argparse.ArgumentParser) -> None:
    """The KV cache of a described transformer (``--kv-tokens``)."""
    k = p.add_argument_group("KV cache (--kv-tokens)")
    k.add_argument("--kv-tokens", type=int, help="tokens per sequence in the cache (prompt + generated)")
    k.add_argument("--sequences", type=int, help="sequences cached at once (default: --batch or 1)")
    k.add_argument("--layers", type=int)
    k.add_argument("--kv-heads", type=int, help="KV heads (grouped-query attention), not query heads")
    k.add_argument("--head-dim", type=int, help="explicit head dimension; wins over hidden/heads")
    k.add_argument("--kv-bytes", type=int, help="bytes per cached value (default 2)")
    k.add_argument("--sliding-window", type=int, help="tokens kept per layer at most")
    k.add_argument("--static-cache", type=int, metavar="CAPACITY", help="static cache preallocating CAPACITY tokens")
    k.add_argument(
        "--kv-convention",
        default="window",
        choices=KV_CONVENTIONS,
        help="what a sliding-window layer caches: window (at most its window: what transformers' DynamicCache holds "
        "after a decode step, and memsweep's generate mode measures), full (every token, as paged servers allocate)",
    )


def _workload_options(p: argparse.ArgumentParser) -> None:
    """The options of memsweep's own mlp workload (``--workload mlp``)."""
    x = p.add_argument_group("memsweep workload (--workload mlp)")
    x.add_argument("--context", type=int)
    x.add_argument("--width", type=int)
    x.add_argument("--depth", type=int, help="default 4")
    x.add_argument("--hidden", type=int, help="mlp hidden (default 4 x width)")
    x.add_argument("--activation", choices=sorted(ACTIVATION_SAVES_OUTPUT), help="default gelu")
    x.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], help="default float32")
    x.add_argument("--mode", choices=["inference", "train"], help="default inference")
    x.add_argument(
        "--device",
        type=device_arg,
        help=ESTIMATE_DEVICES + "; default cpu. Also decides, in a --config training estimate, whether "
        "AdamW's step tensors are counted (on the CPU: yes; on CUDA PyTorch keeps them on the host)",
    )
    x.add_argument("--warmup", type=int, help="default 3")
    x.add_argument("--repeats", type=int, help="default 5")


def _output_options(p: argparse.ArgumentParser) -> None:
    """The reserve (an assumption) and the output's form."""
    o = p.add_argument_group("output")
    r = o.add_mutually_exclusive_group()
    r.add_argument("--reserve-gib", type=str, help="reserve (an assumption) in GiB = 2^30 B")
    r.add_argument("--reserve-gb", type=str, help="reserve (an assumption) in GB = 10^9 B")
    o.add_argument("--json", action="store_true", help="print JSON (bytes) instead of the table")
    o.add_argument("--decimals", type=int, default=2, help="decimals of the GB and GiB columns")


def _reserve(args: argparse.Namespace) -> int:
    for attr, unit in RESERVE_UNITS.items():
        text = getattr(args, attr)
        if text is not None:
            try:
                value = Fraction(text)
            except (ValueError, ZeroDivisionError):
                raise UsageError(f"--{attr.replace('_', '-')} {text!r}: expected a number") from None
            if value < 0:
                raise UsageError(f"--{attr.replace('_', '-')} must be >= 0")
            return int(-(-value * unit // 1))
    return 0


def _apply_recipe(args: argparse.Namespace) -> None:
    """``--precision RECIPE``: the weights' format and mixed precision it names (``TRAINING_RECIPES``).

    Raises:
        UsageError: without --train, with --workload or --lora-rank, or beside --format, --bits or
            --[no-]mixed-precision.
    """
    recipe = getattr(args, "precision", None)
    if recipe is None:
        return
    if not args.train or args.workload or args.lora_rank is not None:
        raise UsageError(
            "--precision is the recipe of a full training estimate (--train with --parameters or --config); "
            "--workload mlp's replay keeps every value in its --dtype (bf16-true with --dtype bfloat16)"
        )
    if args.fmt is not None or args.bits is not None or args.mixed is not None:
        raise UsageError("give --precision or --format/--bits/--[no-]mixed-precision, not both")
    args.fmt, args.mixed = TRAINING_RECIPES[recipe]


def _weight_format(args: argparse.Namespace, default: str | None) -> StorageFormat:
    if args.bits is not None and args.fmt is not None:
        raise UsageError("give --bits or --format, not both")
    if args.bits is not None:
        if args.block_size is not None or args.double_quant:
            raise UsageError("--bits is compact storage without scales; use --format nf4/int8 for block scales")
        return compact_format(args.bits)
    name = args.fmt or default
    if name is None:
        raise UsageError("give the weights' storage: --bits N or --format NAME")
    return storage_format(name, block_size=args.block_size, double_quant=args.double_quant)


def _kept(args: argparse.Namespace) -> dict[str, int]:
    kept: dict[str, int] = {}
    for item in args.keep:
        name, _, count = item.partition(":")
        if not count.isdigit():
            raise UsageError(f"--keep {item!r}: expected FORMAT:COUNT, e.g. bf16:262144000")
        storage_format(name)
        kept[name] = kept.get(name, 0) + int(count)
    return kept


def _fmt_words(fmt: StorageFormat) -> str:
    if fmt.block_size is None:
        if fmt.name.endswith("-bit"):
            return f"{fmt.bits} bits each (compact storage, no scales)"
        return f"{fmt.name}: {fmt.bits} bits each"
    scales = (
        "8-bit scales, double-quantized"
        if fmt.double_quant
        else f"{fmt.scale_bytes}-byte scale per block of {fmt.block_size}"
    )
    return f"{fmt.name}: {fmt.bits} bits each + {scales}"


def _param_bytes(fmt: StorageFormat, train: bool) -> int:
    if train and (fmt.block_size is not None or fmt.bits % 8):
        raise UsageError(
            f"full training of a model stored in {fmt.name} is not estimated (a quantized base is "
            "frozen): train adapters with --lora-rank R --base-format " + fmt.name
        )
    return fmt.bits // 8


def _dense(args: argparse.Namespace) -> tuple[Breakdown, str]:
    """--parameters N: weights, training state, activations from given dims, KV cache."""
    fmt = _weight_format(args, None)
    weights = weight_bytes(args.parameters, fmt, _kept(args))
    title = f"{args.parameters} parameters, {_fmt_words(fmt)}"
    b = Breakdown(weights=weights)
    if args.keep:
        b = b.with_note(
            "kept in another precision: " + ", ".join(f"{c} parameters in {n}" for n, c in _kept(args).items())
        )
    if fmt.block_size is None and fmt.name.endswith("-bit") and fmt.bits < 16:
        b = b.with_note(
            "a real quantized load adds block scales and keeps some modules in 16 bits: "
            "try --format nf4 / int8 and --keep"
        )
    if args.train:
        pb = _param_bytes(fmt, True)
        mixed = args.mixed if args.mixed is not None else pb == 2
        state = training_state(
            args.parameters,
            param_bytes=pb,
            optimizer=args.optimizer,
            mixed_precision=mixed,
            grad_bytes=args.grad_bytes,
            state_bytes=args.state_bytes,
        )
        b = b.replace(
            gradients=state.gradients,
            optimizer_states=state.optimizer_states,
            notes=b.notes + state.notes + (f"optimizer {args.optimizer}",),
        )
    if args.activations:
        b = b.replace(activations=_bare_activations(args))
    b = zero_partition(b, args.zero_stage, args.devices) if args.train else b
    if args.kv_tokens is not None:
        b = b.replace(kv_cache=_bare_kv(args))
    return b, title


def _require(args: argparse.Namespace, names: tuple[str, ...], needs: str) -> None:
    """Raise UsageError ``<needs> (missing --<first name missing>)`` unless every option of
    ``names`` (argparse destinations) was given."""
    missing = [f for f in names if getattr(args, f) is None]
    if missing:
        raise UsageError(f"{needs} (missing --{missing[0].replace('_', '-')})")


def _options(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    """The options ``names`` (argparse destinations) as keyword arguments."""
    return {name: getattr(args, name) for name in names}


def _bare_activations(args: argparse.Namespace) -> int:
    _require(
        args,
        ("batch", "seq_len", "layers", "hidden_size", "heads"),
        "--activations without --config needs --batch, --seq-len, --layers, --hidden-size, --heads",
    )
    kw = _options(args, ("kv_heads", "head_dim", "ffn_hidden", "gated_mlp", "act_bytes", "dropout", "fused_attention"))
    layer = transformer_layer_activation_bytes(
        args.seq_len, args.batch, args.hidden_size, args.heads, recompute=args.recompute, **kw
    )
    total = args.layers * layer
    if args.recompute == "full":
        total += transformer_layer_activation_bytes(args.seq_len, args.batch, args.hidden_size, args.heads, **kw)
    return total


def _bare_kv(args: argparse.Namespace) -> int:
    if args.layers is None or args.kv_heads is None:
        raise UsageError(
            "--kv-tokens without --config needs --layers and --kv-heads (KV heads, not query heads) "
            "and --head-dim (or --hidden-size and --heads)"
        )
    head_dim = resolve_head_dim(args.hidden_size, args.heads, args.head_dim)
    tokens = layer_cached_tokens(args.kv_tokens, args.sliding_window, args.kv_convention, args.static_cache)
    return kv_cache_bytes(
        layers=args.layers,
        kv_heads=args.kv_heads,
        head_dim=head_dim,
        tokens=tokens,
        bytes_per_value=args.kv_bytes or 2,
        sequences=_sequences(args),
    )


def _sequences(args: argparse.Namespace) -> int:
    return args.sequences if args.sequences is not None else (args.batch or 1)


def _from_config(args: argparse.Namespace) -> tuple[Breakdown, str]:
    try:
        model = describe_config(args.config, args.count_with)
    except CountUnavailable as exc:
        raise UsageError(str(exc)) from None
    if args.sliding_window is not None:
        model = model.with_sliding_window(args.sliding_window)
    default = DTYPE_FORMATS.get(str(model.dtype), "bf16")
    if args.lora_rank is not None:
        if args.kv_tokens is not None:
            raise UsageError("--kv-tokens does not apply to --lora-rank (a training estimate)")
        return lora_from_args(args, model, default)
    if args.base_format is not None:
        raise UsageError("--base-format is the frozen base of --lora-rank; without it use --format")
    fmt = _weight_format(args, default)
    compute = 4 if fmt.name == "fp32" else 2
    if args.activations and (args.batch is None or args.seq_len is None):
        raise UsageError("--activations needs --batch and --seq-len")
    pb = _param_bytes(fmt, args.train) if args.train else 2
    steps, steps_note = step_tensor_rule(args)
    mixed = args.mixed if args.mixed is not None else pb == 2
    b = estimate_transformer(
        model,
        weight_format=fmt,
        compute_bytes=compute,
        train=args.train,
        optimizer=args.optimizer,
        mixed_precision=mixed,
        grad_bytes=args.grad_bytes,
        state_bytes=args.state_bytes,
        zero_stage=args.zero_stage,
        devices=args.devices,
        step_tensors=args.train and steps,
        activations=activation_options(args),
        kv_tokens=args.kv_tokens,
        kv_sequences=_sequences(args) if args.kv_tokens is not None else None,
        kv_bytes=args.kv_bytes,
        static_capacity=args.static_cache,
        kv_convention=args.kv_convention,
    )
    if args.train and steps_note:
        b = b.with_note(steps_note)
    active = f" ({model.active} active per token)" if model.experts else ""
    return (
        b,
        f"{args.config}: {model.parameters} parameters{active}, counted by {model.source}; weights {_fmt_words(fmt)}",
    )


def _workload(args: argparse.Namespace) -> tuple[Breakdown, str, list[PhaseEstimate]]:
    for flag in ("bits", "fmt", "parameters", "config"):
        if getattr(args, flag) not in (None, [], False):
            raise UsageError(f"--{flag.replace('fmt', 'format')} does not apply to --workload (its dtype decides)")
    if args.train or args.activations or args.kv_tokens is not None:
        raise UsageError("--workload mlp is estimated whole: use --mode train instead of --train/--activations")
    _require(args, ("batch", "context", "width"), "--workload mlp needs --batch, --context and --width")
    given = {k: getattr(args, k) for k in MLP_DEFAULTS if getattr(args, k) is not None}
    kw = {**MLP_DEFAULTS, **given, "hidden": args.hidden, "device": args.device or "cpu"}
    phases = mlp_phases(args.batch, args.context, args.width, **kw)
    b = estimate_mlp(args.batch, args.context, args.width, **kw)
    title = (
        f"mlp workload: batch={args.batch} context={args.context} width={args.width} depth={kw['depth']} "
        f"hidden={args.hidden or 4 * args.width} {kw['activation']} {kw['dtype']} {kw['mode']} on {kw['device']}"
    )
    if kw["mode"] == "train":  # the replay's recipe, named (a run's default in 16 bits is mixed)
        title += f", precision=pure ({recipe_word({'mode': 'train', 'dtype': kw['dtype'], 'precision': 'pure'})})"
    return b, title, phases


def estimate_load(args: argparse.Namespace) -> tuple[Breakdown, str, list[PhaseEstimate]]:
    """Estimate the load that ``args`` describe (``memsweep estimate`` and ``memsweep.estimate``).

    Args:
        args: ``build_parser()``'s parsed options.

    Returns:
        (the breakdown in bytes, reserve included; what was estimated, one line; a workload
        estimate's phases, or []).

    Raises:
        UsageError: options that do not describe one load.
        ValueError: a value the estimator rejects (``memsweep.estimator``).
        FileNotFoundError: a ``--config`` that does not exist.
    """
    sources = [s for s in ("parameters", "config", "workload") if getattr(args, s) is not None]
    if len(sources) > 1:
        raise UsageError("give one model description: --parameters, --config or --workload")
    if args.zero_stage and not args.train and args.lora_rank is None:
        raise UsageError("--zero-stage partitions training state: add --train")
    if args.lora_rank is not None and args.config is None:
        raise UsageError("--lora-rank needs --config (the adapters' shapes come from the model's Linear modules)")
    if args.keep and args.parameters is None:
        raise UsageError("--keep applies to --parameters (a config keeps embeddings, lm_head and norms in 16 bits)")
    check_applicable(args)
    check_options(args, vars(build_parser().parse_args([])))
    _apply_recipe(args)
    phases: list[PhaseEstimate] = []
    if args.workload:
        b, title, phases = _workload(args)
    elif args.config:
        b, title = _from_config(args)
    elif args.parameters is not None:
        b, title = _dense(args)
    elif args.kv_tokens is not None or args.activations:
        b = Breakdown(
            kv_cache=_bare_kv(args) if args.kv_tokens is not None else None,
            activations=_bare_activations(args) if args.activations else None,
        )
        title = "described layers only (no weights given)"
    else:
        raise UsageError(
            "nothing to estimate: give --parameters N with --bits/--format, --config PATH, "
            "--workload mlp, or --kv-tokens with the cache's dimensions"
        )
    return b.replace(reserve=_reserve(args)), title, phases


def run(args: argparse.Namespace, out=None) -> int:
    """Estimate the load that ``args`` describe (``estimate_load``) and print it: the table, or
    JSON in bytes.

    Args:
        args: ``build_parser()``'s parsed options.
        out: where to print (default ``sys.stdout``).

    Returns:
        0.

    Raises:
        UsageError, ValueError, FileNotFoundError: as ``estimate_load``.
    """
    b, title, phases = estimate_load(args)
    print(estimate_text(b, title, phases, json_output=args.json, decimals=args.decimals), file=out or sys.stdout)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``memsweep estimate``: parse ``argv``, print the estimate.

    Args:
        argv: the options (default ``sys.argv[1:]``).

    Returns:
        the exit status: 0, or 2 on bad input (the error printed to stderr); argparse exits
        with 2 itself on unknown options.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (UsageError, ValueError, FileNotFoundError) as exc:
        print(f"memsweep estimate: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
