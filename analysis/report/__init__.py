"""The margin report: the short card of seed 003 for one or more sweep directories.

``build_report(runs, phases, frontier, policy)`` turns the analysis tables (RUNS_SCHEMA,
PHASES_SCHEMA, FRONTIER_SCHEMA, plus any columns other modules add: ``est_*`` from the
estimator, ``upper_reached``/``stopped_by``/... from the frontier sweeper) into a document;
``write_report`` writes it as ``report.md`` (plots in ``report_plots/``) and a self-contained
``report.html``, never over an existing report.

What is compared with the capacity
----------------------------------
* CUDA / ROCm: ``max_memory_reserved``, the bytes the caching allocator holds from the
  device at the peak (what the issue calls the margin: capacity - max_memory_reserved). The
  CUDA context and other processes are outside it.
* CPU: ``max_memory_allocated``, the live tensor bytes tracked by the worker. The CPU's
  "reserved" is the process resident set, which includes the Python interpreter and the
  PyTorch libraries (about 0.3 GiB): capacity - RSS would be negative for every run. With
  ``capacity_mode=allocator`` (the default) the emulated capacity caps exactly these bytes
  (``worker.counters.apply_cpu_allocator_capacity``); with ``capacity_mode=process`` it limits
  the growth of the worker's data segment above its size at start (RLIMIT_DATA), which holds
  the tensors plus the heap's own overhead, so that margin is optimistic by that overhead; the
  report also shows the resident set above its value when the worker started measuring
  (``reserved above start``).

Calculated, observed and assumed figures go to separate sections. Sizes are printed as raw
bytes next to GiB (2^30 B); GB (10^9 B) appears only where a vendor's own words are quoted.

Modules, in the order the data flows:

* ``margin``: the margin policy (``MarginPolicy``, ``parse_margin``) and which counter is
  compared with the capacity on each kind of device (``basis``).
* ``stats``: per swept axis, the values run and their peaks, the frontier, the margin at
  ``max_ok`` and the recommended value (``analyse_axis``, ``AxisResult``, ``ValueStat``).
* ``phases``: phase order, each phase's rise of the peak, the observed split of the peak.
* ``fit``: the peak as a polynomial of the swept axis, where it crosses a level and the largest
  value of the axis's lattice within it (``capacity_limits``).
* ``fitted``: those limits in words, and the unmeasured value under the margin with its command.
* ``sections_summary``, ``sections_observed``, ``sections_calculated``, ``sections_closing``:
  the document, one function per section.
* ``build``: ``build_report``, the sections in order; ``Report``.
* ``write``: ``write_report`` and ``report_for_dirs``, never over an existing report.
* ``cli``: ``memsweep report`` (the only module that prints or chooses an exit status).
"""

from __future__ import annotations

from memsweep.conf.contract import AXES, gib

from .build import Report, build_report
from .cli import main
from .fit import crossing, fit_context
from .fmt import nbytes, pct
from .margin import BASIS_TEXT, DEFAULT_MARGIN, MarginPolicy, basis, device_kind, parse_margin
from .phases import COLD_WARM_FLAG, OBSERVED_COUNTERPART, PART_NAMES, decomposition, peak_increments, phase_order
from .stats import AxisResult, ValueStat, analyse_axis
from .write import ReportExists, SweepDirNotFound, find_analysis_files, report_for_dirs, report_paths, write_report

__all__ = [
    "AXES",
    "BASIS_TEXT",
    "COLD_WARM_FLAG",
    "DEFAULT_MARGIN",
    "OBSERVED_COUNTERPART",
    "PART_NAMES",
    "AxisResult",
    "MarginPolicy",
    "Report",
    "ReportExists",
    "SweepDirNotFound",
    "ValueStat",
    "analyse_axis",
    "basis",
    "build_report",
    "crossing",
    "decomposition",
    "device_kind",
    "find_analysis_files",
    "fit_context",
    "gib",
    "main",
    "nbytes",
    "parse_margin",
    "pct",
    "peak_increments",
    "phase_order",
    "report_for_dirs",
    "report_paths",
    "write_report",
]
