"""``python -m memsweep.worker --count-params PATH [PATH ...]``: a local config's parameters, counted
by the library that defines the model.

Each config (a ``config.json`` or a directory holding one; never downloaded) becomes its
``transformers`` config class (``AutoConfig.for_model``) and its causal LM is built with
``AutoModelForCausalLM.from_config`` on the meta device, without initialisation. The analysis
process never imports torch, so ``memsweep estimate --config`` asks this entry through a
subprocess (``conf.contract.ask_worker``) and reads the JSON object printed on its last line:
``{"counts": [one object per PATH]}``, each ``count_config``'s result or
``{"path": ..., "error": ...}``. Without transformers (optional, imported lazily) the answer is
``{"counts": [], "error": ...}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

EXPERT_PARAM = re.compile(r"(^|\.)experts\.")
"""A routed expert's parameter (``...mlp.experts.gate_up_proj``, ``...experts.3.w1.weight``);
shared experts (``shared_expert``, ``shared_experts``) are not routed and do not match."""

EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
"""Config keys holding the number of routed experts per MoE layer (Mixtral/gpt-oss,
Qwen-MoE, DeepSeek, others)."""
EXPERTS_PER_TOKEN_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk", "num_experts_per_token")
"""Config keys holding the experts each token is routed to (top-k)."""


def _first(cfg: Mapping, keys: tuple[str, ...]) -> Any:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def load_config(path: str | Path, overrides: Mapping | None = None):
    """The transformers config of a local config.json (or its directory), ``overrides`` applied
    (``worker.workloads.hf.config_from_json``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: no ``model_type``, or one this transformers does not know.
    """
    import transformers  # optional: only this entry and workload=hf import it

    from .workloads.hf import config_from_json

    return config_from_json(transformers, path, overrides)


def _kind(module: nn.Module, name: str) -> str:
    """The kind of a parameter by its owner: experts, embedding, linear, norm or other."""
    if EXPERT_PARAM.search(name):
        return "experts"
    if isinstance(module, nn.Embedding):
        return "embedding"
    if isinstance(module, nn.Linear):
        return "linear"
    if "norm" in type(module).__name__.lower() or "norm" in name.rsplit(".", 2)[0].rsplit(".", 1)[-1].lower():
        return "norm"
    return "other"


def _linear_sizes(module: nn.Module) -> tuple[int, int] | None:
    """(in_features, out_features) of an ``nn.Linear`` or of transformers' ``Conv1D`` (GPT-2: a
    Linear whose weight is stored (in, out), ``nf`` = out; peft adapts both), else ``None``."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    weight = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and weight is not None and getattr(weight, "ndim", 0) == 2:
        return int(weight.shape[0]), int(weight.shape[1])
    return None


def _jsonable(cfg: Mapping) -> dict[str, Any]:
    """The config's scalar and list values (what the estimator reads), JSON-serialisable."""
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        if isinstance(value, (bool, int, float, str)) or value is None:
            out[key] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str)) for v in value):
            out[key] = list(value)
    return out


def _layer_kinds(config) -> tuple[list[str] | None, list[int | None] | None]:
    """Per decoder layer, the cache kind and window transformers' DynamicCache gives it
    (``transformers.cache_utils.get_layer_types_and_kwargs``), or (None, None) if unknown."""
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs
    except ImportError:
        return None, None
    try:
        kinds, kwargs = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    except Exception:  # an older transformers, or a config without per-layer information
        return None, None
    return list(kinds), [kw.get("sliding_window") for kw in kwargs]


PROBE_TOKENS = 2
"""Tokens of the meta-device forward whose cache ``cache_layout`` reads (below any window)."""


def _probe_forward(config, dtype):
    """The cache a meta-device forward of one sequence of ``PROBE_TOKENS`` tokens leaves."""
    import transformers

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
        ids = torch.zeros(1, PROBE_TOKENS, dtype=torch.long)
        with torch.no_grad():
            return model(input_ids=ids, use_cache=True).past_key_values


def cache_layout(config) -> dict:
    """Per cache layer, the K/V values one token adds and the window, as transformers' own cache
    holds them after a meta-device forward (no memory, no download).

    The model is built with ``from_config`` on the meta device (in bf16 when the default dtype
    fails: grouped expert kernels want it) and run on ``PROBE_TOKENS`` tokens; each layer of the
    returned cache (``DynamicCache.layers``) gives ``values`` = K and V elements per token (a
    layer whose ``keys`` stay unset shares another layer's cache: 0), ``window`` (its
    ``sliding_window``, or null for a full layer) and ``kind`` (the layer's class: the estimator
    reads only the K/V layers it knows).

    Returns:
        ``{"layers": [{"values", "window", "keys", "values_shape", "kind"}...], "cache": class name}`` or
        ``{"error": ...}`` when no forward ran or the cache has no per-layer tensors.
    """
    errors = []
    for dtype in (None, torch.bfloat16):
        try:
            cache = _probe_forward(config, dtype)
            break
        except Exception as exc:  # a model that does not run on meta tensors: say why
            errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
    else:
        return {"error": "the meta-device forward failed: " + "; ".join(errors)}
    layers = getattr(cache, "layers", None)
    if not layers:
        return {"error": f"{type(cache).__name__} has no per-layer K/V tensors"}
    out: list[dict[str, Any]] = []
    for layer in layers:
        kind = type(layer).__name__
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if keys is None or values is None:
            out.append({"values": 0, "window": None, "keys": None, "values_shape": None, "kind": kind})
            continue
        per_token = (keys.numel() + values.numel()) // PROBE_TOKENS
        window = getattr(layer, "sliding_window", None)
        out.append(
            {
                "values": per_token,
                "window": window,
                "keys": list(keys.shape),
                "values_shape": list(values.shape),
                "kind": kind,
            }
        )
    return {"layers": out, "cache": type(cache).__name__}


