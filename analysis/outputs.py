"""The analysis's output files (``runs.parquet``, ``phases.parquet``, ``frontier.parquet``) and
the summary of what they hold, as text.

Nothing here prints or exits: ``write_tables`` writes the tables, ``summary_text`` and
``format_frontier`` return text, and the command line (``analysis.cli.analyze``) shows it. A
refusal is an exception (``OutputExists``, ``FileNotFoundError``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq
from filelock import FileLock

from memsweep.conf.contract import SweepRuns, gib, remove_stale_temps, timed_on, tokens_per_sample
from memsweep.estimator.labels import load_words

from .current import stamp
from .frontier import LOAD_FIELDS, differing, direction_words, frontier_table
from .publish import LOCK, MARKER, markers, rename_set, undo_partial
from .tables import build_tables, no_sweep_dir

OUTPUTS = ("runs.parquet", "phases.parquet", "frontier.parquet")


class OutputExists(FileExistsError):
    """An output file of the analysis already exists in the output directory (nothing was
    written): memsweep never overwrites a result."""


PUBLISHING = MARKER.format(kind="tables", pid="{pid}")
"""The marker of a set of tables being renamed into place (its names, JSON): one left behind
means its writer died between the renames (``recover_set``)."""


def recover_set(out_dir: Path) -> list[Path]:
    """Undo what a writer of the tables that died left in ``out_dir``: its temporary files
    (``.NAME.PID.tmp``), and a set it had begun to rename into place but not finished (a
    ``PUBLISHING`` marker with a temporary file still beside it: the tables it had renamed are
    removed, so that no partial set stays, ``publish.undo_partial``); a marker whose set is complete
    is only removed. Call it only while holding ``out_dir``'s ``publish.LOCK`` (every writer holds
    it while it writes).

    Returns:
        The files removed.
    """
    removed = []
    for marker, pid in markers(out_dir, "tables"):
        removed += undo_partial(marker, out_dir, f".{{name}}.{pid}.tmp")
    return removed + remove_stale_temps(out_dir, OUTPUTS)  # under the lock: no writer of them lives


def publish_set(tables: dict[str, pa.Table], out_dir: Path, read_since_ns: int | None = None) -> None:
    """Write the tables into ``out_dir`` as one set: each to a temporary file first, then all
    renamed into place with SIGINT, SIGTERM and SIGHUP held back (``publish.rename_set``: a reader
    never sees part of a set; a writer killed outright leaves a ``PUBLISHING`` marker that
    ``recover_set`` undoes). Each is stamped with the reader that built it and ``read_since_ns``,
    when its runs began to be read (``time.time_ns()``; ``current.stamp``).

    Raises:
        OSError: a table could not be written (a full disk): nothing is published, no temporary
            file is left.
    """
    pid = os.getpid()
    tmps = {name: out_dir / f".{name}.{pid}.tmp" for name in tables}
    try:
        for name, table in tables.items():
            pq.write_table(stamp(table, read_since_ns), tmps[name])
        rename_set([(tmps[n], out_dir / n) for n in tables], out_dir / PUBLISHING.format(pid=pid), replace=True)
    finally:
        for tmp in tmps.values():
            tmp.unlink(missing_ok=True)


FRONTIER_SHOWN = 40
"""The frontier rows ``memsweep analyze`` prints (``summary_text``); a line then says how many more
there are, and that every row is in frontier.parquet."""


def format_frontier(
    frontier: pa.Table,
    n_measured: int | None = None,
    n_predicted: int = 0,
    limit: int | None = None,
    where: Path | None = None,
) -> str:
    """The frontier as a text table; sizes in GiB (2^30 bytes).

    Args:
        frontier: the frontier table (analysis.frontier.FRONTIER_SCHEMA).
        n_measured, n_predicted: the runs behind it (a dry run, source predicted, is never a point
            of the frontier).
        limit: at most this many rows shown, in the table's order, then one line saying how many
            more there are (and how many of them are not monotonic) and where they are (``where``,
            the frontier.parquet written); None: every row.
        where: the file that holds every row, named in that line.

    Returns:
        The lines, joined by newlines.
    """
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
    rows = frontier.to_pylist()
    # Rows of one axis that differ elsewhere in their load (two workloads, light probes next to
    # the full protocol, another optimizer...) would otherwise look alike: name what differs.
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["sweep_dir"], r["axis"]), []).append(r)
    named = tuple(k for k in LOAD_FIELDS if k not in ("mode", "device"))  # in every label already
    differ = {key: differing(group, named) for key, group in groups.items()}
    shown, hidden = (rows, []) if limit is None else (rows[:limit], rows[limit:])
    cells = [_frontier_cells(r, differ[(r["sweep_dir"], r["axis"])]) for r in shown]
    table = aligned_lines(FRONTIER_HEADERS, cells, left=2)
    lines = table[:2]
    for r, line in zip(shown, table[2:]):
        lines += [line, *(f"{'':<8} {note}" for note in _frontier_notes(r))]
    if hidden:
        odd = sum(r["monotonic"] is False for r in hidden)
        lines.append(
            f"... {len(hidden)} more frontier rows ({len(rows)} in all"
            + (f"; {odd} of them not monotonic" if odd else "")
            + f"): every row is in {where or 'frontier.parquet'}"
        )
    return "\n".join(lines)


FRONTIER_HEADERS = (
    ("axis", "", 8),
    ("fixed load", "", 44),
    ("max_ok", "", 8),
    ("min_oom", "", 8),
    ("exact", "", 5),
    ("monot.", "", 6),
    ("peak_alloc@max_ok", "GiB", 17),
    ("peak_resv@max_ok", "GiB", 16),
    ("capacity", "GiB", 9),
)
"""The console frontier table's columns: (name, unit line below it, least width in characters)."""


