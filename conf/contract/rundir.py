"""One reader of a run directory, and one definition of the run's peak.

Every consumer of what a run left (the sweeper's result envelope and resume check, the
frontier sweeper's probes, ``memsweep predict``, the analysis tables and the report) reads
spec.json, record.json and result.json through these functions, and compares the same
counter with the capacity (``peak_counters``):

* CUDA / ROCm: ``max_memory_reserved``, the bytes the caching allocator holds from the device
  at its peak; the emulated capacity caps it (torch.cuda.set_per_process_memory_fraction).
* CPU: ``max_memory_allocated``, the live tensor storage bytes the worker's tracker counts; the
  CPU's "reserved" is the process resident set (the interpreter and PyTorch included).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .attribution import scales_with
from .errors import NewerSchemaError, RecordError, SpecError
from .record import (
    FILE_KINDS,
    RECORD_FILE,
    RESULT_FILE,
    SPEC_FILE,
    document_problems,
    read_json,
)
from .spec import RunSpec
from .vocabulary import OUTCOMES

CPU_PEAK_COUNTERS = ("max_memory_allocated", "max_memory_reserved")
"""(compared with the capacity, the other) on the CPU: the tracker's live tensor bytes first."""

CUDA_PEAK_COUNTERS = ("max_memory_reserved", "max_memory_allocated")
"""(compared with the capacity, the other) on a device with a caching allocator (CUDA, ROCm)."""


def read_file(run_dir: Path | str, name: str) -> dict:
    """Read one JSON file of a run directory.

    Args:
        run_dir: the run directory.
        name: ``SPEC_FILE``, ``RECORD_FILE`` or ``RESULT_FILE``.

    Returns:
        The document (a dict with a readable ``schema_version``).

    Raises:
        RecordError: missing, unreadable, corrupt, or of an unknown version
            (``NewerSchemaError`` when written by a newer memsweep).
    """
    return read_json(os.path.join(run_dir, name), FILE_KINDS[name])  # (a str path: no Path made per file)


def try_read(run_dir: Path | str, name: str) -> tuple[dict | None, str | None]:
    """Read one JSON file of a run directory, without raising.

    Args:
        run_dir: the run directory.
        name: ``SPEC_FILE``, ``RECORD_FILE`` or ``RESULT_FILE``.

    Returns:
        ``(document, None)``, or ``(None, why)`` when it is missing or cannot be read (the
        RecordError's message, which names the file).
    """
    try:
        return read_file(run_dir, name), None
    except RecordError as exc:
        return None, str(exc)


def read_spec(run_dir: Path | str) -> RunSpec | None:
    """Read and validate the spec a run directory holds.

    A spec written before some fields existed gets their defaults (``RunSpec.from_dict``).

    Args:
        run_dir: the run directory.

    Returns:
        The spec, or None when the directory holds no spec.json.

    Raises:
        RecordError: spec.json cannot be read.
        SpecError: spec.json does not hold a valid spec.
    """
    if not (Path(run_dir) / SPEC_FILE).exists():
        return None
    return RunSpec.from_dict(read_file(run_dir, SPEC_FILE))


@dataclass
class Run:
    """What one run directory holds; any of its files may be missing or unreadable.

    Attributes:
        run_dir: the directory.
        spec: spec.json as read (not validated), or None when it cannot be read.
        record: record.json, or None.
        result: result.json, or None.
        problems: what could not be read of record.json and result.json, in words (a newer
            memsweep's file included), for the reader to report.
        record_damage: ``"missing"`` (the run ended, per result.json, without a record) or
            ``"corrupt"`` (record.json exists but cannot be read): the run left no complete
            record, so it is a crash whatever result.json says. None otherwise.
        unreadable: file name -> why it could not be read, for every JSON file that is
            missing or unreadable (the RecordError's message).
        spec_problem: spec.json was read but holds no valid spec (no load, a bad value): the
            SpecError in words. Such a run measured nothing anyone asked for: a ``crash``.
    """

    run_dir: Path
    spec: dict | None
    record: dict | None = None
    result: dict | None = None
    problems: list[str] = field(default_factory=list)
    record_damage: str | None = None
    unreadable: dict[str, str] = field(default_factory=dict)
    spec_problem: str | None = None


