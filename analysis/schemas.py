"""Schemas of the Parquet tables (``runs``, ``phases``) that analysis.tables builds, and
``coerce_table``, which gives a list of row mappings exactly one of them: every byte column is a
nullable int64 (null = not measured, never 0), so any sweep's files read together as one dataset.
Imports pyarrow and conf.contract only."""

from __future__ import annotations

import pyarrow as pa

from memsweep.conf.contract import (
    CAPACITY_FIELDS,
    DEVICE_FIELDS,
    ENVIRONMENT_FIELDS,
    EXTRA_COUNTERS,
    MODEL_FIELDS,
    OOM_DETAIL_FIELDS,
    PEAK_COUNTERS,
    PEAK_SPLIT_FIELDS,
    PHASE_COUNTERS,
    PHASE_FIELDS,
    PHASE_RANK_FIELDS,
    RECORD_FIELDS,
    RESULT_FIELDS,
    SIZE_FIELDS,
    SUB_PHASE_FIELDS,
    Field,
    RunSpec,
)
from memsweep.estimator import ESTIMATE_COLUMNS

from .throughput import THROUGHPUT_TYPES

# The record's phase fields (conf.contract.record, declared there): the counters, then, where the
# backend or the phase has them (null otherwise), extra counters, sizes by construction (tensor
# bytes summed by the worker, not counters) and an OOM's refused request.
COUNTERS = PHASE_COUNTERS
SIZES = SIZE_FIELDS
OOM_DETAIL = OOM_DETAIL_FIELDS
OPTIONS = (
    "precision",
    "optimizer",
    "checkpointing",
    "micro_steps",
    "eval_batch",
    "export",
    "new_tokens",
    "kv_cache",
    "compile",
)
"""Mode options of the spec (conf.contract.RunSpec), one column each in the runs table (its type: the spec's)."""

STACK_COLUMNS = ("python", "torch", "cuda", "hip", "driver", "allocator_backend", "alloc_conf", "host")
"""Runs-table columns of the software stack and host a run ran on (the record's ``environment``)."""

ENV_COLUMNS = (
    "device_kind",
    "device_name",
    "device_total_memory",
    *STACK_COLUMNS,
    "torch_dynamo_imported",
    "schema_version",
)
"""Runs-table columns of the environment (what the worker found), in the order compare shows them."""

ARROW_TYPES = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}
"""The Parquet type of a declared scalar field (conf.contract ``Field.type``): bytes are int64."""


def struct_list(fields: tuple[Field, ...]) -> pa.DataType:
    """The type of a column holding a list of declared objects (a phase's ``devices``, ``ranks``).

    Args:
        fields: the objects' declaration (conf.contract DEVICE_FIELDS, PHASE_RANK_FIELDS); scalar types only.

    Returns:
        ``list<struct>`` with one member per field, in order, typed by ARROW_TYPES.

    Raises:
        KeyError: a field of a type with no scalar Parquet type (dict, list).
    """
    return pa.list_(pa.struct([(f.name, ARROW_TYPES[f.type]) for f in fields]))


def declared_types(*groups: tuple[Field, ...] | dict[str, type]) -> dict[str, pa.DataType]:
    """The Parquet type of every scalar field the contract declares, by name.

    Args:
        groups: declarations (RECORD_FIELDS... or ``RunSpec.field_types()``); a dict or list field
            (an object, not a column) is left out.

    Returns:
        field name -> ARROW_TYPES type.

    Raises:
        TypeError: one name declared with two different scalar types (the tables could not
            give it one column type).
    """
    out: dict[str, pa.DataType] = {}
    for group in groups:
        for name, typ in group.items() if isinstance(group, dict) else ((f.name, f.type) for f in group):
            if typ in ARROW_TYPES and out.setdefault(name, ARROW_TYPES[typ]) != ARROW_TYPES[typ]:
                raise TypeError(f"field {name}: declared both {out[name]} and {ARROW_TYPES[typ]}")
    return out


