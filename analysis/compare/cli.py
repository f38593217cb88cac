"""``memsweep compare``: the command line; the only module of the comparison that prints or exits."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from memsweep.conf.contract import SpecError, check_writable

from ..report import ReportExists, report_paths
from ..tables import repeated_dirs
from .compare import CompareResult, compare, compare_document, compare_text, write_doc
from .gate import Threshold, parse_threshold
from .load import EmptySweep, SweepNotFound, UnreadableSweep
from .match import GATE_COUNTERS
from .speed import parse_slower

EXIT_OK = 0
"""Compared; no peak grew beyond --fail-above and no rate fell beyond --fail-slower (or neither given)."""
EXIT_REGRESSION = 1
"""A peak grew beyond --fail-above, or a value's samples per second fell beyond --fail-slower."""
EXIT_BAD_INPUT = 2
"""Bad arguments, a missing sweep directory or one without a measured run, or an output that exists:
nothing compared."""
EXIT_NOTHING_COMPARABLE = 3
"""A gate was given but had nothing to check: no value compared (--fail-above), no measured rate in
both sweeps (--fail-slower)."""


class _BadInput(Exception):
    """The arguments cannot be compared; the message is printed after ``memsweep compare: error:``."""


def _threshold(args: argparse.Namespace) -> Threshold | None:
    """Check the parsed arguments (two sweeps at least, the threshold's form, no existing output) and
    note a directory given twice, on stderr.

    Returns:
        The --fail-above threshold; None when not given.

    Raises:
        _BadInput: fewer than two sweeps, a bad threshold, or an output that exists or cannot be
            written.
    """
    if len(args.sweep_dirs) < 2:
        raise _BadInput("sweep_dirs: give a baseline and at least one sweep to compare")
    try:
        threshold = parse_threshold(args.fail_above) if args.fail_above is not None else None
        if args.fail_slower is not None:
            parse_slower(args.fail_slower)
    except SpecError as exc:
        raise _BadInput(str(exc)) from exc
    if args.out is not None:
        existing = [p for p in report_paths(args.out, "compare") if p.exists()]
        if existing:
            raise _BadInput(f"--out: {existing[0]} already exists (never overwritten)")
        try:
            check_writable("--out", args.out)
        except SpecError as exc:
            raise _BadInput(str(exc)) from exc
    for first, again in repeated_dirs(args.sweep_dirs)[1]:
        print(
            f"memsweep compare: note: {again.resolve()} was given twice ({first}, {again}): it is compared with "
            "itself (its differences are 0 by construction, not two measurements)",
            file=sys.stderr,
        )
    return threshold


def _write(result: CompareResult, threshold: Threshold | None, slower: str | None, out: Path) -> bool:
    """Write compare.md, its plots and compare.html into ``out`` and print where; False (the message
    printed) when one exists."""
    from . import plot

    doc = compare_document(result, threshold, slower, plot)
    try:
        md, html_ = write_doc(doc, out)
    except ReportExists as exc:
        print(f"memsweep compare: error: --out: {exc}", file=sys.stderr)
        return False
    except OSError as exc:  # a full disk, a file system gone read-only midway
        print(f"memsweep compare: error: --out: cannot write into {out}: {exc}", file=sys.stderr)
        return False
    print(f"memsweep: comparison -> {html_}  (and {md})")
    return True


def main(argv: list[str] | None = None) -> int:
    """``memsweep compare BASELINE OTHER [OTHER ...] [--fail-above 5%|64MiB] [--counter allocated|reserved]
    [--fail-slower 5%] [--out DIR]``.

    Args:
        argv: the arguments after ``compare``; None: ``sys.argv[1:]``.

    Returns:
        The exit status: EXIT_OK (0), EXIT_REGRESSION (1), EXIT_BAD_INPUT (2),
        EXIT_NOTHING_COMPARABLE (3); argparse exits 2 itself on bad arguments.
    """
    parser = argparse.ArgumentParser(
        prog="memsweep compare",
        description="Compare sweeps of comparable loads (the same axis values, one thing changed): per value "
        "and phase the four counters and their differences, what differs between the sweeps, what was not "
        "comparable, and each value's measured samples per second. The first sweep is the baseline; each other is "
        "compared with it. Exit 0 compared, 1 a peak grew beyond --fail-above or a rate fell beyond --fail-slower, "
        "2 bad input, 3 a gate given but nothing comparable for it.",
    )
    parser.add_argument("sweep_dirs", nargs="+", type=Path, metavar="SWEEP_DIR")
    parser.add_argument(
        "--fail-above",
        default=None,
        help="exit 1 when a value's run peak (the --counter peak, max_memory_allocated by default) grew "
        "by more than this over the baseline: a percentage of the baseline's peak (5%%), 0, or a size with its "
        "unit (64MiB, 1GB, 0MiB; a bare number such as 5 is refused)",
    )
    parser.add_argument(
        "--counter",
        choices=tuple(GATE_COUNTERS),
        default="allocated",
        help="the peak --fail-above reads: allocated (max_memory_allocated, the default: on CUDA the tensors' "
        "bytes, steadier than the reserved peak, which moves with the caching allocator's warm-up history; on "
        "the CPU the tracked tensor bytes) or reserved (max_memory_reserved: on CUDA what the caching allocator "
        "holds; on the CPU the process resident set, code and libraries included)",
    )
    parser.add_argument(
        "--fail-slower",
        default=None,
        help="exit 1 when a value's measured samples per second (the median over the warm iterations of its ok "
        "runs) fell by more than this percentage of the baseline's (5%%); values without a measured rate in "
        "both sweeps are not gated",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="write compare.md (plots in compare_plots/) and compare.html here"
    )
    args = parser.parse_args(argv)
    try:
        threshold = _threshold(args)
        slower = parse_slower(args.fail_slower) if args.fail_slower is not None else None
        result = compare(args.sweep_dirs, threshold, args.counter, slower)
    except (_BadInput, SweepNotFound, EmptySweep, UnreadableSweep) as exc:
        print(f"memsweep compare: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(compare_text(result, threshold, args.fail_slower))
    if args.out is not None and not _write(result, threshold, args.fail_slower, args.out):
        return EXIT_BAD_INPUT
    return exit_code(result, threshold, args.fail_slower is not None)


def exit_code(result: CompareResult, threshold: Threshold | None, slower: bool = False) -> int:
    """``memsweep compare``'s exit status for a comparison: EXIT_REGRESSION when a peak grew beyond
    ``--fail-above`` or a rate fell beyond ``--fail-slower`` (``slower``: it was given),
    EXIT_NOTHING_COMPARABLE when a gate given had nothing to check, else EXIT_OK."""
    if result.regressions or result.slowdowns:
        return EXIT_REGRESSION
    if threshold is not None and not any(c.rows for c in result.comparisons):
        return EXIT_NOTHING_COMPARABLE
    if slower and not result.rates:
        return EXIT_NOTHING_COMPARABLE
    return EXIT_OK
