"""Model descriptions counted by the library that defines the model.

``memsweep estimate --config DIR`` describes a model by building it: the worker entry
``python -m memsweep.worker --count-params DIR`` (``worker/count.py``) builds the config's causal LM
with transformers on the meta device and prints its tensors; this module starts that
process (``conf.contract.ask_worker``; the estimate never imports torch) and turns its
answer into a ``TransformerConfig`` whose ``tensors()`` are the model's own. Without
transformers (or torch) here, the formula parser (``hf_config.py``) is the fallback, and it
refuses the configs it does not understand.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path

from memsweep.conf.contract.ask import ask_worker

from .attention import UnknownAttention, read_attention, shared_cache_layers
from .hf_config import load_hf_config, read_config_json
from .kv_cache import resolve_head_dim
from .transformer import LinearModule, ParamTensor, TransformerConfig

COUNTERS = ("auto", "transformers", "parser")
"""Who counts a config's parameters: ``transformers`` (the model built on the meta device, in
a worker process), ``parser`` (memsweep's formulas), ``auto`` (transformers when installed)."""


class CountUnavailable(RuntimeError):
    """transformers could not count a config here (not installed, or the worker failed)."""


def transformers_installed() -> bool:
    """Whether torch and transformers can be imported by a worker (looked up, not imported)."""
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers"))


def count_with_transformers(paths: list[str | Path], timeout: float = 600) -> list[dict]:
    """Counts of local configs by transformers, in one worker process (``worker/count.py``).

    Args:
        paths: config.json files or their directories.
        timeout: seconds for the whole process.

    Returns:
        one ``count_config`` dict per path, in order.

    Raises:
        CountUnavailable: transformers is not installed, or the worker gave no answer, or
            a config could not be built (its error).
    """
    if not transformers_installed():
        raise CountUnavailable("transformers (and torch) are not installed: pip install 'memsweep[hf]'")
    try:
        answer = ask_worker("--count-params", *[str(p) for p in paths], timeout=timeout)
    except RuntimeError as exc:
        raise CountUnavailable(f"the worker could not count the parameters: {exc}") from None
    if answer.get("error"):
        raise CountUnavailable(answer["error"])
    counts = answer.get("counts") or []
    for c in counts:
        if c.get("error"):
            raise CountUnavailable(f"{c.get('path')}: transformers could not build the model: {c['error']}")
    return counts


def _int(cfg: Mapping, *keys: str) -> int | None:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def model_from_count(count: Mapping) -> TransformerConfig:
    """A ``count_config`` answer -> TransformerConfig with the model's own tensors.

    Dimensions for the activation and KV formulas are read from the resolved config
    (``count["config"]``); the KV cache per layer from ``layer_types``/``layer_windows``
    (transformers' DynamicCache); the values each layer caches per token from the cache a
    meta-device forward left (``kv_layout``, ``_kv_fields``), else from the config's attention
    flags (``attention.read_attention``).

    Args:
        count: one entry of ``count_with_transformers``.

    Returns:
        a TransformerConfig; ``source`` names transformers' version.

    Raises:
        ValueError: a count without the dimensions the formulas need.
    """
    cfg = count["config"]
    layers = _int(cfg, "num_hidden_layers", "n_layer")
    hidden = _int(cfg, "hidden_size", "n_embd")
    heads = _int(cfg, "num_attention_heads", "n_head")
    vocab = _int(cfg, "vocab_size")
    if layers is None or hidden is None or heads is None or vocab is None:
        raise ValueError(f"{count.get('path')}: the resolved config has no layers/hidden/heads/vocab")
    head_dim = resolve_head_dim(hidden, heads, _int(cfg, "head_dim"))
    ffn = _int(cfg, "intermediate_size", "n_inner") or 4 * hidden
    experts = count.get("experts") or {}
    types = count.get("layer_types")
    windows = count.get("layer_windows")
    return TransformerConfig(
        model_type=str(cfg.get("model_type")),
        layers=layers,
        hidden=hidden,
        heads=heads,
        head_dim=head_dim,
        ffn_hidden=ffn,
        vocab=vocab,
        gated_mlp=str(cfg.get("model_type")) != "gpt2",
        tie_embeddings=bool(count.get("tied")),
        sliding_window=_int(cfg, "sliding_window"),
        layer_types=tuple(types) if types else None,
        layer_windows=tuple(windows) if windows and len(windows) == layers else None,
        **_kv_fields(count, heads, head_dim, layers),
        dtype=cfg.get("dtype") or cfg.get("torch_dtype"),
        counted=_counted_tensors(count),
        experts=experts.get("num_experts", 0),
        experts_per_token=experts.get("per_token", 0),
        active_parameters=experts.get("active_parameters"),
        active_ffn_hidden=_active_ffn_hidden(cfg, experts, ffn),
        linears=tuple(LinearModule(x["name"], x["in"], x["out"], x["count"]) for x in count.get("linears") or [])
        or None,
        source=count["source"],
    )


KV_CACHE_LAYERS = ("DynamicLayer", "DynamicSlidingWindowLayer", "DummyLayer")
"""transformers' cache layers (``cache_utils.py``) that hold K and V tensors only, read per token
(``DummyLayer`` holds none: a layer that reads another layer's cache, or has no attention)."""


def _kv_fields(count: Mapping, heads: int, head_dim: int, layers: int) -> dict:
    """The KV fields of a counted model's TransformerConfig: ``kv_heads``, ``kv_values_per_token``,
    ``cache_layers`` (the probed cache's layers), ``kv_layout`` (in words) and ``kv_unknown``.

    transformers' own cache (``worker/count.py`` ``cache_layout``) wins; without it the
    config's flags are read (``read_attention``), and a layout neither gives is ``kv_unknown``.
    """
    cfg = count["config"]
    try:
        flags = read_attention(cfg, heads, head_dim)
        shared = shared_cache_layers(cfg, layers)
    except UnknownAttention as exc:
        flags, shared, reason = None, 0, str(exc)
    probe = count.get("kv_layout") or {}
    fields: dict = {"kv_heads": flags.kv_heads if flags else heads, "kv_unknown": None}
    if flags and flags.kind == "latent":
        fields["kv_values_per_token"] = flags.values_per_token
    other = sorted({x.get("kind") for x in probe.get("layers") or ()} - set(KV_CACHE_LAYERS))
    if other:
        return {**fields, "kv_unknown": f"transformers' cache has layers {', '.join(map(str, other))}, not K/V only"}
    if probe.get("layers"):
        cache = tuple((int(x["values"]), x["window"]) for x in probe["layers"])
        shapes = sorted(
            {(tuple(x["keys"][1::2]), tuple(x["values_shape"][1::2])) for x in probe["layers"] if x["keys"]}
        )
        held = ", ".join(f"K {k[0]} x {k[1]} + V {v[0]} x {v[1]}" for k, v in shapes)
        named = flags.describe() if flags else f"flags not read ({reason})"
        fields.update(cache_layers=cache, kv_layout=f"{named}; transformers' {probe['cache']} holds {held} per token")
        if flags and not shared and {v for v, _ in cache if v} != {flags.values_per_token}:
            fields["kv_layout"] += (
                f" (the flags read {flags.values_per_token} values per token: the cache's are counted)"
            )
        return fields
    if flags is None:
        return {**fields, "kv_unknown": f"{reason}; transformers' cache probe: {probe.get('error', 'none')}"}
    if shared:
        return {**fields, "kv_unknown": f"num_kv_shared_layers: {shared} without transformers' cache probe"}
    fields.update(kv_layout=flags.describe() + " (read from the config's flags)")
    return fields


def _counted_tensors(count: Mapping) -> tuple[ParamTensor, ...]:
    """The tensors of a ``count_config`` answer, one ParamTensor per tensor (``kind.i``)."""
    return tuple(
        ParamTensor(f"{t['kind']}.{i}", tuple(t["shape"]), bool(t["quantizable"]))
        for t in count["tensors"]
        for i in range(t["count"])
    )


def _active_ffn_hidden(cfg: Mapping, experts: Mapping, ffn: int) -> int | None:
    """The MLP width one token passes through in a mixture of experts: top-k x the expert's
    width (``moe_intermediate_size``), plus the shared experts'; None for a dense model."""
    if not experts:
        return None
    expert_ffn = _int(cfg, "moe_intermediate_size") or ffn
    shared = (_int(cfg, "n_shared_experts") or 0) * expert_ffn + (_int(cfg, "shared_expert_intermediate_size") or 0)
    return experts["per_token"] * expert_ffn + shared


def describe_config(path: str | Path, counter: str = "auto") -> TransformerConfig:
    """A local config.json described for the estimator, counted by ``counter`` (``COUNTERS``).

    ``auto`` asks transformers when it is installed and falls back to the formula parser
    only when it is not (a config transformers cannot build is an error, not a fallback).

    Args:
        path: a config.json or its directory.
        counter: ``auto``, ``transformers`` or ``parser``.

    Returns:
        a TransformerConfig (``source`` says who counted).

    Raises:
        CountUnavailable: ``transformers`` asked for and unavailable, or it failed.
        hf_config.UnknownConfig: the parser does not understand the config (it names keys).
        FileNotFoundError, ValueError: no such file, not JSON, missing keys.
    """
    if counter not in COUNTERS:
        raise ValueError(f"unknown counter {counter!r}: expected one of {', '.join(COUNTERS)}")
    if counter == "parser" or (counter == "auto" and not transformers_installed()):
        return load_hf_config(path)
    read_config_json(path)  # a file the worker may read: regular, bounded, JSON (else refused here)
    return model_from_count(count_with_transformers([path])[0])