MODEL_STATE_COLUMNS = (
    "model_states_zero_stage",
    "estimated_model_states_bytes",
    "model_states_bytes",
    "model_states_ratio",
    "model_states_allocated_bytes",
    "model_states_allocated_ratio",
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


COLUMN_TYPES = {
    **declared_types(
        RunSpec.field_types(),
        RECORD_FIELDS,
        RESULT_FIELDS,
        ENVIRONMENT_FIELDS,
        CAPACITY_FIELDS,
        MODEL_FIELDS,
        PHASE_FIELDS,
    ),
    # columns analysis.tables derives (declared nowhere else)
    "sweep_dir": pa.string(),
    "run_id": pa.string(),
    "run_dir": pa.string(),
    "workload": pa.string(),  # the spec's workload mapping -> its name
    "workload_params": pa.string(),  # ... -> its other keys, as JSON text
    "alloc_conf": pa.string(),  # the environment's mapping -> JSON text
    "phase": pa.string(),  # the phase's name
    "phase_index": pa.int64(),
    "n_phases": pa.int64(),
    **{f"{group}_{c}": pa.int64() for group in ("completed", "cold", "warm") for c in PEAK_COUNTERS},
    "source_allocated": pa.string(),
    "source_reserved": pa.string(),
    "predicted_outcome": pa.string(),  # a dry run's verdict (conf.contract.predicted_outcome)
    "max_outside_allocator_bytes": pa.int64(),
    **{name: pa.float64() if name == "estimate_error" else pa.int64() for name in ESTIMATE_COLUMNS},
    **{name: pa.float64() if name.endswith("_ratio") else pa.int64() for name in MODEL_STATE_COLUMNS},
    **THROUGHPUT_TYPES,
}
"""Column name -> Parquet type, for every table: the contract's declared fields (spec, record,
result, environment, capacity, model, phase; ``devices`` is the spec's count here, the phases
table's list of devices is DEVICE_TYPE) and the columns the analysis derives."""


def table_schema(*columns: str | tuple[str, pa.DataType]) -> pa.Schema:
    """A table's schema from its columns in order.

    Args:
        columns: a column name (its type: COLUMN_TYPES), or ``(name, type)`` for a column of
            one table only or one whose type there is not COLUMN_TYPES' (the phases' ``devices``).

    Returns:
        The schema; every column nullable (null = not measured, never 0).

    Raises:
        KeyError: a name COLUMN_TYPES lacks.
    """
    return pa.schema([c if isinstance(c, tuple) else (c, COLUMN_TYPES[c]) for c in columns])


RUNS_SCHEMA = table_schema(
    "sweep_dir",
    "run_id",
    "run_dir",
    "workload",
    "mode",
    "batch",
    "context",
    "width",
    "dtype",
    "workload_params",
    "warmup",
    "repeats",
    "seed",
    "device",
    "device_kind",
    "device_name",
    "device_total_memory",
    "capacity_bytes",
    "capacity_method",
    "capacity_mode",
    *OOM_DETAIL_FIELDS,
    "oom_operator",
    "oom_null_reason",
    "failure_class",
    "failure_wording",
    "outcome",
    "failed_phase",
    "error_type",
    "error_message",
    "returncode",
    "signal",
    "timed_out",
    "wall_s",
    "worker_pid",
    "n_phases",
    *PEAK_COUNTERS,
    *(f"{group}_{c}" for group in ("completed", "cold", "warm") for c in PEAK_COUNTERS),
    "source_allocated",
    "source_reserved",
    "source",  # measured | predicted (a dry run: spec dry_run, fake tensors)
    "predicted_outcome",  # a dry run's verdict, its predicted peak against the capacity; null if measured
    *STACK_COLUMNS,
    "started_at",
    "schema_version",
    # how the worker process was started: on the CPU its resident set (memory_reserved) counts
    # the code it holds (spawn vs forkserver; torch._dynamo imported before the phases or not)
    "isolation",
    "torch_dynamo_imported",
    "record_problem",
    *ESTIMATE_COLUMNS,
    "estimate_missing_reason",
    *OPTIONS,
    "train_step",  # train: memsweep or user (the user's workload.train_step, one sub-phase)
    "parameters",
    "parameter_bytes",
    "trainable_parameters",
    "frozen_parameters",
    "trainable_parameter_bytes",
    "devices",
    # CUDA: the memory outside the caching allocator (context, handles, kernels), the fraction
    # applied for capacity minus it, and what made the measurement doubtful
    "max_outside_allocator_bytes",
    "outside_allocator_start_bytes",
    "memory_fraction",
    "memory_fraction_nominal",
    "allocator_limit_bytes",
    "device_not_free",
    "allocator_backend_warning",
    "cublas_workspace_config",
    # a DDP/FSDP run (spec parallel): its ranks, the fullest one and the one whose failure ended it
    "parallel",
    "world_size",
    "reshard_after_forward",
    "global_batch",
    "peak_rank",
    "failed_rank",
    *MODEL_STATE_COLUMNS,  # its model states per rank, recorded and calculated (ZeRO stage 0 or 3)
    *THROUGHPUT_TYPES,  # the warm phases' measured rates (analysis.throughput)
)
"""One row per run. ``max_memory_*``: the largest phase peak of the run (bytes); ``completed_*``: the
largest peak of the phases that ran ok (null when none did; on an ok run the same as ``max_memory_*``;
the frontier's peak of a run that fits for its axis but ran out of memory in a later phase that
does not scale with it, conf.contract.oom_attribution); ``cold_*`` /
``warm_*``: the peaks of the cold and warm phases (cold_forward, or the sub-phases of cold_step /
cold_generate; likewise warm). ``predicted_outcome``: a dry run's (``source`` predicted) verdict,
``conf.contract.predicted_outcome`` of its ``outcome`` and predicted peak (``conf.contract.run_peak``) against
``capacity_bytes``: ``ok`` (fits), ``oom`` (does not fit), the worker's outcome when nothing was predicted,
null without a capacity (no verdict); its ``outcome`` only says every phase could be predicted (fake tensors
never run out of memory). Null for a measured run. ``train_step``: who ran a training run's steps
(conf.contract TRAIN_STEP_KINDS): ``memsweep`` (split into forward, loss, backward, optimizer_step) or
``user`` (the user's own ``workload.train_step``, one sub-phase ``user_step`` per step; the others have no
row); null outside train mode and in records written before the field. ``est_*``: calculated before the run
(the spec's estimate, estimator/; of one rank for a DDP/FSDP run, its model states partitioned at the
run's ZeRO stage: analysis.estimate.rank_estimate), never measured;
``estimate_error`` = (est_peak_bytes - max_memory_allocated) / max_memory_allocated, null on a
predicted (dry-run) row;
``estimate_missing_reason``: why the estimate is null,
or what it leaves out (null when complete). ``parameters``, ``parameter_bytes``: the model's,
by construction (the worker's record). ``devices``: devices the run used (spec ``devices``; 1 for
a spec written before the field, which was a one-device run); on several devices the peaks are the
largest over the devices (conf.contract.phase_peak), the one the capacity is compared with.
``max_outside_allocator_bytes``: the largest per-phase ``outside_allocator_bytes`` (total - free -
reserved, bytes); ``outside_allocator_start_bytes``, ``memory_fraction`` (applied, for capacity minus
the start footprint), ``memory_fraction_nominal`` (capacity / total), ``allocator_limit_bytes``,
``device_not_free`` and ``allocator_backend_warning``: the record's ``capacity`` (CUDA).
``oom_*_bytes`` (conf.contract.OOM_DETAIL_FIELDS) and ``oom_operator`` (the operator the CPU
allocator capacity refused, a string): what the run's OOM said (its failed phase's fields; null
when it did not say, or the run did not run out of memory); ``oom_null_reason``: why a figure the
OOM printed is null (a limit not set, a figure no byte count holds). ``failure_class``: the
failed phase's class (oom, memory_suspect or error; conf.contract.FAILURE_CLASSES; a record
written before the field gives its phase's status), ``failure_wording``: the worker.classify
wording its message matched. ``model_states_*``, ``estimated_model_states_bytes``: a DDP/FSDP
run's model states on its fullest rank, recorded beside the estimator's ZeRO figure
(MODEL_STATE_COLUMNS; analysis.ranks computes them). ``samples_per_s``, ``tokens_per_s``,
``prefill_tokens_per_s``, ``decode_tokens_per_s`` (per second, medians over the warm iterations,
timed on the run's ``device_kind``), ``throughput_noise_rel`` (median absolute deviation / median of
samples per second) and ``throughput_iterations``: record.json's ``throughput``
(conf.contract.throughput); null unless the run was measured and ended ok."""

DEVICE_TYPE = struct_list(DEVICE_FIELDS)
"""Type of the phases table's ``devices`` column: one struct per device of a multi-device run."""
RANK_TYPE = struct_list(PHASE_RANK_FIELDS)
"""Type of the phases table's ``ranks`` column: one struct per rank of a DDP/FSDP run."""

PHASES_SCHEMA = table_schema(
    "sweep_dir",
    "run_id",
    "batch",
    "context",
    "width",
    "dtype",
    "mode",
    "device",
    "phase",
    "phase_index",
    "status",
    "iterations",
    "duration_s",
    "dynamo_graphs_compiled",
    *COUNTERS,
    "error_type",
    "failure_class",
    "failure_wording",
    *SUB_PHASE_FIELDS,
    *EXTRA_COUNTERS,
    *SIZES,
    *OOM_DETAIL,
    "oom_operator",
    "oom_null_reason",
    "source",
    *PEAK_SPLIT_FIELDS,
    ("devices", DEVICE_TYPE),  # not the runs table's count of devices
    "rank",
    "peak_rank",
    ("ranks", RANK_TYPE),
)
"""One row per run and phase; counters in bytes as recorded by the worker (per phase: synchronize,
reset the peaks, run, read).
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
one struct per rank that recorded the phase (conf.contract.PHASE_RANK_FIELDS); null otherwise.
``oom_*_bytes`` and ``oom_operator``: what a phase's OOM said (bytes; the operator the CPU allocator
capacity refused, a string), null when it did not say or the phase did not run out of memory;
``oom_null_reason``: why a figure it printed is null (a limit not set, a figure no byte count holds).
``dynamo_graphs_compiled``: graphs torch.compile's Dynamo compiled during the phase (a count, not
bytes): above 0 in a cold phase of a ``compile`` run, where compilation belongs; above 0 in a warm
phase means it recompiled and its peak includes compilation; null when Dynamo was not imported."""


INT64_RANGE = (-(2**63), 2**63 - 1)
"""The values of a Parquet int64 column (the schema's byte fields declare this maximum)."""


def as_int(value) -> int | None:
    """An int field of a record, or None when it is missing, of another type (a bool too) or
    outside INT64_RANGE (no int64 column holds it; conf.contract.read_run reports such a record)."""
    if isinstance(value, int) and not isinstance(value, bool) and INT64_RANGE[0] <= value <= INT64_RANGE[1]:
        return value
    return None


def _float(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _bool(value) -> bool | None:
    return value if isinstance(value, bool) else None


def _str(value) -> str | None:
    return None if value is None else str(value)


def _list(value) -> list | None:
    return value if isinstance(value, list) else None


_NONE = type(None)

EXACT_TYPES: tuple[tuple, ...] = (
    (pa.types.is_int64, as_int, frozenset({int, _NONE})),
    (pa.types.is_float64, _float, frozenset({float, int, _NONE})),
    (pa.types.is_boolean, _bool, frozenset({bool, _NONE})),
    (pa.types.is_string, _str, frozenset({str, _NONE})),
    (pa.types.is_list, _list, frozenset({list, _NONE})),
)
"""Per kind of column: (its test, the function that nulls a value of the wrong type, the Python
types pyarrow takes as they are, ``coerce_table``'s fast path)."""


def _converter(type_: pa.DataType):
    """(the function that nulls a value of the wrong type for a column of ``type_``, the types
    that need none) for ``coerce_table``; (None, None) for a type whose values go to pyarrow as they are."""
    for test, convert, exact in EXACT_TYPES:
        if test(type_):
            return convert, exact
    return None, None


def coerce_column(raw: list, type_: pa.DataType) -> pa.Array:
    """One column of ``coerce_table``: ``raw`` as an array of ``type_``, a value of the wrong type null.

    Values all of the types the column takes as they are (``EXACT_TYPES``) go to pyarrow at once;
    a value pyarrow refuses then (an int outside int64, one no float64 holds exactly), or any other
    type, sends the column through the converter, value by value (the same result: null where
    the converter says so).
    """
    convert, exact = _converter(type_)
    if convert is None:
        return pa.array(raw, type=type_)
    if exact.issuperset(map(type, raw)):
        try:
            return pa.array(raw, type=type_)
        except (OverflowError, pa.ArrowInvalid):
            pass
    return pa.array([convert(v) for v in raw], type=type_)


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
    names = schema.names
    # a row's values read at once, then turned into columns (zip): fewer steps than a column at a time
    columns = zip(*[tuple(map(row.get, names)) for row in rows]) if rows else ((),) * len(names)
    return pa.table({f.name: coerce_column(list(raw), f.type) for f, raw in zip(schema, columns)}, schema=schema)
