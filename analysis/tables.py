"""Run directories -> the ``runs`` and ``phases`` tables (their pyarrow schemas: analysis.schemas).

Bytes are nullable int64 (a missing measurement is null, never 0), so that files from
different sweeps read as one dataset even when every run of one of them failed.
No torch import: the analysis reads JSON files only.
"""

from __future__ import annotations

import gc
import json
import logging
import multiprocessing as mp
import os
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa

from memsweep.conf.contract import (
    AXES,
    CAPACITY_FIELDS,
    CAPACITY_MODES,
    COLD_PHASES,
    DEVICE_COUNTERS,
    ENVIRONMENT_FIELDS,
    MODEL_FIELDS,
    OOM_DETAIL_FIELDS,
    PEAK_SPLIT_FIELDS,
    PER_DEVICE_EXTRAS,
    RESULT_FILE,
    SPEC_FILE,
    SWEEP_TOKEN_KEY,
    WARM_PHASES,
    Field,
    Run,
    SweepRuns,
    classify_run,
    field_names,
    fork_is_safe,
    largest,
    path_kind,
    phase_peak,
    phase_values,
    phases_in,
    predicted_outcome,
    read_run,
    record_phases,
    run_optimizer,
    run_peak,
    sweep_runs,
    usable_cores,
)
from memsweep.estimator import estimate_columns, rank_estimate

from .ranks import model_state_columns, rank_rows
from .schemas import (  # the schemas (analysis.schemas), also imported from here by callers
    DEVICE_TYPE,
    OPTIONS,
    PHASES_SCHEMA,
    RUNS_SCHEMA,
    as_int,
    coerce_column,
    coerce_table,
)
from .throughput import throughput_columns

__all__ = [
    "DEVICE_TYPE",
    "OPTIONS",
    "PHASES_SCHEMA",
    "RUNS_SCHEMA",
    "build_tables",
    "coerce_table",
    "load_run",
    "phase_columns",
    "phase_rows",
    "phases_table",
    "read_runs",
    "run_row",
    "unique_dirs",
    "repeated_dirs",
    "RunItem",
    "no_sweep_dir",
]

log = logging.getLogger("memsweep")


def load_run(run_dir: Path) -> Run | None:
    """Read a run directory (``conf.contract.read_run``), logging what cannot be read.

    Returns:
        The run, or None (with a warning) when its spec cannot be read.
    """
    return _logged(read_run(run_dir))


def _logged(run: Run) -> Run | None:
    """``load_run`` of a run already read: what cannot be read logged; None without a spec."""
    if run.spec is None:
        log.warning("skipped: %s", run.unreadable[SPEC_FILE])
        return None
    for problem in run.problems:
        log.warning("%s", problem)
    return run


def _spec(run: Run) -> dict:
    """The run's spec as read.

    Raises:
        ValueError: the spec could not be read (``load_run`` leaves such a run out).
    """
    if run.spec is None:
        raise ValueError(f"{run.run_dir}: spec.json could not be read")
    return run.spec


def _dict(value) -> dict:
    """A mapping field of a record, or {} when it is missing or of another type (corrupt)."""
    return value if isinstance(value, dict) else {}


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
    if RESULT_FILE in run.unreadable and (run.run_dir / RESULT_FILE).exists():  # a newer memsweep's...
        return {"outcome": None, "error_message": run.unreadable[RESULT_FILE]}
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


def recorded_columns(fields: tuple[Field, ...], *not_recorded: str) -> tuple[str, ...]:
    """The fields of a record object that are runs-table columns with their recorded value.

    Args:
        fields: the object's declaration (conf.contract ENVIRONMENT_FIELDS, CAPACITY_FIELDS...).
        not_recorded: its fields whose column ``run_row`` fills otherwise (from the spec, or
            transformed).

    Returns:
        The names, in declaration order.
    """
    return tuple(n for n in field_names(fields) if n in RUNS_SCHEMA.names and n not in not_recorded)


