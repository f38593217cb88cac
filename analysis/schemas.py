"""Schemas of the Parquet tables (``runs``, ``phases``) that analysis.tables builds, and
``coerce_table``, which gives a list of row mappings exactly one of them: every byte column is a
nullable int64 (null = not measured, never 0), so any sweep's files read together as one dataset.
Imports pyarrow and conf.contract only."""

from __future__ import annotations

import pyarrow as pa

from conf.contract import (
    DEVICE_COUNTERS,
    EXTRA_COUNTERS,
    OOM_DETAIL_FIELDS,
    PEAK_SPLIT_FIELDS,
    PER_DEVICE_EXTRAS,
    PHASE_COUNTERS,
    SIZE_FIELDS,
)

from .estimate import ESTIMATE_COLUMNS
from .ranks import MODEL_STATE_COLUMNS, RANK_TYPE

# The record's phase fields (conf.contract.record, declared there): the counters, then, where the
# backend or the phase has them (null otherwise), extra counters, sizes by construction (tensor
# bytes summed by the worker, not counters) and an OOM's refused request.
COUNTERS = PHASE_COUNTERS
SIZES = SIZE_FIELDS
OOM_DETAIL = OOM_DETAIL_FIELDS
# Mode options of the spec (conf.contract.RunSpec), one column each in the runs table.
OPTIONS = (
    ("precision", pa.string()),
    ("optimizer", pa.string()),
    ("checkpointing", pa.bool_()),
    ("micro_steps", pa.int64()),
    ("eval_batch", pa.int64()),
    ("export", pa.bool_()),
    ("new_tokens", pa.int64()),
    ("kv_cache", pa.string()),
    ("compile", pa.string()),
)

ENV_COLUMNS = (
    "device_kind",
    "device_name",
    "device_total_memory",
    "torch",
    "python",
    "cuda",
    "hip",
    "driver",
    "allocator_backend",
    "alloc_conf",
    "host",
    "torch_dynamo_imported",
    "schema_version",
)
"""Runs-table columns of the environment (what the worker found), in the order compare shows them."""


