"""``memsweep analyze SWEEP_DIR [SWEEP_DIR ...] [--out DIR]``.

Reads every run under the sweep directories and writes ``runs.parquet``, ``phases.parquet``
and ``frontier.parquet`` (explicit schemas, raw bytes) into ``--out`` (default: the single
sweep directory given), then prints the frontier table with sizes in GiB (2^30 bytes).
An existing output file is never overwritten: the command refuses and exits 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from filelock import FileLock

from conf.contract import AXES, gib, predicted_outcome

from .frontier import LOAD_FIELDS, differing, frontier_table
from .tables import build_tables

log = logging.getLogger("memsweep")
OUTPUTS = ("runs.parquet", "phases.parquet", "frontier.parquet")


class OutputExists(FileExistsError):
    pass


def write_parquet_atomic(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def format_frontier(frontier: pa.Table, n_measured: int | None = None, n_predicted: int = 0) -> str:
    """The frontier as a text table; sizes in GiB (2^30 bytes). ``n_measured``/``n_predicted``:
    the runs behind it (a dry run, source predicted, is never a point of the frontier)."""
    if frontier.num_rows == 0:
        if n_predicted and not n_measured:
            return (
                f"no measured frontier: the {n_predicted} run{'s are' if n_predicted != 1 else ' is a'} dry "
                f"run{'s' if n_predicted != 1 else ''} (predictions on fake tensors, nothing measured), "
                "never points of a measured frontier"
            )
        if n_predicted:
            return (
                f"no frontier: no variable was swept over two or more values among the {n_measured} measured "
                f"runs ({n_predicted} dry runs, predictions, left out)"
            )
        return "no frontier: no variable was swept over two or more values"
    lines = [
        f"{'axis':<8} {'fixed load':<44} {'max_ok':>8} {'min_oom':>8} {'exact':>5} {'monot.':>6} "
        f"{'peak_alloc@max_ok':>17} {'peak_resv@max_ok':>16} {'capacity':>9}",
        f"{'':<8} {'':<44} {'':>8} {'':>8} {'':>5} {'':>6} {'GiB':>17} {'GiB':>16} {'GiB':>9}",
    ]
    rows = frontier.to_pylist()
    # Rows of one axis that differ elsewhere in their load (two workloads, light probes next to
    # the full protocol, another optimizer...) would otherwise look alike: name what differs.
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["sweep_dir"], r["axis"]), []).append(r)
    named = tuple(k for k in LOAD_FIELDS if k not in ("mode", "device"))  # in every label already
    differ = {key: differing(group, named) for key, group in groups.items()}
    for r in rows:
        fixed = " ".join(f"{k}={r[k]}" for k in AXES if r[k] is not None)
        fixed = f"{r['mode']} {r['device']} {fixed}"
        fixed += "".join(f" {k}={r.get(k)}" for k in differ[(r["sweep_dir"], r["axis"])])
        lines.append(
            f"{r['axis']:<8} {fixed:<44} {r['max_ok_label'] or '-':>8} {r['min_oom_label'] or '-':>8} "
            f"{'yes' if r['exact'] else 'no':>5} {'yes' if r['monotonic'] else 'NO':>6} "
            f"{gib(r['max_ok_max_memory_allocated']):>17} {gib(r['max_ok_max_memory_reserved']):>16} "
            f"{gib(r['capacity_bytes']):>9}"
        )
        if r.get("not_reached"):  # only OOMs of phases that do not scale with the axis
            lines.append(f"{'':<8} {r['not_reached']}")
        elif r.get("n_oom_elsewhere"):
            lines.append(
                f"{'':<8} {r['n_oom_elsewhere']} OOM(s) in {r['oom_elsewhere_phases']} "
                f"({r['oom_elsewhere_variables']}), not points of the {r['axis']} frontier"
            )
        if r.get("n_memory_suspect"):
            lines.append(
                f"{'':<8} {r['n_memory_suspect']} run(s) failed with an error that probably means memory "
                "but does not say so (memory_suspect): neither side of the frontier"
            )
        if r.get("search_status"):  # the frontier sweeper searched this axis
            lines.append(f"{'':<8} search ({r['strategy']}, {r['runs_used']} runs): {r['search_status']}")
    return "\n".join(lines)


def analyze(sweep_dirs: list[Path], out_dir: Path, stream=None) -> dict[str, pa.Table]:
    """Write the three Parquet tables for ``sweep_dirs`` into ``out_dir`` and print the frontier.

    Raises:
        FileNotFoundError: a sweep directory does not exist.
        OutputExists: one of the output files already exists (nothing is written).
    """
    stream = stream or sys.stdout
    for d in sweep_dirs:
        if not Path(d).is_dir():
            raise FileNotFoundError(f"sweep directory {d} does not exist")
    out_dir = Path(out_dir)
    runs, phases, problems = build_tables(sweep_dirs)
    frontier = frontier_table(runs)
    out_dir.mkdir(parents=True, exist_ok=True)
    tables = dict(zip(OUTPUTS, (runs, phases, frontier)))
    with FileLock(out_dir / ".analyze.lock"):  # two analyses into one directory: one wins, one refuses
        existing = [out_dir / n for n in OUTPUTS if (out_dir / n).exists()]
        if existing:
            raise OutputExists(f"{existing[0]} already exists: memsweep never overwrites a result; use --out NEW_DIR")
        for name, table in tables.items():
            write_parquet_atomic(table, out_dir / name)
    rows = runs.select(["outcome", "source", "source_allocated", "max_memory_allocated", "capacity_bytes"]).to_pylist()
    measured = [r for r in rows if r["source"] != "predicted"]
    # a dry run's verdict: its predicted peak against the capacity (no verdict without one)
    predicted = [
        dict(
            r,
            outcome=predicted_outcome(r["outcome"], r["max_memory_allocated"], r["capacity_bytes"])
            or "no verdict (no capacity)",
        )
        for r in rows
        if r["source"] == "predicted"
    ]

    def counts(rs: list[dict]) -> str:
        outcomes = [r["outcome"] for r in rs]
        return ", ".join(f"{o}: {outcomes.count(o)}" for o in dict.fromkeys(outcomes))

    if predicted:
        text = f"{len(measured)} measured runs ({counts(measured)})" if measured else "no measured run"
        text = (
            f"{runs.num_rows} runs: {text}, {len(predicted)} dry runs (predicted, nothing measured; "
            f"predicted outcomes {counts(predicted)})"
        )
    else:
        text = f"{len(measured)} runs ({counts(measured)})" if measured else "no run"
    print(f"memsweep: {text} -> {out_dir}/{{{','.join(OUTPUTS)}}}", file=stream)
    for p in problems:
        print(f"memsweep: problem: {p}", file=stream)
    sources = {r["source_allocated"] for r in measured} - {None}
    if any(s.startswith("cpu") for s in sources):
        print(
            "memsweep: CPU run(s): allocated = tracked live tensor bytes, reserved = process RSS; "
            "not a GPU measurement",
            file=stream,
        )
    print(format_frontier(frontier, len(measured), len(predicted)), file=stream)
    return tables


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
    parser = argparse.ArgumentParser(
        prog="memsweep analyze", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_sweep_dir_args(parser, "directory for the Parquet files")
    args = parse_sweep_dir_args(parser, argv)
    try:
        analyze(args.sweep_dirs, args.out)
    except (FileNotFoundError, OutputExists) as exc:
        print(f"memsweep analyze: {exc}", file=sys.stderr)
        return 1
    return 0