ENVIRONMENT_COLUMNS = recorded_columns(ENVIRONMENT_FIELDS, "device", "alloc_conf")  # the spec's; JSON text
CAPACITY_COLUMNS = recorded_columns(CAPACITY_FIELDS, "capacity_mode")  # _capacity_mode: older records too
MODEL_COLUMNS = recorded_columns(MODEL_FIELDS, "compile", "optimizer")  # the spec's mode options


_JSON = json.JSONEncoder(default=str)
"""``json.dumps(value, default=str)``, its encoder made once (a row asks for it every run)."""
_SORTED_JSON = json.JSONEncoder(sort_keys=True, default=str)
"""``json.dumps(value, sort_keys=True, default=str)``, its encoder made once."""


def _load_columns(run: Run, sweep_dir: Path) -> dict:
    """The runs-table columns that name the run and its load: ids, the spec's axes and workload,
    the device and the capacity."""
    spec, record = _spec(run), _dict(run.record)
    capacity = _dict(record.get("capacity"))
    workload = _dict(spec.get("workload"))
    return {
        "sweep_dir": str(sweep_dir),
        "run_id": run_id_of(run.run_dir, sweep_dir),
        "run_dir": str(run.run_dir),
        **{k: spec.get(k) for k in ("mode", *AXES, "warmup", "repeats", "seed", "device")},
        "workload": workload.get("name"),
        "workload_params": _SORTED_JSON.encode({k: v for k, v in workload.items() if k != "name"})
        if workload
        else None,
        "device_kind": record.get("device_kind"),
        "device_total_memory": as_int(record.get("device_total_memory")),
        "capacity_bytes": _capacity(run),
        **{k: capacity.get(k) for k in CAPACITY_COLUMNS},
        "capacity_mode": _capacity_mode(record),
    }


def path_below(path: Path, top: Path) -> str | None:
    """``path.relative_to(top)`` as text (``.`` for ``top`` itself), or None when ``path`` is not
    below ``top``: worked out on the paths' text (a Path's has no ``//`` nor ``.`` part), no Path made."""
    whole, base = str(path), str(top)
    if base == ".":  # a relative path lies below the current directory's ".", an absolute one does not
        return None if whole.startswith("/") else whole
    if whole == base:
        return "."
    prefix = base if base.endswith("/") else base + "/"  # "/" itself ends with one
    return whole[len(prefix) :] if whole.startswith(prefix) else None


def run_id_of(run_dir: Path, sweep_dir: Path) -> str:
    """A run's id: its directory's path below ``sweep_dir`` (``path_below``), else the whole path."""
    below = path_below(run_dir, sweep_dir)
    return str(run_dir) if below is None else below


def _outcome_columns(record: dict, result: dict, phases: list[dict]) -> dict:
    """The runs-table columns of the outcome: the failing phase's OOM details and failure class, and
    result.json's outcome, error, exit and timing."""
    failed = next((p for p in phases if p.get("status") in ("oom", "error")), {})
    return {
        **{name: as_int(failed.get(name)) if failed.get("status") == "oom" else None for name in OOM_DETAIL_FIELDS},
        "oom_operator": failed.get("oom_operator") if failed.get("status") == "oom" else None,
        "oom_null_reason": failed.get("oom_null_reason") if failed.get("status") == "oom" else None,
        "failure_class": failed.get("failure_class") or (failed.get("status") if failed else None),
        "failure_wording": failed.get("failure_wording"),
        "outcome": result.get("outcome"),
        "failed_phase": result.get("failed_phase"),
        "error_type": result.get("error_type"),
        "error_message": result.get("error_message"),
        "returncode": as_int(result.get("returncode")),
        "signal": as_int(result.get("signal")),
        "timed_out": result.get("timed_out"),
        "wall_s": result.get("wall_s"),
        "worker_pid": as_int(result.get("worker_pid")) or as_int(record.get("pid")),
        "n_phases": len(phases),
    }


