"""A sweep's own runs: its manifest (``sweep.json``, schema ``sweep.schema.json``), written
before its first worker starts and added to, atomically, before each run's worker starts; the
sweep's lock (``.sweep.lock``, held by its orchestrator while it runs); and ``sweep_runs``, the
one answer to "which run directories belong to this sweep" that every analysis reads.

Standard library only (``fcntl`` locks: the same kind ``filelock`` takes on Linux).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .errors import RecordError, SpecError
from .record import RESULT_FILE, SPEC_FILE, read_json, write_json_atomic
from .rundir import find_run_dirs
from .temps import remove_stale_temps

SWEEP_FILE = "sweep.json"
"""The sweep's manifest in its sweep directory: the run directories it launched."""

SWEEP_SCHEMA_FILE = Path(__file__).with_name("sweep.schema.json")
"""The manifest's published JSON Schema."""

SWEEP_LOCK = ".sweep.lock"
"""Held (``fcntl.flock``, exclusive) by the orchestrator of a sweep while it runs and analyses."""

MANIFEST_LOCK = ".sweep.json.lock"
"""Taken around each change of the manifest (jobs of one sweep may run in several processes)."""

SESSION_ENV = "MEMSWEEP_SWEEP_SESSION"
"""The orchestrator's session id, passed to the jobs it launches (two jobs of one session that
name one directory collide)."""

MANIFEST_VERSION = 1
"""The manifest's schema version this memsweep writes and reads (``sweep.schema.json``)."""


class SweepBusy(RuntimeError):
    """The sweep directory's lock is held: another orchestrator is running a sweep in it."""


@dataclass(frozen=True)
class SweepRuns:
    """The run directories of one sweep (``sweep_runs``).

    Attributes:
        run_dirs: those it launched that hold a spec.json, in manifest order.
        missing: those it launched that no longer hold one (deleted, or never started).
        listed: whether the sweep has a manifest (False: an older sweep or a hand-made
            directory, whose run directories are every one found under it).
        tokens: run directory -> the token its manifest entry holds, which its spec.json must
            hold too (``spec.SWEEP_TOKEN_KEY``; else it is another sweep's run, copied in); a run whose
            entry has none (written by an older memsweep) is not in it.
    """

    run_dirs: list[Path]
    missing: list[Path]
    listed: bool
    tokens: dict[Path, str] = field(default_factory=dict)


def _check_manifest(data: object, path: Path) -> dict:
    """The manifest, checked against ``sweep.schema.json``'s shape.

    Raises:
        RecordError: not a manifest (names the file and what is wrong).
    """
    if not isinstance(data, dict) or data.get("kind") != "sweep":
        raise RecordError(f"{path}: not a memsweep sweep manifest (kind must be 'sweep')")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= MANIFEST_VERSION:
        raise RecordError(f"{path}: schema_version {version!r}: expected an integer from 1 to {MANIFEST_VERSION}")
    runs = data.get("runs")
    if not isinstance(runs, list) or not all(isinstance(r, dict) and isinstance(r.get("run_id"), str) for r in runs):
        raise RecordError(f"{path}: runs must be a list of objects with a string run_id")
    if not all(isinstance(r.get("token"), str | None) for r in runs):
        raise RecordError(f"{path}: a run's token must be a string or null")
    for r in runs:  # (on the text, as Path would read it on POSIX: no Path made per run)
        if r["run_id"].startswith("/") or ".." in r["run_id"].split("/") or r["run_id"] in ("", "."):
            raise RecordError(f"{path}: run_id {r['run_id']!r} is not a folder inside the sweep directory")
    return data


def read_manifest(sweep_dir: Path | str) -> dict | None:
    """The sweep's manifest, or None when it has none.

    Args:
        sweep_dir: the sweep directory.

    Returns:
        The manifest (checked: ``kind``, ``schema_version``, ``runs`` with their ``run_id``), or None.

    Raises:
        RecordError: the manifest exists but cannot be read or is not one.
    """
    path = Path(sweep_dir) / SWEEP_FILE
    if not path.exists():
        return None
    return _check_manifest(read_json(path, "sweep manifest"), path)  # bounded: a regular file, capped


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created when missing), waited for."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def start_manifest(sweep_dir: Path | str, identity: str | None = None) -> None:
    """Write an empty manifest into ``sweep_dir`` unless it holds one (a resumed sweep keeps its
    runs); either way it names the sweep now running there (``identity``).

    Args:
        sweep_dir: the sweep directory (it exists).
        identity: what makes the sweep this one (``hold_sweep_lock``), or None.

    Raises:
        RecordError: an existing manifest that cannot be read.
        OSError: the directory cannot be written.
    """
    sweep_dir = Path(sweep_dir)
    with _locked(sweep_dir / MANIFEST_LOCK):
        _start_manifest(sweep_dir, identity)


