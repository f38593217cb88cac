"""One condition, one fresh worker process: start it, bound it in time, read what it left.

The result envelope (result.json, written atomically once the process has ended) holds
the outcome: ``ok``, ``oom``, ``error`` (from the worker's complete record), ``crash``
(died by a signal, or left no complete or readable record) or ``timeout`` (killed by us
at ``timeout_s``). A missing result.json means the orchestrator itself died.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from worker.records import (RECORD_FILE, RESULT_FILE, SCHEMA_VERSION, SPEC_FILE, STDERR_FILE,
                            STDOUT_FILE, RecordError, RunSpec, classify_run, read_json, write_json_atomic)

log = logging.getLogger("memsweep")


class RunDirError(RuntimeError):
    """The run directory already holds a run: memsweep never overwrites one."""


def check_run_dir_free(run_dir: Path) -> None:
    """Raise RunDirError when ``run_dir`` already holds a spec, record or result."""
    for name in (RECORD_FILE, RESULT_FILE, SPEC_FILE):
        if (run_dir / name).exists():
            raise RunDirError(f"{run_dir / name} already exists: memsweep never overwrites a run; "
                              f"choose another directory (hydra.run.dir=...)")


def worker_env() -> dict:
    env = dict(os.environ)
    # Few malloc arenas keep the CPU capacity emulation (RLIMIT_DATA) about tensors, not arenas.
    env.setdefault("MALLOC_ARENA_MAX", "2")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def execute(spec: RunSpec, run_dir: Path) -> dict:
    """Run ``spec`` in a fresh ``python -m worker`` process inside ``run_dir``.

    Returns the result envelope (also written to run_dir/result.json): ``outcome``,
    ``failed_phase``, ``error_type``, ``error_message``, ``returncode``, ``signal``,
    ``timed_out``, ``wall_s``, ``worker_pid``, ``record_problem``.

    Raises:
        RunDirError: run_dir already holds a run (nothing is touched).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    check_run_dir_free(run_dir)
    write_json_atomic(run_dir / SPEC_FILE, spec.to_dict())
    t0 = time.monotonic()
    timed_out = False
    with open(run_dir / STDOUT_FILE, "wb") as out, open(run_dir / STDERR_FILE, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "worker", str(run_dir / SPEC_FILE)],
                                stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=run_dir,
                                env=worker_env(), start_new_session=True)
        try:
            returncode = proc.wait(timeout=spec.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            returncode = proc.wait()
    wall_s = time.monotonic() - t0
    record, problem = None, None
    try:
        record = read_json(run_dir / RECORD_FILE, "record")
    except RecordError as exc:
        problem = str(exc)
    outcome = classify_run(record, returncode, timed_out)
    failed_phase = error_type = error_message = None
    if outcome in ("oom", "error"):
        failed_phase, error_type, error_message = (record.get("failed_phase"), record.get("error_type"),
                                                   record.get("error_message"))
    elif outcome in ("crash", "timeout"):
        done = [p.get("name") for p in (record or {}).get("phases") or [] if isinstance(p, dict)]
        todo = [p for p in spec.phases if p not in done]
        failed_phase = todo[0] if todo and record is not None else None
        if record is not None and isinstance(record.get("current_phase"), str):
            failed_phase = record["current_phase"]  # the worker names the phase it started
        if returncode is not None and returncode < 0:
            error_type = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else None
        error_message = (f"killed after timeout_s={spec.timeout_s}" if timed_out
                         else f"worker exited with {returncode}" + (f"; {problem}" if problem else ""))
    result = {
        "schema_version": SCHEMA_VERSION, "outcome": outcome, "failed_phase": failed_phase,
        "error_type": error_type, "error_message": error_message, "returncode": returncode,
        "signal": -returncode if returncode is not None and returncode < 0 else None,
        "timed_out": timed_out, "wall_s": wall_s, "worker_pid": proc.pid, "record_problem": problem,
    }
    write_json_atomic(run_dir / RESULT_FILE, result)
    return result
