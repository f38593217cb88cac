"""The ``memsweep`` command: parses the command line, runs the subcommand, prints, exits.

The only module of memsweep that prints or exits; every subcommand is a thin layer over the
library (the Python API ``memsweep``, ``sweeper.predict``, the analysis).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NamedTuple, TextIO

from memsweep.conf.contract import (
    EXIT_AFTER_RUNS,
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    PEAK_CATEGORIES,
    PEAK_CATEGORY_WORDS,
    PREDICT_EXIT,
    SpecError,
    bytes_text,
    validate_device,
)
from memsweep.estimator.labels import verdict_words

if TYPE_CHECKING:
    from .predict import Prediction

USAGE = """The ``memsweep`` command.

    memsweep run [OVERRIDES]        measure one condition (Hydra run)
    memsweep sweep [OVERRIDES]      one-variable-at-a-time sweep (Hydra multirun), then analyze
    memsweep analyze DIR [DIR ...]  Parquet tables and the frontier of sweep directories
    memsweep report DIR [DIR ...] [--out DIR] [--margin 10%|0.1|2GiB]
                                    report.md + self-contained report.html: frontier, margin,
                                    chosen setting, phases, estimate, other cards
    memsweep compare BASELINE OTHER [...] [--fail-above 5%|64MiB] [--out DIR]
                                    comparable loads side by side; exit 1 when a peak grew
                                    beyond --fail-above, 3 when nothing was comparable
    memsweep estimate [OPTIONS]     calculated memory of a load (weights, training state, KV cache...)
    memsweep predict [OVERRIDES] capacity=SIZE [--axis batch] [--upper N]
                                    predicted edge of an axis from dry runs (fake tensors, no device)
    memsweep env [--device auto|cpu|cuda:N] [--json]
                                    the environment report (device, driver, Python, PyTorch, CUDA/HIP,
                                    allocator settings); exit 2 when PyTorch or the device is missing

OVERRIDES use Hydra's syntax: ``batch=16 capacity=2GiB sweep=ovat hydra/launcher=joblib``.

