"""The margin report of one or more sweep directories.

``build_report(runs, phases, frontier, policy)`` turns the analysis tables (plus any ``est_*``
and search columns) into a ``Report``; ``write_report`` writes it as ``report.md`` (plots in
``report_plots/``) and a self-contained ``report.html``, never over an existing report.

The peak compared with the capacity is ``max_memory_reserved`` on CUDA/ROCm and
``max_memory_allocated`` (tracked tensor bytes) on the CPU (``margin.basis``). Calculated,
observed and assumed figures go to separate sections; sizes are raw bytes beside GiB (2^30 B).

Modules, in the order the data flows: ``margin`` (policy, counter), ``stats`` (per axis: values,
frontier, margin, recommendation), ``phases``, ``fit`` and ``fitted`` (the peak as a polynomial of
the axis), ``sections_*`` (one function per section), ``build`` (``build_report``), ``write``
(``write_report``, ``report_for_dirs``), ``cli`` (``memsweep report``: the only one that prints).
"""

from __future__ import annotations

from memsweep.conf.contract import AXES, gib
from memsweep.estimator.margin import BASIS_TEXT, DEFAULT_MARGIN, MarginPolicy, basis, device_kind, parse_margin

from .build import Report, build_report
from .cli import main
from .fit import crossing, fit_context
from .fmt import nbytes, pct
from .phases import COLD_WARM_FLAG, OBSERVED_COUNTERPART, PART_NAMES, decomposition, peak_increments, phase_order
from .stats import AxisResult, ValueStat, analyse_axis
from .write import (
    ReportExists,
    ReportPaths,
    SweepDirNotFound,
    WrittenReport,
    find_analysis_files,
    report_for_dirs,
    report_paths,
    write_report,
)

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
    "ReportPaths",
    "SweepDirNotFound",
    "ValueStat",
    "WrittenReport",
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
