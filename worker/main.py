"""The worker process: ``python -m memsweep.worker SPEC.json`` measures one condition.

The work is done by ``plan.py``, ``protocol.py`` (``run_phase``), ``measure.py`` (``measure``),
``environment.py``, ``counters/`` and ``workloads/``.

Exit codes: 0 ok, 2 PyTorch or the asked-for device (or dtype on it) unavailable, nothing
measured; 3 a phase ran out of memory; 4 a phase raised another error; 5 bad spec.

``--probe DEVICE`` prints a JSON description of DEVICE (``auto``: cuda:0 when a GPU is visible,
else cpu), so that the sweeper's own process never initialises CUDA; ``--env DEVICE`` prints the
environment report of DEVICE; ``--count-params PATH ...`` counts the parameters of local configs
(``count.py``); ``--check-user WORKLOAD_JSON`` checks a user workload's ``train_step`` call.

This module imports no torch: ``measure`` imports it, and records its absence.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from memsweep.conf.contract import (
    EXIT_BAD_SPEC,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    PARENT_ENV,
    RECORD_FILE,
    RecordError,
    RunSpec,
    SpecError,
    ranks_are_tasks,
    read_json,
)

from .environment import env_report, probe
from .lifecycle import children_die_with_me, die_with_parent, parent_from_env
from .measure import Recorder, measure, run_shape


def main(argv: list[str] | None = None) -> int:
    """The worker's command line: ``SPEC.json``, ``--probe DEVICE``, ``--env DEVICE``,
    ``--count-params PATH ...`` or ``--check-user WORKLOAD_JSON``.

    Args:
        argv: the arguments (``sys.argv[1:]`` when None).

    Returns:
        The exit code (``conf.contract.EXIT_*``): for a spec, ``measure``'s, or ``EXIT_BAD_SPEC``
        (5) for a bad command line, an unreadable or invalid spec, or a record already there
        (never overwritten); for ``--probe``, 0 when torch is installed, else 2; for ``--env``,
        0 when the device is available, else 2; for ``--check-user``, 0 when the train step can be
        called, else 5 (the JSON answer names the field). Printing is done here (JSON on stdout, errors
        on stderr).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    die_with_parent(parent_from_env(os.environ.get(PARENT_ENV)))
    children_die_with_me()
    code = _query(argv)
    if code is not None:
        return code
    if len(argv) != 1:
        print(
            "usage: python -m memsweep.worker SPEC.json | --probe DEVICE | --env DEVICE "
            "| --count-params PATH [PATH ...] | --check-user WORKLOAD_JSON",
            file=sys.stderr,
        )
        return EXIT_BAD_SPEC
    return _run(Path(argv[0]))


def _query(argv: list[str]) -> int | None:
    """Answer ``--probe``, ``--env``, ``--count-params`` or ``--check-user`` (JSON on stdout) and
    return the exit code; None when ``argv`` is none of them."""
    if len(argv) == 2 and argv[0] == "--probe":
        info = probe(argv[1])
        print(json.dumps(info))
        return EXIT_OK if info.get("torch") else EXIT_UNAVAILABLE
    if len(argv) == 2 and argv[0] == "--env":
        info = env_report(argv[1])
        print(json.dumps(info))
        return EXIT_OK if info.get("available") else EXIT_UNAVAILABLE
    if len(argv) >= 2 and argv[0] == "--count-params":
        from .count import count_main  # imports torch (and transformers, if installed)

        answer = count_main(argv[1:])
        print(json.dumps(answer))
        return EXIT_OK if "error" not in answer else EXIT_UNAVAILABLE
    if len(argv) == 2 and argv[0] == "--check-user":
        from .workloads.user import check_user_targets  # imports torch and the user's module

        answer = check_user_targets(json.loads(argv[1]))
        print(json.dumps(answer, default=str))
        return EXIT_OK if answer.get("ok") else EXIT_BAD_SPEC
    return None


def _run(spec_path: Path) -> int:
    """Measure the run of ``spec_path`` (its record.json beside it); returns the exit code."""
    rec = Recorder(spec_path.parent / RECORD_FILE, None)
    try:
        raw = read_json(spec_path, "spec")
        rec.data["spec"] = raw
        spec = RunSpec.from_dict(raw)
        rec.data["train_step"] = spec.train_step
        rec.data.update(run_shape(spec))  # world_size, parallel, global_batch: every run, parallel or not
        if spec.dry_run:  # the Recorder starts as "measured"
            rec.data["source"] = "predicted"
    except (RecordError, SpecError) as exc:
        print(f"memsweep worker: {exc}", file=sys.stderr)
        if spec_path.parent.is_dir() and not rec.path.exists():
            rec.finish("error", EXIT_BAD_SPEC, exc=exc)
        return EXIT_BAD_SPEC
    if ranks_are_tasks(spec):  # ranks as SLURM tasks
        from .ranks import task_rank, task_rendezvous

        try:
            task = task_rendezvous(spec)
        except SpecError:  # measure_ranks records it (below)
            task = None
        if task is not None and task["RANK"] != "0":  # rank 0's task owns record.json
            return task_rank(spec, spec_path.parent, task)
    if rec.path.exists():
        print(f"memsweep worker: {rec.path} already exists; refusing to overwrite a record", file=sys.stderr)
        return EXIT_BAD_SPEC
    rec.save()
    if spec.parallel != "none":  # world_size rank processes, their records merged into this one
        from .ranks import measure_ranks

        return measure_ranks(spec, rec)
    return measure(spec, rec)