def read_run(run_dir: Path | str) -> Run:
    """Read spec.json, record.json and result.json of a run directory.

    Nothing raises: what cannot be read is None, with the reason in ``unreadable`` and, for
    the record and the result, in ``problems``. What is read is checked against the contract: a
    spec that ``RunSpec.from_dict`` refuses (``spec_problem``; the spec stays, as read), a record
    that breaks the published schema (``document_problems``: a field of the wrong type, an unknown
    outcome or other enum value, bytes out of range, in the record or in its nested objects:
    phases and their devices and ranks, ranks, environment, capacity, model; ``record_damage``
    ``"invalid"``, each problem named by its path, ``phases[2].max_memory_allocated``), a result
    that breaks it or has no outcome (dropped: None, as unreadable). A record of a newer memsweep is not damage
    (its outcome is unknown here); a missing record after the run ended (result.json present)
    and an unreadable one are (``record_damage``).

    Args:
        run_dir: the run directory.

    Returns:
        The run's files (see ``Run``).
    """
    run_dir = run_dir if isinstance(run_dir, Path) else Path(run_dir)  # (a Path given: not parsed again)
    run = Run(run_dir, None)
    for name, attr in ((SPEC_FILE, "spec"), (RECORD_FILE, "record"), (RESULT_FILE, "result")):
        try:
            setattr(run, attr, read_file(run_dir, name))
        except RecordError as exc:
            run.unreadable[name] = str(exc)
            if name == SPEC_FILE or not (run_dir / name).exists():
                continue
            if name == RECORD_FILE and not isinstance(exc, NewerSchemaError):
                run.record_damage = "corrupt"
                run.problems.append(f"record corrupt or unreadable: {exc}")
            else:
                run.problems.append(str(exc))
    if run.spec is not None:
        try:
            RunSpec.from_dict(run.spec)
        except SpecError as exc:
            run.spec_problem = f"{run_dir / SPEC_FILE}: not a valid spec ({exc})"
            run.problems.append(run.spec_problem)
    if run.record is not None and (wrong := document_problems(run.record, "record")):
        run.record_damage = "invalid"
        run.problems.append(f"{run_dir / RECORD_FILE}: not a record of the contract ({'; '.join(wrong)})")
    if run.result is not None:
        wrong = document_problems(run.result, "result")
        if run.result.get("outcome") is None:  # the schema allows a null outcome; a finished run has one
            wrong.insert(0, f"outcome={run.result.get('outcome')!r}: expected one of {', '.join(OUTCOMES)}")
        if wrong:
            run.unreadable[RESULT_FILE] = f"{run_dir / RESULT_FILE}: not a result of the contract ({'; '.join(wrong)})"
            run.problems.append(run.unreadable[RESULT_FILE])
            run.result = None
    if run.record is None and run.result is not None and not (run_dir / RECORD_FILE).exists():
        run.record_damage = "missing"
        run.problems.append(f"{run_dir / RECORD_FILE}: record missing (the run ended without one)")
    return run


def find_run_dirs(paths: Iterable[Path | str]) -> list[Path]:
    """Find every run directory (one holding a spec.json) under ``paths``.

    One ``os.scandir`` per directory (``_run_dirs_under``). Directories whose name starts with a dot
    below a path (``.attempts/``, ``.dry_run/``) are skipped, and so is a symbolic link to a
    directory below a path (as ``Path.rglob`` skips them); a spec.json that is a dangling symbolic
    link does not count.

    Args:
        paths: sweep directories (or run directories).

    Returns:
        The run directories, sorted by parent, then by name length, then by name (so that
        ``2`` comes before ``10``).
    """
    found: set[str] = set()
    for path in paths:
        found.update(_run_dirs_under(str(Path(path))))
    return sorted(map(Path, found), key=lambda p: (str(p.parent), len(p.name), p.name))


