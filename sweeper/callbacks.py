"""Hydra callbacks: analyze a sweep directory and write its report when the multirun ends (any
sweeper, any launcher); show the sweep's progress while it runs (a line per finished job, and per
dry run of a prediction); give the sweep's exit status.

Part of the command-line layer: Hydra calls these hooks inside ``memsweep sweep``, and what
they print (progress lines, the analysis summary, the report's path) is the command's output.
The work itself is the analysis's (``analysis.outputs``, ``analysis.report``), which prints
nothing."""

from __future__ import annotations

import datetime
import io
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from memsweep.conf.contract import AXES, EXIT_ERROR, RESULT_FILE, RecordError, sweep_runs, try_read
from memsweep.estimator.labels import SHOWN_WHEN_SET, load_words

from .answer import size_words
from .plain import plain_dict
from .progress import Observer, counts_text, observer, quiet

log = logging.getLogger("memsweep")


class AnalyzeAtEnd(Callback):
    """Writes runs/phases/frontier Parquet tables into the sweep directory, prints the frontier,
    then writes the margin report (report.md, report.html) beside them and prints its path.

    Args (``hydra.callbacks.analyze.*``): ``report`` (false: tables only), ``margin`` (the
    report's margin policy: ``10%``, ``0.1``, ``2GiB``; null = the default, 10 % of capacity).
    """

    def __init__(self, report: bool = True, margin: Any = None) -> None:
        self.report = report
        self.margin = margin

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Hydra's end of the multirun: undo what killed writers of its tables and reports left
        (``analysis.report.write.recover_sweep_outputs``), analyze the sweep directory (``analysis.cli.analyze``,
        into ``analysis/<time>/`` when the directory holds an analysis already) and write the
        report (``write_sweep_report``) unless ``report`` is false. A failure of either is noted
        in ``END_FAILURES`` (the command then exits ``EXIT_AFTER_RUNS``).

        Args:
            config: the multirun's config (``hydra.sweep.dir`` names the sweep directory).
            kwargs: Hydra's other arguments (unused).
        """
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            log.warning("no sweep directory %s: nothing ran, nothing to analyze", sweep_dir)
            return
        try:
            from memsweep.analysis.report.write import recover_sweep_outputs

            recover_sweep_outputs(sweep_dir)  # what killed writers of tables and reports left (a resume's too)
            out_dir, tables = self._tables(sweep_dir)
        except Exception as exc:  # Hydra would turn it into a warning: the command's exit says it
            END_FAILURES.append(end_failure("analysis", exc, sweep_dir))
            return
        if self.report:
            try:
                write_sweep_report(sweep_dir, out_dir, tables, self.margin)
            except Exception as exc:
                END_FAILURES.append(end_failure("report", exc, sweep_dir))

    @staticmethod
    def _tables(sweep_dir: Path) -> tuple[Path, dict]:
        """The sweep's tables, written into it (into ``analysis/<time>/`` when it holds some)."""
        from memsweep.analysis.cli import analyze
        from memsweep.analysis.outputs import OutputExists

        stream = io.StringIO() if quiet() else None  # progress=False: the SweepResult holds the summary
        try:
            return sweep_dir, analyze([sweep_dir], out_dir=sweep_dir, stream=stream)
        except OutputExists:  # a resumed sweep, or a second orchestrator on the same directory
            out_dir = sweep_dir / "analysis" / datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S-%f")
            log.info("%s already holds an analysis; this one goes to %s", sweep_dir, out_dir)
            return out_dir, analyze([sweep_dir], out_dir=out_dir, stream=stream)


def end_failure(step: str, exc: BaseException, sweep_dir: Path) -> str:
    """One line for a step after the runs that failed (``END_FAILURES``)."""
    again = f"memsweep analyze {sweep_dir}" if step == "analysis" else f"memsweep report {sweep_dir} --out NEW_DIR"
    return (
        f"the sweep's {step} failed ({type(exc).__name__}: {' '.join(str(exc).split())[:300]}); its runs are "
        f"kept in {sweep_dir}; "
        f"`{again}` tries again"
    )


