"""The frontier sweeper's throughput objective (``hydra.sweeper.objective=throughput``): once an
axis' margin edge is known, the fastest value inside it, every answer a real run.

``search_timing`` reads a run's throughput from its record; ``fastest_inside`` runs the search
(``sweeper.search.throughput``) through the sweep's runs (reused when the sweep directory holds
them) and writes each measurement to ``search.jsonl`` as a ``throughput_probe`` line.
"""

from __future__ import annotations

import logging
from typing import Any

from memsweep.conf.contract import run_throughput

from .frontier_log import SearchLog
from .frontier_runs import SweepRuns
from .search import Lattice
from .search.throughput import ThroughputSearch

log = logging.getLogger("memsweep")

OBJECTIVES = ("edge", "throughput")
"""``hydra.sweeper.objective``: the memory edge only, or the fastest value inside the margin too."""


def search_timing(run: dict) -> tuple[float | None, float | None]:
    """A run's measured throughput as the search reads it (``conf.contract.run_throughput``: null
    unless the run ended ok).

    Args:
        run: ``sweeper.frontier_runs.read_run``'s dict (its ``record``, record.json, or None, and
            its ``outcome``).

    Returns:
        (``samples_per_s``: the median samples per second, ``noise_rel``: MAD/median of the run's
        samples, a fraction), each None when the record holds none (or a value that is not a
        positive number, or a negative noise).
    """
    tput = run_throughput(run.get("record"), run.get("outcome"))
    speed, noise = number(tput.get("samples_per_s")), number(tput.get("noise_rel"))
    if speed is None or speed <= 0:
        return None, None
    return speed, noise if noise is not None and noise >= 0 else None


def number(x: object) -> float | None:
    """``x`` as a float when it is an int or a float (not a bool, not NaN), else None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x != x:
        return None
    return float(x)


def throughput_upper(result: dict) -> tuple[int | None, str]:
    """The largest value the throughput search may take, and why.

    Args:
        result: the axis' answer (``SearchResult.to_dict()`` with the confirmations' fields).

    Returns:
        (the margin edge, or ``max_ok`` when no margin was searched; None when the search stopped,
        nothing ran ok or no value leaves the margin, with the reason).
    """
    if result.get("stopped_by"):
        return None, f"the memory search stopped ({result['stopped_by']}): no edge to search below"
    if result.get("margin_bytes") is not None:
        edge = result.get("margin_edge")
        return edge, "the margin edge" if edge is not None else "no value ran ok within the margin"
    edge = result.get("max_ok")
    return edge, "max_ok (no margin searched)" if edge is not None else "no value ran ok"


def fastest_inside(
    runs: SweepRuns, search_log: SearchLog, axis: str, lattice: Lattice, result: dict, known: list[int]
) -> dict[str, Any]:
    """Search the values of ``lattice`` up to the margin edge for the highest measured throughput.

    Args:
        runs: the sweep's runs (full protocol; reused when the sweep directory holds them).
        search_log: ``search.jsonl``, where each measurement goes (``throughput_probe``).
        axis: the axis.
        lattice: its values.
        result: the axis' memory answer (``throughput_upper``).
        known: values whose full-protocol run already exists (the memory search's successes):
            read first, not counted as the search's runs.

    Returns:
        ``ThroughputAnswer.to_dict()`` (best, samples_per_s, noise_rel, runs, known, upper, status)
        plus ``runs_reused``; best None with the reason in ``status`` when there is nothing to search.
    """
    upper, why = throughput_upper(result)
    if upper is None:
        return {"best": None, "samples_per_s": None, "noise_rel": None, "runs": 0, "known": 0, "status": why}
    values = sorted(v for v in set(known) if lattice.lower <= v <= upper)
    found = runs.run(axis, [(v, 0) for v in values], [])
    measured = {v: search_timing(r) for v, r in zip(values, found)}
    search, reused = ThroughputSearch(lattice, upper, measured), 0
    for value, run in zip(values, found):
        log_probe(search_log, axis, value, measured[value], run, "measured by the memory search", known=True)
    while (probe := search.propose()) is not None:
        (run,) = runs.run(axis, [(probe, 0)], [])
        timing = search_timing(run)
        search.observe(probe, *timing)
        reused += run["reused"]
        log_probe(search_log, axis, probe, timing, run, search.reason)
    answer = search.answer().to_dict()
    answer["status"] = f"inside {why} {axis}={upper}: {answer['status']}"
    log.info("frontier %s: %s", axis, answer["status"])
    return {**answer, "runs_reused": reused}


def log_probe(
    search_log: SearchLog,
    axis: str,
    value: int,
    timing: tuple[float | None, float | None],
    run: dict,
    reason: str,
    known: bool = False,
) -> None:
    """Write one throughput measurement to ``search.jsonl`` (``throughput_probe``) and the log."""
    search_log.write(
        {
            "event": "throughput_probe",
            "axis": axis,
            "value": value,
            "samples_per_s": timing[0],
            "noise_rel": timing[1],
            "reason": reason,
            "known": known,
            "outcome": run["outcome"],
            "run_dir": run["run_dir"],
            "reused": run["reused"],
            "spec_key": run["key"],
        }
    )
    speed = "no throughput measured" if timing[0] is None else f"{timing[0]:.4g} samples/s"
    log.info(
        "frontier throughput probe %s=%d [%s] -> %s%s", axis, value, reason, speed, " (reused)" if run["reused"] else ""
    )
