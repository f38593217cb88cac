"""Checks made at the start of every multirun, before the sweeper runs anything: the launcher's
settings, and every condition of a sweep by Hydra's basic sweeper (``hydra/sweeper=basic``),
which would otherwise compose and validate each job only when it reaches it, after earlier
jobs ran. memsweep's own sweepers (``sweeper.ovat``, ``sweeper.frontier_sweeper``) check their
conditions themselves.

``CheckBeforeLaunch`` (a Hydra callback, ``hydra.callbacks.checks`` in conf/config.yaml) runs
them at ``on_multirun_start``, before Hydra instantiates the sweeper: a refusal leaves nothing
behind (no sweep directory, no multirun.yaml) and ``sweeper.cli`` exits 2.
"""

from __future__ import annotations

import logging
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from memsweep.conf.contract import SpecError

from .errors import InputRefused
from .inputs import launcher_class
from .plain import plain_list
from .sweep_dir import check_job_name, check_resolvable, check_sweep_layout, claim_sweep_dir, sweep_identity

log = logging.getLogger("memsweep")

JOBLIB_N_JOBS = (
    "a non-zero integer, as joblib reads it: N > 0 worker processes, -1 one per CPU, -N all CPUs but N - 1 "
    "(at least one); null: one"
)
"""What ``hydra.launcher.n_jobs`` accepts (joblib's ``effective_n_jobs``: 0 "has no meaning")."""


def check_launcher_jobs(config: Any) -> None:
    """Refuse a joblib launcher's ``n_jobs`` that joblib would refuse only when the first batch
    is launched.

    Args:
        config: the multirun's composed config (``hydra.launcher``).

    Raises:
        SpecError: field ``hydra.launcher.n_jobs``: 0, or not an integer (``JOBLIB_N_JOBS``).
    """
    if launcher_class(OmegaConf.select(config, "hydra.launcher._target_", default=None)) != "JoblibLauncher":
        return
    n_jobs = OmegaConf.select(config, "hydra.launcher.n_jobs", default=None)
    if n_jobs is not None and (isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs == 0):
        raise SpecError("hydra.launcher.n_jobs", n_jobs, JOBLIB_N_JOBS)


def basic_sweep_jobs(config: DictConfig, config_loader: Any) -> list[list[str]]:
    """The overrides of each job Hydra's basic sweeper will launch, in its order: the cartesian
    product of the command line's sweeps and ``hydra.sweeper.params`` (``BasicSweeper``'s own
    expansion, ``split_arguments``).

    Args:
        config: the multirun's composed config (``hydra.overrides.task``, ``hydra.sweeper.params``).
        config_loader: Hydra's config loader (its override parser resolves group sweeps, ``glob``).

    Returns:
        One list of override lines per job.
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
    arguments = [f"{k}={v}" for k, v in params.items()]
    arguments += plain_list(config.hydra.overrides.task, resolve=False)
    parser = OverridesParser.create(config_loader=config_loader)
    batches = BasicSweeper.split_arguments(parser.parse_overrides(arguments), None)
    return [list(job) for batch in batches for job in batch]


def check_basic_sweep(config: DictConfig, config_loader: Any) -> int:
    """Compose and validate every job of a basic sweep (``sweeper.spec.checked_spec``), and the
    sweep's own settings (``sweeper.inputs.check_sweep_config``), before the first one runs.

    Args:
        config: the multirun's composed config.
        config_loader: Hydra's config loader (``load_sweep_config`` composes each job as the
            launcher will).

    Returns:
        The number of jobs checked.

    Raises:
        InputRefused: the first bad input, naming its field and the values accepted.
    """
    from .inputs import check_sweep_config
    from .spec import checked_spec

    try:
        check_sweep_config(config)
    except SpecError as exc:
        raise InputRefused(exc) from None
    jobs = basic_sweep_jobs(config, config_loader)
    for overrides in jobs:
        checked_spec(config_loader.load_sweep_config(config, overrides))
    return len(jobs)


class CheckBeforeLaunch(Callback):
    """Hydra callback (``hydra.callbacks.checks``): at the multirun's start, before the sweeper
    runs anything, ``check_launcher_jobs``, the sweep's size (``sweeper.sweep_size``), under
    Hydra's basic sweeper ``check_basic_sweep``, then the sweep directory (``sweeper.sweep_dir``:
    checked, locked, its manifest written); at a run's start, its job name."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Hydra's hook at the multirun's start (before the sweeper is instantiated).

        Args:
            config: the multirun's composed config.
            kwargs: Hydra's other arguments (unused).

        Raises:
            InputRefused: bad input (a ``BaseException``: Hydra's callback runner turns an
                ``Exception`` into a warning); ``sweeper.cli`` prints it and exits 2.
        """
        from hydra.core.global_hydra import GlobalHydra

        from .inputs import sweeper_kind
        from .sweep_size import check_sweep_size

        kind = sweeper_kind(OmegaConf.select(config, "hydra.sweeper._target_"))
        try:
            check_resolvable(config)
            check_launcher_jobs(config)
            check_sweep_size(config, product=kind == "basic")  # before any list of values is expanded
        except SpecError as exc:
            raise InputRefused(exc) from None
        if kind == "basic":
            count = check_basic_sweep(config, GlobalHydra.instance().config_loader())
            log.info("basic sweep: %d job(s) checked before the first one runs", count)
        try:  # the sweep directory last: claiming it writes its lock and manifest
            claim_sweep_dir(check_sweep_layout(config, per_job_subdir=kind != "frontier"), sweep_identity(config))
        except SpecError as exc:
            raise InputRefused(exc) from None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Hydra's hook at the start of ``memsweep run``: ``check_resolvable``, ``check_job_name``.

        Args:
            config: the composed config.
            kwargs: Hydra's other arguments (unused).

        Raises:
            InputRefused: an interpolation that cannot be resolved, a job name that is not a
                plain file name.
        """
        try:
            check_resolvable(config)
            check_job_name(config)
        except SpecError as exc:
            raise InputRefused(exc) from None