def _peak_columns(run: Run, record: dict, result: dict, phases: list[dict]) -> dict:
    """The runs-table columns of the peaks (bytes; null when no phase has one): over all, completed,
    cold and warm phases (``conf.contract.phase_peak``'s, each phase's value worked out once), the
    counters' sources, and a dry run's verdict."""
    sources = _dict(record.get("counter_sources"))
    kept = {
        "": None,
        "completed_": [p.get("status") == "ok" for p in phases],
        "cold_": phases_in(phases, COLD_PHASES),
        "warm_": phases_in(phases, WARM_PHASES),
    }
    peaks = {}
    for counter in ("max_memory_allocated", "max_memory_reserved"):
        values = phase_values(phases, counter)
        peaks.update({f"{prefix}{counter}": largest(values, keep) for prefix, keep in kept.items()})
    source = _source(run)
    return {
        **peaks,
        "source_allocated": sources.get("max_memory_allocated"),
        "source_reserved": sources.get("max_memory_reserved"),
        "source": source,
        "predicted_outcome": predicted_outcome(result.get("outcome"), run_peak(record)[0], _capacity(run))
        if source == "predicted"
        else None,
    }


def _setup_columns(run: Run, result: dict, phases: list[dict]) -> dict:
    """The runs-table columns of the environment, what could not be read, the spec's options and
    model, and the parallel layout."""
    spec, record = _spec(run), _dict(run.record)
    env, model = _dict(record.get("environment")), _dict(record.get("model"))
    return {
        **{k: env.get(k) for k in ENVIRONMENT_COLUMNS},  # (coerce_table nulls a wrong type)
        "alloc_conf": _JSON.encode(env.get("alloc_conf")) if env.get("alloc_conf") is not None else None,
        "started_at": record.get("started_at"),
        "schema_version": as_int(record.get("schema_version")),
        "record_problem": "; ".join(run.problems) or result.get("record_problem"),
        **{name: spec.get(name) for name in OPTIONS},
        "optimizer": run_optimizer(spec),  # a user factory's target, not the spec's unused default
        "train_step": record.get("train_step"),
        **{k: model.get(k) for k in MODEL_COLUMNS},
        "devices": as_int(spec.get("devices", 1)),
        "max_outside_allocator_bytes": phase_peak(phases, "outside_allocator_bytes"),
        "parallel": spec.get("parallel", "none"),
        "world_size": as_int(spec.get("world_size", 1)),
        "reshard_after_forward": spec.get("reshard_after_forward"),
        "global_batch": as_int(record.get("global_batch")),
        "peak_rank": as_int(record.get("peak_rank")),
        "failed_rank": as_int(record.get("failed_rank")),
    }


def run_row(run: Run, sweep_dir: Path) -> dict:
    """One row of the runs table (``RUNS_SCHEMA``) from what a run directory holds.

    The outcome comes from result.json, or from a complete record when there is none, and is
    a ``crash`` when the record is missing or unreadable (``_outcome``); the peaks are
    ``conf.contract.phase_peak`` over all, cold and warm phases, in bytes, null when no phase
    has one (never 0); a dry run's verdict (``predicted_outcome``, the same comparison as the
    sweeper's: ``conf.contract.predicted_outcome`` of ``conf.contract.run_peak``); counters' sources,
    environment and the estimator's columns
    (``estimate_columns``: for a DDP/FSDP run, of one rank's estimate, ``rank_estimate``) are
    added, and a DDP/FSDP run's model states per rank beside the estimator's ZeRO figure
    (``analysis.ranks.model_state_columns``).

    Args:
        run: the run directory as read (``conf.contract.read_run``).
        sweep_dir: the sweep directory it belongs to (``run_id`` is the path relative to it).

    Returns:
        column -> value; values of a wrong type are nulled later by ``coerce_table``.
    """
    spec, record = _spec(run), _dict(run.record)
    result = _dict(_outcome(run))
    phases = record_phases(record)
    row = _load_columns(run, sweep_dir)
    row.update(_outcome_columns(record, result, phases))
    row.update(_peak_columns(run, record, result, phases))
    row.update(_setup_columns(run, result, phases))
    # a DDP/FSDP run's estimate per rank, as its max_memory_allocated is the fullest rank's
    estimate = rank_estimate(spec.get("estimate"), row["parallel"], row["world_size"])
    row.update(estimate_columns(estimate, row["max_memory_allocated"], row["outcome"], row["source"]))
    row.update(model_state_columns(spec, record))
    row.update(throughput_columns(record, row["outcome"]))
    row["estimate_missing_reason"] = spec.get("estimate_missing_reason") or (
        "no estimate in the spec (written before this workload was estimated)" if spec.get("estimate") is None else None
    )
    return row


