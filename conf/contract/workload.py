"""Workload descriptions ``{"name": ..., <params>}``: their parameters, defaults and checks.

Standard library only; the worker builds the workload from the validated description
(worker/workloads/), the sweeper validates it before any worker starts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .checks import choice, optional_positive, positive_int
from .errors import SpecError
from .finetune import HF_FINETUNE_DEFAULTS, check_hf_finetune
from .vocabulary import ACTIVATIONS, ATTENTIONS, FFN_KINDS, NORMS, WIDTH_WORKLOADS, WORKLOADS


def _mlp_params(params: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"depth": 4, "hidden": None, "activation": "gelu"}
    out.update(params)
    positive_int("workload.depth", out["depth"], 10_000)
    if out["hidden"] is not None:
        positive_int("workload.hidden", out["hidden"])
    choice("workload.activation", out["activation"], ACTIVATIONS)
    return out


def _transformer_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults and per-field checks; the checks that need the load's width are in RunSpec."""
    out: dict[str, Any] = {
        "layers": 2,
        "hidden": None,
        "heads": 4,
        "kv_heads": None,
        "head_dim": None,
        "ffn_hidden": None,
        "vocab": 32000,
        "attention": "sdpa",
        "norm": "rmsnorm",
        "ffn": "gelu",
        "tie_embeddings": False,
    }
    out.update(params)
    positive_int("workload.layers", out["layers"], 10_000)
    optional_positive("workload.hidden", out["hidden"])
    positive_int("workload.heads", out["heads"], 10_000)
    optional_positive("workload.kv_heads", out["kv_heads"], 10_000)
    optional_positive("workload.head_dim", out["head_dim"], 2**16)
    optional_positive("workload.ffn_hidden", out["ffn_hidden"])
    positive_int("workload.vocab", out["vocab"], 2**31 - 1)
    choice("workload.attention", out["attention"], ATTENTIONS)
    choice("workload.norm", out["norm"], NORMS)
    choice("workload.ffn", out["ffn"], FFN_KINDS)
    if not isinstance(out["tie_embeddings"], bool):
        raise SpecError("workload.tie_embeddings", out["tie_embeddings"], "true or false")
    heads, kv_heads = out["heads"], out["kv_heads"]
    if kv_heads is not None and heads % kv_heads:
        raise SpecError(
            "workload.kv_heads",
            kv_heads,
            f"a divisor of heads={heads} (grouped-query "
            "attention shares each K/V head among heads/kv_heads query heads)",
        )
    if out["head_dim"] is not None and out["head_dim"] % 2:
        raise SpecError("workload.head_dim", out["head_dim"], "an even number (rotary position embedding)")
    return out


_CONFIG_CLASS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*Config")
_MODEL_TYPE = re.compile(r"[a-z0-9][a-z0-9_\-]*")


def hf_config_kind(config: str) -> str:
    """Tell how the hf workload reads its ``config`` setting.

    Args:
        config: the hf workload's ``config``.

    Returns:
        ``"class"`` (a transformers config class name such as ``LlamaConfig``), ``"path"`` (a
        local config.json or a directory holding one) or ``"model_type"`` (a registered model
        type such as ``gpt2``, via AutoConfig.for_model).
    """
    if "/" in config or config.endswith(".json") or config.startswith("."):
        return "path"
    if _CONFIG_CLASS.fullmatch(config):
        return "class"
    return "model_type"


def _hf_params(params: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"config": None, "overrides": {}, "attention": "sdpa", **HF_FINETUNE_DEFAULTS}
    out.update(params)
    config = out["config"]
    accepted = (
        "a transformers config class name (LlamaConfig), a registered model type (gpt2) or a local config.json path"
    )
    if config is None and out.get("pretrained") is not None:  # the checkpoint's config.json is read
        return _hf_rest(out)
    if not isinstance(config, str) or not config.strip():
        raise SpecError("workload.config", config, accepted)
    if hf_config_kind(config) == "model_type" and not _MODEL_TYPE.fullmatch(config):
        raise SpecError("workload.config", config, accepted)
    return _hf_rest(out)