RUNS_SCHEMA = pa.schema(
    [
        ("sweep_dir", pa.string()),
        ("run_id", pa.string()),
        ("run_dir", pa.string()),
        ("workload", pa.string()),
        ("mode", pa.string()),
        ("batch", pa.int64()),
        ("context", pa.int64()),
        ("width", pa.int64()),
        ("dtype", pa.string()),
        ("workload_params", pa.string()),
        ("warmup", pa.int64()),
        ("repeats", pa.int64()),
        ("seed", pa.int64()),
        ("device", pa.string()),
        ("device_kind", pa.string()),
        ("device_name", pa.string()),
        ("device_total_memory", pa.int64()),
        ("capacity_bytes", pa.int64()),
        ("capacity_method", pa.string()),
        ("capacity_mode", pa.string()),
        *[(name, pa.int64()) for name in OOM_DETAIL_FIELDS],
        ("failure_class", pa.string()),
        ("failure_wording", pa.string()),
        ("outcome", pa.string()),
        ("failed_phase", pa.string()),
        ("error_type", pa.string()),
        ("error_message", pa.string()),
        ("returncode", pa.int64()),
        ("signal", pa.int64()),
        ("timed_out", pa.bool_()),
        ("wall_s", pa.float64()),
        ("worker_pid", pa.int64()),
        ("n_phases", pa.int64()),
        ("max_memory_allocated", pa.int64()),
        ("max_memory_reserved", pa.int64()),
        ("completed_max_memory_allocated", pa.int64()),
        ("completed_max_memory_reserved", pa.int64()),
        ("cold_max_memory_allocated", pa.int64()),
        ("cold_max_memory_reserved", pa.int64()),
        ("warm_max_memory_allocated", pa.int64()),
        ("warm_max_memory_reserved", pa.int64()),
        ("source_allocated", pa.string()),
        ("source_reserved", pa.string()),
        ("source", pa.string()),  # measured | predicted (a dry run: spec dry_run, fake tensors)
        ("python", pa.string()),
        ("torch", pa.string()),
        ("cuda", pa.string()),
        ("hip", pa.string()),
        ("driver", pa.string()),
        ("allocator_backend", pa.string()),
        ("alloc_conf", pa.string()),
        ("host", pa.string()),
        ("started_at", pa.string()),
        ("schema_version", pa.int64()),
        # how the worker process was started: on the CPU its resident set (memory_reserved) counts
        # the code it holds (spawn vs forkserver; torch._dynamo imported before the phases or not)
        ("isolation", pa.string()),
        ("torch_dynamo_imported", pa.bool_()),
        ("record_problem", pa.string()),
        *[(name, pa.float64() if name == "estimate_error" else pa.int64()) for name in ESTIMATE_COLUMNS],
        ("estimate_missing_reason", pa.string()),
        *OPTIONS,
        ("train_step", pa.string()),  # train: memsweep or user (the user's workload.train_step, one sub-phase)
        ("parameters", pa.int64()),
        ("parameter_bytes", pa.int64()),
        ("trainable_parameters", pa.int64()),
        ("frozen_parameters", pa.int64()),
        ("trainable_parameter_bytes", pa.int64()),
        ("devices", pa.int64()),
        # CUDA: the memory outside the caching allocator (context, handles, kernels), the fraction
        # applied for capacity minus it, and what made the measurement doubtful
        ("max_outside_allocator_bytes", pa.int64()),
        ("outside_allocator_start_bytes", pa.int64()),
        ("memory_fraction", pa.float64()),
        ("memory_fraction_nominal", pa.float64()),
        ("allocator_limit_bytes", pa.int64()),
        ("device_not_free", pa.string()),
        ("allocator_backend_warning", pa.string()),
        ("cublas_workspace_config", pa.string()),
        # a DDP/FSDP run (spec parallel): its ranks, the fullest one and the one whose failure ended it
        ("parallel", pa.string()),
        ("world_size", pa.int64()),
        ("reshard_after_forward", pa.bool_()),
        ("global_batch", pa.int64()),
        ("peak_rank", pa.int64()),
        ("failed_rank", pa.int64()),
        *MODEL_STATE_COLUMNS,  # its model states per rank, recorded and calculated (ZeRO stage 0 or 3)
    ]
)
"""One row per run. ``max_memory_*``: the largest phase peak of the run (bytes); ``completed_*``: the
largest peak of the phases that ran ok (null when none did; on an ok run the same as ``max_memory_*``;
the frontier's peak of a run that fits for its axis but ran out of memory in a later phase that
does not scale with it, conf.contract.oom_attribution); ``cold_*`` /
``warm_*``: the peaks of the cold and warm phases (cold_forward, or the sub-phases of cold_step /
cold_generate; likewise warm). ``train_step``: who ran a training run's steps (conf.contract
TRAIN_STEP_KINDS): ``memsweep`` (split into forward, loss, backward, optimizer_step) or ``user``
(the user's own ``workload.train_step``, one sub-phase ``user_step`` per step; the others have no
row); null outside train mode and in records written before the field. ``est_*``: calculated
before the run (the spec's estimate, analysis/estimate/; of one rank for a DDP/FSDP run, its model states
partitioned at the run's ZeRO stage: analysis.estimate.rank_estimate), never measured;
``estimate_error`` = (est_peak_bytes - max_memory_allocated) / max_memory_allocated;
``estimate_missing_reason``: why the estimate is null,
or what it leaves out (null when complete). ``parameters``, ``parameter_bytes``: the model's,
by construction (the worker's record). ``devices``: devices the run used (spec ``devices``; 1 for
a spec written before the field, which was a one-device run); on several devices the peaks are the
largest over the devices (conf.contract.phase_peak), the one the capacity is compared with.
``max_outside_allocator_bytes``: the largest per-phase ``outside_allocator_bytes`` (total - free -
reserved, bytes); ``outside_allocator_start_bytes``, ``memory_fraction`` (applied, for capacity minus
the start footprint), ``memory_fraction_nominal`` (capacity / total), ``allocator_limit_bytes``,
``device_not_free`` and ``allocator_backend_warning``: the record's ``capacity`` (CUDA).
``oom_*_bytes`` (conf.contract.OOM_DETAIL_FIELDS): what the run's OOM said (its failed phase's
fields; null when it did not say, or the run did not run out of memory). ``failure_class``: the
failed phase's class (oom, memory_suspect or error; conf.contract.FAILURE_CLASSES; a record
written before the field gives its phase's status), ``failure_wording``: the worker.classify
wording its message matched. ``model_states_*``, ``estimated_model_states_bytes``: a DDP/FSDP
run's model states on its fullest rank, recorded beside the estimator's ZeRO figure
(analysis.ranks.MODEL_STATE_COLUMNS)."""

