"""Tables already written for a sweep, read in the place of its run directories when they are
current: written by this memsweep's reader after every file of every run the sweep holds now.

``stamp`` marks a table with the reader that built it (``READER_KEY`` in its Parquet metadata) as
the tables are published; ``current_tables`` finds a sweep's newest set and returns it only when
that stamp is this reader's, the sweep is not running, its runs are exactly the rows of the table,
and no run directory nor file of theirs changed since the reading began (``READ_SINCE_KEY``) or
the tables were written (modification times in ns); otherwise None: the runs are read again.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from memsweep.conf.contract import RECORD_FILE, RESULT_FILE, SPEC_FILE, sweep_running, sweep_runs

from .tables import run_id_of

READER_KEY = b"memsweep.reader"
"""The Parquet metadata key that names the reader that built a table (``reader_fingerprint``)."""

READER_SOURCES = ("analysis", "conf/contract", "estimator")
"""The package folders whose modules build the tables' rows (their top-level ``*.py`` files)."""


@functools.cache
def reader_fingerprint() -> bytes:
    """The SHA-256 (hex, as bytes) of the source of every module that builds the tables' rows
    (``READER_SOURCES``): tables stamped with another one were built by another memsweep's code.

    Returns:
        64 hexadecimal digits, as bytes.
    """
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for folder in READER_SOURCES:
        for path in sorted((root / folder).glob("*.py")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest().encode()


READ_SINCE_KEY = b"memsweep.read_since_ns"
"""The Parquet metadata key of when the reading of the runs began (``time.time_ns()``, decimal)."""


def stamp(table: pa.Table, read_since_ns: int | None = None) -> pa.Table:
    """``table`` with ``READER_KEY`` (this reader's fingerprint) and, when given, ``READ_SINCE_KEY``
    (when its runs began to be read, ns) added to its schema's metadata."""
    metadata = dict(table.schema.metadata or {})
    metadata[READER_KEY] = reader_fingerprint()
    if read_since_ns is not None:
        metadata[READ_SINCE_KEY] = str(read_since_ns).encode()
    return table.replace_schema_metadata(metadata)


class CurrentTables(NamedTuple):
    """A sweep's tables, current with its run directories (``current_tables``)."""

    runs: pa.Table
    phases: pa.Table
    files: list[Path]  # the runs and phases Parquet files read


def current_tables(sweep_dir: Path, files: list[Path]) -> CurrentTables | None:
    """The runs and phases tables of ``sweep_dir`` from ``files`` (its newest set, as
    ``analysis.report.find_analysis_files`` finds it), when they are current (see the module).

    Args:
        sweep_dir: the sweep directory, as given (the tables' ``sweep_dir`` column must be it, or an
            absolute name of it: ``_named_as``).
        files: the Parquet tables found for it.

    Returns:
        The tables, or None: no complete set, another reader's, a running sweep, a run added,
        removed or changed since they were written, or a file that cannot be read.
    """
    by_name = {f.name: f for f in files}
    if "runs.parquet" not in by_name or "phases.parquet" not in by_name or sweep_running(sweep_dir):
        return None
    paths = [by_name["runs.parquet"], by_name["phases.parquet"]]
    try:
        stamps = [(pq.read_schema(p).metadata or {}) for p in paths]  # (the footers only)
        if any(m.get(READER_KEY) != reader_fingerprint() for m in stamps):
            return None
        # a run changed while the tables were being built is in them as it was before: the time the
        # reading began, where recorded, else the tables' own
        since = [int(m[READ_SINCE_KEY]) for m in stamps if READ_SINCE_KEY in m]
        written = min([os.stat(p).st_mtime_ns for p in paths] + since)
        run_dirs = sweep_runs(sweep_dir).run_dirs
        if not _unchanged_since(run_dirs, written):
            return None
        runs, phases = (_named_as(pq.read_table(p), sweep_dir) for p in paths)
    except (OSError, pa.ArrowException, ValueError):
        return None
    if runs is None or phases is None or not _same_runs(runs, sweep_dir, run_dirs):
        return None
    return CurrentTables(runs, phases, paths)


def _named_as(table: pa.Table, sweep_dir: Path) -> pa.Table | None:
    """``table`` with the sweep directory named as given: its ``sweep_dir`` column (and ``run_dir``,
    the sweep directory joined with ``run_id``, as reading the runs names it) rewritten when it holds
    one absolute name of the same directory (its real path); the table as it is when it already
    names it so; None when it names another (or a relative name, whose working directory is unknown).
    The sweep's own analysis names its directory absolute; a user types it relative."""
    names = set(table.column("sweep_dir").to_pylist()) if "sweep_dir" in table.column_names else set()
    if names <= {str(sweep_dir)}:
        return table
    (name,) = names if len(names) == 1 else (None,)
    if not isinstance(name, str) or not os.path.isabs(name) or os.path.realpath(name) != os.path.realpath(sweep_dir):
        return None
    ids = table.column("run_id").to_pylist()
    if any(not isinstance(i, str) or i.startswith("/") for i in ids):
        return None
    table = _set(table, "sweep_dir", [str(sweep_dir)] * table.num_rows)
    if "run_dir" in table.column_names:
        table = _set(table, "run_dir", [str(Path(sweep_dir) / i) for i in ids])
    return table


def _set(table: pa.Table, name: str, values: list[str]) -> pa.Table:
    """``table`` with its string column ``name`` replaced by ``values`` (the same field)."""
    i = table.column_names.index(name)
    return table.set_column(i, table.schema.field(i), pa.array(values, pa.string()))


def _unchanged_since(run_dirs: list[Path], written: int) -> bool:
    """True when every run directory and each of its spec, record and result files present was last
    modified before ``written`` (ns): a file added, removed or renamed into place changes its
    directory's time, one rewritten in place its own. Equal times count as changed."""
    for run_dir in run_dirs:
        base = str(run_dir)
        if os.stat(base).st_mtime_ns >= written:
            return False
        for name in (SPEC_FILE, RECORD_FILE, RESULT_FILE):
            try:
                if os.stat(os.path.join(base, name)).st_mtime_ns >= written:
                    return False
            except FileNotFoundError:
                continue
    return True


def _same_runs(runs: pa.Table, sweep_dir: Path, run_dirs: list[Path]) -> bool:
    """True when the table's rows are exactly the sweep's runs: each once, all of ``sweep_dir``
    (its ``sweep_dir`` column, as given)."""
    if runs.num_rows != len(run_dirs) or "sweep_dir" not in runs.column_names or "run_id" not in runs.column_names:
        return False
    if set(runs.column("sweep_dir").to_pylist()) - {str(sweep_dir)}:
        return False
    ids = runs.column("run_id").to_pylist()
    return len(set(ids)) == len(ids) and set(ids) == {run_id_of(d, sweep_dir) for d in run_dirs}