def _run_dirs_under(top: str) -> list[str]:
    """The directories holding a spec.json at or below ``top`` (not below a dot-folder or a
    symbolic link), as ``top`` joined with their path below it; a directory that cannot be listed
    (gone, no permission) holds none."""
    found, todo = [], [top]
    while todo:
        directory = todo.pop()
        try:
            with os.scandir(directory) as entries:
                listed = list(entries)
        except OSError:
            continue
        for entry in listed:
            name = entry.name
            if name == SPEC_FILE and (not entry.is_symlink() or os.path.exists(entry.path)):
                found.append(directory)
            if name.startswith("."):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):  # a directory, not a link to one
                    todo.append(entry.path)
            except OSError:  # gone since it was listed
                pass
    return found


def record_phases(record: Mapping | None) -> list[dict]:
    """List the phase objects of a record.

    Args:
        record: the worker's record, or None.

    Returns:
        Its ``phases`` entries that are mappings, in order; empty when the record, or its
        phases, are missing or corrupt.
    """
    phases = record.get("phases") if isinstance(record, Mapping) else None
    return [p for p in phases if isinstance(p, dict)] if isinstance(phases, list) else []


def device_kind_of(device_kind: str | None, device: str | None) -> str:
    """Name the kind of device a run used.

    Args:
        device_kind: the record's ``device_kind`` (torch.device.type), when known.
        device: the spec's ``device`` (``cpu``, ``cuda:N``), used when the kind is not known.

    Returns:
        ``device_kind`` when given; else ``cpu`` or ``cuda`` from the device; else ``unknown``.
    """
    if device_kind:
        return device_kind
    device = str(device or "")
    return "cpu" if device == "cpu" else ("cuda" if device.startswith("cuda") else "unknown")


def peak_counters(device_kind: str | None, source: str | None = None) -> tuple[str, str]:
    """Name the peak counter compared with the capacity on a kind of device, and the other one.

    The CPU's is ``max_memory_allocated`` (the worker's live tensor tracker: what the CPU
    capacity caps); any other device's is ``max_memory_reserved`` (what the caching allocator
    holds from the device, which the per-process memory fraction caps). With no device known
    (None: a run that left no record, or stopped before it chose its device) the CPU's name is
    given; such a run has no peak. A dry run (``source`` ``predicted``) predicts
    ``max_memory_allocated`` only, on any device.

    Args:
        device_kind: ``cpu``, ``cuda``, ``unknown`` (``device_kind_of``), or None (or empty).
        source: the record's ``source``: ``measured`` (or None) or ``predicted``.

    Returns:
        (counter compared with the capacity, the other counter): ``CPU_PEAK_COUNTERS`` or
        ``CUDA_PEAK_COUNTERS``.
    """
    if source == "predicted" or not device_kind or device_kind == "cpu":
        return CPU_PEAK_COUNTERS
    return CUDA_PEAK_COUNTERS


def phase_peak(phases: Sequence[Mapping], counter: str, names: Sequence[str] | None = None) -> int | None:
    """Find the largest value of a counter over phases.

    Args:
        phases: phase objects (``record_phases``).
        counter: a counter field (``max_memory_allocated``...).
        names: only the phases of these names, or whose ``parent`` is one of them
            (``COLD_PHASES``, ``WARM_PHASES``: ``phases_in``); None for every phase.

    Returns:
        The largest integer value, in bytes; None when no phase has one (missing is null, never 0).
        A phase of a run on several devices (a ``devices`` list) counts with the largest value
        over its devices: the capacity caps every device, so the fullest one is compared with it;
        likewise a phase of a DDP/FSDP run (a ``ranks`` list) with its fullest rank
        (``phase_values``).
    """
    return largest(phase_values(phases, counter), None if names is None else phases_in(phases, names))


def phases_in(phases: Sequence[Mapping], names: Sequence[str]) -> list[bool]:
    """Tell of each phase whether it is one of ``names``, or a sub-phase of one (its ``parent``).

    Args:
        phases: phase objects (``record_phases``).
        names: phase names (``COLD_PHASES``, ``WARM_PHASES``).

    Returns:
        One flag per phase, in order: True when its ``name`` or its ``parent`` is one of them.
    """
    return [p.get("name") in names or p.get("parent") in names for p in phases]


