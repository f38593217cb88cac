"""The rows of the analysis tables as the report reads them: the runs kept apart by what they are
(measured, dry runs, unread records), and the phase rows read for the runs that need them.

Every run needs only its first phase's ``memory_reserved_start`` (``phase_starts``); the phase
rows themselves are read for the runs shown in full (``phases_of``), so that a report of many
loads does not turn every phase of every run into a dictionary.
"""

from __future__ import annotations

from typing import NamedTuple

import pyarrow as pa

from .stats import record_unread

PREDICTED = "predicted"
"""The ``source`` of a dry run's rows (fake tensors, nothing measured)."""


class Rows(NamedTuple):
    """The rows of the analysis tables, kept apart by what they are."""

    all_runs: list[dict]  # every run row, dry runs and unread records included
    runs: list[dict]  # the measured runs whose record was read
    predicted: list[dict]  # the dry runs (source "predicted")
    unread: list[dict]  # runs whose record could not be read
    phases: list[dict]  # the measured phase rows of the runs shown in full (``phases_of``)
    predicted_phases: list[dict]  # the dry runs' phase rows


def _rows_at(table: pa.Table, indices: list[int]) -> list[dict]:
    """The rows of ``table`` at ``indices`` (ascending) as dicts: each stretch of consecutive
    indices sliced (zero-copy) and converted, so that the other rows are never turned into dicts
    (nor pyarrow.compute imported, slow to import, for a filter)."""
    out: list[dict] = []
    i = 0
    while i < len(indices):
        j = i
        while j + 1 < len(indices) and indices[j + 1] == indices[j] + 1:
            j += 1
        out += table.slice(indices[i], indices[j] - indices[i] + 1).to_pylist()
        i = j + 1
    return out


def _predicted(phases: pa.Table) -> list[bool]:
    """Per phase row, whether it is a dry run's (a null ``source`` is measured)."""
    return [s == PREDICTED for s in phases.column("source").to_pylist()]


def split_rows(runs_table: pa.Table, phases_table: pa.Table) -> Rows:
    """Split the tables' rows: a dry run (source "predicted": fake tensors, nothing measured) is never
    an observation, and a run whose record could not be read is neither measured nor unfinished.

    Returns:
        The rows; ``phases`` empty until ``phases_of`` reads those of the runs shown.
    """
    all_runs = runs_table.to_pylist()
    predicted = [r for r in all_runs if r.get("source") == PREDICTED]
    runs = [r for r in all_runs if r.get("source") != PREDICTED]
    unread = [r for r in runs if record_unread(r)]
    runs = [r for r in runs if not record_unread(r)]
    predicted_phases = _rows_at(phases_table, [i for i, dry in enumerate(_predicted(phases_table)) if dry])
    return Rows(all_runs, runs, predicted, unread, [], predicted_phases)


def phase_starts(phases_table: pa.Table) -> dict[tuple, int | None]:
    """Each run's ``memory_reserved_start`` (bytes) of its first phase: the measured phase row of the
    smallest ``phase_index`` (the first such row on a tie), by (sweep_dir, run_id); a run whose
    phases carry no index is left out."""
    names = ["sweep_dir", "run_id", "phase_index", "memory_reserved_start"]
    columns = [phases_table.column(n).to_pylist() for n in names]
    first: dict[tuple, tuple[int, int | None]] = {}
    for dry, sweep_dir, run_id, index, start in zip(_predicted(phases_table), *columns):
        key = (sweep_dir, run_id)
        if not dry and index is not None and (key not in first or index < first[key][0]):
            first[key] = (index, start)
    return {key: start for key, (_, start) in first.items()}


def phases_of(phases_table: pa.Table, runs: list[dict]) -> list[dict]:
    """The measured phase rows of ``runs`` (matched by sweep_dir and run_id), in the table's order."""
    keys = {(r["sweep_dir"], r["run_id"]) for r in runs}
    at = zip(
        _predicted(phases_table),
        phases_table.column("sweep_dir").to_pylist(),
        phases_table.column("run_id").to_pylist(),
    )
    return _rows_at(phases_table, [i for i, (dry, d, r) in enumerate(at) if not dry and (d, r) in keys])
