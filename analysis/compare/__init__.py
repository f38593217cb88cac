"""``memsweep compare``: sweeps of comparable loads side by side, and a gate CI can fail on.

Modules, in the order the data flows:

* ``load``: a sweep's Parquet tables (of any memsweep version: a missing column is unknown),
  else its run records.
* ``match``: series (one swept axis of one load), pairing with the other sweep's closest load,
  per value and phase the four counters, what differs, what was not comparable and why.
* ``names``: a load's workload parameters named compactly (those that differ, or a digest).
* ``gate``: ``--fail-above 5%`` / ``64MiB`` on each value's run peak (``--counter``: which peak).
* ``speed``: ``--fail-slower 5%`` on each value's measured samples per second.
* ``compare``: all of it for a list of sweep directories (the first is the baseline); writing the document.
* ``render``: the text and the document; ``plot``: the four counters against the axis (matplotlib).
* ``scale``: a comparison of many series bounded: the pairs shown in full, lists named up to a bound.
* ``cli``: the command line (the only module that prints or chooses an exit status).
"""

from __future__ import annotations

from .cli import EXIT_BAD_INPUT, EXIT_NOTHING_COMPARABLE, EXIT_OK, EXIT_REGRESSION, main
from .compare import CompareResult, compare, compare_document, compare_text, write_doc
from .gate import Regression, Threshold, parse_threshold, regressions
from .load import EmptySweep, Sweep, SweepNotFound, load_sweep
from .match import COUNTERS, GATE_COUNTERS, Comparison, Difference, Row, Series, compare_series, differences, series_of
from .speed import Slowdown, parse_slower, rate_changes, slowdowns

__all__ = [
    "COUNTERS",
    "GATE_COUNTERS",
    "EXIT_BAD_INPUT",
    "EXIT_NOTHING_COMPARABLE",
    "EXIT_OK",
    "EXIT_REGRESSION",
    "CompareResult",
    "Comparison",
    "Difference",
    "EmptySweep",
    "Regression",
    "Row",
    "Slowdown",
    "Series",
    "Sweep",
    "SweepNotFound",
    "Threshold",
    "compare",
    "compare_document",
    "compare_text",
    "compare_series",
    "differences",
    "load_sweep",
    "main",
    "parse_slower",
    "parse_threshold",
    "rate_changes",
    "regressions",
    "series_of",
    "slowdowns",
    "write_doc",
]