def count_config(path: str | Path, overrides: Mapping | None = None) -> dict:
    """Count the parameters of the causal LM a local config describes, built on the meta device.

    Tied weights (``lm_head`` sharing the embedding) are counted once: ``named_parameters``
    removes duplicates, and ``tied`` names the parameters it removed.

    Args:
        path: a config.json or its directory.
        overrides: config attributes to set (e.g. ``{"num_hidden_layers": 2}``).

    Returns:
        a JSON-serialisable dict: ``source``, ``model_class``, ``parameters`` (total),
        ``tied`` (names counted once), ``by_dtype`` / ``by_kind`` (counts), ``experts``
        (``num_experts``, ``per_token``, ``expert_parameters``, ``active_parameters``; null
        without routed experts), ``tensors`` (groups of equal shape: ``shape``, ``count``,
        ``kind``, ``quantizable`` = the weight of an ``nn.Linear`` other than the output
        embedding, what bitsandbytes replaces), ``linears`` (per module name: ``in``, ``out``,
        ``count``, ``bias``; every ``nn.Linear`` and GPT-2 ``Conv1D``: the LoRA targets),
        ``layer_types``/``layer_windows`` (the DynamicCache's per-layer kinds), ``kv_layout``
        (``cache_layout``: the cache's per-layer values per token), ``config`` (the resolved
        text config's values).

    Raises:
        FileNotFoundError, ValueError: as ``load_config``; anything transformers raises.
    """
    return count_model(load_config(path, overrides), str(path))


def count_model(config, label: str) -> dict:
    """``count_config``'s answer for a transformers config object (``label`` is its ``path``)."""
    import transformers

    init = getattr(getattr(transformers, "initialization", None), "no_init_weights", None)
    with torch.device("meta"), init() if init else contextlib.nullcontext():
        model = transformers.AutoModelForCausalLM.from_config(config)
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    owners = dict(model.named_modules())
    unique = dict(model.named_parameters())
    tied = sorted(n for n, _ in model.named_parameters(remove_duplicate=False) if n not in unique)
    by_dtype: dict[str, int] = {}
    by_kind: dict[str, int] = {}
    groups: dict[tuple, int] = {}
    linears: dict[tuple, int] = {}
    for name, p in unique.items():
        owner_name = name.rpartition(".")[0]
        owner = owners.get(owner_name, model)
        kind = _kind(owner, name)
        n = p.numel()
        by_dtype[str(p.dtype).removeprefix("torch.")] = by_dtype.get(str(p.dtype).removeprefix("torch."), 0) + n
        by_kind[kind] = by_kind.get(kind, 0) + n
        quantizable = isinstance(owner, nn.Linear) and owner is not output and name.endswith("weight")
        key = (tuple(p.shape), kind, quantizable)
        groups[key] = groups.get(key, 0) + 1
        sizes = _linear_sizes(owner)
        if sizes and name.endswith("weight") and owner is not output:
            lk = (owner_name.rsplit(".", 1)[-1], *sizes, owner.bias is not None)
            linears[lk] = linears.get(lk, 0) + 1
    total = sum(by_kind.values())
    text = config.get_text_config(decoder=True)
    resolved = _jsonable(text.to_dict())
    experts = None
    num, k = _first(resolved, EXPERT_COUNT_KEYS), _first(resolved, EXPERTS_PER_TOKEN_KEYS)
    if by_kind.get("experts") and num and k:
        routed = by_kind["experts"]
        active = total - routed + routed * k // num if routed % num == 0 else None
        experts = {"num_experts": num, "per_token": k, "expert_parameters": routed, "active_parameters": active}
    kinds, windows = _layer_kinds(config)
    return {
        "path": label,
        "source": f"transformers {transformers.__version__}: {type(model).__name__} built on the meta device",
        "model_class": type(model).__name__,
        "parameters": total,
        "tied": tied,
        "by_dtype": by_dtype,
        "by_kind": by_kind,
        "experts": experts,
        "tensors": [{"shape": list(s), "kind": kd, "quantizable": q, "count": c} for (s, kd, q), c in groups.items()],
        "linears": [{"name": nm, "in": i, "out": o, "bias": b, "count": c} for (nm, i, o, b), c in linears.items()],
        "layer_types": kinds,
        "layer_windows": windows,
        "kv_layout": cache_layout(config),
        "config": resolved,
    }


def count_main(paths: list[str]) -> dict:
    """``--count-params``: one ``count_config`` per path (an error names its path), offline.

    An argument that is a JSON object, ``{"config": ..., "overrides": {...}}``, is an hf
    workload's model (``worker.workloads.hf.hf_config``: a class name, a model type or a path).

    Returns:
        ``{"counts": [...]}``, or ``{"counts": [], "error": ...}`` without transformers.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers  # optional
    except ImportError as exc:
        return {"counts": [], "error": f"transformers is not installed ({exc}): pip install 'memsweep[hf]'"}
    counts = []
    for path in paths:
        try:
            if path.lstrip().startswith("{"):  # an hf workload: {"config": ..., "overrides": {...}}
                from .workloads.hf import hf_config

                described = json.loads(path)
                config = hf_config(transformers, described["config"], described.get("overrides") or {})
                counts.append(count_model(config, described["config"]))
            else:
                counts.append(count_config(path))
        except Exception as exc:  # one bad config must not hide the others' counts
            counts.append({"path": path, "error": f"{type(exc).__name__}: {exc}"})
    return {"counts": counts}