def _capacity(run: Run) -> int | None:
    """The run's capacity in bytes: the record's, else the spec's (runs table ``capacity_bytes``)."""
    return as_int(_dict(run.record).get("capacity_bytes")) or as_int(_spec(run).get("capacity_bytes"))


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
    return _dict(run.record).get("source") or ("predicted" if _spec(run).get("dry_run") else "measured")


PHASE_RUN_COLUMNS = (
    "sweep_dir",
    "run_id",
    "source",
    *(k for k in (*AXES, "mode", "device") if k in PHASES_SCHEMA.names),
)
"""The phases-table columns that are the run's (its ids, the spec's load, its source), alike on each of its phases."""


PHASE_OWN_COLUMNS = tuple(n for n in PHASES_SCHEMA.names if n not in PHASE_RUN_COLUMNS and n != "phase_index")
"""The phases-table columns read from each phase record (``_phase_column``): its fields."""
_PHASE_KEYS = tuple("name" if n == "phase" else n for n in PHASE_OWN_COLUMNS)
"""The phase record's key of each of ``PHASE_OWN_COLUMNS`` (``phase`` is its ``name``)."""


def phase_columns(entries: Iterable[tuple[Run, str, Path]]) -> dict[str, list]:
    """The columns of the phases table (``PHASES_SCHEMA``) of runs: one value per phase record,
    in order (sub-phases such as ``forward`` or ``decode`` name their ``parent``); counters in
    bytes, null when missing; the ``predicted_*`` split only on a dry run's (source predicted) rows.

    Args:
        entries: (the run as read, ``conf.contract.read_run``; its id, ``run_row``'s; the sweep
            directory it belongs to), per run.

    Returns:
        column -> values, in ``PHASES_SCHEMA``'s order; values of a wrong type are nulled later
        (``analysis.schemas.coerce_column``).
    """
    phases: list[dict] = []
    index: list[int] = []
    predicted: list[bool] = []
    of_run: dict[str, list] = {k: [] for k in PHASE_RUN_COLUMNS}
    for run, run_id, sweep_dir in entries:
        found = record_phases(run.record)
        if not found:
            continue
        spec, source, n = _spec(run), _source(run), len(found)
        values = {"sweep_dir": str(sweep_dir), "run_id": run_id, "source": source}
        for k in PHASE_RUN_COLUMNS:
            of_run[k] += [values[k] if k in values else spec.get(k)] * n
        phases += found
        index += range(n)
        predicted += [source == "predicted"] * n
    # the phases' own fields read a phase at a time, then turned into columns (zip)
    fields = zip(*[tuple(map(p.get, _PHASE_KEYS)) for p in phases]) if phases else ((),) * len(_PHASE_KEYS)
    own = {n: _phase_column(n, list(raw), predicted) for n, raw in zip(PHASE_OWN_COLUMNS, fields)}
    return {n: index if n == "phase_index" else of_run[n] if n in of_run else own[n] for n in PHASES_SCHEMA.names}


def _phase_column(name: str, raw: list, predicted: list[bool]) -> list:
    """One column of ``phase_columns`` that is the phases' own, from their field's values (``raw``):
    as they are, a dry run's split (null on a measured phase) or the nested lists as rows."""
    if name in PEAK_SPLIT_FIELDS:
        return [v if dry else None for v, dry in zip(raw, predicted)]
    if name == "devices":  # (a null is null: a phase of one device)
        return [None if v is None else _devices(v) for v in raw]
    if name == "ranks":  # (a null is null: a phase of one process)
        return [None if v is None else rank_rows(v) for v in raw]
    return raw


