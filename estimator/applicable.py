"""Which ``memsweep estimate`` option each estimate applies: every option given either changes
the figure or is refused, naming the option and why (``check_options``).

An estimate takes one of ``PATHS``: ``mlp`` (``--workload mlp``, the exact replay), ``config``
(``--config``: the formulas over the model's tensors), ``lora`` (``--config --lora-rank``),
``parameters`` (``--parameters``: a dense count) or ``layers`` (no model: ``--kv-tokens`` or
``--activations`` over described layers). An option left at its parser default is not "given".
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, NamedTuple

from .errors import UsageError

PATHS = ("mlp", "config", "lora", "parameters", "layers")
"""The estimates ``memsweep estimate`` makes (see the module docstring)."""


class Rule(NamedTuple):
    """Where an option applies: on ``paths``, and there (on the ``needs_on`` paths) only with one
    of ``needs`` given; ``why`` says what it is for."""

    paths: tuple[str, ...]
    needs: tuple[str, ...] = ()
    why: str = ""
    needs_on: tuple[str, ...] = PATHS


_WEIGHTS = ("config", "lora", "parameters")
_FULL = ("config", "parameters")
_BARE = ("parameters", "layers")
_ALL = PATHS
_KV = ("config", "parameters", "layers")
_ACT = ("config", "lora", "parameters", "layers")
_MLP_WHY = "the mlp replay models its worker's defaults (AdamW, pure precision); `memsweep run` measures the rest"

RULES: dict[str, Rule] = {
    "count_with": Rule(("config", "lora"), why="it chooses who counts a --config"),
    "bits": Rule(("config", "parameters"), why="the weights' storage of --parameters or --config"),
    "fmt": Rule(_WEIGHTS, why="the weights' storage (the mlp's is --dtype)"),
    "block_size": Rule(_WEIGHTS, ("fmt", "base_format"), "block scales of --format/--base-format"),
    "double_quant": Rule(_WEIGHTS, ("fmt", "base_format"), "it quantizes the scales of --format/--base-format"),
    "keep": Rule(("parameters",), why="a config keeps embeddings, lm_head and norms in 16 bits itself"),
    "train": Rule(_FULL, why="full training of --parameters/--config; --lora-rank is one already, the mlp's is --mode"),
    "optimizer": Rule(("config", "lora", "parameters"), ("train", "lora_rank"), _MLP_WHY),
    "precision": Rule(_FULL, ("train",), "the recipe of full training: it sets --format and the master copy"),
    "mixed": Rule(_FULL, ("train",), "the master copy of full training (LoRA adapters are fp32)"),
    "grad_bytes": Rule(_FULL, ("train",), "gradients of full training"),
    "state_bytes": Rule(_FULL, ("train",), "optimizer states of full training"),
    "zero_stage": Rule(_FULL, ("devices",), "ZeRO partitions full training state over --devices N > 1"),
    "devices": Rule(_FULL, ("zero_stage",), "the devices ZeRO partitions over"),
    "activations": Rule(_ACT, ("train",), "training activations; the mlp replay counts its own", ("config",)),
    "batch": Rule(_ALL, ("activations", "kv_tokens", "workload"), "the batch of activations or the KV cache"),
    "seq_len": Rule(_ACT, ("activations",), "tokens per sequence of --activations (the mlp's is --context)"),
    "recompute": Rule(_ACT, ("activations",), "recomputation of --activations"),
    "fused_attention": Rule(_ACT, ("activations",), "attention scores of --activations"),
    "dropout": Rule(_ACT, ("activations",), "dropout masks of --activations"),
    "no_head": Rule(("config", "lora"), ("activations",), "the output layer of a --config's activations"),
    "hidden_size": Rule(_BARE, ("activations", "kv_tokens"), "described layers (a --config gives its own)"),
    "heads": Rule(_BARE, ("activations", "kv_tokens"), "described layers (a --config gives its own)"),
    "ffn_hidden": Rule(_BARE, ("activations",), "described layers' activations (a --config gives its own)"),
    "gated_mlp": Rule(_BARE, ("activations",), "described layers' activations (a --config gives its own)"),
    "act_bytes": Rule(_BARE, ("activations",), "described layers' activations (a --config's follow --format)"),
    "kv_tokens": Rule(_KV, why="the KV cache of a transformer (a LoRA estimate is a training one)"),
    "sequences": Rule(_KV, ("kv_tokens",), "sequences in the KV cache"),
    "layers": Rule(_BARE, ("activations", "kv_tokens"), "described layers (a --config gives its own)"),
    "kv_heads": Rule(_BARE, ("activations", "kv_tokens"), "described layers (a --config's layout is its own)"),
    "head_dim": Rule(_BARE, ("activations", "kv_tokens"), "described layers (a --config gives its own)"),
    "kv_bytes": Rule(_KV, ("kv_tokens",), "values in the KV cache"),
    "sliding_window": Rule(_KV, ("kv_tokens",), "the window of the KV cache"),
    "static_cache": Rule(_KV, ("kv_tokens",), "a static KV cache"),
    "kv_convention": Rule(_KV, ("kv_tokens",), "what the KV cache's sliding layers keep"),
    "lora_rank": Rule(("lora",), why="adapters on a --config's Linear modules"),
    "lora_targets": Rule(("lora",), why="the adapted modules"),
    "lora_alpha": Rule(("lora",), why="peft's scaling, named in the output: no memory of its own"),
    "lora_dropout": Rule(("lora",), ("activations",), "the dropped copy of the adapters' input"),
    "adapter_bytes": Rule(("lora",), why="the adapters' values"),
    "base_format": Rule(("lora",), why="the frozen base of --lora-rank (elsewhere --format)"),
    "reserve_gib": Rule(_ALL),
    "reserve_gb": Rule(_ALL),
    "json": Rule(_ALL),
    "decimals": Rule(_ALL),
}
"""Per option (argparse destination) other than the model choice and the mlp's own
(``cli_args.check_applicable`` refuses those elsewhere), where it applies."""


def estimate_path(args: argparse.Namespace) -> str:
    """The ``PATHS`` entry ``args`` ask for (``mlp``, ``config``, ``lora``, ``parameters``, ``layers``)."""
    if args.workload is not None:
        return "mlp"
    if args.config is not None:
        return "lora" if args.lora_rank is not None else "config"
    return "parameters" if args.parameters is not None else "layers"


def _head_dim_given(args: argparse.Namespace, defaults: Mapping[str, Any]) -> None:
    """Without ``--activations``, ``--hidden-size``/``--heads`` give the KV cache's head dimension
    only: refused beside an explicit ``--head-dim``."""
    if args.activations or args.head_dim is None or args.config is not None:
        return
    for name in ("hidden_size", "heads"):
        if given(args, defaults, name):
            option = "--" + name.replace("_", "-")
            raise UsageError(f"{option} does not apply beside --head-dim without --activations (it gives the head dim)")


def given(args: argparse.Namespace, defaults: Mapping[str, Any], name: str) -> bool:
    """Whether option ``name`` was given a value other than its parser default."""
    return getattr(args, name) not in (defaults.get(name), None, [])


def check_options(args: argparse.Namespace, defaults: Mapping[str, Any]) -> None:
    """Refuse an option the estimate ``args`` ask for would not apply (``RULES``).

    Args:
        args: ``memsweep estimate``'s parsed options.
        defaults: the parser's defaults (``build_parser().parse_args([])``).

    Raises:
        UsageError: ``--OPTION does not apply to <path>`` or ``--OPTION applies with --NEED``,
            with what the option is for.
    """
    path = estimate_path(args)
    if path == "layers" and args.kv_tokens is None and not args.activations:
        return  # nothing to estimate: the caller says so
    _head_dim_given(args, defaults)
    for name, rule in RULES.items():
        if not given(args, defaults, name):
            continue
        option = "--" + {"fmt": "format", "mixed": "mixed-precision", "dropout": "no-dropout"}.get(name, name)
        option = option.replace("_", "-")
        why = f" ({rule.why})" if rule.why else ""
        if path not in rule.paths:
            raise UsageError(f"{option} does not apply to the {path} estimate{why}")
        if rule.needs and path in rule.needs_on and not any(given(args, defaults, n) for n in rule.needs):
            needs = " or ".join("--" + n.replace("_", "-").replace("fmt", "format") for n in rule.needs)
            raise UsageError(f"{option} applies with {needs}{why}")