DEVICE_TYPE = pa.list_(
    pa.struct([("device_index", pa.int64()), *[(name, pa.int64()) for name in DEVICE_COUNTERS + PER_DEVICE_EXTRAS]])
)
"""Type of the phases table's ``devices`` column: one struct per device of a multi-device run."""

PHASES_SCHEMA = pa.schema(
    [
        ("sweep_dir", pa.string()),
        ("run_id", pa.string()),
        ("batch", pa.int64()),
        ("context", pa.int64()),
        ("width", pa.int64()),
        ("dtype", pa.string()),
        ("mode", pa.string()),
        ("device", pa.string()),
        ("phase", pa.string()),
        ("phase_index", pa.int64()),
        ("status", pa.string()),
        ("iterations", pa.int64()),
        ("duration_s", pa.float64()),
        *[(name, pa.int64()) for name in COUNTERS],
        ("error_type", pa.string()),
        ("failure_class", pa.string()),
        ("failure_wording", pa.string()),
        ("parent", pa.string()),
        ("sub_phase", pa.string()),
        ("step", pa.int64()),
        ("micro_step", pa.int64()),
        *[(name, pa.int64()) for name in EXTRA_COUNTERS + SIZES + OOM_DETAIL],
        ("source", pa.string()),
        *[(name, pa.int64()) for name in PEAK_SPLIT_FIELDS],
        ("devices", DEVICE_TYPE),
        ("rank", pa.int64()),
        ("peak_rank", pa.int64()),
        ("ranks", RANK_TYPE),
    ]
)
"""One row per run and phase; counters in bytes as recorded by the worker (seed 003 protocol).
A sub-phase of a training step or a generation (``phase`` = ``cold_step.backward``) also has
``parent`` (cold_step), ``sub_phase`` (backward), ``step`` and ``micro_step``. ``source``:
measured, or predicted (a dry run). ``predicted_parameter_bytes``, ``predicted_gradient_bytes``,
``predicted_optimizer_state_bytes``, ``predicted_activation_bytes``: a predicted row's peak
(``max_memory_allocated``) split by what was live at that moment (the categories of
torch.distributed._tools.mem_tracker; activation = activations and temporaries, everything
else); they sum to the peak. Null on measured rows, and on records written before the split.
``devices``: a run on several devices (spec ``devices`` > 1), one struct per device in order,
``device_index`` and the six counters (bytes, null when unreadable); the row's own counters are
those of cuda:0, the run's device. Null for a one-device run and for records without it.
``rank``, ``peak_rank``, ``ranks``: a DDP/FSDP run's phase: whose counters the row's are (rank 0,
or the rank whose failure ended the run), the rank with the largest ``max_memory_allocated``, and
one struct per rank that recorded the phase (conf.contract.PHASE_RANK_FIELDS); null otherwise."""


def as_int(value) -> int | None:
    """An int field of a record, or None when it is missing or of another type (a bool too)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def coerce_table(rows: list[dict], schema: pa.Schema) -> pa.Table:
    """Build a table with exactly ``schema``; a value of the wrong type becomes null.

    Args:
        rows: one mapping per row; a column the schema has and a row lacks is null, a key
            the schema lacks is dropped.
        schema: the table's schema (RUNS_SCHEMA, PHASES_SCHEMA, FRONTIER_SCHEMA...); bytes are int64.

    Returns:
        A table of ``len(rows)`` rows and exactly ``schema``'s columns, in its order (a
        missing measurement is null, never 0).
    """
    columns = {}
    for f in schema:
        values = []
        for row in rows:
            v = row.get(f.name)
            if pa.types.is_int64(f.type):
                v = as_int(v)
            elif pa.types.is_float64(f.type):
                v = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
            elif pa.types.is_boolean(f.type):
                v = v if isinstance(v, bool) else None
            elif pa.types.is_string(f.type):
                v = None if v is None else str(v)
            elif pa.types.is_list(f.type):
                v = v if isinstance(v, list) else None
            values.append(v)
        columns[f.name] = pa.array(values, type=f.type)
    return pa.table(columns, schema=schema)
