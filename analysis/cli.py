"""``memsweep analyze SWEEP_DIR [SWEEP_DIR ...] [--out DIR]``.

Reads every run under the sweep directories and writes ``runs.parquet``, ``phases.parquet``
and ``frontier.parquet`` (explicit schemas, raw bytes) into ``--out`` (default: the single
sweep directory given), then prints the frontier table with sizes in GiB (2^30 bytes).
An existing output file is never overwritten: the command refuses and exits 1; a missing sweep
directory, or one that holds no run (no run directory with a spec.json under it), is bad input
(exit 2), and nothing is written.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TextIO

import pyarrow as pa

from memsweep.conf.contract import SPEC_FILE, find_run_dirs

from .outputs import OutputExists, summary_text, write_tables

log = logging.getLogger("memsweep")


def analyze(sweep_dirs: list[Path], out_dir: Path, stream: TextIO | None = None) -> dict[str, pa.Table]:
    """``memsweep analyze``'s work: write the three Parquet tables for ``sweep_dirs`` into
    ``out_dir`` (``analysis.outputs.write_tables``) and print their summary and the frontier
    (``analysis.outputs.summary_text``) to ``stream``. The sweep's end (``sweeper.callbacks``)
    shows the same.

    Args:
        sweep_dirs: sweep directories.
        out_dir: the output directory.
        stream: where the summary goes; None: standard output.

    Returns:
        ``OUTPUTS`` name -> table.

    Raises:
        FileNotFoundError: a sweep directory does not exist.
        OutputExists: one of the output files already exists (nothing is written).
    """
    tables, problems = write_tables(sweep_dirs, out_dir)
    print(summary_text(tables, problems, Path(out_dir)), file=stream or sys.stdout)
    return tables


class NotASweep(ValueError):
    """A directory given as a sweep holds no run: no run directory (one with a spec.json) under it."""


def check_sweeps(sweep_dirs: list[Path]) -> None:
    """Refuse a directory that exists but holds no sweep, before anything is read or written.

    Args:
        sweep_dirs: the directories given as sweeps (a missing one is left to the caller's own
            error, ``FileNotFoundError``).

    Raises:
        NotASweep: an existing directory under which ``conf.contract.find_run_dirs`` finds no run.
    """
    for d in sweep_dirs:
        if Path(d).is_dir() and not find_run_dirs([d]):
            raise NotASweep(
                f"{d} holds no sweep: no run directory (a folder with {SPEC_FILE}) under it; give a sweep "
                "directory such as results/<sweep>/<time>/ (nothing was written)"
            )


def add_sweep_dir_args(parser: argparse.ArgumentParser, out_help: str) -> None:
    """SWEEP_DIR [SWEEP_DIR ...] and --out, as `memsweep analyze` and `memsweep report` take them."""
    parser.add_argument("sweep_dirs", nargs="+", type=Path, metavar="SWEEP_DIR")
    parser.add_argument(
        "--out", type=Path, default=None, help=f"{out_help} (default: the sweep directory; required with several)"
    )


def parse_sweep_dir_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse, defaulting --out to the single sweep directory (an error with several)."""
    args = parser.parse_args(argv)
    if args.out is None:
        if len(args.sweep_dirs) > 1:
            parser.error("--out is required when several sweep directories are given")
        args.out = args.sweep_dirs[0]
    if Path(args.out).exists() and not Path(args.out).is_dir():
        parser.error(f"--out {args.out} is a file, not a directory (give a new or existing directory)")
    return args


def main(argv: list[str] | None = None) -> int:
    """``memsweep analyze SWEEP_DIR [SWEEP_DIR ...] [--out DIR]`` (see the module's docstring).

    Args:
        argv: the arguments after ``analyze``; None: ``sys.argv[1:]``.

    Returns:
        The exit status: 0 written, 1 an output file existing, 2 a sweep directory missing or
        holding no run (message on stderr, nothing written); argparse exits 2 itself on bad arguments.
    """
    parser = argparse.ArgumentParser(
        prog="memsweep analyze", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_sweep_dir_args(parser, "directory for the Parquet files")
    args = parse_sweep_dir_args(parser, argv)
    try:
        check_sweeps(args.sweep_dirs)
        analyze(args.sweep_dirs, args.out)
    except NotASweep as exc:
        print(f"memsweep analyze: {exc}", file=sys.stderr)
        return 2
    except OutputExists as exc:
        print(f"memsweep analyze: {exc}", file=sys.stderr)
        return 1
    except FileNotFoundError as exc:  # a sweep directory missing: bad input
        print(f"memsweep analyze: {exc}", file=sys.stderr)
        return 2
    return 0
