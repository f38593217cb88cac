"""The frontier sweeper's record of its decisions: ``search.jsonl`` in the sweep directory, and
the log lines that say the same to the person watching.

``search.jsonl`` is appended, never rewritten, one JSON object a line, each stamped with the
sweep's session: ``start`` (settings), ``dry_run`` (the edge the dry runs predict), ``probe``
and ``light_probe`` (value, why it was chosen, what the model predicted, outcome, peak, run
directory, reused or not), ``verify`` (a light edge run with the full protocol), ``confirm``,
``throughput_probe`` (``sweeper.frontier_throughput``: one throughput measurement of
``objective=throughput``) and ``result`` (the answer of each axis, which ``analysis.frontier`` reads).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from memsweep.conf.contract import AXES, SEARCH_LOG, SOURCES, RunSpec

from .frontier_runs import PEAK_COUNTERS
from .search import Probe

log = logging.getLogger("memsweep")

# The baseline's fields a result line names (the searched axis among them, as null).
FIXED_FIELDS = (*AXES, "mode", "device", "warmup", "repeats")


class SearchLog:
    """``search.jsonl`` of one sweep session.

    Args:
        sweep_dir: the sweep directory (the file is ``SEARCH_LOG`` in it).
        session: the session's name (``sweeper.owner.session_id``: start time in UTC, host, pid
            and a random token), added to every line.
    """

    def __init__(self, sweep_dir: Path, session: str) -> None:
        self.path = Path(sweep_dir) / SEARCH_LOG
        self.session = session

    def write(self, event: dict[str, Any]) -> None:
        """Append ``event`` (one decision, a JSON object; the session is added first) and sync
        the file to disk (os.fsync), so that a killed sweep keeps every decision it made."""
        event = {"session": self.session, **event}
        with open(self.path, "a") as f:
            f.write(json.dumps(event, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def probe(
        self,
        event: str,
        axis: str,
        probe: Probe,
        run: dict[str, Any],
        counter: str | None,
        extra: list[str],
        outcome: str,
    ) -> None:
        """Record one observed probe of the search, and log it.

        Args:
            event: ``probe`` or ``light probe`` (``light_probe`` in the file).
            axis: the axis searched.
            probe: the probe, observed (``Probe.to_dict`` goes into the line).
            run: what the run left (``sweeper.frontier_runs.read_run``).
            counter: the counter the peak was read from (``conf.contract.run_peak``).
            extra: the overrides added to the probe (the light protocol).
            outcome: what the run tells the search along ``axis``
                (``sweeper.frontier_runs.axis_reading``: an OOM of another phase is no OOM of
                the axis), as the probe observed it.
        """
        self.write(
            {
                "event": event.replace(" ", "_"),
                "axis": axis,
                **probe.to_dict(),
                "peak_counter": counter,
                "capacity_bytes": run["capacity_bytes"],
                "spec_key": run["key"],
                "overrides": extra,
            }
        )
        log.info(
            "frontier %s %s=%d [%s] -> %s%s%s",
            event,
            axis,
            probe.value,
            probe.reason,
            outcome,
            "" if probe.expected is None or outcome == probe.expected else f" (predicted {probe.expected})",
            " (reused)" if run["reused"] else "",
        )

    def edge_run(self, event: str, axis: str, value: int, run: dict[str, Any], outcome: str, **fields: Any) -> None:
        """Record one run at an edge value (``verify`` or ``confirm``).

        Args:
            event: ``verify`` or ``confirm``.
            axis: the axis searched.
            value: the edge value run.
            run: what the run left (``sweeper.frontier_runs.read_run``).
            outcome: what the run tells the search along ``axis`` (``axis_reading``).
            fields: more fields, written after ``value`` (``light_outcome``).
        """
        self.write(
            {
                "event": event,
                "axis": axis,
                "value": value,
                **fields,
                "outcome": outcome,
                "message": run["message"],
                "run_dir": run["run_dir"],
                "reused": run["reused"],
                "spec_key": run["key"],
            }
        )

    def result(
        self,
        axis: str,
        result: dict[str, Any],
        baseline: RunSpec,
        capacity: int | None,
        counter: str | None,
    ) -> None:
        """Record the answer of one axis, and log it.

        Args:
            axis: the axis searched.
            result: the search's result with the verification's and confirmations' fields and
                ``source`` (``predicted``: the line says the edge is a prediction of dry runs).
            baseline: the spec of the other axes' values (``FIXED_FIELDS`` of it are written).
            capacity: the capacity the runs recorded (bytes), or None for the baseline's.
            counter: the counter the peaks were read from (described by ``PEAK_COUNTERS``).
        """
        fixed = {k: getattr(baseline, k) for k in FIXED_FIELDS}
        fixed[axis] = None
        self.write(
            {
                "event": "result",
                **result,
                "workload": baseline.workload_name,
                "capacity_bytes": capacity if capacity is not None else baseline.capacity_bytes,
                "fixed": fixed,
                "peak_counter": PEAK_COUNTERS.get(counter, counter) if counter is not None else None,
            }
        )
        n_confirm = sum(len(v) for v in result.get("confirm_outcomes", {}).values())
        stable = {True: "yes", False: "NO (a confirmation flipped)", None: "not checked (nothing re-run)"}
        predicted = result.get("source") == SOURCES[1]
        if predicted:
            stable[None] = "not checked (dry runs are deterministic: a re-run repeats the same prediction)"
        log.info(
            "frontier %s: %s%s; max_ok=%s min_oom=%s after %d search run(s) (%d reused) and %d more "
            "confirmation run(s), stable: %s",
            axis,
            "PREDICTED by dry runs, nothing measured: " if predicted else "",
            result["status"],
            result["max_ok"],
            result["min_oom"],
            result["runs_used"],
            result["runs_reused"],
            n_confirm,
            stable[result["stable"]],
        )
