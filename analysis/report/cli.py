"""``memsweep report``: the command line; the only part of the report that prints or exits."""

from __future__ import annotations

import argparse
import sys

from memsweep.conf.contract import SpecError
from memsweep.estimator.margin import DEFAULT_MARGIN, parse_margin

from ..cli import NotASweep, add_sweep_dir_args, check_out, check_sweeps, parse_sweep_dir_args
from .write import ReportExists, SweepDirNotFound, report_for_dirs


def main(argv: list[str] | None = None) -> int:
    """``memsweep report SWEEP_DIR [SWEEP_DIR ...] [--out DIR] [--margin 10%|0.1|2GiB]``.

    Args:
        argv: the arguments after ``report``; None: ``sys.argv[1:]``.

    Returns:
        The exit status: 0 written (its paths printed), 1 a report already there, 2 bad input: a
        sweep directory missing or holding no run, a bad ``--margin`` or one not below the runs'
        capacity (the message on stderr; nothing written). argparse exits 2 itself on bad arguments.
    """
    parser = argparse.ArgumentParser(
        prog="memsweep report",
        description="Write report.md (plots in report_plots/) and a self-contained report.html for "
        "sweep directories: frontier, margin at max_ok, chosen setting under a margin policy, "
        "phases, estimate, other cards. Never overwrites an existing report.",
    )
    add_sweep_dir_args(parser, "output directory")
    parser.add_argument(
        "--margin",
        default=None,
        help=f"headroom kept below the capacity: a fraction (10%% or 0.1), 0, or a size with its unit "
        f"(2GiB, 1500MB, 0B; a bare number is refused); default {DEFAULT_MARGIN.replace('%', '%%')} of the capacity",
    )
    args = parse_sweep_dir_args(parser, argv)
    try:
        parse_margin(args.margin)  # checked before any table is read
        check_sweeps(args.sweep_dirs, args.out)
        check_out(args.out)
    except (SpecError, NotASweep) as exc:
        print(f"memsweep report: {exc}", file=sys.stderr)
        return 2
    try:
        report, md, html_ = report_for_dirs(args.sweep_dirs, args.out, args.margin)
    except SweepDirNotFound as exc:  # bad input, as a bad --margin
        print(f"memsweep report: {exc}", file=sys.stderr)
        return 2
    except ReportExists as exc:
        print(f"memsweep report: {exc}", file=sys.stderr)
        return 1
    except SpecError as exc:
        print(f"memsweep report: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the report could not be written (a full disk...)
        print(f"memsweep report: error: cannot write the report into {args.out}: {exc}", file=sys.stderr)
        return 1
    for note in report.notes:
        print(f"memsweep report: note: {note}", file=sys.stderr)
    print(f"memsweep: report -> {html_}  (and {md})")
    return 0