def _start_manifest(sweep_dir: Path, identity: str | None) -> None:
    """``start_manifest``'s work, under the manifest's lock; a dead writer's temporaries removed."""
    remove_stale_temps(sweep_dir, (SWEEP_FILE,))
    data = read_manifest(sweep_dir) or {"schema_version": MANIFEST_VERSION, "kind": "sweep", "runs": []}
    if data.get("sweep") != identity or not (sweep_dir / SWEEP_FILE).exists():
        write_json_atomic(sweep_dir / SWEEP_FILE, {**data, "sweep": identity})


def register_run(sweep_dir: Path | str, run_dir: Path | str, overrides: list[str], session: str | None) -> str | None:
    """Add a run to its sweep's manifest before its worker starts (atomically, under a lock).

    Its entry holds a token (random, ``secrets.token_hex``) that the job writes into the run's
    spec.json (``spec.SWEEP_TOKEN_KEY``), so that a run folder copied in from another sweep is told
    from the sweep's own (``sweep_runs``). An entry keeps its token when the run is registered
    again (a resumed sweep, another orchestrator of the same sweep); a new entry for a folder that
    already holds a spec.json (a sweep of an older memsweep, or one whose manifest was lost) gets
    none: its spec could not carry it.

    Args:
        sweep_dir: the sweep directory.
        run_dir: the job's directory; it must lie inside ``sweep_dir``.
        overrides: the job's overrides (what condition it runs).
        session: the orchestrator's session id (``SESSION_ENV``), or None.

    Returns:
        The entry's token, to write into the run's spec.json; None when it has none.

    Raises:
        SpecError: field ``hydra.sweep.subdir``: the run directory is not inside the sweep
            directory, or another job of this session already has it with other overrides.
        RecordError: the manifest cannot be read.
    """
    sweep_dir, run_dir = Path(sweep_dir).absolute(), Path(run_dir).absolute()
    sweep_real, run_real = Path(os.path.realpath(sweep_dir)), Path(os.path.realpath(run_dir))
    if run_real == sweep_real or not run_real.is_relative_to(sweep_real):
        raise SpecError("hydra.sweep.subdir", str(run_dir), f"a folder inside the sweep directory {sweep_dir}")
    run_id = run_real.relative_to(sweep_real).as_posix()
    with _locked(sweep_dir / MANIFEST_LOCK):
        data = read_manifest(sweep_dir) or {"schema_version": MANIFEST_VERSION, "kind": "sweep", "runs": []}
        entry = next((r for r in data["runs"] if r["run_id"] == run_id), None)
        if entry is not None and session is not None and entry.get("session") == session:
            if entry.get("overrides") != overrides:
                raise SpecError(
                    "hydra.sweep.subdir",
                    run_id,
                    "a folder of its own for each job (such as ${hydra.job.num}); two jobs of this sweep "
                    f"({' '.join(entry.get('overrides') or [])} and {' '.join(overrides)}) got this one",
                )
            return entry.get("token")
        if entry is not None:
            token = entry.get("token")
        else:
            token = None if os.path.isfile(run_real / SPEC_FILE) else secrets.token_hex(16)
        new = {"run_id": run_id, "overrides": list(overrides), "session": session, "token": token}
        data["runs"] = [r for r in data["runs"] if r["run_id"] != run_id] + [new]
        write_json_atomic(sweep_dir / SWEEP_FILE, data)
        return token


