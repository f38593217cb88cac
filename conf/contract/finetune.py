"""Fine-tuning and serving options of a run: LoRA adapters, a local checkpoint, a 4-bit base,
``torch.compile``, the user's own training step. Their values and their cross-field checks.

Standard library only (the sweeper validates without torch). What needs the host (a directory
that exists, an installed package, a C++ compiler) is checked by ``sweeper.finetune`` before any
worker starts; what needs only the spec is checked here, when the spec is built.

Sources: peft's ``LoraConfig`` (https://huggingface.co/docs/peft/package_reference/lora: ``r``,
``lora_alpha``, ``lora_dropout``, ``target_modules``, ``"all-linear"``); transformers'
``BitsAndBytesConfig`` (https://huggingface.co/docs/transformers/main_classes/quantization:
``load_in_4bit``, ``bnb_4bit_quant_type`` nf4 | fp4); ``torch.compile``'s ``mode``
(https://pytorch.org/docs/stable/generated/torch.compile.html: default, reduce-overhead,
max-autotune).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from .checks import optional_positive
from .errors import SpecError

COMPILE_MODES = ("false", "default", "reduce-overhead", "max-autotune")
"""Values of the spec's ``compile``: ``false`` (eager, the default; YAML's false is accepted and
normalised to it) or a ``torch.compile`` mode."""

QUANTIZATIONS = ("nf4", "fp4")
"""Values of the hf workload's ``quantization`` (a bitsandbytes 4-bit base, QLoRA's): the
``bnb_4bit_quant_type`` of transformers' BitsAndBytesConfig; null = no quantization."""

HF_FINETUNE_DEFAULTS: dict[str, Any] = {
    "pretrained": None,
    "lora_rank": None,
    "lora_alpha": None,
    "lora_dropout": 0.0,
    "lora_targets": None,
    "quantization": None,
}
"""The hf workload's fine-tuning settings and their defaults (null = off / the library's default)."""

LORA_RANK_SETTINGS = ("lora_alpha", "lora_targets", "lora_dropout")
"""The LoRA settings other than the rank: each is set only with a rank (no LoRA without one)."""


def lora_settings_without_rank(values: Mapping[str, Any]) -> list[str]:
    """The settings of ``LORA_RANK_SETTINGS`` given while ``lora_rank`` is not.

    A setting counts as given when it is not null (``lora_dropout``: not null and not 0). The
    hf workload's check (``check_hf_finetune``) and ``memsweep estimate``'s options share this rule.

    Args:
        values: ``lora_rank`` and the settings by name (a missing one counts as not given).

    Returns:
        their names, in ``LORA_RANK_SETTINGS``'s order; [] when ``lora_rank`` is given.
    """
    if values.get("lora_rank") is not None:
        return []
    return [n for n in LORA_RANK_SETTINGS if values.get(n) is not None and not (n == "lora_dropout" and not values[n])]


_MODULE_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def check_hf_finetune(out: dict) -> dict:
    """Check the hf workload's fine-tuning settings, one field at a time.

    ``pretrained``: null or a local directory (a string; that it exists and holds a checkpoint is
    checked by the sweeper). ``lora_rank``: null (no LoRA) or the adapters' rank r >= 1.
    ``lora_alpha``: null (peft's default, 8) or a number > 0. ``lora_dropout``: in [0, 1).
    ``lora_targets``: null (peft's default target modules for the architecture), ``all-linear``
    or a list of module names (``[q_proj, v_proj]``). ``quantization``: null, ``nf4`` or ``fp4``.
    The LoRA settings other than the rank need a rank.

    Args:
        out: the hf parameters with defaults filled (modified in place: lists copied).

    Returns:
        ``out``.

    Raises:
        SpecError: a bad value, naming ``workload.<field>``.
    """
    pretrained = out["pretrained"]
    if pretrained is not None and (not isinstance(pretrained, str) or not pretrained.strip()):
        raise SpecError("workload.pretrained", pretrained, "null or a local directory written by save_pretrained")
    optional_positive("workload.lora_rank", out["lora_rank"], 2**16)
    alpha = out["lora_alpha"]
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0):
        raise SpecError("workload.lora_alpha", alpha, "null (peft's default, 8) or a number > 0")
    dropout = out["lora_dropout"]
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise SpecError("workload.lora_dropout", dropout, "a number in [0, 1)")
    targets = out["lora_targets"]
    if targets is not None and targets != "all-linear":
        if (
            not isinstance(targets, (list, tuple))
            or not targets
            or not all(isinstance(t, str) and _MODULE_NAME.fullmatch(t) for t in targets)
        ):
            raise SpecError(
                "workload.lora_targets",
                targets,
                "null (peft's default for the architecture), all-linear or a list of module names [q_proj, v_proj]",
            )
        out["lora_targets"] = list(targets)
    without_rank = lora_settings_without_rank(out)
    if without_rank:
        name = without_rank[0]
        unset = "0" if name == "lora_dropout" else "null"
        raise SpecError(f"workload.{name}", out[name], f"{unset} without workload.lora_rank (no LoRA)")
    if out["quantization"] is not None and out["quantization"] not in QUANTIZATIONS:
        raise SpecError("workload.quantization", out["quantization"], "null or one of " + ", ".join(QUANTIZATIONS))
    return out


def normalise_compile(value: Any) -> str:
    """The spec's ``compile`` as one of COMPILE_MODES (YAML's ``false`` becomes ``"false"``).

    Args:
        value: the spec's ``compile`` as given (``False``, ``"false"`` or a torch.compile mode).

    Returns:
        One of COMPILE_MODES.

    Raises:
        SpecError: anything else (``true`` included: name the mode, ``default``).
    """
    if value is False:
        return "false"
    if isinstance(value, str) and value in COMPILE_MODES:
        return value
    raise SpecError("compile", value, "false or a torch.compile mode: default, reduce-overhead, max-autotune")