def phases_table(entries: Iterable[tuple[Run, str, Path]]) -> pa.Table:
    """The phases table (``PHASES_SCHEMA``) of runs (``phase_columns``), a value of the wrong type null."""
    columns = phase_columns(entries)
    return pa.table({f.name: coerce_column(columns[f.name], f.type) for f in PHASES_SCHEMA}, schema=PHASES_SCHEMA)


def phase_rows(run: Run, run_id: str, sweep_dir: Path) -> list[dict]:
    """The rows of the phases table (``PHASES_SCHEMA``) of one run (``phase_columns``), one per
    phase record in order.

    Args:
        run: the run directory as read (``conf.contract.read_run``).
        run_id: the run's id (``run_row``'s).
        sweep_dir: the sweep directory it belongs to.

    Returns:
        column -> value, one dict per phase; values of a wrong type are nulled later by ``coerce_table``.
    """
    columns = phase_columns([(run, run_id, sweep_dir)])
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


def _devices(value) -> list[dict] | None:
    """A phase's ``devices`` list as rows of DEVICE_TYPE; null when absent or not a list (a
    one-device run); an entry that is not a mapping is dropped, a non-integer value is null."""
    if not isinstance(value, list):
        return None
    return [
        {
            "device_index": as_int(d.get("device_index")),
            **{name: as_int(d.get(name)) for name in DEVICE_COUNTERS + PER_DEVICE_EXTRAS},
        }
        for d in value
        if isinstance(d, dict)
    ]


def no_sweep_dir(path: Path | str) -> str:
    """The message for a sweep directory given that is none: ``sweep directory X does not exist``,
    or, for something else there (a FIFO, a file), what it is."""
    kind = path_kind(path)
    if kind is None:
        return f"sweep directory {path} does not exist"
    return f"sweep directory {path} is not a directory ({kind}): give a sweep directory"


class UniqueDirs(NamedTuple):
    """Directories given, each once (``unique_dirs``)."""

    dirs: list[Path]  # in the order given, a repeated one left out
    notes: list[str]  # one per directory left out, naming it and the one kept


class RepeatedDirs(NamedTuple):
    """Directories given, each once, and those given again (``repeated_dirs``)."""

    kept: list[Path]  # in the order given, a repeated one left out
    repeats: list[tuple[Path, Path]]  # (the one kept, the repeat) per directory left out


class RunItem(NamedTuple):
    """One run directory to read (``read_runs``)."""

    run_dir: Path
    sweep_dir: Path  # the sweep directory it belongs to
    token: str | None = None  # its manifest entry's token, which its spec.json must hold; None: not checked


class Tables(NamedTuple):
    """The runs and phases tables of some sweep directories (``build_tables``)."""

    runs: pa.Table  # RUNS_SCHEMA
    phases: pa.Table  # PHASES_SCHEMA
    problems: list[str]  # met reading them, and the notes of what was read once, one line each


def unique_dirs(sweep_dirs: Iterable[Path]) -> UniqueDirs:
    """The sweep directories given, each directory once: two that resolve to the same path
    (``c32`` and ``./c32/``, a path given twice) are one sweep, read once.

    Args:
        sweep_dirs: sweep directories, as given.

    Returns:
        (the directories in the order given, a repeated one left out; one note per directory
        left out, naming it and the one kept).
    """
    kept, repeats = repeated_dirs(sweep_dirs)
    return UniqueDirs(
        kept, [f"{d.resolve()} was given twice ({first}, {d}): its runs are read once" for first, d in repeats]
    )


def repeated_dirs(sweep_dirs: Iterable[Path]) -> RepeatedDirs:
    """The directories given, each once, and those given again: two that resolve to the same path
    (``c32`` and ``./c32/``) are one directory.

    Args:
        sweep_dirs: directories, as given.

    Returns:
        (the directories in the order given, a repeated one left out; (the one kept, the repeat)
        per directory left out).
    """
    kept: dict[Path, Path] = {}
    repeats = []
    for d in sweep_dirs:
        d = Path(d)
        first = kept.setdefault(d.resolve(), d)
        if first is not d:
            repeats.append((first, d))
    return RepeatedDirs(list(kept.values()), repeats)