def write_sweep_report(sweep_dir: Path, out_dir: Path, tables: dict, margin: Any = None) -> Path | None:
    """Write the report of a finished sweep into ``out_dir`` and print its path (not in a quiet API
    call, ``sweeper.progress.quiet``). An existing report is never overwritten: this one then gets
    a timestamped name beside it.

    Returns:
        The report's HTML file.
    """
    from memsweep.analysis.outputs import OUTPUTS
    from memsweep.analysis.report import ReportExists, build_report, parse_margin, write_report

    report = build_report(
        tables["runs.parquet"],
        tables["phases.parquet"],
        tables["frontier.parquet"],
        parse_margin(margin),
        [sweep_dir],
        [out_dir / n for n in OUTPUTS],
    )
    try:
        md, html = write_report(report, out_dir)
    except ReportExists:
        name = "report-" + datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S-%f")
        log.info("%s already holds a report; this one is %s", out_dir, name)
        md, html = write_report(report, out_dir, name)
    if not quiet():  # progress=False: SweepResult.report names it
        print(f"memsweep: report -> {html}  (and {md})", flush=True)
    return html


END_FAILURES: list[str] = []
"""The steps after the runs that failed in this process (the sweep's analysis, its report), one
line each: what ``memsweep sweep`` prints before it exits ``EXIT_AFTER_RUNS``."""


ANSWERING_OUTCOMES = ("ok", "oom")
"""The outcomes that answer whether a load fits; an error, crash or timeout answers nothing."""


SWEEPS_STARTED: list[Path] = []
"""The sweep directories of the multiruns this process started (``Progress.on_multirun_start``, in
the orchestrator, whatever the launcher): what ``sweep_exit_code`` reads once the multirun ends."""


def sweep_exit_code(sweep_dirs: list[Path]) -> int:
    """``memsweep sweep``'s exit status once it ran: ``EXIT_ERROR`` (4) when its sweep directories
    hold runs and none of them ended ``ok`` or ``oom`` (every run an error, such as a failure in
    set-up, a crash or a timeout: nothing answered whether a load fits), with a message on stderr;
    else 0 (a sweep's OOMs are its data).

    Args:
        sweep_dirs: the sweep directories of the multirun (``SWEEPS_STARTED``, and those of the
            jobs this process ran); none: 0.

    Returns:
        0 or ``EXIT_ERROR``.
    """
    run_dirs = [r for d in sorted(set(sweep_dirs)) if d.is_dir() for r in _own_runs(d)]
    outcomes = [(try_read(run_dir, RESULT_FILE)[0] or {}).get("outcome") for run_dir in run_dirs]
    if not outcomes or any(o in ANSWERING_OUTCOMES for o in outcomes):
        return 0
    print(
        f"memsweep: error: none of the {len(outcomes)} run(s) of this sweep ended ok or oom "
        f"({', '.join(sorted({str(o) for o in outcomes}))}): nothing was measured that answers whether the load fits; "
        "each run's cause is in its stderr.log",
        file=sys.stderr,
        flush=True,
    )
    return EXIT_ERROR


def _own_runs(sweep_dir: Path) -> list[Path]:
    """The sweep's runs (``conf.contract.sweep_runs``); none when its manifest cannot be read."""
    try:
        return sweep_runs(sweep_dir).run_dirs
    except RecordError:
        return []