def aligned_lines(headers: tuple[tuple[str, str, int], ...], rows: list[list[str]], left: int) -> list[str]:
    """A text table whose every column is as wide as its widest cell or header (at least its least
    width): two header lines (the names, then their units), then one line per row; the first
    ``left`` columns are aligned left, the others right (numbers).

    Args:
        headers: (name, unit, least width) per column.
        rows: the cells of each row, as text.
        left: how many columns, from the first, are aligned left.

    Returns:
        The lines, columns separated by one space, trailing spaces removed.
    """
    table = [[h[0] for h in headers], [h[1] for h in headers], *rows]
    widths = [max(headers[i][2], *(len(row[i]) for row in table)) for i in range(len(headers))]
    return [
        " ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()
        for row in table
    ]


def _frontier_cells(r: dict, differ) -> list[str]:
    """One frontier row's cells, in ``FRONTIER_HEADERS``' order: the workload, mode and device, the
    axes, a precision/parallel (analysis.labels), then what differs from the rows beside it."""
    words = [w for w in load_words(r, differ) if not w.startswith("workload=")]  # named first
    fixed = " ".join([str(r.get("workload") or "workload?"), r["mode"], r["device"], *words])
    return [
        r["axis"],
        fixed,
        str(r["max_ok_label"] or "-"),
        str(r["min_oom_label"] or "-"),
        "yes" if r["exact"] else "no",
        "yes" if r["monotonic"] else "NO",
        str(gib(r["max_ok_max_memory_allocated"])),
        str(gib(r["max_ok_max_memory_reserved"])),
        str(gib(r["capacity_bytes"])),
    ]


def _frontier_notes(r: dict) -> list[str]:
    """The lines printed under one frontier row: how its edge reads, a decreasing axis's peak, OOMs
    that are not points of it, suspect failures, the search that found it."""
    notes = []
    if direction := direction_words(r):  # an edge read other than "larger is harder" (world_size)
        notes.append(direction)
    if r.get("direction") == "decreasing" and r.get("min_ok") is not None:
        notes.append(
            f"peak at min_ok: {gib(r['min_ok_max_memory_allocated'])} GiB allocated, "
            f"{gib(r['min_ok_max_memory_reserved'])} GiB reserved"
        )
    if r.get("not_reached"):  # only OOMs of phases that do not scale with the axis
        notes.append(str(r["not_reached"]))
    elif r.get("n_oom_elsewhere"):
        notes.append(
            f"{r['n_oom_elsewhere']} OOM(s) in {r['oom_elsewhere_phases']} "
            f"({r['oom_elsewhere_variables']}), not points of the {r['axis']} frontier"
        )
    if r.get("n_memory_suspect"):
        notes.append(
            f"{r['n_memory_suspect']} run(s) failed with an error that probably means memory "
            "but does not say so (memory_suspect): neither side of the frontier"
        )
    if r.get("search_status"):  # the frontier sweeper searched this axis
        notes.append(f"search ({r['strategy']}, {r['runs_used']} runs): {r['search_status']}")
    notes.extend(_answer_notes(r))
    return notes


def _answer_notes(r: dict) -> list[str]:
    """The margin's edge (a searched row's) and the fastest value measured inside it, where known, with
    its noise (``throughput_noise_rel``: the spread of its timed iterations, not between runs); along
    context in tokens per second (``_fastest_rate``)."""
    notes = []
    if r.get("margin_edge") is not None:
        notes.append(f"margin edge: {r['axis']}={r['margin_edge']} (the largest whose measured peak leaves the margin)")
    if r.get("fastest_label") is not None and isinstance(r.get("fastest_samples_per_s"), (int, float)):
        device = str(r.get("device") or "")
        where = timed_on(device.split(":")[0] or None, None)
        inside = "inside the margin" if r.get("margin_edge") is not None else "among the ok runs"
        noise = r.get("fastest_noise_rel")
        spread = f"; noise {100 * noise:.1f} % within its run" if isinstance(noise, (int, float)) else ""
        by, rate = _fastest_rate(r)
        notes.append(
            f"fastest {inside}{by}: {r['axis']}={r['fastest_label']}, {rate} "
            f"(measured, {where}{spread}; another run of the sweep may time them otherwise)"
        )
    return notes