MISSING_SHOWN = 20
"""The missing runs of one sweep named one line each (``sweep_run_dirs``); one line counts the rest."""


def sweep_run_dirs(sweep_dir: Path, problems: list[str], runs: SweepRuns | None = None) -> list[Path]:
    """The run directories of the sweep in ``sweep_dir`` (``conf.contract.sweep_runs``: those its
    manifest lists), a line added to ``problems`` for each one it launched that is missing.

    Args:
        sweep_dir: the sweep directory.
        problems: where the lines go.
        runs: its ``sweep_runs`` when already found (``analysis.cli.check_sweeps``); None: found here.

    Raises:
        RecordError: the sweep's manifest cannot be read.
    """
    runs = sweep_runs(sweep_dir) if runs is None else runs
    for run_dir in runs.missing[:MISSING_SHOWN]:
        problems.append(
            f"{run_dir}: a run of this sweep is missing (no spec.json of its own: deleted, never started, "
            "or a link put in its place)"
        )
    if len(runs.missing) > MISSING_SHOWN:
        problems.append(
            f"{sweep_dir}: {len(runs.missing) - MISSING_SHOWN} more runs of this sweep's manifest are missing"
        )
    return runs.run_dirs


def real_path(run_dir: Path, sweep_dir: Path, real_sweep: str) -> str:
    """``os.path.realpath(run_dir)`` (``Path.resolve``'s), from ``real_sweep`` (the real path of
    ``sweep_dir``) when ``run_dir`` lies below ``sweep_dir`` through no symbolic link: one
    ``os.lstat`` per folder below it instead of one per folder of the whole path.

    Args:
        run_dir: a run directory.
        sweep_dir: the sweep directory it was found in.
        real_sweep: ``os.path.realpath(sweep_dir)``.

    Returns:
        The real path, as ``os.path.realpath`` gives it.
    """
    below = path_below(run_dir, sweep_dir)
    if below is None:
        return os.path.realpath(run_dir)
    parts = [] if below == "." else below.split("/")
    path = str(sweep_dir)
    for part in parts:
        path = os.path.join(path, part)
        if part == ".." or os.path.islink(path):
            return os.path.realpath(run_dir)
    return os.path.join(real_sweep, *parts)


PARALLEL_FROM = 2000
"""Run directories from which ``read_runs`` reads in several processes (below it, one is faster)."""
CHUNK = 500
"""Run directories per task of a parallel read."""


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused (then restored as it was) while runs are read:
    their documents and rows hold no cycle (reference counting frees what is dropped), and its
    passes over a heap that grows with every run read would only cost time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _read_chunk(items: list[RunItem]) -> Tables:
    """The tables of the run directories given (``RunItem``), read in this process."""
    with _collector_paused():
        return _read_items(items)


def foreign_line(run_dir: Path) -> str:
    """The problem line of a run folder that holds another sweep's run (its spec.json's token is
    not its manifest entry's: copied in from elsewhere), left out of the tables."""
    return (
        f"{run_dir}: not this sweep's run (its spec.json holds another {SWEEP_TOKEN_KEY} than the sweep's "
        "manifest gave it: copied in from another sweep or run); left out, as a missing run"
    )


def _read_items(items: list[RunItem]) -> Tables:
    """``_read_chunk``'s work: a run whose spec.json lacks its manifest entry's token is left
    out with a problem line (``foreign_line``), checked on the spec read anyway."""
    runs: list[dict] = []
    read: list[tuple[Run, str, Path]] = []
    problems: list[str] = []
    for run_dir, sweep_dir, token in items:
        found = read_run(run_dir)
        if token is not None and found.spec is not None and found.spec.get(SWEEP_TOKEN_KEY) != token:
            problems.append(foreign_line(run_dir))
            continue
        run = _logged(found)
        if run is None:
            problems.append(f"{run_dir}: unreadable spec.json, run skipped")
            continue
        problems.extend(run.problems)
        row = run_row(run, sweep_dir)
        runs.append(row)
        read.append((run, row["run_id"], sweep_dir))
    return Tables(coerce_table(runs, RUNS_SCHEMA), phases_table(read), problems)


