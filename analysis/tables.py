"""Run directories -> the ``runs`` and ``phases`` tables, with explicit pyarrow schemas.

Bytes are nullable int64 (a missing measurement is null, never 0), so that files from
different sweeps read as one dataset even when every run of one of them failed.
No torch import: the analysis reads JSON files only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa

from conf.contract import (
    AXES,
    CAPACITY_MODES,
    COLD_PHASES,
    DEVICE_COUNTERS,
    EXTRA_COUNTERS,
    OOM_DETAIL_FIELDS,
    PEAK_SPLIT_FIELDS,
    PER_DEVICE_EXTRAS,
    PHASE_COUNTERS,
    SIZE_FIELDS,
    SPEC_FILE,
    WARM_PHASES,
    Run,
    classify_run,
    find_run_dirs,
    phase_peak,
    read_run,
    record_phases,
)

from .estimate import ESTIMATE_COLUMNS, estimate_columns
from .ranks import RANK_TYPE, rank_rows

log = logging.getLogger("memsweep")

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
    ]
)
"""One row per run. ``max_memory_*``: the largest phase peak of the run (bytes); ``completed_*``: the
largest peak of the phases that ran ok (null when none did; on an ok run the same as ``max_memory_*``;
the frontier's peak of a run that fits for its axis but ran out of memory in a later phase that
does not scale with it, conf.contract.oom_attribution); ``cold_*`` /
``warm_*``: the peaks of the cold and warm phases (cold_forward, or the sub-phases of cold_step /
cold_generate; likewise warm). ``est_*``: calculated before the run (the spec's estimate,
analysis/estimate/), never measured; ``estimate_error`` = (est_peak_bytes -
max_memory_allocated) / max_memory_allocated; ``estimate_missing_reason``: why the estimate is null,
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
wording its message matched."""

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


def load_run(run_dir: Path) -> Run | None:
    """Read a run directory (``conf.contract.read_run``), logging what cannot be read.

    Returns:
        The run, or None (with a warning) when its spec cannot be read.
    """
    run = read_run(run_dir)
    if run.spec is None:
        log.warning("skipped: %s", run.unreadable[SPEC_FILE])
        return None
    for problem in run.problems:
        log.warning("%s", problem)
    return run


def _dict(value) -> dict:
    """A mapping field of a record, or {} when it is missing or of another type (corrupt)."""
    return value if isinstance(value, dict) else {}


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _outcome(run: Run) -> dict:
    """The run's outcome from result.json; without one, from a complete record alone; else null
    (the run is still going, or its orchestrator died before the worker ended). A run whose
    record.json is missing (after it ended) or unreadable is a ``crash``, whatever result.json
    says: it left no complete record (README), so no ``ok`` is taken on trust; a ``timeout``
    stays a timeout (a worker killed before its first record leaves none)."""
    if run.spec_problem is not None:  # nothing anyone asked for was measured: never an ok row
        return {**_dict(run.result), "outcome": "crash", "error_message": run.spec_problem}
    if run.record_damage is not None:
        result = _dict(run.result)
        if result.get("outcome") in ("timeout", "crash"):  # killed early: no record is expected
            return {**result, "error_message": f"{result.get('error_message')}; record.json {run.record_damage}"}
        return {
            **result,
            "outcome": "crash",
            "error_message": f"record.json {run.record_damage}"
            + (f"; result.json said {result.get('outcome')}" if result.get("outcome") else ""),
        }
    if run.result is not None:
        return run.result
    record = _dict(run.record)
    if record.get("complete") is True:
        return {
            "outcome": classify_run(record, None, False),
            "failed_phase": record.get("failed_phase"),
            "error_type": record.get("error_type"),
            "error_message": record.get("error_message"),
        }
    return {
        "outcome": None,
        "error_message": "no result.json yet: the run is still going, or its orchestrator stopped before it ended",
    }


def run_row(run: Run, sweep_dir: Path) -> dict:
    """One row of the runs table (``RUNS_SCHEMA``) from what a run directory holds.

    The outcome comes from result.json, or from a complete record when there is none, and is
    a ``crash`` when the record is missing or unreadable (``_outcome``); the peaks are
    ``conf.contract.phase_peak`` over all, cold and warm phases, in bytes, null when no phase
    has one (never 0); counters' sources, environment and the estimator's columns
    (``estimate_columns``) are added.

    Args:
        run: the run directory as read (``conf.contract.read_run``).
        sweep_dir: the sweep directory it belongs to (``run_id`` is the path relative to it).

    Returns:
        column -> value; values of a wrong type are nulled later by ``coerce_table``.
    """
    spec, record = run.spec, _dict(run.record)
    result = _dict(_outcome(run))
    phases = record_phases(record)
    failed = next((p for p in phases if p.get("status") in ("oom", "error")), {})
    env = _dict(record.get("environment"))
    sources = _dict(record.get("counter_sources"))
    workload = _dict(spec.get("workload"))
    row = {
        "sweep_dir": str(sweep_dir),
        "run_id": str(run.run_dir.relative_to(sweep_dir))
        if run.run_dir.is_relative_to(sweep_dir)
        else str(run.run_dir),
        "run_dir": str(run.run_dir),
        **{k: spec.get(k) for k in ("mode", *AXES, "warmup", "repeats", "seed", "device")},
        "workload": workload.get("name"),
        "workload_params": json.dumps({k: v for k, v in workload.items() if k != "name"}, sort_keys=True, default=str)
        if workload
        else None,
        "device_kind": record.get("device_kind"),
        "device_name": env.get("device_name"),
        "device_total_memory": _int(record.get("device_total_memory")),
        "capacity_bytes": _int(record.get("capacity_bytes")) or _int(spec.get("capacity_bytes")),
        "capacity_method": _dict(record.get("capacity")).get("capacity_method"),
        "capacity_mode": _capacity_mode(record),
        **{name: _int(failed.get(name)) if failed.get("status") == "oom" else None for name in OOM_DETAIL_FIELDS},
        "failure_class": failed.get("failure_class") or (failed.get("status") if failed else None),
        "failure_wording": failed.get("failure_wording"),
        "outcome": result.get("outcome"),
        "failed_phase": result.get("failed_phase"),
        "error_type": result.get("error_type"),
        "error_message": result.get("error_message"),
        "returncode": _int(result.get("returncode")),
        "signal": _int(result.get("signal")),
        "timed_out": result.get("timed_out"),
        "wall_s": result.get("wall_s"),
        "worker_pid": _int(result.get("worker_pid")) or _int(record.get("pid")),
        "n_phases": len(phases),
        "max_memory_allocated": phase_peak(phases, "max_memory_allocated"),
        "max_memory_reserved": phase_peak(phases, "max_memory_reserved"),
        **{
            f"completed_{c}": phase_peak([p for p in phases if p.get("status") == "ok"], c)
            for c in ("max_memory_allocated", "max_memory_reserved")
        },
        "cold_max_memory_allocated": phase_peak(phases, "max_memory_allocated", COLD_PHASES),
        "cold_max_memory_reserved": phase_peak(phases, "max_memory_reserved", COLD_PHASES),
        "warm_max_memory_allocated": phase_peak(phases, "max_memory_allocated", WARM_PHASES),
        "warm_max_memory_reserved": phase_peak(phases, "max_memory_reserved", WARM_PHASES),
        "source_allocated": sources.get("max_memory_allocated"),
        "source_reserved": sources.get("max_memory_reserved"),
        "source": _source(run),
        **{
            k: env.get(k)
            for k in (
                "python",
                "torch",
                "cuda",
                "hip",
                "driver",
                "allocator_backend",
                "host",
                "isolation",
                "torch_dynamo_imported",
            )
        },  # (coerce_table nulls a wrong type)
        "alloc_conf": json.dumps(env.get("alloc_conf"), default=str) if env.get("alloc_conf") is not None else None,
        "started_at": record.get("started_at"),
        "schema_version": _int(record.get("schema_version")),
        "record_problem": "; ".join(run.problems) or result.get("record_problem"),
        **{name: spec.get(name) for name, _ in OPTIONS},
        "parameters": _int((record.get("model") or {}).get("parameters")),
        "parameter_bytes": _int((record.get("model") or {}).get("parameter_bytes")),
        **{
            k: _int((record.get("model") or {}).get(k))
            for k in ("trainable_parameters", "frozen_parameters", "trainable_parameter_bytes")
        },
        "devices": _int(spec.get("devices", 1)),
        "max_outside_allocator_bytes": phase_peak(phases, "outside_allocator_bytes"),
        **{
            k: _dict(record.get("capacity")).get(k)
            for k in (
                "outside_allocator_start_bytes",
                "memory_fraction",
                "memory_fraction_nominal",
                "allocator_limit_bytes",
                "device_not_free",
                "allocator_backend_warning",
            )
        },
        "cublas_workspace_config": env.get("cublas_workspace_config"),
        "parallel": spec.get("parallel", "none"),
        "world_size": _int(spec.get("world_size", 1)),
        "reshard_after_forward": spec.get("reshard_after_forward"),
        "global_batch": _int(record.get("global_batch")),
        "peak_rank": _int(record.get("peak_rank")),
        "failed_rank": _int(record.get("failed_rank")),
    }
    row.update(estimate_columns(spec.get("estimate"), row["max_memory_allocated"], row["outcome"]))
    row["estimate_missing_reason"] = spec.get("estimate_missing_reason") or (
        "no estimate in the spec (written before this workload was estimated)" if spec.get("estimate") is None else None
    )
    return row


def _capacity_mode(record: dict) -> str | None:
    """What the run's emulated capacity capped (spec capacity_mode): ``allocator`` or ``process``;
    null when no capacity was emulated (the device's own memory, a dry run). A record written
    before the field had only the RLIMIT_DATA emulation on the CPU, which is ``process``."""
    capacity = _dict(record.get("capacity"))
    if capacity.get("capacity_mode") in CAPACITY_MODES:
        return capacity["capacity_mode"]
    method = str(capacity.get("capacity_method") or "")
    if method.startswith("RLIMIT_DATA"):
        return "process"
    return "allocator" if method.startswith("torch.cuda.set_per_process_memory_fraction") else None


def _source(run: Run) -> str:
    return _dict(run.record).get("source") or ("predicted" if run.spec.get("dry_run") else "measured")


def phase_rows(run: Run, run_id: str, sweep_dir: Path) -> list[dict]:
    """The rows of the phases table (``PHASES_SCHEMA``) of one run, one per phase record in
    order (sub-phases such as ``forward`` or ``decode`` name their ``parent``); counters in
    bytes, null when missing.

    Args:
        run: the run directory as read (``conf.contract.read_run``).
        run_id: the run's id (``run_row``'s).
        sweep_dir: the sweep directory it belongs to.

    Returns:
        column -> value, one dict per phase.
    """
    rows = []
    source = _source(run)
    for index, p in enumerate(record_phases(run.record)):
        rows.append(
            {
                "sweep_dir": str(sweep_dir),
                "run_id": run_id,
                **{k: run.spec.get(k) for k in (*AXES, "mode", "device")},
                "phase": p.get("name"),
                "phase_index": index,
                "status": p.get("status"),
                "iterations": _int(p.get("iterations")),
                "duration_s": p.get("duration_s"),
                **{name: _int(p.get(name)) for name in COUNTERS},
                "error_type": p.get("error_type"),
                "failure_class": p.get("failure_class"),
                "failure_wording": p.get("failure_wording"),
                **{k: p.get(k) for k in ("parent", "sub_phase", "step", "micro_step")},
                **{name: _int(p.get(name)) for name in EXTRA_COUNTERS + SIZES + OOM_DETAIL},
                "source": source,
                **{name: _int(p.get(name)) if source == "predicted" else None for name in PEAK_SPLIT_FIELDS},
                "devices": _devices(p.get("devices")),
                "rank": _int(p.get("rank")),
                "peak_rank": _int(p.get("peak_rank")),
                "ranks": rank_rows(p.get("ranks")),
            }
        )
    return rows


def _devices(value) -> list[dict] | None:
    """A phase's ``devices`` list as rows of DEVICE_TYPE; null when absent or not a list (a
    one-device run); an entry that is not a mapping is dropped, a non-integer value is null."""
    if not isinstance(value, list):
        return None
    return [
        {
            "device_index": _int(d.get("device_index")),
            **{name: _int(d.get(name)) for name in DEVICE_COUNTERS + PER_DEVICE_EXTRAS},
        }
        for d in value
        if isinstance(d, dict)
    ]


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
                v = _int(v)
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


def build_tables(sweep_dirs: Iterable[Path]) -> tuple[pa.Table, pa.Table, list[str]]:
    """(runs, phases, problems) for every run under ``sweep_dirs``."""
    runs, phases, problems = [], [], []
    for sweep_dir in sweep_dirs:
        sweep_dir = Path(sweep_dir)
        for run_dir in find_run_dirs([sweep_dir]):
            run = load_run(run_dir)
            if run is None:
                problems.append(f"{run_dir}: unreadable spec.json, run skipped")
                continue
            problems.extend(run.problems)
            row = run_row(run, sweep_dir)
            runs.append(row)
            phases.extend(phase_rows(run, row["run_id"], sweep_dir))
    return coerce_table(runs, RUNS_SCHEMA), coerce_table(phases, PHASES_SCHEMA), problems
