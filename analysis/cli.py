"""``memsweep analyze SWEEP_DIR [SWEEP_DIR ...] [--out DIR]``.

Reads every run under the sweep directories and writes ``runs.parquet``, ``phases.parquet``
and ``frontier.parquet`` (explicit schemas, raw bytes) into ``--out`` (default: the single
sweep directory given), then prints the frontier table with sizes in GiB (2^30 bytes).
An existing output file is never overwritten: the command refuses and exits 1; a missing sweep
directory, one that holds no run (no run directory with a spec.json under it), a sweep still
running (without an ``--out`` elsewhere) or an unwritable ``--out`` is bad input (exit 2), and
nothing is written. A sweep's runs are those its manifest lists (a missing one is named).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

import pyarrow as pa

from memsweep.conf.contract import (
    SPEC_FILE,
    RecordError,
    SpecError,
    SweepRuns,
    check_writable,
    path_kind,
    sweep_running,
    sweep_runs,
)

from .outputs import OutputExists, summary_text, write_tables
from .tables import no_sweep_dir

log = logging.getLogger("memsweep")


def analyze(
    sweep_dirs: list[Path],
    out_dir: Path,
    stream: TextIO | None = None,
    found: Mapping[Path, SweepRuns] | None = None,
) -> dict[str, pa.Table]:
    """``memsweep analyze``'s work: write the three Parquet tables for ``sweep_dirs`` into
    ``out_dir`` (``analysis.outputs.write_tables``) and print their summary and the frontier
    (``analysis.outputs.summary_text``) to ``stream``. The sweep's end (``sweeper.callbacks``)
    shows the same.

    Args:
        sweep_dirs: sweep directories.
        out_dir: the output directory.
        stream: where the summary goes; None: standard output.
        found: the run directories of some sweeps, as ``check_sweeps`` found them (not looked
            for again); None: found while reading.

    Returns:
        ``OUTPUTS`` name -> table.

    Raises:
        FileNotFoundError: a sweep directory does not exist.
        OutputExists: one of the output files already exists (nothing is written).
    """
    tables, problems = write_tables(sweep_dirs, out_dir, found)
    print(summary_text(tables, problems, Path(out_dir)), file=stream or sys.stdout)
    return tables


class NotASweep(ValueError):
    """A directory given as a sweep holds no run (no run directory with a spec.json under it),
    is a whole file system, has an unreadable manifest, or is a sweep still running."""


def check_sweeps(sweep_dirs: list[Path], out_dir: Path | None = None) -> dict[Path, SweepRuns]:
    """Refuse, before anything is read or written, a directory that exists but holds no sweep, a
    file system's root (a mount point: every file under it would be searched), a sweep whose
    manifest cannot be read, and a sweep still running (its orchestrator holds its lock,
    ``conf.contract.sweep_running``) when the output would go into it (``out_dir`` the sweep
    directory itself: a partial set of tables it would keep for good).

    Args:
        sweep_dirs: the directories given as sweeps (a missing one is left to the caller's own
            error, ``FileNotFoundError``).
        out_dir: where the output goes; None: nowhere checked.

    Returns:
        directory as given -> its run directories (``conf.contract.sweep_runs``), for the reading
        (``analyze``'s ``found``), so that a sweep's directory is looked through once.

    Raises:
        NotASweep: the first such directory, in words.
    """
    found: dict[Path, SweepRuns] = {}
    for d in sweep_dirs:
        if not Path(d).is_dir():
            continue
        if os.path.ismount(d):
            raise NotASweep(
                f"{d} is a whole file system, not a sweep directory; give one such as results/<sweep>/<time>/"
            )
        if out_dir is not None and Path(out_dir).resolve() == Path(d).resolve() and sweep_running(d):
            raise NotASweep(
                f"{d} is a sweep still running (its orchestrator holds {d}/.sweep.lock): its own analysis comes "
                "at its end; give --out NEW_DIR to analyse what it holds now (nothing was written)"
            )
        try:
            runs = sweep_runs(d)
        except RecordError as exc:
            raise NotASweep(f"{exc} (nothing was written)") from None
        if not runs.run_dirs:
            held = f"its {len(runs.missing)} run(s) are all missing" if runs.missing else "no run directory"
            raise NotASweep(
                f"{d} holds no sweep: {held} (a folder with {SPEC_FILE}) under it; give a sweep "
                "directory such as results/<sweep>/<time>/ (nothing was written)"
            )
        found[Path(d)] = runs
    return found


def check_out(out_dir: Path) -> None:
    """Refuse an output directory that cannot be created or written (``conf.contract.check_writable``).

    Raises:
        NotASweep: the field ``--out``, in words.
    """
    try:
        check_writable("--out", out_dir)
    except SpecError as exc:
        raise NotASweep(str(exc)) from None


def add_sweep_dir_args(parser: argparse.ArgumentParser, out_help: str) -> None:
    """SWEEP_DIR [SWEEP_DIR ...] and --out, as `memsweep analyze` and `memsweep report` take them."""
    parser.add_argument("sweep_dirs", nargs="+", type=Path, metavar="SWEEP_DIR")
    parser.add_argument(
        "--out", type=Path, default=None, help=f"{out_help} (default: the sweep directory; required with several)"
    )


def parse_sweep_dir_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse, defaulting --out to the single sweep directory (an error with several)."""
    args = parser.parse_args(argv)
    given = args.out is not None
    if not given:
        if len(args.sweep_dirs) > 1:
            parser.error("--out is required when several sweep directories are given")
        args.out = args.sweep_dirs[0]
    if Path(args.out).exists() and not Path(args.out).is_dir():
        if not given:  # the sweep directory itself is none
            parser.error(no_sweep_dir(args.out))
        parser.error(f"--out {args.out} is {path_kind(args.out)}, not a directory (give a new or existing directory)")
    return args


def main(argv: list[str] | None = None) -> int:
    """``memsweep analyze SWEEP_DIR [SWEEP_DIR ...] [--out DIR]`` (see the module's docstring).

    Args:
        argv: the arguments after ``analyze``; None: ``sys.argv[1:]``.

    Returns:
        The exit status: 0 written, 1 an output file existing or the output not writable midway
        (a full disk: nothing published), 2 a sweep directory missing, holding no run or still
        running, or an ``--out`` that cannot be written (message on stderr, nothing written);
        argparse exits 2 itself on bad arguments.
    """
    parser = argparse.ArgumentParser(
        prog="memsweep analyze", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_sweep_dir_args(parser, "directory for the Parquet files")
    args = parse_sweep_dir_args(parser, argv)
    try:
        found = check_sweeps(args.sweep_dirs, args.out)
        check_out(args.out)
        analyze(args.sweep_dirs, args.out, found=found)
    except NotASweep as exc:
        print(f"memsweep analyze: {exc}", file=sys.stderr)
        return 2
    except OutputExists as exc:
        print(f"memsweep analyze: {exc}", file=sys.stderr)
        return 1
    except FileNotFoundError as exc:  # a sweep directory missing: bad input
        print(f"memsweep analyze: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the output could not be written (a full disk...): nothing published
        print(f"memsweep analyze: error: cannot write the tables into {args.out}: {exc}", file=sys.stderr)
        return 1
    return 0