def _hf_rest(out: dict) -> dict:
    """The hf settings after ``config``: overrides, attention and the fine-tuning settings."""
    overrides = {} if out["overrides"] is None else out["overrides"]
    if not isinstance(overrides, Mapping) or not all(isinstance(k, str) for k in overrides):
        raise SpecError("workload.overrides", overrides, "a mapping of config attribute -> value")
    out["overrides"] = dict(overrides)
    choice("workload.attention", out["attention"], ATTENTIONS)
    return check_hf_finetune(out)


_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")


def _target(name: str, value: Any, required: bool) -> dict | None:
    """A Hydra-style call description ``{_target_: "pkg.module.function", **kwargs}``."""
    accepted = "a mapping {_target_: package.module.function, <keyword arguments>}"
    if value is None and not required:
        return None
    if not isinstance(value, Mapping) or not isinstance(value.get("_target_"), str):
        raise SpecError(name, value, accepted + ("" if required else " or null"))
    if not _DOTTED.fullmatch(value["_target_"]):
        raise SpecError(f"{name}._target_", value["_target_"], "a dotted path package.module.function")
    bad = [k for k in value if not isinstance(k, str) or (k.startswith("_") and k != "_target_")]
    if bad:
        raise SpecError(
            f"{name}.{bad[0]}",
            value[bad[0]],
            "keyword arguments (Hydra's _args_, _partial_ and other _special_ keys are not supported)",
        )
    return dict(value)


def _user_params(params: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": None,
        "inputs": None,
        "loss": None,
        "path": None,
        "optimizer": None,
        "train_step": None,
    }
    out.update(params)
    out["model"] = _target("workload.model", out["model"], True)
    out["inputs"] = _target("workload.inputs", out["inputs"], True)
    out["loss"] = _target("workload.loss", out["loss"], False)
    out["optimizer"] = _target("workload.optimizer", out["optimizer"], False)
    out["train_step"] = _target("workload.train_step", out["train_step"], False)
    path = out["path"]
    if path is not None and (not isinstance(path, (list, tuple)) or not all(isinstance(d, str) for d in path)):
        raise SpecError("workload.path", path, "null or a list of directories to put on sys.path")
    out["path"] = None if path is None else list(path)
    return out


WORKLOAD_PARAMS = {
    "mlp": (("depth", "hidden", "activation"), _mlp_params),
    "transformer": (
        (
            "layers",
            "hidden",
            "heads",
            "kv_heads",
            "head_dim",
            "ffn_hidden",
            "vocab",
            "attention",
            "norm",
            "ffn",
            "tie_embeddings",
        ),
        _transformer_params,
    ),
    "hf": (("config", "overrides", "attention", *HF_FINETUNE_DEFAULTS), _hf_params),
    "user": (("model", "inputs", "loss", "path", "optimizer", "train_step"), _user_params),
}
"""Workload name -> (accepted parameter names, validator returning the params with defaults filled)."""


def validate_workload(workload: Any) -> dict:
    """Check a workload description ``{"name": ..., <params>}``; returns it with defaults.

    mlp params: ``depth`` (blocks), ``hidden`` (null = 4 * width), ``activation``.
    transformer params: ``layers``, ``hidden`` (null = width), ``heads``, ``kv_heads`` (null =
    heads), ``head_dim`` (null = hidden / heads), ``ffn_hidden`` (null = 4 * hidden), ``vocab``,
    ``attention`` (sdpa | eager), ``norm`` (rmsnorm | layernorm), ``ffn`` (gelu | swiglu),
    ``tie_embeddings``.
    hf params: ``config`` (class name, model type or config.json path), ``overrides``
    (config attributes), ``attention`` (sdpa | eager), and the fine-tuning settings
    ``pretrained``, ``lora_rank``, ``lora_alpha``, ``lora_dropout``, ``lora_targets``,
    ``quantization`` (``finetune.check_hf_finetune``).
    user params: ``model``, ``inputs``, ``loss`` (Hydra-style ``{_target_: dotted.path, **kwargs}``;
    loss may be null), ``path`` (directories put on sys.path before importing the targets),
    ``optimizer`` (null or ``fn(params, **kwargs) -> torch.optim.Optimizer``, the user's own
    optimizer factory, train mode only; it replaces the spec's ``optimizer``), ``train_step``
    (null or ``fn(model, batch, optimizer, **kwargs)``, the user's whole training step, train mode
    only; recorded as one sub-phase, ``USER_STEP_SUB_PHASES``).

    Args:
        workload: the description, a mapping with ``name`` (one of WORKLOADS) and its params.

    Returns:
        ``{"name": ..., <every param of that workload, defaults filled>}``.

    Raises:
        SpecError: unknown workload name, unknown parameter or bad value.
    """
    if not isinstance(workload, Mapping) or "name" not in workload:
        raise SpecError("workload", workload, "a mapping with a name: one of " + ", ".join(WORKLOADS))
    name = workload["name"]
    if name not in WORKLOAD_PARAMS:
        raise SpecError("workload", name, "one of " + ", ".join(WORKLOADS))
    accepted, check = WORKLOAD_PARAMS[name]
    params = {k: v for k, v in workload.items() if k != "name"}
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise SpecError(
            f"workload.{unknown[0]}", params[unknown[0]], f"one of the {name} settings " + ", ".join(accepted)
        )
    return {"name": name, **check(params)}