def check_run_options(spec: Any) -> None:
    """Cross-field checks of the fine-tuning and compile options of a run spec.

    * LoRA (``workload.lora_rank``) trains adapters: mode=train only.
    * ``workload.quantization`` (a 4-bit base) is applied by ``from_pretrained``: it needs
      ``workload.pretrained``; in train mode it needs LoRA (4-bit weights do not train), and
      ``precision=pure`` with ``dtype`` float16 or bfloat16 or float32 as the compute dtype.
    * A dry run has fake tensors: no checkpoint, no quantization (bitsandbytes' Params4bit cannot
      wrap a fake tensor), no compile; LoRA adapters are fine.
    * ``compile`` applies to inference and train (a generation's growing cache recompiles).
    * A user workload's ``optimizer`` and ``train_step`` apply to mode=train (``_check_user_options``).

    Args:
        spec: a ``RunSpec`` whose single fields are already checked.

    Raises:
        SpecError: naming the field that cannot apply.
    """
    _check_compile(spec)
    if spec.workload_name == "user":
        _check_user_options(spec)
    if spec.workload_name != "hf":
        return
    w = spec.workload
    if w["lora_rank"] is not None and spec.mode != "train":
        raise SpecError(
            "workload.lora_rank",
            w["lora_rank"],
            f"null with mode={spec.mode} (LoRA adapters are what trains: mode=train)",
        )
    if w["quantization"] is not None:
        _check_quantization(spec)
    if spec.dry_run:
        if w["quantization"] is not None:
            raise SpecError(
                "workload.quantization",
                w["quantization"],
                "null with dry_run=true (bitsandbytes' 4-bit weight, Params4bit, cannot wrap a fake tensor: "
                "torch.Tensor._make_subclass refuses one; measure QLoRA with a real run)",
            )
        if w["pretrained"] is not None:
            raise SpecError(
                "workload.pretrained", w["pretrained"], "null with dry_run=true (dry runs build from a config)"
            )


def _check_compile(spec: Any) -> None:
    """``compile``: false with mode=generate or a dry run. Raises SpecError naming it."""
    compile_mode = spec.compile
    if compile_mode == "false":
        return
    if spec.mode == "generate":
        raise SpecError(
            "compile",
            compile_mode,
            "false with mode=generate (each decoded token changes the cache's shape: a recompilation); "
            "compile applies to mode=inference or train",
        )
    if spec.dry_run:
        raise SpecError("compile", compile_mode, "false with dry_run=true (fake tensors are not compiled)")


def _check_quantization(spec: Any) -> None:
    """A set ``workload.quantization``: needs ``workload.pretrained``, LoRA in mode=train and
    ``precision=pure``. Raises SpecError naming the field."""
    w = spec.workload
    if w["pretrained"] is None:
        raise SpecError(
            "workload.quantization",
            w["quantization"],
            "null without workload.pretrained (transformers quantizes a checkpoint as from_pretrained loads it)",
        )
    if spec.mode == "train" and w["lora_rank"] is None:
        raise SpecError(
            "workload.quantization",
            w["quantization"],
            "null in mode=train without workload.lora_rank (4-bit weights do not train; QLoRA trains adapters)",
        )
    if spec.precision != "pure":
        raise SpecError("precision", spec.precision, "pure with workload.quantization (dtype is the compute dtype)")


def _check_user_options(spec: Any) -> None:
    """A user workload's ``optimizer`` and ``train_step``: mode=train only; the user's own
    optimizer factory replaces the spec's ``optimizer``, which stays at its default; the user's own step
    (``train_step``) owns the whole step, so memsweep's ``micro_steps`` and ``precision=autocast``
    (its autocast and GradScaler around its own sub-phases) cannot apply to it.

    Raises:
        SpecError: naming the field that cannot apply.
    """
    w = spec.workload
    for name in ("optimizer", "train_step"):
        if w.get(name) is not None and spec.mode != "train":
            raise SpecError(f"workload.{name}", w[name], f"null with mode={spec.mode} (train mode only)")
    default = next(f.default for f in dataclasses.fields(spec) if f.name == "optimizer")
    if w.get("optimizer") is not None and spec.optimizer != default:  # the factory replaces it: never ignored
        raise SpecError(
            "optimizer",
            spec.optimizer,
            f"{default} (the default, unused) with workload.optimizer={w['optimizer'].get('_target_')} (your "
            "factory builds the optimizer; leave optimizer out)",
        )
    if w.get("train_step") is None:
        return
    if spec.micro_steps != 1:
        raise SpecError(
            "micro_steps",
            spec.micro_steps,
            "1 with workload.train_step (your train_step is the whole step: accumulate gradients inside it)",
        )
    if spec.precision != "pure":
        raise SpecError(
            "precision",
            spec.precision,
            "pure with workload.train_step (the step is yours: put torch.autocast, and a GradScaler for "
            "float16, inside it)",
        )


def version_tuple(text: str) -> tuple[int, int]:
    """(major, minor) of an optional package's version string, such as ``4.56.0.dev0``
    (transformers, bitsandbytes), for the settings that changed between versions.

    Args:
        text: the package's ``__version__``.

    Returns:
        (major, minor); a part without digits counts 0, a missing part 0.
    """
    parts = [int("".join(ch for ch in p if ch.isdigit()) or 0) for p in text.split(".")[:2]]
    return (parts + [0, 0])[0], (parts + [0, 0])[1]