def planned_jobs(config: DictConfig) -> int | None:
    """How many jobs the multirun will launch, when it can be known up front: the ovat
    sweeper's conditions, or the basic sweeper's cartesian product; None otherwise (an
    adaptive search decides as it goes)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    target = str(OmegaConf.select(config, "hydra.sweeper._target_") or "")
    overrides = OverridesParser.create().parse_overrides(list(OmegaConf.select(config, "hydra.overrides.task") or []))
    sweeps = {
        o.get_key_element(): list(o.sweep_string_iterator())
        for o in overrides
        if o.is_sweep_override() and o.is_discrete_sweep()
    }
    if target.endswith("OvatSweeper"):
        from memsweep.sweeper.ovat import plan_conditions

        axes_cfg = OmegaConf.select(config, "sweep.axes")
        axes = plain_dict(axes_cfg, resolve=True) if axes_cfg else {}
        axes.update(sweeps)
        return len(plan_conditions(axes, {a: config.get(a) for a in AXES}))
    if target.endswith("BasicSweeper"):
        n = 1
        for values in sweeps.values():
            n *= len(values)
        return n
    return None


class Progress(Callback):
    """A sweep's progress while it runs. On a terminal a live bar (tqdm, on stderr: jobs done of the
    planned, the time left, the last job's condition and outcome); elsewhere (logs, CI, pipes) one
    line per finished job: jobs done and left, the time left at the pace so far, the condition, the
    outcome, the elapsed time (``sweeper.progress.counts_text``). ``MEMSWEEP_PROGRESS`` chooses:
    ``bar``, ``1`` (lines), ``0`` (nothing). Inside a call of the Python API the jobs go to its
    observer instead (``sweeper.progress``: a bar, or nothing).

    Jobs done are counted from the run directories holding a result.json, so the count holds
    with launchers that run jobs in other processes (joblib, submitit) and on resumed sweeps.
    """

    def __init__(self) -> None:
        self.started: float | None = None
        self.total: int | None = None
        self.done = 0
        self.bar: Observer | None = None

    @staticmethod
    def mode(config: DictConfig | None = None) -> str:
        """How progress is shown: ``MEMSWEEP_PROGRESS`` when set, in the job's
        ``hydra.job.env_set`` (``config``'s; an API call with ``progress=False``) or else in the
        environment (``0``, empty, ``false``, ``no``: ``"off"``; ``bar``: ``"bar"``; anything else
        ``"lines"``), else ``"bar"`` when stdout is a terminal and ``"lines"`` when it is not."""
        forced = os.environ.get("MEMSWEEP_PROGRESS")
        if config is not None:
            forced = OmegaConf.select(config, "hydra.job.env_set.MEMSWEEP_PROGRESS", default=forced)
        if forced is not None:
            forced = str(forced)
            return "off" if forced in ("0", "", "false", "no") else "bar" if forced == "bar" else "lines"
        return "bar" if sys.stdout.isatty() else "lines"

    @classmethod
    def enabled(cls, config: DictConfig | None = None) -> bool:
        """Whether any progress is shown (``mode`` of ``config`` is not ``"off"``)."""
        return cls.mode(config) != "off"

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Hydra's start of the multirun: note its sweep directory (``SWEEPS_STARTED``), start the
        clock and count the planned jobs (``planned_jobs``), both also put in the environment for
        launchers' worker processes (``MEMSWEEP_PROGRESS_TOTAL``, ``MEMSWEEP_PROGRESS_T0``).

        Args:
            config: the multirun's config.
            kwargs: Hydra's other arguments (unused).
        """
        self.started = time.monotonic()
        SWEEPS_STARTED.append(Path(str(config.hydra.sweep.dir)).absolute())
        try:
            self.total = planned_jobs(config)
        except Exception:  # a plan we cannot replay: show no total rather than fail the sweep
            self.total = None
        if self.total is not None:
            os.environ["MEMSWEEP_PROGRESS_TOTAL"] = str(self.total)  # for launchers' worker processes
        os.environ["MEMSWEEP_PROGRESS_T0"] = str(time.time())
        watching = observer()
        if watching is None and self.mode() == "bar":  # the command line on a terminal: its own bar
            watching = self.bar = Observer(bar=True, total=self.total)
        if watching is not None:  # an API call: its bar, and the sweep directory Hydra chose
            watching.multirun_start(str(config.hydra.sweep.dir), self.total)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Hydra's end of the multirun: close the command line's bar (before the analysis prints).

        Args:
            config: the multirun's config (unused).
            kwargs: Hydra's other arguments (unused).
        """
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _counts(self, config: DictConfig) -> str:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        on_disk = sum(1 for _ in sweep_dir.glob("*/result.json")) if sweep_dir.is_dir() else 0
        total = self.total
        if total is None and os.environ.get("MEMSWEEP_PROGRESS_TOTAL", "").isdigit():
            total = int(os.environ["MEMSWEEP_PROGRESS_TOTAL"])
        return counts_text(max(self.done, on_disk), total, self._elapsed_s())

    def _elapsed_s(self) -> float | None:
        if self.started is not None:
            return time.monotonic() - self.started
        try:
            return time.time() - float(os.environ["MEMSWEEP_PROGRESS_T0"])
        except (KeyError, ValueError):
            return None

    def _elapsed(self) -> str:
        seconds = self._elapsed_s()
        return "-" if seconds is None else str(datetime.timedelta(seconds=int(seconds)))

    @staticmethod
    def _condition(config: DictConfig) -> str:
        load = {k: config.get(k) for k in (*AXES, *SHOWN_WHEN_SET, "world_size", "mode")}
        fields = [*load_words(load), *(f"{k}={config.get(k)}" for k in ("mode", "device") if config.get(k) is not None)]
        return f"job {config.hydra.job.get('num', '?')}: " + " ".join(fields)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Hydra's start of a job: shown beside a bar (an API call's, or the command line's on a
        terminal); the lines are one per finished job (``on_job_end``).

        Args:
            config: the job's config.
            kwargs: Hydra's other arguments (unused).
        """
        watching = observer() or self.bar
        if watching is not None:  # a bar (or, for an API call, nothing)
            watching.job_start(self._condition(config))

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        """Hydra's end of a job: count it and print ``memsweep: [done/total done, N left, about
        H:MM:SS left] <condition> -> <outcome> · elapsed H:MM:SS`` when ``enabled`` (``failed``
        when the job returned no result).

        Args:
            config: the job's config.
            job_return: Hydra's JobReturn (its value is the result envelope).
            kwargs: Hydra's other arguments (unused).
        """
        self.done += 1
        watching = observer() or self.bar
        if watching is None and not self.enabled(config):
            return
        outcome = "failed"
        value = getattr(job_return, "_return_value", None)
        if isinstance(value, dict) and value.get("outcome"):
            outcome = value["outcome"] + (f" in {value['failed_phase']}" if value.get("failed_phase") else "")
        if watching is not None:
            watching.job_end(self._condition(config), outcome)
            return
        if config.hydra.mode != RunMode.MULTIRUN:  # ``memsweep run``: its answer says how it ended
            return
        print(
            f"memsweep: [{self._counts(config)}] {self._condition(config)} -> {outcome} · elapsed {self._elapsed()}",
            flush=True,
        )


def report_dry_run(n: int, value: str, result: dict, peak: int | None, verdict: str | None, capacity: int) -> None:
    """Say on stderr that a dry run of ``memsweep predict`` (or of a search seeded from dry runs)
    ended: its value, the predicted peak and verdict against the capacity. Silent inside a call of
    the Python API (``observer``), whose caller reads the answer it returns.

    Args:
        n: the dry runs made so far, this one included.
        value: the value run (``batch=64``).
        result: its result envelope (``outcome``, ``wall_s``, ``failed_phase``).
        peak: its predicted ``max_memory_allocated`` (bytes), or None.
        verdict: ``conf.contract.predicted_outcome``'s (ok, oom, the worker's outcome).
        capacity: the capacity predicted against (bytes).
    """
    if observer() is not None:
        return
    cap = size_words(capacity)
    if verdict in ("ok", "oom") and peak is not None:
        fit = "fits" if verdict == "ok" else "does not fit"
        text = f"predicted max_memory_allocated {size_words(peak)}: {fit} in {cap}"
    else:
        where = f" in {result['failed_phase']}" if result.get("failed_phase") else ""
        text = f"{result.get('outcome')}{where}: nothing predicted"
    wall = result.get("wall_s")
    took = f"{wall:.1f} s; " if isinstance(wall, (int, float)) else ""
    print(
        f"memsweep: dry run {n}: {value} -> {text} ({took}fake tensors, nothing measured)", file=sys.stderr, flush=True
    )


def report_card(done: int, total: int, row: dict, axis: str) -> None:
    """Say on stderr that ``memsweep predict --cards`` has predicted one card's edge (its dry runs
    were each said as they ended, ``report_dry_run``): the card, its capacity, the largest value
    that fits and the smallest that does not. Silent inside a call of the Python API.

    Args:
        done: the cards predicted so far, this one included.
        total: the cards to predict.
        row: the card's row (``sweeper.predict_cards.card_row``: ``card``, ``capacity_bytes``,
            ``max_fit``, ``min_miss``, ``exact``, ``error``).
        axis: the axis searched.
    """
    if observer() is not None:
        return
    fit = "nothing fits" if row["max_fit"] is None else f"{axis}={row['max_fit']} fits"
    if row["max_fit"] is not None and not row["exact"]:
        fit += " (not exact)"
    miss = "" if row["min_miss"] is None else f", {axis}={row['min_miss']} does not"
    failed = f"; a dry run failed: {row['error']}" if row.get("error") else ""
    print(
        f"memsweep: card {done}/{total} {row['card']} ({size_words(row['capacity_bytes'])}): {fit}{miss}{failed} "
        "(predicted)",
        file=sys.stderr,
        flush=True,
    )