def _path(path: Path | str) -> Path:
    """``path`` as a Path (one given is kept: making it again would parse it again)."""
    return path if isinstance(path, Path) else Path(path)


def _workers(n_items: int) -> int:
    """How many processes read ``n_items`` run directories: one below ``PARALLEL_FROM``, else one
    per CPU this process may use (at most 8)."""
    if n_items < PARALLEL_FROM:
        return 1
    return max(1, min(usable_cores(), 8))


def read_runs(items: Iterable[RunItem]) -> Tables:
    """(runs, phases, problems) of the run directories given, each file read once, in several
    processes when there are many (``PARALLEL_FROM``); the rows are in the order given either way.

    Args:
        items: the run directories (``RunItem``: with the sweep directory each belongs to and its
            manifest token), each run once: the directories a sweep found
            (``conf.contract.find_run_dirs``) or listed as launched. A run whose spec.json does
            not hold the token given is another sweep's: left out, with a problem line.

    Returns:
        (the runs table, RUNS_SCHEMA; the phases table, PHASES_SCHEMA; the problems met, one line each).
    """
    runs = [RunItem(_path(i.run_dir), _path(i.sweep_dir), i.token) for i in items]
    workers = _workers(len(runs))
    if workers == 1:
        return _read_chunk(runs)
    chunks = [runs[i : i + CHUNK] for i in range(0, len(runs), CHUNK)]
    # fork re-imports nothing; with other threads alive (a fork would copy their locks) a fresh server
    method = "fork" if fork_is_safe() else "spawn"
    if method == "fork":  # pyarrow imports pandas at its first list it converts: once here, not in each worker
        pa.array([], type=pa.int64())
    with ProcessPoolExecutor(workers, mp_context=mp.get_context(method)) as pool:
        parts = list(pool.map(_read_chunk, chunks))
    return Tables(
        pa.concat_tables([p.runs for p in parts]),
        pa.concat_tables([p.phases for p in parts]),
        [line for p in parts for line in p.problems],
    )


def build_tables(sweep_dirs: Iterable[Path], found: Mapping[Path, SweepRuns] | None = None) -> Tables:
    """(runs, phases, problems) for every run under ``sweep_dirs`` (read by ``read_runs``).

    Each directory is read once (``unique_dirs``), its runs those its sweep launched
    (``sweep_run_dirs``: a missing one is a problem line; one whose spec.json lacks its manifest
    entry's token, another sweep's run copied in, is left out with a problem line, ``read_runs``),
    and each run directory gives one row, under the
    first sweep directory that holds it (a run directory inside two of the directories given,
    such as a sweep and one of its runs, is one run, not a re-run: their real paths, ``real_path``).

    Args:
        sweep_dirs: sweep directories (or run directories).
        found: ``conf.contract.sweep_runs`` of some of them, as given, when already found
            (``analysis.cli.check_sweeps``): not looked for again.

    Returns:
        (the runs table, RUNS_SCHEMA; the phases table, PHASES_SCHEMA; the problems met reading
        them and the notes of what was read once, one line each).
    """
    dirs, problems = unique_dirs(sweep_dirs)
    seen: dict[str, Path] = {}
    items: list[RunItem] = []
    for sweep_dir in dirs:
        real_sweep = os.path.realpath(sweep_dir)
        launched = (found or {}).get(sweep_dir) or sweep_runs(sweep_dir)
        for run_dir in sweep_run_dirs(sweep_dir, problems, launched):
            first = seen.setdefault(real_path(run_dir, sweep_dir, real_sweep), sweep_dir)
            if first is not sweep_dir:
                problems.append(f"{run_dir}: already read under {first}: one run, counted once")
                continue
            items.append(RunItem(run_dir, sweep_dir, launched.tokens.get(run_dir)))
    runs, phases, read_problems = read_runs(items)
    return Tables(runs, phases, problems + read_problems)