def phase_values(phases: Sequence[Mapping], counter: str) -> list[int | None]:
    """The value of a counter on each phase: its own and, on a run of several devices or ranks
    (a ``devices`` or ``ranks`` list), the largest of its own and theirs (``_fullest``).

    Args:
        phases: phase objects (``record_phases``).
        counter: a counter field (``max_memory_allocated``...).

    Returns:
        One value per phase, in order: bytes, or None where none is an integer (missing is
        null, never 0; a bool is not a count).
    """
    return [
        _fullest(p, counter)
        if isinstance(p.get("devices"), list) or isinstance(p.get("ranks"), list)
        else (v if isinstance(v := p.get(counter), int) and not isinstance(v, bool) else None)
        for p in phases
    ]


def _fullest(phase: Mapping, counter: str) -> int | None:
    """The largest integer value of a counter on a phase, its devices and its ranks (None: none)."""
    found = [phase.get(counter)]
    for entries in (phase.get("devices"), phase.get("ranks")):
        if isinstance(entries, list):
            found += [e.get(counter) for e in entries if isinstance(e, Mapping)]
    return largest([v if isinstance(v, int) and not isinstance(v, bool) else None for v in found])


def largest(values: Iterable[int | None], keep: Iterable[bool] | None = None) -> int | None:
    """Find the largest of some phases' values (``phase_values``', one per phase).

    Args:
        values: one value per phase (bytes), None where it has none.
        keep: one flag per phase (``phases_in``): only the values whose flag is true count;
            None: every one.

    Returns:
        The largest value that is not None and counts; None when there is none (never 0).
    """
    if keep is None:
        counts = [v for v in values if v is not None]
    else:
        counts = [v for v, k in zip(values, keep) if k and v is not None]
    return max(counts) if counts else None


def run_peak(record: Mapping | None, axis: str | None = None) -> tuple[int | None, str]:
    """Find the run's peak compared with the capacity, from its record.

    Args:
        record: the worker's record, or None when it left none.
        axis: None for every phase; a load variable (``batch``, ``eval_batch``...) for only the
            phases that did not fail and whose size follows it (``attribution.scales_with``): the peak a
            search along that axis fits, which a later phase of another variable (an eval after
            training, in a batch search) neither raises nor hides. A phase without a status
            counts (only a phase recorded as failed, ``oom`` or ``error``, is left out).

    Returns:
        (peak in bytes or None, counter name): the largest phase value of
        ``peak_counters(record's device_kind, record's source)[0]``.
    """
    record = record if isinstance(record, Mapping) else {}
    counter = peak_counters(record.get("device_kind"), record.get("source"))[0]
    phases = record_phases(record)
    if axis is not None:
        phases = [p for p in phases if p.get("status") not in ("oom", "error") and scales_with(p.get("name"), axis)]
    return phase_peak(phases, counter), counter


def predicted_outcome(outcome: str | None, peak: int | None, capacity_bytes: int | None) -> str | None:
    """Give a dry run's verdict: its predicted peak against the capacity.

    A dry run (record ``source`` ``predicted``) never runs out of memory: fake tensors hold
    no storage and no capacity limits it, so the worker's ``ok`` only says that every phase
    could be predicted. Whether the load fits is the predicted peak (``run_peak``: the
    largest phase ``max_memory_allocated``) compared with the capacity asked for. This is the
    one place that comparison is made (frontier search on dry runs, ``memsweep predict``,
    the analysis and report of dry runs).

    Args:
        outcome: the worker's outcome of the dry run (``ok``, ``error``, ``crash``...).
        peak: its predicted peak in bytes, or None.
        capacity_bytes: the capacity asked for in bytes, or None (none given).

    Returns:
        ``ok`` (predicted peak <= capacity), ``oom`` (predicted above the capacity: does not
        fit), the worker's outcome when it is not ``ok`` (nothing was predicted), or None
        when the peak or the capacity is unknown (no verdict: never read as a fit).
    """
    if outcome != "ok":
        return outcome
    if peak is None or capacity_bytes is None:
        return None
    return "ok" if peak <= capacity_bytes else "oom"
