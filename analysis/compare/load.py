"""Reading a sweep for a comparison: its Parquet tables (of any memsweep version), else its records.

Parquet written by an older memsweep has fewer columns: a column a file lacks reads as null
(unknown), never as 0, and the sweep says which columns it lacked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..report import find_analysis_files
from ..tables import PHASES_SCHEMA, RUNS_SCHEMA, build_tables, no_sweep_dir


class SweepNotFound(FileNotFoundError):
    """A path given to compare is not a directory (nothing was read).

    Args:
        path: the path given, kept as ``self.path``.
    """

    def __init__(self, path: Path):
        super().__init__(no_sweep_dir(path))
        self.path = Path(path)


class EmptySweep(ValueError):
    """A directory given to compare holds no measured run (nothing to compare; bad input).

    Args:
        path: the directory given, kept as ``self.path``.
        dry_runs: how many dry runs (predictions, never compared) it holds.
    """

    def __init__(self, path: Path, dry_runs: int = 0):
        held = f"only {dry_runs} dry run(s), predictions" if dry_runs else "no run directory and no runs.parquet"
        super().__init__(f"sweep directory {path} holds no measured run ({held}): nothing to compare")
        self.path = Path(path)


class UnreadableSweep(ValueError):
    """A Parquet table of a directory given to compare cannot be read (not Parquet, truncated, or
    another file under its name): bad input, named by its path and the reader's words."""


@dataclass
class Sweep:
    """One sweep as compare reads it.

    Attributes:
        label: its short name in the output (``A``, ``B``, ...).
        path: the directory given.
        source: where the rows came from (the Parquet files, or the run records).
        runs: the measured run rows (dicts; a dry run, source ``predicted``, is left out), of the
            columns read (``load_sweep``'s ``run_columns``; all by default).
        phases: their phase rows (dicts), of the columns read (``phase_columns``).
        missing_columns: columns of today's runs/phases schema the Parquet files lack (an older
            memsweep wrote them); their values are null.
        dry_runs: how many dry runs (predictions) were left out.
    """

    label: str
    path: Path
    source: str
    runs: list[dict]
    phases: list[dict]
    missing_columns: list[str] = field(default_factory=list)
    dry_runs: int = 0
    _by_run: dict[tuple, list[dict]] | None = field(default=None, repr=False, compare=False)

    def phases_of(self, run: dict) -> list[dict]:
        """The phase rows of one run (matched by sweep_dir and run_id), found by one look-up: the
        phases are grouped by run once.

        Args:
            run: a run row of this sweep.

        Returns:
            Its phase rows, in the order of ``phases``.
        """
        if self._by_run is None:
            self._by_run = {}
            for p in self.phases:
                self._by_run.setdefault((p.get("sweep_dir"), p.get("run_id")), []).append(p)
        return self._by_run.get((run.get("sweep_dir"), run.get("run_id")), [])


def rows_of(table: pa.Table) -> list[dict]:
    """A table's rows as dicts (column name -> Python value), as ``Table.to_pylist``: converted a
    column at a time, then zipped into rows (faster than row by row for many rows)."""
    names = table.column_names
    if not names:
        return [{} for _ in range(table.num_rows)]
    return [dict(zip(names, values)) for values in zip(*(c.to_pylist() for c in table.columns))]


def _read(path: Path, columns: Sequence[str] | None) -> tuple[list[dict], list[str]]:
    """The rows of one Parquet table (only ``columns`` of it, those it has; None: all), and the
    columns of today's schema it lacks."""
    try:
        names = pq.read_schema(path).names
        table = pq.read_table(path, columns=None if columns is None else [c for c in columns if c in names])
    except (pa.ArrowException, OSError) as exc:  # ArrowInvalid: not Parquet; OSError: unreadable
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise UnreadableSweep(f"{path} is not a Parquet table memsweep can read ({first})") from None
    schema = RUNS_SCHEMA if path.name.startswith("runs") else PHASES_SCHEMA
    return rows_of(table), [n for n in schema.names if n not in names]


def _select(table: pa.Table, columns: Sequence[str] | None) -> pa.Table:
    return table if columns is None else table.select([c for c in columns if c in table.column_names])


def load_sweep(
    path: Path,
    label: str,
    run_columns: Sequence[str] | None = None,
    phase_columns: Sequence[str] | None = None,
) -> Sweep:
    """Read a sweep directory: its newest ``runs.parquet`` and ``phases.parquet`` (those of the
    directory, or of its latest ``analysis/<time>/``), else its run records (as ``memsweep analyze``).

    Args:
        path: a sweep directory (or a directory holding the two Parquet files).
        label: its short name in the output.
        run_columns, phase_columns: the columns to read (of those present; ``sweep_dir``, ``run_id``
            and ``source`` are needed to pair phases with runs and leave dry runs out); None: all.
            A comparison reads only what it shows (``match.RUN_COLUMNS``, ``match.PHASE_COLUMNS``):
            most of a runs table's columns are never compared.

    Returns:
        The sweep; a row lacking a column (older Parquet) lacks that key.

    Raises:
        SweepNotFound: ``path`` is not a directory.
        EmptySweep: it holds no measured run.
        UnreadableSweep: its runs.parquet or phases.parquet cannot be read.
    """
    path = Path(path)
    if not path.is_dir():
        raise SweepNotFound(path)
    files = {f.name: f for f in find_analysis_files(path)}
    if "runs.parquet" in files and "phases.parquet" in files:
        runs, missing_r = _read(files["runs.parquet"], run_columns)
        phases, missing_p = _read(files["phases.parquet"], phase_columns)
        source = f"{files['runs.parquet']} and {files['phases.parquet'].name}"
        missing = missing_r + [f"phases.{n}" for n in missing_p]
    else:
        runs_t, phases_t, _ = build_tables([path])
        runs, phases = rows_of(_select(runs_t, run_columns)), rows_of(_select(phases_t, phase_columns))
        missing = []
        source = "the run records (no Parquet tables found)"
    measured = [r for r in runs if r.get("source") != "predicted"]
    if not measured:
        raise EmptySweep(path, len(runs))
    keep = {(r.get("sweep_dir"), r.get("run_id")) for r in measured}
    phases = [p for p in phases if (p.get("sweep_dir"), p.get("run_id")) in keep]
    return Sweep(label, path, source, measured, phases, missing, len(runs) - len(measured))