def sweep_runs(sweep_dir: Path | str) -> SweepRuns:
    """The run directories that belong to the sweep in ``sweep_dir``: those its manifest lists
    (each once, in order; one without a spec.json is ``missing``, never silently dropped, unless
    its folder is there without a result.json and the sweep still runs: it is starting; one whose
    folder is a symbolic link, a run put in place from elsewhere, is ``missing`` too, never read
    as this sweep's); without a manifest, every run
    directory under it (``find_run_dirs``). No file of a run is read here: whether a real folder
    holds the sweep's own run or one copied in from another sweep is told by its spec.json's token
    (``SweepRuns.tokens``), checked where the spec is read (``analysis.tables``).

    Args:
        sweep_dir: the sweep directory.

    Returns:
        ``SweepRuns``: the runs present, those missing, whether a manifest listed them, their tokens.

    Raises:
        RecordError: a manifest that cannot be read.
    """
    sweep_dir = Path(sweep_dir)
    data = read_manifest(sweep_dir)
    if data is None:
        return SweepRuns(find_run_dirs([sweep_dir]), [], False)
    present: list[Path] = []
    missing: list[Path] = []
    tokens: dict[Path, str] = {}
    running = sweep_running(sweep_dir)
    base = str(sweep_dir)
    entries = {r["run_id"]: r.get("token") for r in data["runs"]}  # (one entry per run: register_run)
    for run_id, token in entries.items():
        run_dir = sweep_dir / run_id
        path = os.path.join(base, run_id)
        if os.path.islink(path):  # a run put in place from elsewhere is not this sweep's run
            missing.append(run_dir)
        elif os.path.isfile(os.path.join(path, SPEC_FILE)):  # (a str: one stat, no Path made)
            present.append(run_dir)
            if token is not None:
                tokens[run_dir] = token
        elif not (running and run_dir.is_dir() and not os.path.exists(os.path.join(path, RESULT_FILE))):
            missing.append(run_dir)  # a run of a running sweep may not have written it yet; one that ended has
    return SweepRuns(present, missing, True, tokens)


def hold_sweep_lock(sweep_dir: Path | str, identity: str | None = None) -> int:
    """Join the sweep running in ``sweep_dir``, or start it: take its lock (``SWEEP_LOCK``, shared:
    orchestrators of the same sweep share its directory, each running the conditions the other has
    not) and write its manifest (``start_manifest``). The caller closes the descriptor returned to
    release it (the process's exit releases it too).

    Args:
        sweep_dir: the sweep directory (it exists).
        identity: what makes this sweep this one (its overrides and sweeper, hashed).

    Raises:
        SweepBusy: another sweep (another ``identity``) runs in the directory now.
    """
    sweep_dir = Path(sweep_dir)
    with _locked(sweep_dir / MANIFEST_LOCK):  # two orchestrators starting at one instant: one after the other
        data = read_manifest(sweep_dir)
        if sweep_running(sweep_dir) and (data or {}).get("sweep") != identity:
            raise SweepBusy(f"{sweep_dir} is in use by another sweep (its orchestrator holds {SWEEP_LOCK})")
        fd = os.open(sweep_dir / SWEEP_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            _start_manifest(sweep_dir, identity)
        except BaseException:
            os.close(fd)
            raise
    return fd


def sweep_running(sweep_dir: Path | str) -> bool:
    """Whether an orchestrator holds ``sweep_dir``'s lock now (a sweep still running in it).

    Args:
        sweep_dir: the sweep directory.

    Returns:
        True while any orchestrator holds ``SWEEP_LOCK``; False otherwise (or with no lock file).
    """
    path = Path(sweep_dir) / SWEEP_LOCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while any orchestrator holds it shared
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def check_writable(field: str, path: object) -> None:
    """Refuse an output directory that cannot be created or written.

    Args:
        field: the setting's name (``results_dir``, ``hydra.sweep.dir``).
        path: the directory (it need not exist yet).

    Raises:
        SpecError: a path whose nearest existing ancestor is not a directory, or is one this
            process cannot create a directory in (tried with a temporary directory, removed at
            once).
    """
    target = Path(os.path.realpath(Path(str(path)).expanduser()))  # `..` as the kernel follows it
    probe = target
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise SpecError(field, str(path), f"a directory that can be created ({probe} is not a directory)")
    try:  # os.access answers yes to root on a read-only file system: try, and leave nothing behind
        os.rmdir(tempfile.mkdtemp(prefix=".memsweep-write-check-", dir=probe))
    except OSError as exc:
        raise SpecError(
            field, str(path), f"a directory this user can write ({probe} is not writable: {exc.strerror})"
        ) from None
