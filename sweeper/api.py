"""memsweep's Python API: ``import memsweep``, then ``memsweep.run``, ``sweep``, ``frontier``,
``predict``, ``estimate``, ``compare`` and ``load_tables`` (docs/api.md).

Each function does what the command of the same name does, through the same functions (``hydra_jobs``
is what ``memsweep run`` and ``memsweep sweep`` call too); every measured run is a fresh worker
process, never this one. Results are frozen dataclasses holding the numbers the files hold (bytes as
integers, None where nothing was measured); bad input raises the refusal the command line turns into
exit status 2 (``SpecError``, a ``ValueError`` naming the setting, or ``RunDirError``).

Settings are keyword arguments turned into Hydra overrides (``batch=2`` -> ``batch=2``; a dict names
nested keys, a list sweeps), then ``overrides=[...]`` as written on the command line. A user
workload's functions (``model=``, ``inputs=``, ...) are ``"pkg.module:function"`` strings or
importable functions, imported by name in the worker (nothing is pickled).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memsweep import __all__ as API_NAMES
from memsweep.conf.contract import (
    PREDICT_EXIT,
    RECORD_FILE,
    RESULT_FILE,
    RUN_EXIT,
    SPEC_FILE,
    SpecError,
    device_kind_of,
    peak_counters,
    phase_peak,
    record_phases,
    run_peak,
    run_throughput,
    spec_settings,
    try_read,
)

if TYPE_CHECKING:
    from .predict import PredictedEdge

__all__ = list(API_NAMES)  # the names ``import memsweep`` exports, declared once, in its __init__

USER_FUNCTIONS = ("model", "inputs", "loss", "optimizer", "train_step")
"""The functions of a user workload (``workload=user``), in the order its fields are set."""

_PLAIN = re.compile(r"[\w./:+\-@%]+")
"""A value written as is in an override; anything else is quoted."""


# -- overrides ------------------------------------------------------------------------------------


def override_value(value: Any) -> str:
    """One value in Hydra's override syntax: ``null``, ``true``/``false``, a number, a plain word as
    is, any other text single-quoted (``'a b'``).

    Raises:
        SpecError: a value that is none of these (field ``value``).
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        if _PLAIN.fullmatch(text):
            return text
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    raise SpecError("value", value, "None, a bool, a number or text (a dict names nested keys, a list sweeps)")


def settings_overrides(settings: Mapping[str, Any], lists: bool, prefix: str = "") -> list[str]:
    """Hydra overrides of keyword settings: ``key=value``, a dict's items as ``key.sub=value``, a
    list or tuple as a sweep ``key=a,b`` (``lists``).

    Args:
        settings: setting -> value.
        lists: lists are allowed (a sweep); False: refused.
        prefix: the dotted key above these (for a dict's items).

    Raises:
        SpecError: a list where ``lists`` is False, or an empty one.
    """
    out: list[str] = []
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out += settings_overrides(value, lists, f"{name}.")
        elif isinstance(value, (list, tuple)):
            if not lists or not value:
                accepted = "a non-empty list of values" if lists else "a single value (a list sweeps: memsweep.sweep)"
                raise SpecError(name, value, accepted)
            out.append(f"{name}=" + ",".join(override_value(v) for v in value))
        else:
            out.append(f"{name}={override_value(value)}")
    return out


def target_path(function: str | Callable, field: str = "model") -> tuple[str, str | None]:
    """The dotted import path of a user function (Hydra's ``_target_``), and the directory to put
    on the worker's ``sys.path`` so that it imports there (a function object's top package's
    parent; None for a string).

    Args:
        function: ``"pkg.module:function"``, or a function defined at the top level of a module.
        field: the argument's name, for the messages.

    Raises:
        SpecError: a string not of that form; a lambda, a function defined inside another one or
            a method; a function defined in ``__main__`` (a notebook, the script run); one its
            module does not hold under its name. The message says how to make it importable.
    """
    if isinstance(function, str):
        module, sep, name = function.partition(":")
        parts = [*module.split("."), name]
        if not sep or not all(p.isidentifier() for p in parts):
            raise SpecError(field, function, "'pkg.module:function' (a module the worker imports)")
        return f"{module}.{name}", None
    owner: str | None = getattr(function, "__module__", None)
    qualname: str | None = getattr(function, "__qualname__", None)
    module = owner or ""
    how = (
        "define it at the top level of a .py module (beside your notebook or script) and pass it, or "
        "'module:function': the worker imports it by name in its own process"
    )
    if not callable(function) or not owner or not qualname:
        raise SpecError(field, function, f"a function (not a function); {how}")
    if qualname == "<lambda>" or "." in qualname:
        raise SpecError(
            field,
            function,
            f"a function importable by name ({qualname} of {module} is a lambda, a nested function or a method); {how}",
        )
    if module == "__main__":
        raise SpecError(
            field,
            function,
            f"a function importable by name ({qualname} is defined in __main__, a notebook or the script run, "
            f"which another process cannot import); {how}",
        )
    held = sys.modules.get(module)
    if held is None or getattr(held, qualname, None) is not function:
        raise SpecError(
            field, function, f"a function its module holds under its name ({module}.{qualname} is not); {how}"
        )
    return f"{module}.{qualname}", import_root(held)


def import_root(module: Any) -> str | None:
    """The directory from which ``module`` imports under its name (the parent of its top package,
    or of the module file itself); None for a module without a file."""
    file = getattr(module, "__file__", None)
    if not file:
        return None
    path = Path(file).resolve().parent  # pkg/sub/__init__.py or pkg/sub/mod.py -> pkg/sub
    depth = module.__name__.count(".") + (1 if Path(file).name == "__init__.py" else 0)
    return str(path.parents[depth - 1]) if depth else str(path)