def _fastest_rate(r: dict) -> tuple[str, str]:
    """How the fastest value of frontier row ``r`` was chosen and its rate, in words.

    Returns:
        (``""`` and ``"812.3 samples/s"`` on batch and on loads that count no tokens; along context,
        where a sample holds ``context`` tokens, ``" (by tokens/s)"`` and ``"1.912e+05 tokens/s = 5976
        samples/s x 32 tokens"``; a throughput search's answer (``fastest`` set) was chosen by
        samples/s, and says so).
    """
    samples = float(r["fastest_samples_per_s"])
    label = str(r["fastest_label"])
    context = int(label) if r.get("axis") == "context" and label.isdigit() else None
    tokens = tokens_per_sample(r.get("workload"), r.get("mode"), context, r.get("new_tokens"))
    if tokens is None:
        return "", f"{samples:.4g} samples/s"
    both = f"{samples * tokens:.4g} tokens/s = {samples:.4g} samples/s x {tokens} tokens"
    if r.get("fastest") is not None:  # hydra.sweeper.objective=throughput: the search's answer
        return " (by samples/s, the throughput search's measure)", both
    return " (by tokens/s)", both


class Written(NamedTuple):
    """The tables ``write_tables`` wrote."""

    tables: dict[str, pa.Table]  # ``OUTPUTS`` name -> table
    problems: list[str]  # met reading the runs, one line each


def write_tables(sweep_dirs: Iterable[Path], out_dir: Path, found: Mapping[Path, SweepRuns] | None = None) -> Written:
    """Read the runs of ``sweep_dirs`` and write the three Parquet tables into ``out_dir``, as one
    set (``publish_set``; a set a killed writer left partial is undone first, ``recover_set``).

    Args:
        sweep_dirs: sweep directories (each holds run directories).
        out_dir: the output directory (created when missing).
        found: the run directories of some of them, already found (``analysis.tables.build_tables``).

    Returns:
        (``OUTPUTS`` name -> table, the problems met reading the runs, one line each).

    Raises:
        FileNotFoundError: a sweep directory does not exist (nothing is written).
        OutputExists: one of the output files already exists (nothing is written).
        OSError: the tables could not be written (nothing is published).
    """
    for d in sweep_dirs:
        if not Path(d).is_dir():
            raise FileNotFoundError(no_sweep_dir(d))
    out_dir = Path(out_dir)
    read_since = time.time_ns()  # (``current.current_tables``: a run changed from now on is read again)
    runs, phases, problems = build_tables(sweep_dirs, found)
    frontier = frontier_table(runs)
    out_dir.mkdir(parents=True, exist_ok=True)
    tables = dict(zip(OUTPUTS, (runs, phases, frontier)))
    with FileLock(out_dir / LOCK):  # two analyses into one directory: one wins, one refuses
        recover_set(out_dir)  # a writer that died here left no partial set and no temporary file
        existing = [out_dir / n for n in OUTPUTS if (out_dir / n).exists()]
        if existing:
            raise OutputExists(f"{existing[0]} already exists: memsweep never overwrites a result; use --out NEW_DIR")
        publish_set(tables, out_dir, read_since)
    return Written(tables, problems)


def summary_text(tables: dict[str, pa.Table], problems: list[str], out_dir: Path) -> str:
    """What ``memsweep analyze`` shows of the tables it wrote: the runs by outcome (measured
    apart from dry runs, whose outcome is their verdict: the runs table's ``predicted_outcome``;
    a run with no outcome is ``unreadable`` when it has a ``record_problem``, a newer memsweep's
    files, else ``no outcome yet``), each problem, a note when runs were on the CPU, and the
    frontier (``format_frontier``; sizes in GiB, 2^30 bytes; its first ``FRONTIER_SHOWN`` rows,
    then a line saying how many more are in frontier.parquet).

    Args:
        tables: ``OUTPUTS`` name -> table, as ``write_tables`` returns them.
        problems: the problems ``write_tables`` met.
        out_dir: where the tables were written.

    Returns:
        The lines, joined by newlines (no trailing newline).
    """
    runs = tables["runs.parquet"]
    rows = runs.select(["outcome", "source", "source_allocated", "predicted_outcome", "record_problem"]).to_pylist()
    # a null outcome, in words: its files could not be read (a newer memsweep's...), or it still runs
    rows = [dict(r, outcome=r["outcome"] or ("unreadable" if r["record_problem"] else "no outcome yet")) for r in rows]
    measured = [r for r in rows if r["source"] != "predicted"]
    # a dry run's verdict: its predicted peak against the capacity (no verdict without one)
    predicted = [
        dict(r, outcome=r["predicted_outcome"] or "no verdict (no capacity)")
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
    lines = [f"memsweep: {text} -> {out_dir}/{{{','.join(OUTPUTS)}}}"]
    lines += [f"memsweep: problem: {p}" for p in problems]
    sources = {r["source_allocated"] for r in measured} - {None}
    if any(s.startswith("cpu") for s in sources):
        lines.append(
            "memsweep: CPU run(s): allocated = tracked live tensor bytes, reserved = process RSS; not a GPU measurement"
        )
    frontier = tables["frontier.parquet"]
    lines.append(format_frontier(frontier, len(measured), len(predicted), FRONTIER_SHOWN, out_dir / "frontier.parquet"))
    return "\n".join(lines)
