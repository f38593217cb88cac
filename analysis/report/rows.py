"""The rows of the analysis tables as the report reads them: the runs kept apart by what they are
(measured, dry runs, unread records), and the phase rows read for the runs that need them.

Every run needs only its first phase's ``memory_reserved_start`` (``phase_starts``); the phase
rows themselves are read for the runs shown in full (``phases_of``), so that a report of many
loads does not turn every phase of every run into a dictionary.
"""

from __future__ import annotations

from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

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


def _measured(phases: pa.Table) -> pa.Table:
    """The phase rows not of a dry run (a null ``source`` is measured)."""
    return phases.filter(pc.fill_null(pc.not_equal(phases["source"], PREDICTED), True))


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
    predicted_phases = phases_table.filter(pc.equal(phases_table["source"], PREDICTED)).to_pylist()
    return Rows(all_runs, runs, predicted, unread, [], predicted_phases)


def phase_starts(phases_table: pa.Table) -> dict[tuple, int | None]:
    """Each run's ``memory_reserved_start`` (bytes) of its first phase: the measured phase row of the
    smallest ``phase_index`` (the first such row on a tie), by (sweep_dir, run_id); a run whose
    phases carry no index is left out."""
    cols = _measured(phases_table).select(["sweep_dir", "run_id", "phase_index", "memory_reserved_start"])
    first: dict[tuple, tuple[int, int | None]] = {}
    for sweep_dir, run_id, index, start in zip(*(c.to_pylist() for c in cols.columns)):
        key = (sweep_dir, run_id)
        if index is not None and (key not in first or index < first[key][0]):
            first[key] = (index, start)
    return {key: start for key, (_, start) in first.items()}


def phases_of(phases_table: pa.Table, runs: list[dict]) -> list[dict]:
    """The measured phase rows of ``runs`` (matched by sweep_dir and run_id), in the table's order."""
    keys = {(r["sweep_dir"], r["run_id"]) for r in runs}
    measured = _measured(phases_table)
    ids = pa.array(sorted({k[1] for k in keys}), measured.schema.field("run_id").type)
    near = measured.filter(pc.is_in(measured["run_id"], value_set=ids))
    return [p for p in near.to_pylist() if (p["sweep_dir"], p["run_id"]) in keys]
