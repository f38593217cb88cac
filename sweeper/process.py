"""One condition, one fresh worker process: start it, bound it in time, read what it left.

The result envelope (result.json, written atomically once the process has ended) holds
the outcome: ``ok``, ``oom``, ``error`` (from the worker's complete record), ``crash``
(died by a signal, or left no complete or readable record) or ``timeout`` (killed by us
at ``timeout_s``). A missing result.json means the orchestrator itself died.

How the process starts is apart: ``sweeper.launch`` (a new interpreter per run, the worker's
environment) and ``sweeper.forkserver_client`` (a fork from the fork server, the default).
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from filelock import FileLock

from memsweep.conf.contract import (
    DEFAULT_ISOLATION,
    EXIT_STATUS_FILE,
    FORK_SERVER_LOST,
    ISOLATION_ENV,
    ISOLATION_FORKSERVER,
    ISOLATION_SPAWN,
    ISOLATIONS,
    LAUNCHER_WORKER_LOST,
    RECORD_FILE,
    RESULT_FILE,
    SCHEMA_VERSION,
    SPEC_FILE,
    STDERR_FILE,
    STDOUT_FILE,
    SWEEP_TOKEN_KEY,
    RecordError,
    RunSpec,
    SpecError,
    classify_run,
    needs_dynamo,
    predicted_outcome,
    read_spec,
    remove_stale_temps,
    run_peak,
    try_read,
    write_json_atomic,
)

from .forkserver_client import SHARED_FORKSERVER_ENV, ForkServer, ForkServerLost, shared_name, shared_server
from .kept_runs import wait_for_kept_run
from .launch import WorkerExit, run_spawn, worker_env
from .liveness import wait_for_old_worker
from .owner import stop_if_orphaned

log = logging.getLogger("memsweep")
LOCK_FILE = ".run.lock"
ORPHAN_GRACE_S = 1.0
"""After a lost fork server, how long a launcher worker looks for its orchestrator's death before
it runs the run again (seconds; ``sweeper.owner.stop_if_orphaned``)."""
RUN_FILES = (SPEC_FILE, RECORD_FILE, RESULT_FILE, EXIT_STATUS_FILE)
"""The JSON files of a run directory, each written atomically (``conf.contract.write_json_atomic``)."""


class RunDirError(RuntimeError):
    """The run directory already holds a run: memsweep never overwrites one."""


def check_run_dir_free(run_dir: Path) -> None:
    """Raise RunDirError when ``run_dir`` already holds a spec, record or result."""
    for name in (RECORD_FILE, RESULT_FILE, SPEC_FILE):
        if (run_dir / name).exists():
            raise RunDirError(
                f"{run_dir / name} already exists: memsweep never overwrites a run; "
                f"choose another directory (hydra.run.dir=...)"
            )


def _result(
    spec: RunSpec,
    run_dir: Path,
    returncode: int | None,
    timed_out: bool,
    wall_s: float | None,
    pid: int | None,
    lost: str | None = None,
) -> dict:
    """Classify what the worker left in ``run_dir`` and write result.json atomically.
    ``lost``: why the worker's exit status never came (ForkServerLost), for a crash's message.
    ``outcome`` is the worker process's; a dry run's verdict (its predicted peak against the
    capacity, ``conf.contract.predicted_outcome``) is ``predicted_outcome`` (None when measured)."""
    record, problem = try_read(run_dir, RECORD_FILE)
    outcome = classify_run(record, returncode, timed_out)
    failed_phase = error_type = error_message = None
    if outcome in ("oom", "error") and record is not None:  # classify_run reads both from a record
        failed_phase, error_type, error_message = (
            record.get("failed_phase"),
            record.get("error_type"),
            record.get("error_message"),
        )
    elif outcome in ("crash", "timeout"):
        done = [p.get("name") for p in (record or {}).get("phases") or [] if isinstance(p, dict)]
        todo = [p for p in spec.phases if p not in done]
        failed_phase = todo[0] if todo and record is not None else None
        if record is not None and isinstance(record.get("current_phase"), str):
            failed_phase = record["current_phase"]  # the worker names the phase it started
        if returncode is not None and returncode < 0:
            error_type = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else None
        error_message = (
            f"killed after timeout_s={spec.timeout_s}"
            if timed_out
            else f"worker exited with {returncode}" + (f"; {problem}" if problem else "")
        )
        if lost is not None:
            error_type, error_message = FORK_SERVER_LOST, lost + (f"; {problem}" if problem else "")
    result = {
        "schema_version": SCHEMA_VERSION,
        "outcome": outcome,
        "failed_phase": failed_phase,
        "error_type": error_type,
        "error_message": error_message,
        "returncode": returncode,
        "signal": -returncode if returncode is not None and returncode < 0 else None,
        "timed_out": timed_out,
        "wall_s": wall_s,
        "worker_pid": pid,
        "record_problem": problem,
        "predicted_outcome": (
            predicted_outcome(outcome, run_peak(record)[0], spec.capacity_bytes) if spec.dry_run else None
        ),
    }
    remove_stale_temps(run_dir, RUN_FILES)  # the worker has ended: a temporary file left is a killed write's
    write_json_atomic(run_dir / RESULT_FILE, result)
    return result


def stored_spec(run_dir: Path) -> RunSpec | None:
    """The spec ``run_dir`` holds (spec.json, ``conf.contract.read_spec``), or None when it holds
    none.

    Raises:
        RunDirError: an unreadable or invalid spec.json.
    """
    try:
        return read_spec(run_dir)
    except (RecordError, SpecError) as exc:
        raise RunDirError(f"{run_dir} holds an unreadable spec.json ({exc}); memsweep never overwrites a run") from None


def check_resumable(spec: RunSpec, run_dir: Path) -> None:
    """Raise RunDirError when ``run_dir`` holds another condition's spec (or an unreadable one):
    a sweep resumed in its directory must be the same sweep. Nothing is written."""
    old = stored_spec(run_dir)
    if old is not None and old != spec:
        raise RunDirError(
            f"{run_dir / SPEC_FILE} already exists for another condition: memsweep never "
            f"overwrites a run; choose another directory"
        )


def _resume(spec: RunSpec, run_dir: Path) -> dict | None:
    """A run directory left by an earlier attempt at the same spec.

    Returns the stored result when the run ended (it is not run twice); takes over a run whose
    launcher worker died while it ran and whose fork-server handler kept it (waits for it to
    end, then builds its result from the exit status the handler wrote, ``EXIT_STATUS_FILE``);
    finalizes a run whose worker ended but whose orchestrator died before writing result.json;
    otherwise (the worker died mid-run, or the run was lost with the launcher's worker, result
    error_type ``LAUNCHER_WORKER_LOST``) moves the partial files into ``.attempts/N/`` (kept, and
    skipped by the analysis) and returns None so the run starts afresh. The earlier worker is
    waited for (at most ``timeout_s``; a kept run's status ``HANDOVER_S`` more, ``sweeper.kept_runs``)
    only while its pid still names that process (``sweeper.liveness``).

    Raises:
        RunDirError: the directory holds a different spec, or an unreadable one.
    """
    check_resumable(spec, run_dir)
    if (run_dir / RESULT_FILE).exists():
        result, _ = try_read(run_dir, RESULT_FILE)
        if result is not None and result.get("error_type") == LAUNCHER_WORKER_LOST:  # not the load's: again
            target = _set_attempt_aside(run_dir)
            log.warning("%s: lost with the launcher's worker; its files are kept in %s, running again", run_dir, target)
            return None
        if result is not None:
            remove_stale_temps(run_dir, RUN_FILES)  # a dead writer's (its run is over: no live one writes here)
            return {**result, "resumed": True}
        # a torn result cannot exist (atomic writes); an unreadable one is re-derived below
    record, _ = try_read(run_dir, RECORD_FILE)
    pid = (record or {}).get("pid")
    kept = (run_dir / EXIT_STATUS_FILE).exists()
    status = wait_for_kept_run(run_dir, record, spec.timeout_s)
    if status is None and not kept and record is not None and wait_for_old_worker(record, spec.timeout_s, run_dir):
        record, _ = try_read(run_dir, RECORD_FILE)  # the worker ended (or the pid is another's now)
        status = wait_for_kept_run(run_dir, record, 0)  # its handler may have taken it over meanwhile
    if status is not None:  # kept by its fork-server handler after the process that asked for it died
        log.warning(
            "%s: the process that asked for this run died while it ran; the run went on, taken over, not run again",
            run_dir,
        )
        returncode, timed_out, wall_s = status.get("returncode"), bool(status.get("timed_out")), status.get("wall_s")
        return {**_result(spec, run_dir, returncode, timed_out, wall_s, status.get("worker_pid")), "resumed": True}
    if record is not None and record.get("complete"):
        return {**_result(spec, run_dir, record.get("exit_code"), False, None, pid), "resumed": True}
    target = _set_attempt_aside(run_dir)
    log.warning("%s: an earlier attempt died mid-run; its files are kept in %s, running again", run_dir, target)
    return None


def _set_attempt_aside(run_dir: Path) -> Path:
    """Move an unfinished attempt's files (record, a lost run's result or exit status, stdout, stderr)
    into ``.attempts/N/`` (kept, and skipped by the analysis), so the run can start afresh; returns
    that directory."""
    remove_stale_temps(run_dir, RUN_FILES)  # the attempt's killed writes
    attempts = run_dir / ".attempts"
    n = len(list(attempts.iterdir())) + 1 if attempts.is_dir() else 1
    target = attempts / str(n)
    target.mkdir(parents=True)
    for name in (RECORD_FILE, RESULT_FILE, EXIT_STATUS_FILE, STDOUT_FILE, STDERR_FILE):
        if (run_dir / name).exists():
            os.replace(run_dir / name, target / name)
    return target


def execute(
    spec: RunSpec,
    run_dir: Path,
    resume: bool = True,
    isolation: str = DEFAULT_ISOLATION,
    extra_env: dict | None = None,
    sweep_token: str | None = None,
) -> dict:
    """Run ``spec`` in a fresh ``python -m memsweep.worker`` process inside ``run_dir``.

    Returns the result envelope (also written to run_dir/result.json): ``outcome``,
    ``failed_phase``, ``error_type``, ``error_message``, ``returncode``, ``signal``,
    ``timed_out``, ``wall_s``, ``worker_pid``, ``record_problem``, ``predicted_outcome`` (a dry
    run's verdict, ``conf.contract.predicted_outcome``: ok, oom when the predicted peak is above
    the capacity, None without a capacity; None for a measured run: ``outcome`` stays the worker
    process's) (and ``resumed: True`` when it was found rather than run).

    With ``resume`` (a sweep started again on the same directory), a directory holding the
    same spec is resumed (see ``_resume``): a finished run is never run twice.

    ``isolation``: ``spawn`` starts a new interpreter per run (from the sweep's fork server's
    handler when the sweep shares one, see ``_run_spawn``); ``forkserver`` forks each run
    from a server process that imported torch but never touched a device (every run is
    still a new process with its own CUDA context and allocator; the worker checks that no
    CUDA context exists when it starts). ``extra_env``: variables for the worker only
    (a device lease's CUDA_VISIBLE_DEVICES, MEMSWEEP_CPU_CORES). ``sweep_token``: the token of
    the run's entry in its sweep's manifest (``conf.contract.register_run``), written into a new
    spec.json beside the spec's fields (``conf.contract.SWEEP_TOKEN_KEY``; a resumed run's spec.json
    already holds it); None: none written.

    Raises:
        RunDirError: run_dir already holds a run of another spec, or any run when not
            resuming (nothing is touched).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    # Two orchestrators on one directory (a sweep started twice, a requeued cluster job): the
    # second waits for the first's run to end, then finds its result instead of running it again.
    with FileLock(run_dir / LOCK_FILE):
        return _execute_locked(spec, run_dir, resume, isolation, extra_env, sweep_token)


def _execute_locked(
    spec: RunSpec, run_dir: Path, resume: bool, isolation: str, extra_env: dict | None, sweep_token: str | None
) -> dict:
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation={isolation!r}: expected one of {', '.join(ISOLATIONS)}")
    if resume and (run_dir / SPEC_FILE).exists():
        found = _resume(spec, run_dir)
        if found is not None:
            return found
    else:
        check_run_dir_free(run_dir)
        token = {SWEEP_TOKEN_KEY: sweep_token} if sweep_token is not None else {}
        write_json_atomic(run_dir / SPEC_FILE, {**spec.to_dict(), **token})
    env = worker_env({**(extra_env or {}), ISOLATION_ENV: isolation})
    start = _run_forkserver if isolation == ISOLATION_FORKSERVER else _run_spawn
    try:
        returncode, timed_out, pid, wall_s = start(run_dir, env, spec)
    except ForkServerLost as exc:  # not the load's doing: once more, from a fork server that lives
        stop_if_orphaned(f"{run_dir}: {exc}; not run again", ORPHAN_GRACE_S)  # gone with the orchestrator: stop
        target = _set_attempt_aside(run_dir)
        log.warning("%s: %s; its files are kept in %s, running again", run_dir, exc, target)
        again = start if isolation == ISOLATION_FORKSERVER else run_spawn  # a spawned run needs no server
        try:
            returncode, timed_out, pid, wall_s = again(run_dir, env, spec)
        except ForkServerLost as again:
            return _result(
                spec, run_dir, None, False, None, again.pid, lost=f"{again} (twice; isolation=spawn needs no server)"
            )
    return _result(spec, run_dir, returncode, timed_out, wall_s, pid)


_FORKSERVER = ForkServer()


def share_fork_server(isolation: str) -> None:
    """In a sweep's main process, before the launcher starts: start the fork server now and name
    its socket in the environment (``MEMSWEEP_FORKSERVER``), so that the launcher's worker
    processes (joblib's loky workers, submitit_local's jobs) start their runs from this one
    server: with ``isolation=forkserver`` they fork them from it instead of each importing torch
    into a server of its own; with ``isolation=spawn`` its handlers start the new interpreters
    (the server imports no torch). Either way a run belongs to this process's server, not to the
    launcher worker that asked for it, and outlives that worker (``worker.forkserver``). The
    server still dies with this process."""
    os.environ[SHARED_FORKSERVER_ENV] = shared_name(_FORKSERVER.start(preload=isolation == ISOLATION_FORKSERVER))


def _run_forkserver(run_dir: Path, env: dict, spec: RunSpec) -> WorkerExit:
    """A fresh process forked from a server that imported torch once (worker/forkserver.py)."""
    return _FORKSERVER.run(run_dir, env, spec.timeout_s, needs_dynamo(spec))


def _run_spawn(run_dir: Path, env: dict, spec: RunSpec) -> WorkerExit:
    """A new interpreter (``python -m memsweep.worker SPEC``): started by a handler of the sweep's shared
    server when this process has one (``share_fork_server``; the run then outlives a killed
    launcher worker), else by this process (``sweeper.launch.run_spawn``)."""
    if shared_server() is None:
        return run_spawn(run_dir, env, spec)
    return _FORKSERVER.run(run_dir, env, spec.timeout_s, dynamo=False, isolation=ISOLATION_SPAWN)
