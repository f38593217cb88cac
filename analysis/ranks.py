"""A DDP/FSDP run's per-rank figures (no torch): the phases table's ``ranks`` column, and each
rank's model states as the run recorded them, beside the estimator's (runs.parquet's
``MODEL_STATE_COLUMNS``)."""

from __future__ import annotations

from collections.abc import Mapping

from memsweep.conf.contract import INFERENCE_PHASES, PHASE_RANK_FIELDS, STEP_SUB_PHASES, record_phases
from memsweep.estimator import PARALLEL_ZERO_STAGE, estimated_model_states

from .schemas import MODEL_STATE_COLUMNS, as_int

INPUTS = INFERENCE_PHASES[1]
BACKWARD, OPTIMIZER_STEP = STEP_SUB_PHASES[2:]


def rank_rows(value) -> list[dict] | None:
    """A phase's ``ranks`` list as rows of analysis.schemas.RANK_TYPE; null when absent (a one-process run)."""
    if not isinstance(value, list):
        return None
    out = []
    for r in value:
        if not isinstance(r, dict):
            continue
        row = {}
        for f in PHASE_RANK_FIELDS:
            v = r.get(f.name)
            if f.type is int:
                v = as_int(v)
            elif f.type is float:
                v = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
            else:
                v = v if isinstance(v, str) else None
            row[f.name] = v
        out.append(row)
    return out


def rank_model_states(record: Mapping | None) -> list[dict]:
    """Each rank's model states as its record shows them (see ``MODEL_STATE_COLUMNS``).

    Args:
        record: a DDP/FSDP run's merged record (``ranks``, and per phase ``ranks`` entries).

    Returns:
        One dict per rank of the record's ``ranks``, in order: ``rank``, ``model_states_bytes``
        and ``model_states_allocated_bytes`` (bytes, None where a figure is missing: a rank that
        failed before its first optimizer step, a record without ranks).
    """
    ranks = record.get("ranks") if isinstance(record, Mapping) else None
    if not isinstance(ranks, list):
        return []
    # {rank: {phase key: the rank's entry}}: the last ok backward and optimizer step win (a
    # rank's gradients and optimizer states have the same size at every step)
    seen: dict[int, dict[str, Mapping]] = {}
    for phase in record_phases(record):
        key = INPUTS if phase.get("name") == INPUTS else phase.get("sub_phase")
        if key not in (INPUTS, BACKWARD, OPTIMIZER_STEP):
            continue
        for entry in phase.get("ranks") or []:
            if isinstance(entry, Mapping) and entry.get("status") == "ok" and as_int(entry.get("rank")) is not None:
                seen.setdefault(entry["rank"], {})[key] = entry
    out = []
    for r in ranks:
        rank = as_int(r.get("rank")) if isinstance(r, Mapping) else None
        got = seen.get(rank, {}) if rank is not None else {}
        params = as_int(r.get("local_parameter_bytes")) if isinstance(r, Mapping) else None
        grads = as_int(got.get(BACKWARD, {}).get("gradient_bytes"))
        states = as_int(got.get(OPTIMIZER_STEP, {}).get("optimizer_state_bytes"))
        after_step = as_int(got.get(OPTIMIZER_STEP, {}).get("memory_allocated"))
        # the inputs' bytes: what the inputs phase itself added (its end less its start; model_load's
        # end can still hold a collective's transient, released on gloo's thread before inputs starts)
        before_inputs = as_int(got.get(INPUTS, {}).get("memory_allocated_start"))
        with_inputs = as_int(got.get(INPUTS, {}).get("memory_allocated"))
        out.append(
            {
                "rank": rank,
                "model_states_bytes": _total(params, grads, states),
                "model_states_allocated_bytes": _total(
                    after_step, before_inputs, -with_inputs if with_inputs is not None else None
                ),
            }
        )
    return out


def _total(*values: int | None) -> int | None:
    """The sum of ``values``; None when any of them is."""
    known = [v for v in values if v is not None]
    return sum(known) if len(known) == len(values) else None


def _fullest(per_rank: list[dict], key: str) -> int | None:
    values = [r[key] for r in per_rank]
    return max(values) if values and all(v is not None for v in values) else None


def _ratio(measured: int | None, estimated: int | None) -> float | None:
    return measured / estimated if measured is not None and estimated else None


def model_state_columns(spec: Mapping, record: Mapping | None) -> dict:
    """The ``MODEL_STATE_COLUMNS`` of one run (all null unless it is a DDP/FSDP run).

    Args:
        spec: the run's spec (``parallel``, ``world_size``, ``estimate``).
        record: its merged record, or None.

    Returns:
        ``{column: value}`` for every column of ``MODEL_STATE_COLUMNS``: bytes as int, ratios as
        float, None where unknown.
    """
    parallel = spec.get("parallel")
    stage = PARALLEL_ZERO_STAGE.get(str(parallel))
    if stage is None:
        return dict.fromkeys(MODEL_STATE_COLUMNS)
    estimated = estimated_model_states(spec.get("estimate"), parallel, as_int(spec.get("world_size", 1)))
    per_rank = rank_model_states(record)
    measured = _fullest(per_rank, "model_states_bytes")
    allocated = _fullest(per_rank, "model_states_allocated_bytes")
    return {
        "model_states_zero_stage": stage,
        "estimated_model_states_bytes": estimated,
        "model_states_bytes": measured,
        "model_states_ratio": _ratio(measured, estimated),
        "model_states_allocated_bytes": allocated,
        "model_states_allocated_ratio": _ratio(allocated, estimated),
    }