def user_overrides(functions: Mapping[str, Any], kwargs: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    """The overrides of a user workload given by its functions (``USER_FUNCTIONS``; None: not
    given): ``workload=user``, each function's ``_target_`` with its keyword arguments, and
    ``workload.path`` (the working directory, then each function object's package root) so that the
    worker imports them.

    Args:
        functions: name (``model``...) -> ``"pkg.module:function"``, a function, or None.
        kwargs: name -> the keyword arguments the worker calls that function with.

    Raises:
        SpecError: a function that cannot be imported by name (``target_path``), or ``model`` without
            ``inputs`` (or the reverse).
        SpecError: a keyword argument's value that cannot be written as an override.
    """
    given = {k: v for k, v in functions.items() if v is not None}
    if not given:
        return []
    if "model" not in given or "inputs" not in given:
        raise SpecError(
            "model" if "model" not in given else "inputs",
            None,
            "a user workload needs model= and inputs= (and optionally loss=, optimizer=, train_step=)",
        )
    out, path = ["workload=user"], [os.getcwd()]
    for name in USER_FUNCTIONS:
        if name in given:
            target, root = target_path(given[name], name)
            extra = (f"{k}:{override_value(v)}" for k, v in (kwargs or {}).get(name, {}).items())
            out.append(f"workload.{name}={{" + ",".join([f"_target_:{target}", *extra]) + "}")
            if root is not None and root not in path:
                path.append(root)
    return out + ["workload.path=[" + ",".join(override_value(p) for p in path) + "]"]


def load_overrides(
    settings: Mapping[str, Any], overrides: Sequence[str], functions: Mapping[str, Any], lists: bool
) -> list[str]:
    """All overrides of a call: the user workload's, the keyword settings', then ``overrides``. With
    user functions, ``workload={"model": {"hidden": 4}}`` gives ``model`` its keyword arguments.

    Raises:
        SpecError: ``overrides`` given as one string, a setting that cannot be written as an override.
        ValueError: user functions that cannot be imported by name (``user_overrides``).
    """
    if isinstance(overrides, str):
        raise SpecError("overrides", overrides, "a list of overrides, e.g. ['batch=2', 'device=cpu']")
    workload, kwargs = settings.get("workload"), {}
    if any(v is not None for v in functions.values()) and isinstance(workload, Mapping):
        kwargs = {k: v for k, v in workload.items() if k in USER_FUNCTIONS and isinstance(v, Mapping)}
        rest = {k: v for k, v in workload.items() if k not in kwargs}
        settings = {k: v for k, v in settings.items() if k != "workload"} | ({"workload": rest} if rest else {})
    return [*user_overrides(functions, kwargs), *settings_overrides(settings, lists), *overrides]


# -- Hydra runs and multiruns (memsweep run, memsweep sweep) --------------------------------------


@dataclass(frozen=True)
class Job:
    """One Hydra job of ``hydra_jobs``: its run directory, the sweep directory (a multirun's; None
    for one run) and the result envelope ``sweeper.job.run_condition`` returned."""

    run_dir: Path
    sweep_dir: Path | None
    result: dict


def hydra_jobs(argv: list[str], multirun: bool) -> list[Job]:
    """Run memsweep's Hydra app on ``argv``: one run (``memsweep run``) or a multirun (``memsweep
    sweep``), each job ``sweeper.job.run_condition``. ``sys.argv`` is restored afterwards.

    Args:
        argv: the overrides (and Hydra's own options), as after ``memsweep run``/``sweep``.
        multirun: a sweep.

    Returns:
        The jobs this process ran (a launcher that runs jobs in other processes leaves none here).

    Raises:
        sweeper.process.RunDirError: a given ``hydra.run.dir`` already holds a run (nothing written).
        SpecError: an output directory that cannot be written (``sweeper.cli.check_output_args``).
        InputRefused: a sweeper or the task refused its input before any worker started.
        sweeper.hydra_errors.HydraStopped: the app ended with an exception, in one line (unless
            ``HYDRA_FULL_ERROR`` is set: then Hydra reports it itself, ``SystemExit``).
        SystemExit: Hydra exited by itself (``--help``, ``--cfg``).
        KeyboardInterrupt: interrupted.
    """
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import DictConfig

    from .cli import check_output_args, hydra_command
    from .job import run_condition
    from .override_keys import check_override_keys
    from .process import check_run_dir_free

    new_run_dir = True  # the default run directory is a new, timestamped one
    existed: Path | None = None  # the deepest folder of a given hydra.run.dir that exists already
    if not multirun:
        for arg in argv:  # refuse before Hydra writes anything into an existing run directory
            if arg.startswith("hydra.run.dir="):
                if not arg.split("=", 1)[1].strip():  # Path("") is the working directory
                    raise SpecError("hydra.run.dir", "", "a directory of its own for the run's files, not empty")
                run_dir = Path(arg.split("=", 1)[1])
                new_run_dir = not run_dir.exists()
                existed = next(p for p in (run_dir.absolute(), *run_dir.absolute().parents) if p.exists())
                check_run_dir_free(run_dir)
    check_output_args(argv)
    check_override_keys(argv)
    jobs: list[Job] = []

    @hydra.main(version_base="1.3", config_path="pkg://memsweep.conf", config_name="config")
    def _main(cfg: DictConfig) -> dict:
        result = run_condition(cfg, new_run_dir=new_run_dir, existed=existed)
        hc = HydraConfig.get()
        sweep_dir = Path(str(hc.sweep.dir)).absolute() if hc.mode == RunMode.MULTIRUN else None
        jobs.append(Job(Path(hc.runtime.output_dir).absolute(), sweep_dir, result))
        return result

    given = multirun and hydra_command(argv)  # `memsweep sweep --cfg job`: Hydra shows the config, nothing runs
    _call_hydra(_main, ["memsweep"] + (["--multirun"] if multirun and not given else []) + argv)
    return jobs


def _call_hydra(main: Callable[[], Any], argv: list[str]) -> None:
    """Call a ``hydra.main`` function with ``argv`` as ``sys.argv``; then restore it, clear Hydra
    (a later call, or compose for predict, initializes it again) and release the sweep directories
    claimed (``sweeper.sweep_dir.release_sweep_dirs``: what claiming made is removed when the
    sweep was refused before it ran; an interrupted or failed one keeps its directory)."""
    from hydra.core.global_hydra import GlobalHydra

    from .errors import InputRefused
    from .hydra_errors import raised_errors
    from .process import RunDirError
    from .sweep_dir import release_sweep_dirs

    saved, sys.argv = sys.argv, argv
    refused = True
    try:
        with raised_errors():  # one line, not Hydra's traceback: sweeper.hydra_errors
            main()
        refused = False
    except (InputRefused, SpecError, RunDirError):
        raise
    except BaseException:
        refused = False
        raise
    finally:
        sys.argv = saved
        GlobalHydra.instance().clear()
        release_sweep_dirs(refused)


def run_exit_code(result: Mapping[str, Any]) -> int:
    """``memsweep run``'s exit status for a run's result envelope: its outcome's (``RUN_EXIT``; a dry
    run's verdict, ``predicted_outcome``, when it has one), 1 for an outcome it does not know."""
    return RUN_EXIT.get(str(result.get("predicted_outcome") or result.get("outcome")), 1)


def refusal(exc: BaseException) -> Exception:
    """The ``Exception`` an API call raises for an ``InputRefused`` (a ``BaseException`` only so that it
    passes through Hydra): the ``SpecError`` it carries, its note added to what is accepted; any other
    refusal as it is (``RunDirError``)."""
    error, note = getattr(exc, "error", exc), getattr(exc, "note", None)
    if isinstance(error, SpecError) and note:
        return SpecError(error.field, error.value, f"{error.accepted} ({note})")
    return error if isinstance(error, Exception) else RuntimeError(str(exc))


def _hydra(argv: list[str], multirun: bool, progress: bool) -> tuple[list[Job], Path | None]:
    """``hydra_jobs`` for an API call: its observer (``sweeper.progress``: the bar, the sweep
    directory), errors raised as the typed refusals. Without ``progress``, quiet: Hydra's console
    logging kept to warnings and errors (``sweeper.progress.quiet_overrides``), no summary printed.

    Returns:
        (the jobs run in this process, the sweep directory of a multirun or None).

    Raises:
        SpecError: bad input (an ``InputRefused``'s, or an override Hydra cannot compose, naming
            Hydra's reason in one line).
        RunDirError: the run directory holds a run already.
        RuntimeError: the sweep's analysis or report failed at its end (its runs are kept).
    """
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from .errors import InputRefused
    from .hydra_errors import full_errors
    from .predict import first_line
    from .progress import observing, quiet_overrides

    quiet = [] if progress else quiet_overrides(argv)
    with observing(progress, None if multirun else 1) as watching, full_errors():
        try:
            jobs = hydra_jobs([*quiet, *argv], multirun)
        except InputRefused as exc:
            raise refusal(exc) from None
        except (HydraException, OmegaConfBaseException) as exc:
            accepted = f"overrides of memsweep's config ({first_line(exc)})"
            raise SpecError("overrides", " ".join(argv), accepted) from None
    from .callbacks import END_FAILURES

    failures, END_FAILURES[:] = list(END_FAILURES), []
    if failures:  # the runs ended, the analysis or the report at the sweep's end did not
        raise RuntimeError(failures[0])
    return jobs, watching.sweep_dir or next((j.sweep_dir for j in jobs if j.sweep_dir), None)


# -- results --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunResult:
    """One run, as its files hold it (``result.json``, ``record.json``, ``spec.json``).

    Attributes:
        run_dir: the run directory.
        outcome: ok, oom, error, crash or timeout (the worker process's; None when it left none).
        exit_code: what ``memsweep run`` exits with (``conf.contract.RUN_EXIT``; a dry run's verdict).
        failed_phase, error_type, error_message: where and why it failed (None when it did not).
        peak: the run's peak compared with the capacity (bytes; ``conf.contract.run_peak``), or None.
        peak_counter: that peak's counter (``max_memory_allocated`` on the CPU and in a dry run,
            ``max_memory_reserved`` on CUDA).
        max_memory_allocated, max_memory_reserved: the largest value of each over the phases
            (bytes), None when no phase has one (never 0 for missing).
        capacity_bytes: the capacity of the run (bytes), None for the device's own.
        dry_run: a prediction on fake tensors (nothing measured).
        predicted_outcome: a dry run's verdict (ok, oom; None without a capacity or when measured).
        wall_s: the worker's wall time (seconds), or None.
        spec, record, result: the three files as read (``record`` None when the worker wrote none;
            ``spec`` without the sweep's bookkeeping, ``conf.contract.SWEEP_TOKEN_KEY``).
        throughput: the warm phases' measured rates (``conf.contract.THROUGHPUT_KEYS``:
            ``samples_per_s``, ``tokens_per_s``, ``prefill_tokens_per_s``, ``decode_tokens_per_s``
            per second, ``noise_rel``, ``iterations``), timed on the run's device
            (``record["device_kind"]``); each None when not measured (a dry run, a failed run).
    """

    run_dir: Path
    outcome: str | None
    exit_code: int
    failed_phase: str | None
    error_type: str | None
    error_message: str | None
    peak: int | None
    peak_counter: str
    max_memory_allocated: int | None
    max_memory_reserved: int | None
    capacity_bytes: int | None
    dry_run: bool
    predicted_outcome: str | None
    wall_s: float | None
    spec: Mapping[str, Any]
    record: Mapping[str, Any] | None
    result: Mapping[str, Any]
    throughput: Mapping[str, Any] = field(default_factory=dict)

    def answer(self) -> str:
        """The run's answer as ``memsweep run`` prints it (``sweeper.answer.run_answer``): both
        peaks, the capacity and the headroom (an ok run's only), and the load it answered for.

        Returns:
            Its lines joined by newlines, no newline at the end: ``print(result.answer())``;
            ``.splitlines()`` gives the lines.
        """
        from .answer import run_answer

        return "\n".join(run_answer(self.spec, self.record))

    @classmethod
    def read(cls, run_dir: Path) -> RunResult:
        """The run in ``run_dir``, read from its files.

        Raises:
            FileNotFoundError: ``run_dir`` holds no ``result.json`` (no run ended there).
        """
        run_dir = Path(run_dir)
        result, problem = try_read(run_dir, RESULT_FILE)
        if result is None:
            raise FileNotFoundError(f"{run_dir}: no readable {RESULT_FILE} ({problem})")
        spec = dict(spec_settings(try_read(run_dir, SPEC_FILE)[0] or {}))
        record = try_read(run_dir, RECORD_FILE)[0]
        peak, counter = run_peak(record)
        phases = record_phases(record)
        return cls(
            run_dir=run_dir,
            outcome=result.get("outcome"),
            exit_code=run_exit_code(result),
            failed_phase=result.get("failed_phase"),
            error_type=result.get("error_type"),
            error_message=result.get("error_message"),
            peak=peak,
            peak_counter=counter,
            max_memory_allocated=phase_peak(phases, "max_memory_allocated"),
            max_memory_reserved=phase_peak(phases, "max_memory_reserved"),
            capacity_bytes=spec.get("capacity_bytes"),
            dry_run=bool(spec.get("dry_run")),
            predicted_outcome=result.get("predicted_outcome"),
            wall_s=result.get("wall_s"),
            spec=spec,
            record=record,
            result=result,
            throughput=run_throughput(record, result.get("outcome")),
        )


@dataclass(frozen=True)
class Tables:
    """A sweep's Parquet tables (``memsweep analyze``'s), as pandas DataFrames (raw bytes).

    Attributes:
        directory: where they were read.
        runs, phases, frontier: ``runs.parquet``, ``phases.parquet``, ``frontier.parquet``.
    """

    directory: Path
    runs: Any
    phases: Any
    frontier: Any


def tables_dir(sweep_dir: Path) -> Path:
    """Where a sweep's latest tables are: ``sweep_dir`` itself, or the latest of its
    ``analysis/<time>/`` (an analysis of a resumed sweep never overwrites the first).

    Raises:
        FileNotFoundError: none of them holds the tables (nothing analyzed: ``memsweep analyze DIR``).
    """
    from memsweep.analysis.outputs import OUTPUTS

    sweep_dir = Path(sweep_dir)
    candidates = [sweep_dir, *sorted((sweep_dir / "analysis").glob("*/"))]
    found = [d for d in candidates if all((d / name).is_file() for name in OUTPUTS)]
    if not found:
        raise FileNotFoundError(
            f"{sweep_dir}: no {', '.join(OUTPUTS)} (a sweep directory's tables; `memsweep analyze {sweep_dir}` "
            "writes them when it holds a sweep's runs)"
        )
    return found[-1]


def load_tables(sweep_dir: str | os.PathLike) -> Tables:
    """A sweep directory's tables (``runs``, ``phases``, ``frontier``) as pandas DataFrames, integer
    columns (bytes) as pandas' nullable ``Int64`` and booleans as ``boolean`` (a null stays ``<NA>``).

    Args:
        sweep_dir: a sweep directory a sweep (or ``memsweep analyze``) wrote the tables into; its
            latest ``analysis/<time>/`` when it holds several (``tables_dir``).

    Raises:
        FileNotFoundError: the directory does not exist or holds no tables (no ``SpecError``: the
            command line's exit 2 all the same).
    """
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    # integers stay integers, null stays missing (pandas' nullable dtypes, not floats with NaN)
    nullable = {pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}.get
    directory = tables_dir(Path(sweep_dir))
    read = {
        n: pq.read_table(directory / f"{n}.parquet").to_pandas(types_mapper=nullable)
        for n in ("runs", "phases", "frontier")
    }
    return Tables(directory, read["runs"], read["phases"], read["frontier"])


@dataclass(frozen=True)
class SweepResult:
    """A sweep: its directory, its tables, and the runs this process ran.

    Attributes:
        sweep_dir: the sweep directory.
        tables: its tables (``load_tables``), written when the sweep ended.
        runs: the runs ended in this process, in order (none when a launcher ran them elsewhere).
        report: the report's HTML file beside the tables, or None
            (``overrides=["hydra.callbacks.analyze.report=false"]``).
    """

    sweep_dir: Path
    tables: Tables
    runs: tuple[RunResult, ...]
    report: Path | None


@dataclass(frozen=True)
class FrontierResult:
    """The edge of one axis found by the frontier search, from its sweep's ``frontier.parquet``.

    Attributes:
        axis: batch, context or width.
        max_ok: the largest value that ran ok; None when none did.
        min_oom: the smallest value that ran out of memory; None when none did.
        exact: max_ok and min_oom are neighbours on the search's lattice.
        monotonic: no ok above an oom.
        upper_reached: the upper bound ran ok (the edge lies above it).
        stopped_by: what stopped the search before the edge (an error...), or None.
        search_status: the search's own words.
        runs_used: the runs it made.
        capacity_bytes: the capacity searched against (bytes), None for the device's own.
        max_ok_peak: the max_ok run's peak of the counter compared with the capacity (bytes), or None.
        margin_edge: the largest value whose measured peak leaves the report's margin (a real
            run; the value the report recommends), None when none was found.
        error_values: values whose run failed in setup (a shape the model refuses), stepped past.
        load: the load the edge holds for (the row's fixed settings, those not null).
        sweep: the sweep (its directory, tables and runs).
        max_ok_samples_per_s: the max_ok value's measured samples per second (the median of its ok
            runs, timed on the row's device), or None.
        margin_edge_samples_per_s: the margin edge's measured samples per second, or None.
        fastest: the value with the most measured samples per second (tokens per second along context),
            its label; or None.
        fastest_samples_per_s: its samples per second, or None.
    """

    axis: str
    max_ok: int | None
    min_oom: int | None
    exact: bool | None
    monotonic: bool | None
    upper_reached: bool | None
    stopped_by: str | None
    search_status: str | None
    runs_used: int | None
    capacity_bytes: int | None
    max_ok_peak: int | None
    margin_edge: int | None
    error_values: tuple[int, ...]
    load: Mapping[str, Any]
    sweep: SweepResult
    max_ok_samples_per_s: float | None = None
    margin_edge_samples_per_s: float | None = None
    fastest: str | None = None
    fastest_samples_per_s: float | None = None


# -- the API --------------------------------------------------------------------------------------


def run(
    *,
    overrides: Sequence[str] = (),
    run_dir: str | os.PathLike | None = None,
    progress: bool = True,
    model: str | Callable | None = None,
    inputs: str | Callable | None = None,
    loss: str | Callable | None = None,
    optimizer: str | Callable | None = None,
    train_step: str | Callable | None = None,
    **settings: Any,
) -> RunResult:
    """Measure one condition in a fresh worker process (``memsweep run``).

    Args:
        overrides: Hydra overrides, after the keyword settings (``["workload=transformer"]``).
        run_dir: the run directory (``hydra.run.dir``; it must not hold a run); None:
            ``<results_dir>/run/<time>``, as the command's.
        progress: show a progress bar; False: quiet, only warnings and errors shown (docs/api.md).
        model, inputs, loss, optimizer, train_step: a user workload's functions (module docstring).
        settings: memsweep's settings (``batch=2, device="cpu", capacity="256MiB"``).

    Returns:
        The run (``RunResult.read`` of its directory); an ``oom`` is a result, not an error.

    Raises:
        SpecError: bad input, naming the setting (nothing ran).
        RunDirError: ``run_dir`` already holds a run.
        SpecError: a user function that cannot be imported by name.
    """
    functions = dict(model=model, inputs=inputs, loss=loss, optimizer=optimizer, train_step=train_step)
    argv = load_overrides(settings, overrides, functions, lists=False)
    if run_dir is not None:
        argv.append(f"hydra.run.dir={override_value(os.fspath(run_dir))}")
    jobs, _ = _hydra(argv, multirun=False, progress=progress)
    if not jobs:
        raise RuntimeError(f"memsweep run {' '.join(argv)}: Hydra ran no job")
    return RunResult.read(jobs[-1].run_dir)


def _sweep(argv: list[str], sweep_dir: str | os.PathLike | None, progress: bool) -> SweepResult:
    """The multirun of ``argv`` in ``sweep_dir`` (None: the config's), read back as a ``SweepResult``."""
    if sweep_dir is not None:
        argv = [*argv, f"hydra.sweep.dir={override_value(os.fspath(sweep_dir))}"]
    jobs, found = _hydra(argv, multirun=True, progress=progress)
    directory = Path(sweep_dir).absolute() if sweep_dir is not None else found
    if directory is None:
        raise RuntimeError(f"memsweep sweep {' '.join(argv)}: no sweep directory (no job ran)")
    tables = load_tables(directory)
    report = tables.directory / "report.html"
    runs = tuple(RunResult.read(j.run_dir) for j in jobs if (j.run_dir / RESULT_FILE).is_file())
    return SweepResult(directory, tables, runs, report if report.is_file() else None)


def sweep(
    *,
    overrides: Sequence[str] = (),
    sweep_dir: str | os.PathLike | None = None,
    progress: bool = True,
    model: str | Callable | None = None,
    inputs: str | Callable | None = None,
    loss: str | Callable | None = None,
    optimizer: str | Callable | None = None,
    train_step: str | Callable | None = None,
    **settings: Any,
) -> SweepResult:
    """Sweep one variable at a time (``memsweep sweep``), then write the tables and the report.

    Args:
        overrides: Hydra overrides, after the keyword settings (``["hydra/launcher=joblib"]``).
        sweep_dir: the sweep directory (``hydra.sweep.dir``; the same one again resumes it);
            None: ``<results_dir>/<sweep>/<time>``, as the command's.
        progress: show a progress bar; False: quiet, only warnings and errors shown (docs/api.md).
        model, inputs, loss, optimizer, train_step: a user workload's functions (module docstring).
        settings: memsweep's settings; a list is swept (``sweep="none", batch=[1, 2, 4]``).

    Returns:
        The sweep.

    Raises:
        SpecError: bad input, naming the setting (nothing ran).
        SpecError: a user function that cannot be imported by name.
    """
    functions = dict(model=model, inputs=inputs, loss=loss, optimizer=optimizer, train_step=train_step)
    return _sweep(load_overrides(settings, overrides, functions, lists=True), sweep_dir, progress)


def frontier(
    axis: str = "batch",
    *,
    lower: int | None = None,
    upper: int | None = None,
    multiple_of: int | None = None,
    confirm: int | None = None,
    overrides: Sequence[str] = (),
    sweep_dir: str | os.PathLike | None = None,
    progress: bool = True,
    model: str | Callable | None = None,
    inputs: str | Callable | None = None,
    loss: str | Callable | None = None,
    optimizer: str | Callable | None = None,
    train_step: str | Callable | None = None,
    **settings: Any,
) -> FrontierResult:
    """Search the success/OOM edge of one axis (``memsweep sweep hydra/sweeper=frontier
    hydra.sweeper.axis=AXIS``), every probe a fresh worker process.

    Args:
        axis: batch, context or width.
        lower, upper, multiple_of: the values searched (``hydra.sweeper.*``); None: the sweeper's
            defaults (1, 65536, 1).
        confirm: ok runs repeated at the edge (``hydra.sweeper.confirm``); None: its default.
        overrides: Hydra overrides, after the keyword settings (``["hydra.sweeper.strategy=bisect"]``).
        sweep_dir: the sweep directory; None: the config's.
        progress: show a progress bar; False: quiet, only warnings and errors shown (docs/api.md).
        model, inputs, loss, optimizer, train_step: a user workload's functions (module docstring).
        settings: memsweep's settings (``capacity="256MiB", device="cpu"``).

    Returns:
        The edge, read from the sweep's ``frontier.parquet`` row of the searched axis.

    Raises:
        SpecError: bad input (an axis the search cannot walk, settings it refuses).
        SpecError: a user function that cannot be imported by name.
    """
    search = {"axis": axis, "lower": lower, "upper": upper, "multiple_of": multiple_of, "confirm": confirm}
    given = {f"hydra.sweeper.{k}": v for k, v in search.items() if v is not None}
    functions = dict(model=model, inputs=inputs, loss=loss, optimizer=optimizer, train_step=train_step)
    argv = ["hydra/sweeper=frontier", *settings_overrides(given, lists=False)]
    result = _sweep(argv + load_overrides(settings, overrides, functions, lists=False), sweep_dir, progress)
    return frontier_result(axis, result)


def frontier_result(axis: str, result: SweepResult) -> FrontierResult:
    """The ``FrontierResult`` of ``axis`` in a frontier sweep: its row of ``frontier.parquet``
    (read with pyarrow: integers stay ``int``), the one the search filled, of the full protocol
    when light probes made a row of their own.

    Raises:
        RuntimeError: the table has no row of ``axis``.
    """
    import pyarrow.parquet as pq

    rows = [r for r in pq.read_table(result.tables.directory / "frontier.parquet").to_pylist() if r["axis"] == axis]
    searched = [r for r in rows if r.get("search_status") is not None] or rows
    if not searched:
        raise RuntimeError(f"{result.sweep_dir}: frontier.parquet has no row of {axis}")
    row = max(searched, key=lambda r: (r.get("warmup") or 0, r.get("repeats") or 0))
    counter = peak_counters(device_kind_of(None, row.get("device")))[0]
    load = {k: v for k, v in row.items() if k in _identity() and v is not None and k != "sweep_dir"}
    return FrontierResult(
        axis=axis,
        max_ok=row["max_ok"],
        min_oom=row["min_oom"],
        exact=row["exact"],
        monotonic=row["monotonic"],
        upper_reached=row["upper_reached"],
        stopped_by=row["stopped_by"],
        search_status=row["search_status"],
        runs_used=row["runs_used"],
        capacity_bytes=row["capacity_bytes"],
        max_ok_peak=row.get(f"max_ok_{counter}"),
        margin_edge=row.get("margin_edge"),
        error_values=tuple(int(v) for v in (row.get("error_values") or "").split(",") if v),
        load=load,
        sweep=result,
        max_ok_samples_per_s=row.get("max_ok_samples_per_s"),
        margin_edge_samples_per_s=row.get("margin_edge_samples_per_s"),
        fastest=row.get("fastest_label"),
        fastest_samples_per_s=row.get("fastest_samples_per_s"),
    )


def _identity() -> tuple[str, ...]:
    """The frontier row's columns that name its load (``analysis.frontier.IDENTITY``)."""
    from memsweep.analysis.frontier import IDENTITY

    return IDENTITY


@dataclass(frozen=True)
class PredictResult:
    """The predicted edge of an axis on dry runs (``memsweep predict``; what ``predict.json`` holds).

    A prediction of live tensor bytes on fake tensors, not a measurement: ``blind_spots`` says
    what it cannot see.

    Attributes:
        axis: the axis predicted.
        capacity_bytes: the capacity (bytes).
        out_dir: the directory of the dry runs and of predict.json.
        max_fit: the largest value predicted to fit, or None.
        min_miss: the smallest value predicted not to fit, or None.
        exact: they are neighbours (or nothing fits), and no dry run failed.
        upper: the largest value searched; upper_reached: it fits (the edge lies above it).
        peak: the largest predicted phase peak at max_fit (bytes), or None.
        device: the device the dry runs were on (cpu, or cuda:N: fake CUDA tensors).
        error: the dry run that failed ({"value", "error_type", "error_message"...}), or None.
        exit_code: what ``memsweep predict`` exits with (``conf.contract.PREDICT_EXIT``).
        blind_spots: what a dry run cannot see.
        summary: predict.json as written (per-value runs, breakdown, peak split, estimator figures).
    """

    axis: str
    capacity_bytes: int
    out_dir: Path
    max_fit: int | None
    min_miss: int | None
    exact: bool
    upper: int
    upper_reached: bool
    peak: int | None
    device: str
    error: Mapping[str, Any] | None
    exit_code: int
    blind_spots: tuple[str, ...]
    summary: Mapping[str, Any]


def predict_exit_code(edge: PredictedEdge) -> int:
    """``memsweep predict``'s exit status for ``Predictor.search``'s answer (``PREDICT_EXIT``): a dry
    run failed, an edge predicted, or nothing fits."""
    if edge.error is not None:
        return PREDICT_EXIT["error"]
    return PREDICT_EXIT["edge"] if edge.max_fit is not None else PREDICT_EXIT["nothing_fits"]


def predict(
    axis: str = "batch",
    *,
    capacity: str | int,
    upper: int | None = None,
    overrides: Sequence[str] = (),
    model: str | Callable | None = None,
    inputs: str | Callable | None = None,
    loss: str | Callable | None = None,
    optimizer: str | Callable | None = None,
    train_step: str | Callable | None = None,
    **settings: Any,
) -> PredictResult:
    """Predict the edge of an axis on dry runs, no device used (``memsweep predict``,
    ``sweeper.predict.predict_edge``); each dry run a fresh worker process.

    Args:
        axis: batch, context or width.
        capacity: the capacity to fit in, with its unit (``"80GB"``, ``"2GiB"``, ``"4096B"``; a bare
            number is refused).
        upper: the largest value searched; None: the frontier sweeper's default.
        overrides: Hydra overrides of the load, after the keyword settings.
        model, inputs, loss, optimizer, train_step: a user workload's functions (module docstring).
        settings: the load's settings (those of ``run``; ``device="cpu"`` unless given).

    Returns:
        The prediction (predict.json is written in ``<results_dir>/predict/<time>``).

    Raises:
        SpecError: bad input (the axis, the capacity, ``upper``, the load).
        SpecError: a user function that cannot be imported by name.
    """
    from .predict import blind_spots, check_upper, predict_edge

    upper = None if upper is None else check_upper(upper)
    functions = dict(model=model, inputs=inputs, loss=loss, optimizer=optimizer, train_step=train_step)
    argv = load_overrides(settings, overrides, functions, lists=False)
    p = predict_edge(argv, axis, str(capacity), upper=upper)
    edge, at = p.edge, p.predictor.runs.get(p.edge.max_fit) if p.edge.max_fit is not None else None
    return PredictResult(
        axis=p.axis,
        capacity_bytes=p.capacity_bytes,
        out_dir=Path(p.out_dir),
        max_fit=edge.max_fit,
        min_miss=edge.min_miss,
        exact=edge.exact,
        upper=edge.upper,
        upper_reached=edge.upper_reached,
        peak=at["peak"] if at else None,
        device=p.predictor.device,
        error={k: v for k, v in edge.error.items() if k != "record"} if edge.error else None,
        exit_code=predict_exit_code(edge),
        blind_spots=tuple(blind_spots(p.predictor.device)),
        summary=p.summary,
    )


@dataclass(frozen=True)
class EstimateResult:
    """The calculated memory of a load (``memsweep estimate``): an estimate, not a measurement.

    Attributes:
        breakdown: bytes by component (``estimator.Breakdown``: ``weights``, ``gradients``,
            ``optimizer_states``, ``activations``, ``kv_cache``, ``temporaries``; None where not
            estimated), ``reserve`` (an assumption), ``peak`` and ``total``.
        title: what was estimated, in one line.
        phases: a workload estimate's phases (``--workload mlp``), else empty.
        text: what the command prints (its table; JSON with ``json=True``).
    """

    breakdown: Any
    title: str
    phases: tuple[Any, ...]
    text: str


def estimate_argv(parser: Any, options: Mapping[str, Any]) -> list[str]:
    """``memsweep estimate``'s command line for keyword options named as its parser's destinations
    (``parameters=7_000_000_000, bits=16, train=True, keep=["bf16:1000"]``; ``fmt`` is ``--format``,
    ``dropout=False`` is ``--no-dropout``).

    Raises:
        SpecError: an option the command does not have (field ``option``), a flag given other than
            True or False (field: the flag's name).
    """
    actions: dict[tuple[str, Any], Any] = {}
    for action in parser._actions:  # argparse's public surface has no mapping of destinations
        if action.option_strings:
            actions.setdefault((action.dest, action.const if action.nargs == 0 else None), action)
    argv: list[str] = []
    known = sorted({dest for dest, _ in actions if dest != "help"})
    for name, value in options.items():
        if name not in known:
            raise SpecError("option", name, "one of memsweep estimate's: " + ", ".join(known))
        if isinstance(value, bool) and (name, value) in actions:
            argv.append(actions[(name, value)].option_strings[0])
            continue
        if isinstance(value, bool) and (name, not value) in actions:
            continue  # the flag's default (train=False)
        action = actions.get((name, None))
        if action is None:  # a flag (train, mixed...) takes no value of its own
            raise SpecError(name, value, "True or False")
        if isinstance(value, (list, tuple)):
            argv += [x for v in value for x in (action.option_strings[0], str(v))]
        elif value is not None:
            argv += [action.option_strings[0], str(value)]
    return argv


def estimate_args(parser: argparse.ArgumentParser, options: Mapping[str, Any]) -> argparse.Namespace:
    """``parser``'s options parsed from keyword ``options`` (``estimate_argv``), a refusal raised
    rather than an exit.

    Raises:
        SpecError: an option the command does not have; a value its option refuses (an ``int``
            option given ``"many"``, a choice it does not offer), field: the option's keyword,
            accepted: its choices or its type.
    """
    from memsweep.estimator.errors import UsageError

    def refuse(message: str) -> Any:
        raise UsageError(message)

    parser.error = refuse  # type: ignore[method-assign]  # what argparse still reports this way
    parser.exit_on_error = False  # a bad value: argparse.ArgumentError, naming its option
    argv = estimate_argv(parser, options)
    try:
        return parser.parse_args(argv)
    except argparse.ArgumentError as exc:
        names = {"/".join(a.option_strings): a for a in parser._actions} | {
            s: a for a in parser._actions for s in a.option_strings
        }
        action = names.get(str(exc.argument_name))
        if action is None:
            raise estimate_refusal(exc, parser, options) from None
        types: dict[Any, str] = {int: "an integer", float: "a number"}
        # a type of the estimator's own (device_arg) says in its message what it takes
        accepted = types.get(action.type, exc.message.split("expected ", 1)[-1])
        if action.choices:
            accepted = "one of " + ", ".join(str(c) for c in action.choices)
        raise SpecError(action.dest, options.get(action.dest), accepted) from None
    except UsageError as exc:
        raise estimate_refusal(exc, parser, options) from None


def estimate_refusal(exc: Exception, parser: argparse.ArgumentParser, options: Mapping[str, Any]) -> SpecError:
    """The ``SpecError`` of options the estimator refuses (``UsageError``: options that do not
    describe one load; a ``ValueError``: a value it rejects), its reason kept in what is accepted.

    Returns:
        ``SpecError`` of the option given that the reason starts with (``parameters must be...``,
        ``--zero-stage partitions...``) or whose text it quotes (``unknown storage format 'xml'``),
        else of field ``options`` (all of them, as given).
    """
    reason = " ".join(str(exc).split())
    accepted = f"options that describe one load ({reason})"
    for name, value in options.items():
        spellings = {name, *(s for a in parser._actions if a.dest == name for s in a.option_strings)}
        if any(reason.startswith((f"{s} ", f"{s}:")) for s in spellings):
            return SpecError(name, value, accepted)
    for name, value in options.items():
        if isinstance(value, str) and repr(value) in reason:
            return SpecError(name, value, accepted)
    return SpecError("options", dict(options), accepted)


def estimate(**options: Any) -> EstimateResult:
    """Calculate the memory of a load before anything runs (``memsweep estimate``'s options as
    keywords, ``estimate_argv``; ``estimator.cli.estimate_load``). Standard library only.

    Args:
        options: e.g. ``parameters=7_000_000_000, bits=16, train=True``, or ``workload="mlp",
            batch=8, context=128, width=256, mode="train"``.

    Returns:
        The estimate.

    Raises:
        SpecError: an option the command does not have, a value its option refuses
            (``estimate_args``), options that do not describe one load or a value the estimator
            rejects (``estimate_refusal``): what ``memsweep estimate`` exits 2 for.
        FileNotFoundError: a ``config`` that does not exist.
    """
    from memsweep.estimator.cli import build_parser, estimate_load
    from memsweep.estimator.cli_output import estimate_text

    parser = build_parser()
    args = estimate_args(parser, options)
    try:
        b, title, phases = estimate_load(args)
    except SpecError:
        raise
    except ValueError as exc:  # UsageError too: the command's exit 2
        raise estimate_refusal(exc, parser, options) from None
    text = estimate_text(b, title, phases, json_output=args.json, decimals=args.decimals)
    return EstimateResult(b, title, tuple(phases), text)


@dataclass(frozen=True)
class CompareResult:
    """Sweeps of comparable loads side by side (``memsweep compare``).

    Attributes:
        sweeps: the sweep directories, baseline first.
        text: what the command prints (per value and phase the four counters and their differences).
        regressions: the peaks that grew beyond ``fail_above`` (``analysis.compare.Regression``:
            title, value, counter, base and other peak in bytes); empty without a gate.
        slowdowns: the values whose samples per second fell beyond ``fail_slower``
            (``analysis.compare.Slowdown``: title, value, base and other rate per second, noise,
            where timed); empty without that gate.
        comparable: some value could be compared.
        exit_code: what the command exits with (0, 1 a peak grew beyond ``fail_above`` or a rate
            fell beyond ``fail_slower``, 3 a gate had nothing to check).
        markdown, html: the document written into ``out`` (None without one).
        details: the comparison itself (``analysis.compare.CompareResult``: sweeps, differences,
            comparisons).
    """

    sweeps: tuple[Path, ...]
    text: str
    regressions: tuple[Any, ...]
    comparable: bool
    exit_code: int
    markdown: Path | None
    html: Path | None
    details: Any
    slowdowns: tuple[Any, ...] = ()


def compare(
    baseline: str | os.PathLike,
    *others: str | os.PathLike,
    fail_above: str | None = None,
    out: str | os.PathLike | None = None,
    counter: str = "allocated",
    fail_slower: str | None = None,
) -> CompareResult:
    """Compare sweeps with a baseline (``memsweep compare``, ``analysis.compare.compare``).

    Args:
        baseline: the baseline's sweep directory.
        others: the sweeps compared with it (at least one).
        fail_above: the gate: a value's run peak may grow by this much over the baseline's
            (``"5%"`` of it, or a size: ``"64MiB"``); None: no gate.
        out: write compare.md, compare_plots/ and compare.html here (never over existing files).
        counter: the peak ``fail_above`` reads: ``allocated`` (``max_memory_allocated``, the
            default) or ``reserved`` (``analysis.compare.GATE_COUNTERS``).
        fail_slower: the throughput gate: a value's samples per second may fall by this
            percentage of the baseline's (``"5%"``); None: no gate.

    Returns:
        The comparison.

    Raises:
        SpecError: no other sweep (field ``others``), a ``fail_above`` that is neither, a
            ``counter`` not allocated or reserved, a ``fail_slower`` that is no percentage.
        analysis.compare.SweepNotFound: a directory that does not exist (a FileNotFoundError).
        analysis.compare.EmptySweep: a directory without a measured run (a ValueError).
        analysis.report.ReportExists: ``out`` already holds a comparison.
    """
    from memsweep.analysis.compare import compare as compare_sweeps
    from memsweep.analysis.compare import compare_document, compare_text, parse_slower, parse_threshold, write_doc
    from memsweep.analysis.compare.cli import exit_code

    if not others:
        raise SpecError("others", others, "a baseline and at least one sweep to compare")
    threshold = parse_threshold(fail_above) if fail_above is not None else None
    slower = parse_slower(fail_slower) if fail_slower is not None else None
    paths = [Path(p) for p in (baseline, *others)]
    result = compare_sweeps(paths, threshold, counter, slower)
    md = html = None
    if out is not None:
        from memsweep.analysis.compare import plot

        md, html = write_doc(compare_document(result, threshold, fail_slower, plot), Path(out))
    return CompareResult(
        sweeps=tuple(paths),
        text=compare_text(result, threshold, fail_slower),
        regressions=tuple(result.regressions),
        comparable=any(c.rows for c in result.comparisons),
        exit_code=exit_code(result, threshold, fail_slower is not None),
        markdown=md,
        html=html,
        details=result,
        slowdowns=tuple(result.slowdowns),
    )
