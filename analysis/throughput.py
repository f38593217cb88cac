"""Measured throughput in the tables: the runs-table columns of record.json's ``throughput``
(conf.contract.throughput), the frontier's rates at its edges and its fastest value, and the
label that says on which device a rate was timed (``conf.contract.timed_on``).

A record written before the field carries none: its rates are worked out from its phases'
``iteration_s`` by the same function the worker uses. A run that did not end ``ok`` has none.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from memsweep.conf.contract import THROUGHPUT_KEYS, run_throughput

THROUGHPUT_COLUMNS = {
    "samples_per_s": "samples_per_s",
    "tokens_per_s": "tokens_per_s",
    "prefill_tokens_per_s": "prefill_tokens_per_s",
    "decode_tokens_per_s": "decode_tokens_per_s",
    "noise_rel": "throughput_noise_rel",
    "iterations": "throughput_iterations",
}
"""record.json ``throughput`` key -> runs-table column (the count and the noise prefixed: a phase
has ``iterations`` of its own)."""

THROUGHPUT_TYPES = {
    column: pa.int64() if key == "iterations" else pa.float64() for key, column in THROUGHPUT_COLUMNS.items()
}
"""runs-table column -> Parquet type: rates and noise float64 (per second; a ratio), the count int64."""

assert tuple(THROUGHPUT_COLUMNS) == THROUGHPUT_KEYS, "a throughput key without a runs-table column"


def throughput_columns(record: Mapping, outcome: str | None) -> dict:
    """The runs-table throughput columns of one run.

    Args:
        record: the worker's record (its ``throughput``, else its phases).
        outcome: the run's outcome (result.json's); rates are kept only for ``ok``.

    Returns:
        THROUGHPUT_COLUMNS' columns -> value (per second; null when not measured, never 0).
    """
    measured = run_throughput(record, outcome)
    return {column: measured[key] for key, column in THROUGHPUT_COLUMNS.items()}


FRONTIER_THROUGHPUT = (
    ("max_ok_samples_per_s", pa.float64()),
    ("min_ok_samples_per_s", pa.float64()),
    ("margin_edge_samples_per_s", pa.float64()),
    ("fastest_label", pa.string()),
    ("fastest_samples_per_s", pa.float64()),
    ("fastest_noise_rel", pa.float64()),
)
"""The frontier table's throughput columns (samples per second, medians over a value's ok runs):
at the edge that fits (``max_ok``; ``min_ok`` on a decreasing axis), at the search's
``margin_edge``, and the fastest value measured (its label, rate and ``throughput_noise_rel``),
at most the margin edge when one was searched (the fastest inside the margin). Along ``context``
the fastest is the one with the most tokens per second (``rate_column``); its column still holds
its samples per second (tokens per second: that times ``conf.contract.tokens_per_sample``)."""


RATE_UNITS = {"samples_per_s": "samples/s", "tokens_per_s": "tokens/s"}
"""A rate column -> its unit in words."""
RATE_WORDS = {"samples/s": "samples per second", "tokens/s": "tokens per second"}
"""A rate's unit (``RATE_UNITS``' values) -> the same spelt out (an axis label, a caption)."""


def rate_column(rows: Iterable[Mapping], axis: str) -> str:
    """The rate that says which value of ``axis`` is fastest: ``tokens_per_s`` along ``context``
    (a sample holds more tokens at each value, so samples per second fall by construction) where
    an ok run measured one; ``samples_per_s`` elsewhere, and for loads whose context counts no
    tokens (a user workload: its token rates are null).

    Args:
        rows: runs-table rows of one load, differing only in ``axis``.
        axis: the swept column.

    Returns:
        A key of ``RATE_UNITS``.
    """
    if axis == "context" and any(
        r.get("outcome") == "ok" and isinstance(r.get("tokens_per_s"), (int, float)) for r in rows
    ):
        return "tokens_per_s"
    return "samples_per_s"


def value_rates(
    rows: Iterable[Mapping], axis: str, column: str = "samples_per_s"
) -> dict[Any, tuple[float, float | None]]:
    """The measured rate of each value of ``axis``: the median ``column`` of its ok runs.

    Args:
        rows: runs-table rows (mappings) of one load, differing only in ``axis``.
        axis: the swept column.
        column: the rate, ``samples_per_s`` or ``tokens_per_s`` (``rate_column``).

    Returns:
        value -> (that rate per second, the median ``throughput_noise_rel`` of those runs or None);
        values without a measured ok run are left out.
    """
    rates: dict[Any, list[tuple[float, float | None]]] = {}
    for r in rows:
        rate = r.get(column)
        if r.get("outcome") == "ok" and isinstance(rate, (int, float)) and rate == rate and rate > 0:
            noise = r.get("throughput_noise_rel")
            noise = noise if isinstance(noise, (int, float)) and noise == noise else None
            rates.setdefault(r.get(axis), []).append((float(rate), noise))
    out = {}
    for value, pairs in rates.items():
        noises = [n for _, n in pairs if n is not None]
        out[value] = (statistics.median(p for p, _ in pairs), statistics.median(noises) if noises else None)
    return out


def _le(value: Any, edge: Any) -> bool:
    """value <= edge for numbers; True for values that do not compare (dtype labels)."""
    try:
        return bool(value <= edge)
    except TypeError:
        return True


def frontier_throughput(rows: Iterable[Mapping], axis: str, edge_of: str, fit: Any, margin_edge: Any) -> dict:
    """The frontier row's throughput columns (FRONTIER_THROUGHPUT) of one group of runs.

    Args:
        rows: the group's runs-table rows.
        axis: the swept column.
        edge_of: ``max_ok`` or ``min_ok``: which edge ``fit`` is.
        fit: the value at that edge, or None.
        margin_edge: the search's margin edge, or None.

    Returns:
        column -> samples per second (null where that value has no measured ok run), the
        fastest value's label, rate (samples per second) and noise; the fastest is the one with
        the most ``rate_column`` (tokens per second along ``context``, else samples per second).
    """
    rows = list(rows)
    rates = value_rates(rows, axis)
    column = rate_column(rows, axis)
    out = dict.fromkeys(name for name, _ in FRONTIER_THROUGHPUT)
    out[f"{edge_of}_samples_per_s"] = rates.get(fit, (None,))[0] if fit is not None else None
    out["margin_edge_samples_per_s"] = rates.get(margin_edge, (None,))[0] if margin_edge is not None else None
    by = rates if column == "samples_per_s" else value_rates(rows, axis, column)
    inside = {
        v: r
        for v, r in by.items()
        if v in rates and (margin_edge is None or edge_of != "max_ok" or _le(v, margin_edge))
    }
    if inside:
        fastest = max(inside, key=lambda v: inside[v][0])
        out.update(
            fastest_label=str(fastest), fastest_samples_per_s=rates[fastest][0], fastest_noise_rel=rates[fastest][1]
        )
    return out
