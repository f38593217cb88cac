"""What a predicted edge consists of (``memsweep predict``): the dry run's phases, the split of its
largest peak by category (conf.contract.PEAK_CATEGORIES) and, for an hf load, the estimator's
figures beside it (calculated, ``memsweep.estimator``). All figures are bytes; every one is a
prediction (fake tensors), never a measurement.
"""

from __future__ import annotations

from memsweep.conf.contract import PEAK_CATEGORIES, RunSpec


def breakdown(record: dict) -> list[dict]:
    """What a dry run predicts, phase by phase.

    Args:
        record: a dry run's record.json.

    Returns:
        One dict per phase: "phase", "peak_bytes" (predicted ``max_memory_allocated``),
        "live_bytes" (``memory_allocated`` at its end), the peak's split by category
        (``predicted_*_bytes``, conf.contract.PEAK_CATEGORIES; None when the record has
        none) and the sizes by construction the worker adds (``gradient_bytes``,
        ``optimizer_state_bytes``, ``kv_cache_bytes``, at the phase's end), all bytes.
    """
    rows = []
    for p in record.get("phases", []):
        rows.append(
            {
                "phase": p["name"],
                "peak_bytes": p.get("max_memory_allocated"),
                "live_bytes": p.get("memory_allocated"),
                **{field: p.get(field) for _, field in PEAK_CATEGORIES},
                **{
                    k: p[k]
                    for k in ("gradient_bytes", "optimizer_state_bytes", "kv_cache_bytes")
                    if p.get(k) is not None
                },
            }
        )
    return rows


def peak_split_at(record: dict) -> dict | None:
    """The split of the largest predicted peak by category.

    Args:
        record: a dry run's record.json.

    Returns:
        {"phase", "peak_bytes", and each ``predicted_*_bytes`` field (bytes)} of the phase
        with the largest predicted peak (the first such phase), or None when no phase has a
        peak or that phase has no split (a record written before it existed).
    """
    phases = [p for p in record.get("phases", []) if p.get("max_memory_allocated") is not None]
    if not phases:
        return None
    top = max(phases, key=lambda p: p["max_memory_allocated"])
    split = {field: top.get(field) for _, field in PEAK_CATEGORIES}
    if any(v is None for v in split.values()):
        return None
    return {"phase": top["name"], "peak_bytes": top["max_memory_allocated"], **split}


def hf_config(spec: RunSpec, record: dict | None) -> dict | None:
    """The model config an hf load's dry run recorded (record.json's ``model.hf_config``, what
    the estimator reads), or None: another workload, no record, or a record without it."""
    if spec.workload_name != "hf":
        return None
    return ((record or {}).get("model") or {}).get("hf_config") or None


def estimator_figures(spec: RunSpec, record: dict | None) -> dict | None:
    """The estimator's weights, gradients and optimizer states of an hf load, to print beside a
    dry run's split (calculated: ``estimator.hf_load.estimate_hf_load`` on the resolved
    config the dry run recorded, ``model.hf_config``).

    Args:
        spec: the load.
        record: a dry run's record.json of that load (or None).

    Returns:
        {"weights", "gradients", "optimizer_states"} in bytes (None where not asked for: the
        last two outside train mode), and "phase" with "predicted": the dry run's split at that
        phase's peak, {same keys: bytes}, where all three are live (``cold_step.optimizer_step``
        in train mode, the last phase otherwise); or None for another workload, a record
        without the config, or a config the estimator cannot read.
    """
    from memsweep.estimator.hf_load import estimate_hf_load

    config = hf_config(spec, record)
    if config is None:
        return None
    try:
        est = estimate_hf_load(config, spec)
    except ValueError:
        return None
    phases = {p["name"]: p for p in (record or {}).get("phases", [])}
    name = "cold_step.optimizer_step" if spec.mode == "train" else next(reversed(phases), None)
    at = phases.get(name) or {}
    predicted = {
        "weights": at.get("predicted_parameter_bytes"),
        "gradients": at.get("predicted_gradient_bytes") if spec.mode == "train" else None,
        "optimizer_states": at.get("predicted_optimizer_state_bytes") if spec.mode == "train" else None,
    }
    return {
        "weights": est.weights,
        "gradients": est.gradients,
        "optimizer_states": est.optimizer_states,
        "phase": name if at else None,
        "predicted": predicted,
    }