Exit status of ``memsweep run``: 0 ok, 3 out of memory, 4 error, 6 crash, 7 timeout (the run's
outcome), 2 bad input (nothing ran). ``memsweep sweep``: 0 when the sweep ran (its OOMs are
its data), 4 when no run ended ok or oom (every run an error, crash or timeout), 8 when the
analysis or the report at its end failed (its runs kept), 2 bad input, 1 stopped (a file it
could not write or read: the disk full, a directory removed; resumable), 130 interrupted (Ctrl-C,
SIGTERM, SIGHUP; resumable). ``memsweep predict``: 0 edge predicted, 3 nothing
fits, 4 a dry run failed, 2 bad input (``memsweep.conf.contract.PREDICT_EXIT``). Every command
interrupted (Ctrl-C, SIGTERM, SIGHUP) says so in one line and exits 130.
"""


def _hydra_main(argv: list[str], multirun: bool) -> int:
    """``memsweep run`` / ``memsweep sweep``: ``sweeper.api.hydra_jobs`` with SIGTERM and SIGHUP
    handled as SIGINT (``interrupted_by_signals``), its refusals printed and turned into the exit
    status (the module's docstring)."""
    from .api import hydra_jobs, run_exit_code
    from .errors import InputRefused
    from .hydra_errors import HydraStopped
    from .process import RunDirError

    try:
        with interrupted_by_signals():
            jobs = hydra_jobs(argv, multirun)
    except RunDirError as exc:  # a given hydra.run.dir holds a run: refused before Hydra wrote anything
        print(f"memsweep run: {exc}", file=sys.stderr)
        return 1
    except (SpecError, InputRefused) as exc:  # an output directory, or a sweeper's or the task's refusal
        print(f"memsweep: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except HydraStopped as exc:  # one line for what ended Hydra's app (sweeper.hydra_errors)
        print(f"memsweep: error: {exc}", file=sys.stderr)
        return exc.code
    except SystemExit as exc:  # Hydra exits 1 after printing a job's error
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    except KeyboardInterrupt:
        print(
            "memsweep: interrupted; finished runs are kept: the same command with the same "
            "hydra.sweep.dir=... resumes without running them again"
            if multirun
            else "memsweep: interrupted",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    if not multirun and jobs:  # one run: its outcome is the exit status (a sweep's OOMs are its data)
        return run_exit_code(jobs[-1].result)
    from .callbacks import END_FAILURES, SWEEPS_STARTED, sweep_exit_code  # 4: no run ended ok or oom

    started, SWEEPS_STARTED[:] = list(SWEEPS_STARTED), []
    failures, END_FAILURES[:] = list(END_FAILURES), []
    code = sweep_exit_code(started + [j.sweep_dir for j in jobs if j.sweep_dir is not None])
    for line in failures:  # a step after the runs failed: the command fails with it
        print(f"memsweep: error: {line}", file=sys.stderr)
    return code or (EXIT_AFTER_RUNS if failures else 0)


HANDLED_SIGNALS = ("SIGTERM", "SIGHUP")
"""Signals that end ``memsweep run``/``sweep`` as Ctrl-C does (a cluster's preemption sends SIGTERM)."""


@contextlib.contextmanager
def interrupted_by_signals() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise ``KeyboardInterrupt`` (in the main thread), as SIGINT
    does: the command then ends its runs and says how to resume. Outside the main thread: nothing."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    saved = {name: signal.signal(getattr(signal, name), _raise) for name in HANDLED_SIGNALS}
    try:
        yield
    finally:
        for name, handler in saved.items():
            signal.signal(getattr(signal, name), handler)


def hydra_command(argv: list[str]) -> bool:
    """Tell whether ``argv`` gives one of Hydra's own commands, read by Hydra's own parser (its
    spellings and abbreviations: ``--cfg job``, ``-c job``, ``--info``, ``--shell-completion``,
    ``--run``, ``--multirun``). Hydra takes one of them at a time, so ``memsweep sweep`` adds
    ``--multirun`` only when none is given (``--cfg``, ``--info``: Hydra shows, nothing runs).

    Args:
        argv: the arguments after ``memsweep sweep``.

    Returns:
        True when one is given; False when none is (or for a command line Hydra itself refuses,
        in its own words, once it parses it).
    """
    import contextlib
    import io

    from hydra._internal.utils import get_args_parser

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            args, _ = get_args_parser().parse_known_args(argv)
    except SystemExit:
        return False
    return bool(args.cfg is not None or args.info is not None or args.shell_completion or args.run or args.multirun)


def check_output_args(argv: list[str]) -> None:
    """Check, before Hydra creates any directory, that the output directories given on the
    command line (``results_dir``, ``hydra.run.dir``, ``hydra.sweep.dir``; ``results`` here when
    none is given) can be written.

    Raises:
        SpecError: the first that cannot (``sweeper.inputs.check_writable``).
    """
    from .inputs import check_writable

    given = {}
    for arg in argv:
        key, sep, value = arg.lstrip("+").partition("=")
        if sep and key in ("results_dir", "hydra.run.dir", "hydra.sweep.dir") and "${" not in value:
            given[key] = value
    for key, value in (given or {"results_dir": "results"}).items():
        check_writable(key, value)


def env_command(argv: list[str]) -> int:
    """``memsweep env``: asks a worker process (this one never imports torch) for the report."""
    import argparse
    import json

    from memsweep.conf.contract.ask import ask_worker

    parser = argparse.ArgumentParser(prog="memsweep env", description=env_command.__doc__)
    parser.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    try:
        validate_device(args.device)
    except ValueError as exc:
        print(f"memsweep env: {exc}", file=sys.stderr)
        return 2
    try:
        info = ask_worker("--env", args.device)
    except RuntimeError as exc:
        print(f"memsweep env: the worker could not report ({exc})", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        print(
            f"device: {info.get('device', args.device)}  available: {info.get('available')}"
            + (f"  ({info['reason']})" if info.get("reason") else "")
        )
        for key, value in (info.get("environment") or {}).items():
            print(f"  {key}: {value}")
        if info.get("total_memory") is not None:
            print(f"  total_memory: {bytes_text(info['total_memory'])}")
    return 0 if info.get("available") else 2


def _predict_usage() -> str:
    """``memsweep predict --help``: its usage, options and exit status, the axes from the vocabulary
    (``sweeper.search.SEARCH_AXES``), the default upper bound the frontier sweeper's
    (``FrontierSweeperConf.upper``)."""
    from .frontier_settings import FrontierSweeperConf
    from .search import SEARCH_AXES

    axes = "|".join(SEARCH_AXES)
    return f"""usage: memsweep predict [OVERRIDES] capacity=SIZE [--axis {axes}] [--upper N]
       memsweep predict [OVERRIDES] --cards[=NAME,NAME] [--axis ...] [--upper N]   one table: the edge on each card

Predicts, without the device, the largest value of the axis whose tensor bytes fit in SIZE
(GB = 10^9 B, GiB = 2^30 B), on dry runs: the frontier search's model strategy (the predicted
peaks fitted against the axis aim each next dry run; bisection when a guess is wrong), on the
values 1..N (--upper, default {FrontierSweeperConf.upper}, the frontier sweeper's), until the edge is exact.
OVERRIDES are those of `memsweep run` (key=value; dry_run is always true here);
device=cpu (the default) or device=cuda[:N] (fake CUDA tensors: no GPU needed; CUDA's 512 B
allocator blocks counted). --cards=T4 --cards=H100 names several cards (--cards alone: every card).
Options: {", ".join(PREDICT_OPTIONS)}.
Exit status: 0 an edge predicted, 3 nothing fits, 4 a dry run failed, 2 bad input."""


# The options of `memsweep predict` (everything else is an override, key=value).
PREDICT_OPTIONS = ("--axis AXIS", "--upper N", "--cards[=NAME,NAME]", "-h/--help")


class PredictArgs(NamedTuple):
    """``memsweep predict``'s arguments, parsed.

    Attributes:
        overrides: the load's overrides (key=value).
        axis: the axis searched (``--axis``, default batch).
        capacity: the ``capacity=`` text, or None.
        upper: the largest value searched (``--upper``), or None.
    """

    overrides: list[str]
    axis: str
    capacity: str | None
    upper: int | None


def _parse_predict_args(argv: list[str]) -> PredictArgs:
    """The ``PredictArgs`` of ``memsweep predict``'s arguments (``--cards`` taken out).

    Raises:
        SpecError: an axis a search cannot walk (field ``--axis``), an ``--upper`` that is not an
            integer from 1 to ``sweeper.predict.MAX_VALUE`` (``check_upper``), or an unknown option (field
            ``option``, listing ``PREDICT_OPTIONS``).
    """
    from .predict import check_upper
    from .search import check_search_axis

    axis: str | None = "batch"
    overrides: list[str] = []
    capacity: str | None = None
    upper: int | None = None
    it = iter(argv)
    for arg in it:
        name, eq, given = arg.partition("=")
        if name in ("--axis", "--upper"):
            value = given if eq else next(it, None)
            if name == "--axis":
                axis = value
            else:
                upper = check_upper(value, "--upper")
        elif arg.startswith("-"):
            raise SpecError("option", arg, "one of " + ", ".join(PREDICT_OPTIONS) + "; overrides are key=value")
        elif arg.startswith("capacity="):
            capacity = given
        else:
            overrides.append(arg)
    return PredictArgs(overrides, check_search_axis(axis, "--axis"), capacity, upper)


def _predict_error(exc: SpecError) -> str:
    """How ``memsweep predict`` words a refusal: "unknown option X (options: ...)" for an option it
    does not take (field ``option``, ``_parse_predict_args``), else the error's own message."""
    if exc.field == "option":
        options = ", ".join(PREDICT_OPTIONS)
        return f"unknown option {exc.value}; memsweep predict's options: {options} (overrides: key=value)"
    return str(exc)


def _print_edge(prediction: Prediction, axis: str, out: TextIO) -> None:
    """Print ``memsweep predict``'s predicted edge and the tensor bytes per phase at it.

    Args:
        prediction: ``predict_edge``'s answer.
        axis: the axis searched.
        out: where it is printed.
    """
    predictor, edge, summary = prediction.predictor, prediction.edge, prediction.summary
    at = predictor.runs.get(edge.max_fit) if edge.max_fit is not None else None
    load = " ".join(verdict_words(predictor.base.to_dict(), prediction.capacity_bytes, skip=(axis,)))
    if edge.error is not None:
        err = edge.error
        print(f"  dry run at {axis}={err['value']} failed: {err['error_type']}: {err['error_message']}", file=out)
        print("  (a real run measures such a load: memsweep run / sweep)", file=out)
    if edge.max_fit is None and edge.min_miss == 1:
        need = bytes_text(predictor.runs[1]["peak"])
        print(f"  PREDICTED: nothing fits; {axis}=1 already needs {need}, for {load}", file=out)
    if edge.upper_reached:
        print(
            f"  PREDICTED: edge not found below the upper bound: {axis}={edge.max_fit} (--upper) fits; "
            f"the edge lies above it (a larger --upper searches further), for {load}",
            file=out,
        )
    elif edge.max_fit is not None:
        exact = "exact" if edge.exact else "not exact"
        print(
            f"  PREDICTED edge: max fit {axis}={edge.max_fit}, min miss {axis}={edge.min_miss} ({exact}), for {load}",
            file=out,
        )
    if edge.max_fit is not None:
        print(f"  predicted tensor bytes at {axis}={edge.max_fit}, per phase (peak / live at its end):", file=out)
        for row in summary["breakdown"]:
            extra = "".join(
                f", {k} {v}"
                for k, v in row.items()
                if k.endswith("_bytes")
                and v is not None
                and k not in ("peak_bytes", "live_bytes")
                and not k.startswith("predicted_")
            )
            print(f"    {row['phase']:<28} {row['peak_bytes']:>16} B {row['live_bytes']:>16} B{extra}", file=out)
        if at is not None:  # the run at max_fit
            print(f"  largest phase peak: {bytes_text(at['peak'])}", file=out)


def predict_command(argv: list[str], out: TextIO | None = None) -> int:
    """``memsweep predict``: the predicted edge of an axis from dry runs (``sweeper.predict``).

    Args:
        argv: the command's arguments (overrides, ``capacity=SIZE``, ``--axis AXIS``).
        out: where the answer is printed (errors go to stderr); None: the current ``sys.stdout``
            (looked up at the call, not at import).

    Returns:
        The exit status (``memsweep.conf.contract.PREDICT_EXIT``): 0 edge found, 3 nothing fits, 4 a dry
        run failed, 2 bad input.
    """
    out = out if out is not None else sys.stdout
    from .predict import blind_spots, predict_edge

    if any(a in ("-h", "--help") for a in argv):
        print(_predict_usage(), file=out)
        return 0
    cards = [a for a in argv if a == "--cards" or a.startswith("--cards=")]
    if cards:
        return _predict_cards_command([a for a in argv if a not in cards], cards, out)
    try:
        overrides, axis, capacity, upper = _parse_predict_args(argv)
        prediction = predict_edge(overrides, axis, capacity, axis_field="--axis", upper=upper)
    except SpecError as exc:  # bad input, or a load the dry run refuses (e.g. a workload it cannot fake)
        print(f"memsweep predict: error: {_predict_error(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    predictor, edge, summary = prediction.predictor, prediction.edge, prediction.summary
    print(
        f"memsweep predict: {axis} at capacity {bytes_text(prediction.capacity_bytes)}, {len(predictor.runs)} "
        f"dry runs (fake tensors, no device), in {prediction.out_dir}",
        file=out,
    )
    if predictor.device.startswith("cuda"):
        print(
            f"  a PREDICTION for a CUDA device ({predictor.device}) made on this machine with fake CUDA tensors "
            f"(no GPU used); tensor bytes counted as the CUDA caching allocator counts them, each storage "
            f"rounded up to 512 B blocks: the predicted peak is torch.cuda.max_memory_allocated's, not "
            f"max_memory_reserved's",
            file=out,
        )
    _print_edge(prediction, axis, out)
    _print_split(summary, axis, out)
    print("  This is a prediction of live tensor bytes, not a measurement. It cannot see:", file=out)
    for item in blind_spots(predictor.device):
        print(f"    - {item}", file=out)
    print("  Keep a margin for these, or measure the edge: memsweep sweep ... capacity=SIZE", file=out)
    from .api import predict_exit_code

    return predict_exit_code(edge)


def card_names(args: list[str]) -> list[str] | None:
    """The cards named by ``memsweep predict``'s ``--cards`` arguments, every one given
    (``--cards=T4 --cards=H100,A100``), in order, each once; None (the whole catalog) when only
    a bare ``--cards`` is given.

    Args:
        args: the ``--cards`` and ``--cards=...`` arguments.

    Raises:
        SpecError: field ``--cards``, an empty list (``--cards=``, ``--cards=,``).
    """
    names: list[str] = []
    for arg in args:
        if arg == "--cards":
            continue
        given = [n.strip() for n in arg.partition("=")[2].split(",") if n.strip()]
        if not given:
            raise SpecError(
                "--cards", arg.partition("=")[2], "card names, comma-separated (or --cards alone for every card)"
            )
        names += [n for n in given if n not in names]
    return names or None


def _predict_cards_command(argv: list[str], cards: list[str], out) -> int:
    """``memsweep predict [OVERRIDES] --cards[=NAME,NAME]``: one table of the predicted edge per
    card of the catalog (``sweeper.predict_cards``); exit 0, 4 when a dry run failed, 2 bad input."""
    from .predict import blind_spots
    from .predict_cards import CARD_TABLE_HEAD, card_table_row, predict_cards

    try:
        names = card_names(cards)
        overrides, axis, capacity, upper = _parse_predict_args(argv)
        if capacity is not None:
            raise SpecError("capacity", capacity, "no capacity with --cards (each card's reported total is used)")
        summary = predict_cards(overrides, axis, names, axis_field="--axis", upper=upper)
    except SpecError as exc:
        print(f"memsweep predict: error: {_predict_error(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    load = " ".join(w for w in verdict_words(summary["load"], None, skip=(axis,)) if not w.startswith("capacity="))
    print(
        f"memsweep predict: PREDICTED edge of {axis} per card ({summary['device']}; each card's reported total, "
        f"estimator/cards.py), for {load}; {summary['dry_runs']} dry runs (fake tensors, no device), "
        f"in {summary['out_dir']}",
        file=out,
    )
    print(CARD_TABLE_HEAD, file=out)
    for r in summary["cards"]:
        print(card_table_row(r), file=out)
        if r["error"]:
            print(f"    dry run failed: {r['error']}", file=out)
    print(
        "  GiB = 2^30 B. max fit: largest value whose largest predicted phase peak fits the card; ? = not exact. "
        "estimator (calculated, memsweep.estimator): weights + gradients + optimizer states, and its own edge "
        "(train along batch: Korthikanti et al. 2022 activations), of an hf workload (its config.json); "
        "'-' for another workload, which the estimator does not read",
        file=out,
    )
    print("  A prediction of live tensor bytes, not a measurement on these cards. It cannot see:", file=out)
    for item in blind_spots(summary["device"]):
        print(f"    - {item}", file=out)
    return PREDICT_EXIT["error"] if any(r["error"] for r in summary["cards"]) else PREDICT_EXIT["edge"]


def _print_split(summary: dict, axis: str, out) -> None:
    """The split of the largest predicted phase peak at ``summary["split_value"]`` by category,
    then (hf loads) the dry run's parameters, gradients and optimizer states where all are live
    next to the estimator's figures (calculated, memsweep.estimator)."""
    split, est = summary.get("peak_split"), summary.get("estimator")
    if split is not None:
        print(
            f"  at the largest phase peak of {axis}={summary['split_value']} ({split['phase']}), live tensor "
            f"bytes by category (torch.distributed._tools.mem_tracker's categories):",
            file=out,
        )
        for name, field in PEAK_CATEGORIES:
            print(f"    {PEAK_CATEGORY_WORDS[name]:<28} {bytes_text(split[field])}", file=out)
    if not est or est.get("phase") is None:
        return
    print(
        f"  at the peak of {est['phase']}, dry run (predicted) vs estimator (calculated, memsweep.estimator):", file=out
    )
    for key, label in (("weights", "parameters"), ("gradients", "gradients"), ("optimizer_states", "optimizer states")):
        dry, calc = est["predicted"].get(key), est.get(key)
        if calc is None:
            continue
        same = "equal" if dry == calc else f"differ by {dry - calc:+d} B" if dry is not None else "no dry-run figure"
        print(f"    {label:<18} {dry!s:>16} B  {calc:>16} B  {same}", file=out)


ANALYSIS_COMMANDS = {
    "analyze": "memsweep.analysis.cli",
    "report": "memsweep.analysis.report",
    "compare": "memsweep.analysis.compare",
    "estimate": "memsweep.estimator.cli",
}
"""The subcommands the analysis package runs: command -> the module whose ``main(argv)`` runs it
(imported when called: a Hydra run does not load pandas)."""


def main(argv: list[str] | None = None) -> int:
    """The ``memsweep`` command: dispatch to its subcommands (the module's docstring).

    Args:
        argv: the arguments after ``memsweep`` (default: ``sys.argv[1:]``).

    Returns:
        The exit status (see the module's docstring).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _dispatch(argv)
    except BrokenPipeError:  # `memsweep estimate ... | head`: the reader left; no traceback
        # https://docs.python.org/3/library/signal.html#note-on-sigpipe: stdout to devnull, so
        # that the interpreter's flush at exit does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _interruptible(command: str, run: Callable[[], int]) -> int:
    """``run()`` (a subcommand other than ``run``/``sweep``) with SIGTERM and SIGHUP handled as
    Ctrl-C (``interrupted_by_signals``): interrupted, it says so in one line, naming the signal, and
    exits 130 (``EXIT_INTERRUPTED``), as ``memsweep sweep`` does, instead of dying silently (143) or
    with a traceback. The analysis commands publish their tables and reports whole or not at all
    (``analysis.publish``: the renames hold these signals back), which the line says."""
    try:
        with interrupted_by_signals():
            return run()
    except KeyboardInterrupt as exc:
        how = f" ({exc.args[0]})" if exc.args else " (Ctrl-C)"
        kept = (
            "; nothing is left half-written (tables and reports are published whole or not at all): "
            "the same command starts again"
            if command in ANALYSIS_COMMANDS
            else ""
        )
        print(f"memsweep {command}: interrupted{how}{kept}", file=sys.stderr)
        return EXIT_INTERRUPTED


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "run":
        return _hydra_main(rest, multirun=False)
    if command == "sweep":
        return _hydra_main(rest, multirun=True)
    if command in ANALYSIS_COMMANDS:
        return _interruptible(command, lambda: importlib.import_module(ANALYSIS_COMMANDS[command]).main(rest))
    if command == "predict":
        return _interruptible(command, lambda: predict_command(rest))
    if command == "env":
        return _interruptible(command, lambda: env_command(rest))
    print(
        f"memsweep: unknown command {command!r}; expected one of run, sweep, analyze, report, compare, estimate, "
        f"predict, env\n{USAGE}",
        file=sys.stderr,
    )
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
