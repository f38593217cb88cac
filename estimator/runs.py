"""The estimate of one run of any workload, or the reason there is none.

``estimate_run`` is what the sweeper puts into a spec (``estimate``, and
``estimate_missing_reason`` when the estimate is null or leaves a component out):

* ``mlp``: the exact allocation replay (``workloads.estimate_for_spec``);
* ``transformer`` (``worker/models.py``) and ``hf`` (transformers' own count,
  ``counted.model_from_count``): the formulas of ``transformer`` for the run's mode (LoRA:
  ``finetune.estimate_lora_run``; training: ``training_state`` and ``training_activations``;
  generation: ``kv_cache_estimate`` over context + new_tokens); inference and prefill
  activations are not estimated (null, with the reason);
* ``user``: arbitrary user code, not described to the estimator: null, with the reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from memsweep.conf.contract import RunSpec

from .activations import run_activations
from .breakdown import Breakdown
from .counted import model_from_count
from .finetune import base_formats, estimate_lora_run, lora_settings
from .formats import DTYPE_BYTES, DTYPE_FORMATS, weights_from_shapes
from .training import counts_step_tensors, training_state
from .transformer import TransformerConfig, kv_cache_estimate, training_activations
from .workloads import estimate_for_spec

USER_REASON = (
    "user workload: its model is user code (workload.model), not described to the estimator; "
    "dry_run=true predicts it from the model's own ops"
)
"""Why a ``user`` run has no estimate."""


def transformer_workload_model(workload: Mapping, width: int) -> TransformerConfig:
    """memsweep's ``transformer`` workload (``worker.models.Transformer``) as a TransformerConfig.

    Same defaults as ``worker.workloads.transformer.transformer_dims``: hidden = width, kv_heads
    = heads, head_dim = hidden / heads, ffn_hidden = 4 x hidden. No biases, no learned
    positions (rotary), two norms per layer (LayerNorm: weight and bias), a gated MLP for
    ``ffn: swiglu``.

    Args:
        workload: the spec's validated ``workload`` mapping (name ``transformer``).
        width: the spec's ``width``.

    Returns:
        a TransformerConfig whose ``tensors()`` are the workload's parameters.
    """
    hidden = workload.get("hidden") or width
    heads = workload.get("heads", 4)
    return TransformerConfig(
        model_type="memsweep transformer",
        layers=workload.get("layers", 2),
        hidden=hidden,
        heads=heads,
        kv_heads=workload.get("kv_heads") or heads,
        head_dim=workload.get("head_dim") or hidden // heads,
        ffn_hidden=workload.get("ffn_hidden") or 4 * hidden,
        vocab=workload.get("vocab", 32000),
        gated_mlp=workload.get("ffn") == "swiglu",
        tie_embeddings=bool(workload.get("tie_embeddings")),
        norm=workload.get("norm", "rmsnorm"),
        source="memsweep's transformer workload (worker/models.py)",
    )


def estimate_lm_run(model: TransformerConfig, data: Mapping) -> tuple[Breakdown, str | None]:
    """The estimate of a transformer/hf run of ``model`` described by the spec ``data``.

    Args:
        model: the run's model (``transformer_workload_model`` or ``model_from_count``).
        data: the spec's fields (``RunSpec.to_dict``).

    Returns:
        (Breakdown, reason): the reason names what the estimate leaves out, or ``None``.

    Raises:
        ValueError: a size the formulas reject.
    """
    compute = DTYPE_BYTES[DTYPE_FORMATS[data.get("dtype", "float32")]]
    fmt, keep = base_formats(data)
    param_bytes = fmt.bits // 8
    tensors = model.tensors()
    params = sum(t.numel for t in tensors)
    stored = fmt.name if fmt == keep else f"{fmt.name} (decoder Linear weights; the others in {keep.name})"
    b = Breakdown(weights=weights_from_shapes(tensors, fmt, keep)).with_note(
        f"{model.model_type}: {params} parameters ({model.source}) in {stored}"
    )
    mode = data.get("mode", "inference")
    batch, context = data["batch"], data["context"]
    missing = []
    if mode == "train":
        attention = (data.get("workload") or {}).get("attention", "sdpa")
        settings = run_activations(batch, context, data.get("checkpointing"), attention)
        if lora_settings(data.get("workload") or {}) is not None:
            b = estimate_lora_run(model, data, settings)
        else:
            optimizer = data.get("optimizer", "adamw")
            state = training_state(
                params,
                param_bytes=param_bytes,
                optimizer=optimizer,
                mixed_precision=False,
                shapes=[t.shape for t in tensors],
                step_tensors=counts_step_tensors(optimizer, str(data.get("device", "cpu"))),
            )
            acts, note = training_activations(model, settings, compute_bytes=compute)
            b = b.replace(gradients=state.gradients, optimizer_states=state.optimizer_states, activations=acts)
            b = b.with_note(*state.notes, note)
        if data.get("eval_batch"):
            missing.append("the eval phase's activations")
    elif mode == "generate":
        tokens = context + data.get("new_tokens", 16)
        static = tokens if data.get("kv_cache") == "static" else None
        kv, note = kv_cache_estimate(model, tokens, batch, compute, static)
        b = b.replace(kv_cache=kv).with_note(note)
        missing.append("prefill activations and logits")
        if kv is None:
            missing.append(f"the KV cache ({model.kv_unknown})")
    else:
        missing.append("inference activations and logits")
    reason = f"{', '.join(missing)} not estimated (formulas for training and the KV cache only)" if missing else None
    return b, reason


def estimate_run(spec: Any, count: Mapping | None = None) -> tuple[Breakdown | None, str | None]:
    """The estimate of a run (a RunSpec or its dict), and what it leaves out or why it is null.

    Args:
        spec: a ``conf.contract.RunSpec`` (anything with ``to_dict``) or a mapping of its fields.
        count: for an ``hf`` run, transformers' count of its model (an entry of
            ``counted.count_with_transformers``), or ``{"error": ...}`` when it failed; ``None``
            when it was not asked for.

    Returns:
        (Breakdown or ``None``, reason or ``None``): the reason is set whenever the estimate is
        null or leaves a component of the run out.
    """
    data = spec.to_dict() if hasattr(spec, "to_dict") else dict(spec)
    workload = data.get("workload") or {"name": "mlp"}
    name = workload.get("name")
    if name == "mlp":
        b = estimate_for_spec(data)
        if b is not None:
            return b, None
        options = ("precision", "optimizer", "checkpointing", "micro_steps", "eval_batch", "export")
        defaults = {f.name: f.default for f in dataclasses.fields(RunSpec) if f.name in options}
        defaults["precision"] = "pure"  # a spec stores it resolved; the replay models pure
        changed = [f"{k}={data.get(k)}" for k in options if data.get(k, defaults[k]) != defaults[k]]
        return (
            None,
            f"mlp with {', '.join(changed)}: the exact replay models precision=pure and the default mode options only",
        )
    if name == "user":
        return None, USER_REASON
    try:
        if name == "transformer":
            model = transformer_workload_model(workload, data["width"])
        elif name == "hf":
            if count is None:
                return None, "hf: transformers' count of the model was not asked for"
            if count.get("error"):
                return None, f"hf: transformers could not count the model: {count['error']}"
            model = model_from_count(count)
        else:
            return None, f"workload {name!r} is not described to the estimator"
        return estimate_lm_run(model, data)
    except (KeyError, ValueError) as exc:
        return None, f"{name}: the estimate failed: {exc}"