def width_ignored(name: str, params: Mapping[str, Any]) -> str | None:
    """Why a load of workload ``name`` with ``params`` does not read the width axis, or None when
    it does: only the workloads of ``WIDTH_WORKLOADS`` read it, the transformer only while
    ``workload.hidden`` is null. The one rule behind ``axis_ignored`` and the load labels
    (``analysis.labels.load_words``, which answers from a runs-table row).

    Args:
        name: the workload's name (one of ``WORKLOADS``).
        params: its parameters (a spec's workload mapping or a row's parsed ``workload_params``);
            a parameter missing counts as its default (null).

    Returns:
        The reason in words, or None.
    """
    if name not in WIDTH_WORKLOADS:
        return (
            f"workload={name} builds its model from workload.config and workload.overrides, width changes "
            "nothing (vary the model through workload.overrides, e.g. hidden_size)"
        )
    hidden = params.get("hidden")
    if name == "transformer" and hidden is not None:
        return f"workload.hidden={hidden} fixes the transformer's width (hidden = width when null)"
    return None


def axis_ignored(spec: Any, axis: str) -> str | None:
    """Why the load of ``spec`` does not read ``axis``, or None when it does.

    The width: only the workloads of ``WIDTH_WORKLOADS`` read it, the transformer only while
    ``workload.hidden`` is null. ``eval_batch``: the batch of the eval pass after training,
    mode=train only.

    Args:
        spec: a ``RunSpec``.
        axis: one of ``AXES``.

    Returns:
        The reason in words, or None.
    """
    if axis == "width":
        return width_ignored(spec.workload_name, spec.workload)
    if axis == "eval_batch" and spec.mode != "train":
        return f"eval_batch is the batch of the eval pass after training: it needs mode=train (mode={spec.mode})"
    return None


def check_axis_read(spec: Any, axis: str, field: str, value: Any = None) -> None:
    """Refuse varying ``axis`` (a sweep's list of values, a search, a prediction) on a load that
    does not read it (``axis_ignored``): every value would run the same load, and its "edge"
    would be none.

    Args:
        spec: the load's ``RunSpec`` (the baseline, or a condition of the sweep).
        axis: the axis varied (one of ``AXES``).
        field: the setting or argument that varies it, as the user typed it (``width``,
            ``--axis``, ``hydra.sweeper.axis``).
        value: the value shown in the error (default: ``axis``).

    Raises:
        SpecError: ``field``, when the load ignores ``axis``.
    """
    reason = axis_ignored(spec, axis)
    if reason is not None:
        raise SpecError(field, axis if value is None else value, f"an axis this load reads, not {axis}: {reason}")


def run_optimizer(spec: Mapping[str, Any]) -> str | None:
    """The optimizer a run's spec asks for, as the runs table names it: a user workload's own
    factory (``workload.optimizer._target_``, which replaces the spec's ``optimizer``), else the
    spec's ``optimizer``.

    Args:
        spec: a spec.json's content (``RunSpec.to_dict``); a key may be missing.

    Returns:
        The factory's dotted path, the spec's optimizer name, or None when the spec has neither.
    """
    workload = spec.get("workload")
    factory = workload.get("optimizer") if isinstance(workload, Mapping) else None
    if isinstance(factory, Mapping) and isinstance(factory.get("_target_"), str):
        return factory["_target_"]
    return spec.get("optimizer")
