"""A DDP/FSDP run's per-rank figures (no torch): the phases table's ``ranks`` column, and each
rank's model states as the run recorded them, beside the estimator's (runs.parquet's
``MODEL_STATE_COLUMNS``)."""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from conf.contract import INFERENCE_PHASES, PHASE_RANK_FIELDS, STEP_SUB_PHASES, record_phases

from .estimate import PARALLEL_ZERO_STAGE, estimated_model_states

RANK_TYPES = {int: pa.int64(), float: pa.float64(), str: pa.string()}
RANK_TYPE = pa.list_(pa.struct([(f.name, RANK_TYPES[f.type]) for f in PHASE_RANK_FIELDS]))
"""Type of the phases table's ``ranks`` column: one struct per rank of a DDP/FSDP run."""

INPUTS = INFERENCE_PHASES[1]
BACKWARD, OPTIMIZER_STEP = STEP_SUB_PHASES[2:]

MODEL_STATE_COLUMNS = tuple(
    (name, pa.float64() if name.endswith("_ratio") else pa.int64())
    for name in (
        "model_states_zero_stage",
        "estimated_model_states_bytes",
        "model_states_bytes",
        "model_states_ratio",
        "model_states_allocated_bytes",
        "model_states_allocated_ratio",
    )
)
"""runs.parquet's columns of a DDP/FSDP run's model states per rank (null for any other run, and
wherever a figure is missing; never 0 for "unknown"):

* ``model_states_zero_stage``: the ZeRO stage the run matches (0 for ddp, 3 for fsdp;
  ``analysis.estimate.PARALLEL_ZERO_STAGE``);
* ``estimated_model_states_bytes``: **calculated**: the spec's estimate of the weights,
  gradients and optimizer states partitioned at that stage over ``world_size`` ranks
  (``analysis.estimate.estimated_model_states``);
* ``model_states_bytes``: **recorded**, by construction: on each rank, its parameters
  (``ranks[].local_parameter_bytes``, after model_load) + its gradients (``gradient_bytes`` after
  the last backward that ran ok) + its optimizer states (``optimizer_state_bytes`` after the last
  optimizer_step that ran ok): the storage bytes of the rank's own tensors of each kind (its
  shards under FSDP, padding included), summed by the worker; the largest over the ranks (the
  fullest rank); null unless every rank has all three;
* ``model_states_allocated_bytes``: **observed** with the counters: on each rank,
  ``memory_allocated`` at the end of the last optimizer_step that ran ok, less what the inputs
  phase added (its ``memory_allocated`` less its ``memory_allocated_start``; not less model_load's
  end, which on a DDP rank > 0 can still hold the transient of the parameters' broadcast, released
  on gloo's thread a moment later): what the rank's allocator holds
  between two steps apart from the inputs. That is the model states plus what the wrapper keeps
  beside them (DDP's gradient buckets, a replica's size; FSDP's device mesh); the largest over
  the ranks, null unless every rank has it;
* ``model_states_ratio``, ``model_states_allocated_ratio``: each measured figure / the estimate
  (float; null when either is)."""


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def rank_rows(value) -> list[dict] | None:
    """A phase's ``ranks`` list as rows of RANK_TYPE; null when absent (a one-process run)."""
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
                v = _int(v)
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
            if isinstance(entry, Mapping) and entry.get("status") == "ok" and _int(entry.get("rank")) is not None:
                seen.setdefault(entry["rank"], {})[key] = entry
    out = []
    for r in ranks:
        rank = _int(r.get("rank")) if isinstance(r, Mapping) else None
        got = seen.get(rank, {}) if rank is not None else {}
        params = _int(r.get("local_parameter_bytes")) if isinstance(r, Mapping) else None
        grads = _int(got.get(BACKWARD, {}).get("gradient_bytes"))
        states = _int(got.get(OPTIMIZER_STEP, {}).get("optimizer_state_bytes"))
        after_step = _int(got.get(OPTIMIZER_STEP, {}).get("memory_allocated"))
        # the inputs' bytes: what the inputs phase itself added (its end less its start; model_load's
        # end can still hold a collective's transient, released on gloo's thread before inputs starts)
        before_inputs = _int(got.get(INPUTS, {}).get("memory_allocated_start"))
        with_inputs = _int(got.get(INPUTS, {}).get("memory_allocated"))
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
        return {name: None for name, _ in MODEL_STATE_COLUMNS}
    estimated = estimated_model_states(spec.get("estimate"), parallel, _int(spec.get("world_size", 1)))
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
