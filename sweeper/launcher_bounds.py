"""A launcher's pool bounded by what a launch can use, its idle workers bound to the orchestrator.

joblib's launcher starts ``hydra.launcher.n_jobs`` loky worker processes whatever the number of
jobs: ``n_jobs=100000`` for two conditions would start hundreds of interpreters, and a worker
that never gets a job never runs the owner guard of a job (``sweeper.owner``). Before each
launch, ``bound_launcher`` caps the pool at the jobs of that launch and at this node's usable
cores (each run is a process of its own, started by the sweep's fork server; a launcher worker
only waits on it), and names ``guard_launcher_worker`` as loky's initializer, so that every
worker, busy or idle, exits soon after the orchestrator dies.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from memsweep.conf.contract import usable_cores

from .owner import guard_launcher_worker

log = logging.getLogger("memsweep")

_ASKED = "_memsweep_n_jobs_asked"
"""The attribute of a joblib launcher that keeps the ``n_jobs`` the user asked for."""


def resolved_n_jobs(n_jobs: Any) -> int | None:
    """joblib's reading of ``n_jobs`` as a worker count (``effective_n_jobs``): N > 0 itself, -N
    the CPUs + 1 - N (at least 1); None for anything else (null, 0, not an integer: checked up
    front by ``sweeper.upfront.check_launcher_jobs``)."""
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs == 0:
        return None
    return n_jobs if n_jobs > 0 else max(1, (os.cpu_count() or 1) + 1 + n_jobs)


def worker_bound(n_jobs: Any, jobs: int) -> int | None:
    """How many launcher workers a launch of ``jobs`` jobs may start for ``n_jobs``: at most the
    jobs and the usable cores; None where ``n_jobs`` is no count (``resolved_n_jobs``)."""
    asked = resolved_n_jobs(n_jobs)
    if asked is None:
        return None
    return max(1, min(asked, jobs, usable_cores()))


def bound_launcher(launcher: Any, jobs: int) -> None:
    """Before a launch of ``jobs`` jobs: bound a joblib launcher's pool (``worker_bound``, said in
    the log when it is lowered) and make ``guard_launcher_worker`` its workers' initializer. Other
    launchers are left as they are (submitit_local is bounded by the sweepers, SLURM by its
    ``array_parallelism``).

    Args:
        launcher: the Hydra launcher (joblib's keeps its ``Parallel`` arguments in ``joblib``).
        jobs: the number of jobs about to be launched.
    """
    settings = getattr(launcher, "joblib", None)
    if not isinstance(settings, dict):
        return
    if not hasattr(launcher, _ASKED):
        setattr(launcher, _ASKED, settings.get("n_jobs"))
    asked = getattr(launcher, _ASKED)
    bound = worker_bound(asked, jobs)
    if bound is not None:
        if bound < (resolved_n_jobs(asked) or 0):
            log.info(
                "joblib: %d worker process(es) for %d job(s) on %d usable core(s) (hydra.launcher.n_jobs=%s)",
                bound,
                jobs,
                usable_cores(),
                asked,
            )
        settings["n_jobs"] = bound
    settings["initializer"] = guard_launcher_worker
