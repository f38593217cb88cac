"""One-variable-at-a-time Sweeper for Hydra (``hydra/sweeper=ovat``, memsweep's default).

Hydra's basic sweeper runs the cartesian product of its sweep overrides. A memory sweep
changes **one variable at a time** with everything else at the baseline: the axes come
from the ``sweep`` config group (``sweep.axes: {batch: [1, 2, 4], context: [...]}``) and
from command-line sweep overrides (``batch=1,2,4``), and the conditions are their union,
the baseline run once. Every condition is composed and validated before the first one is
launched, then all of them go to ``self.launcher`` in one batch, largest first
(``launch_order``), so the basic, joblib and submitit launchers all work unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import MISSING, DictConfig, OmegaConf

from memsweep.conf.contract import AXES, SPEC_FILE, SpecError, check_axis_read

from .errors import InputRefused
from .plain import plain_dict

log = logging.getLogger("memsweep")


@dataclass
class OvatSweeperConf:
    """The settings of ``hydra/sweeper=ovat`` (``hydra.sweeper.*``), registered by the plugin
    shim ``hydra_plugins.memsweep.memsweep_sweepers``; ``order`` is checked by ``launch_order``.

    ``_target_`` (the plugin class Hydra instantiates) is filled in by the shim from the class
    itself when it registers this node: this module cannot import the shim, which imports it.
    """

    _target_: str = MISSING
    # Launch at most this many conditions per launcher call (None: all at once).
    max_batch_size: int | None = None
    # The order of the jobs: "largest_first" (by batch x context x width, see launch_order) or
    # "given" (the axes' order, as planned).
    order: str = "largest_first"


ORDERS = ("largest_first", "given")


def launch_order(specs: Sequence, order: str = "largest_first") -> list[int]:
    """Indices of ``specs`` (RunSpecs) in the order their jobs are launched.

    ``largest_first``: by ``batch * context * width`` (the size of the activations; the time
    of a run grows with it on every built-in workload), largest first, ties in the given
    order. A launcher that runs jobs concurrently (joblib, submitit arrays) then ends its
    workers together instead of leaving the largest, slowest runs alone at the end: the
    longest-processing-time-first rule (R. L. Graham, "Bounds on multiprocessing timing
    anomalies", SIAM J. Appl. Math. 17(2), 1969: makespan within 4/3 of the optimum). It also
    shows the OOMs, if any, first. ``given``: as planned. The order is a pure function of the
    conditions, so a resumed sweep numbers its jobs as the interrupted one did.

    Raises:
        SpecError: ``order`` not in ORDERS.
    """
    if order not in ORDERS:
        raise SpecError("hydra.sweeper.order", order, " or ".join(ORDERS))
    indices = list(range(len(specs)))
    if order == "given":
        return indices
    return sorted(indices, key=lambda i: -specs[i].batch * specs[i].context * specs[i].width)


def plan_conditions(axes: dict, baseline: dict) -> list[tuple[str, str]]:
    """The (axis, value) pairs of a one-variable-at-a-time sweep, in order, baseline once.

    ``axes`` maps an axis name to its list of values; ``baseline`` maps each axis to its
    baseline value. A value equal to the baseline becomes ``("", "")`` (the baseline run),
    which appears once, where it first occurs.

    Raises:
        SpecError: an axis not in AXES, or an empty list of values.
    """
    conditions: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for axis, values in axes.items():
        if axis not in AXES:
            raise SpecError("sweep.axes", axis, "axes among " + ", ".join(AXES))
        if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__") or not list(values):
            raise SpecError(f"sweep.axes.{axis}", values, "a non-empty list of values")
        for value in values:
            key = ("", "") if str(value) == str(baseline.get(axis)) else (axis, str(value))
            if key not in seen:
                seen.add(key)
                conditions.append(key)
    return conditions


class OvatSweeperImpl:
    """The logic of ``hydra_plugins.memsweep.memsweep_sweepers.OvatSweeper`` (Hydra loads
    plugin classes only from the hydra_plugins package; the shim delegates here)."""

    def __init__(self, max_batch_size: int | None = None, order: str = "largest_first") -> None:
        self.max_batch_size = max_batch_size
        self.order = order
        # set by setup(), which Hydra calls before sweep()
        self.config: DictConfig
        self.launcher: Launcher
        self.hydra_context: HydraContext

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Hydra's Sweeper.setup: keep the config and context, instantiate the launcher."""
        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def job_overrides(self, arguments: list[str]) -> list[list[str]]:
        """Overrides of every condition: the fixed arguments plus one ``axis=value``."""
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        fixed, cli_axes = [], {}
        for override in parser.parse_overrides(arguments):
            if override.is_sweep_override():
                if not override.is_discrete_sweep():
                    raise SpecError(
                        override.get_key_element(),
                        override.input_line,
                        "a list of values (a=1,2,4) for the ovat sweeper",
                    )
                cli_axes[override.get_key_element()] = list(override.sweep_string_iterator())
            else:
                fixed.append(str(override.input_line))
        sweep = self.config.get("sweep")
        axes_cfg = sweep.get("axes") if sweep is not None else None
        axes = plain_dict(axes_cfg, resolve=True) if axes_cfg else {}
        axes.update(cli_axes)
        baseline = {axis: self.config.get(axis) for axis in AXES}
        planned = plan_conditions(axes, baseline)
        self.planned = planned
        return [fixed + ([f"{axis}={value}"] if axis else []) for axis, value in planned]

    def conditions(self, batches: list[list[str]]) -> list[DictConfig]:
        """Each condition's config, for validation: the composed baseline with its one
        ``axis=value`` set, the value typed by Hydra's override parser, interpolations left for
        ``spec_from_config`` to resolve. The same config a full Hydra compose of the
        condition gives (the axes are plain top-level keys and every other override is already
        in the baseline), at a fraction of its cost (a compose takes about 0.4 s); of the ``hydra``
        node only the launcher's ``_target_`` is kept."""
        parser = OverridesParser.create()
        base = plain_dict(self.config, resolve=False)
        base.pop("hydra", None)
        # the launcher, which decides whether ranks may be SLURM tasks (sweeper.inputs.check_task_ranks)
        base["hydra"] = {"launcher": {"_target_": OmegaConf.select(self.config, "hydra.launcher._target_")}}
        out = []
        for overrides in batches:
            data = dict(base)
            for line in overrides:  # the axis, and fixed axis overrides already in the baseline
                override = parser.parse_override(line)
                if override.get_key_element() in AXES:
                    data[override.get_key_element()] = override.value()
            out.append(OmegaConf.create(data))
        return out

    def resume_numbers(self, sweep_dir: Path, batches: list, specs: list) -> tuple[list, list]:
        """A sweep started again on its directory must be the same sweep, and keeps the job
        numbers it was started with whatever order it is launched in now (``hydra.sweeper.order``
        changed, or a memsweep that ordered otherwise): each condition whose spec a job directory
        holds goes back to that number (``hydra.sweep.subdir`` = the job number, the default),
        the others fill the free numbers in launch order. Checked before anything is written
        (multirun.yaml included).

        Args:
            sweep_dir: the sweep directory.
            batches: each condition's overrides, in launch order.
            specs: each condition's spec, in the same order.

        Returns:
            (batches, specs), reordered so that each condition found keeps its job number.

        Raises:
            InputRefused: a job directory holds a condition of another sweep, or an unreadable
                spec (``sweeper.cli`` prints it and exits 2).
        """
        from .process import RunDirError, stored_spec

        subdir = plain_dict(self.config.hydra.sweep, resolve=False).get("subdir")
        if subdir != "${hydra.job.num}" or not sweep_dir.is_dir():
            return batches, specs
        placed: dict[int, int] = {}  # condition -> the job number its directory has
        try:
            # every job directory there, also those past this sweep's count (a larger sweep's)
            numbers = sorted({int(p.name) for p in sweep_dir.iterdir() if p.name.isdigit()} | set(range(len(specs))))
            for number in numbers:
                found = stored_spec(sweep_dir / str(number))
                if found is None:
                    continue
                if found not in specs or specs.index(found) in placed or number >= len(specs):
                    raise RunDirError(
                        f"{sweep_dir / str(number) / SPEC_FILE} already exists for another condition: "
                        f"memsweep never overwrites a run; choose another directory"
                    )
                placed[specs.index(found)] = number
        except RunDirError as exc:
            raise InputRefused(
                exc, "this directory holds a different sweep; resuming needs the same conditions"
            ) from None
        if all(condition == number for condition, number in placed.items()):
            return batches, specs
        free = iter(n for n in range(len(specs)) if n not in placed.values())
        order: list[int] = [0] * len(specs)
        for condition in range(len(specs)):
            order[placed[condition] if condition in placed else next(free)] = condition
        log.info("resuming with the job numbers this directory was started with")
        return [batches[c] for c in order], [specs[c] for c in order]

    def check_baseline(self) -> None:
        """Refuse an invalid baseline, unless no condition runs it and its only fault is the
        value of the one axis swept (``sweep=none dtype=float16,bfloat16 precision=autocast``:
        the baseline's dtype=float32 cannot go with autocast, but every condition replaces it).
        A value the user typed for the swept axis itself (``batch=0 sweep=batch``) is refused:
        every condition would silently override it.

        Raises:
            InputRefused: the baseline refused, naming the field and (in its note) the way out;
                ``sweeper.cli`` prints it and exits 2.
        """
        from .spec import launch_settings, spec_from_config

        try:
            launch_settings(self.config)
            spec_from_config(self.config)
            return
        except SpecError as exc:
            error = exc
        axes = {axis for axis, _ in getattr(self, "planned", [])}
        if len(axes) == 1 and "" not in axes and error.field not in axes:
            log.info("the baseline (%s) is not one of the conditions and is not run", error)
            return
        note = None
        if len(axes - {""}) == 1 and error.field not in axes:
            (axis,) = axes - {""}
            note = (
                f"this is the sweep's baseline, {axis}={self.config.get(axis)} from conf/config.yaml, which the "
                f"sweep also runs because a value of {axis} equals it: leave {axis}={self.config.get(axis)} out of "
                f"the list and the other values run without it"
            )
        raise InputRefused(error, note)

    def local_bound(self, specs: list) -> int | None:
        """Jobs per launch under submitit_local, which starts every job of a launch at once: the
        pool's size on this node (``sweeper.pool.pool_size``); None for other launchers (joblib
        bounds itself with n_jobs, SLURM with array_parallelism).

        Args:
            specs: the conditions' specs (the first one's device and devices are the pool's).
        """

        from .pool import pool_size
        from .spec import launch_settings, probe_device

        target = str(OmegaConf.select(self.config, "hydra.launcher._target_") or "")
        if not target.endswith(".LocalLauncher") or not specs:
            return None
        launch, spec = launch_settings(self.config), specs[0]
        probe = probe_device(spec.device) if spec.device.startswith("cuda") and not spec.dry_run else None
        size = pool_size(launch["pool"], spec.device, launch["cores_per_run"], probe, spec.devices)
        log.info("submitit_local: at most %d job(s) at once (the pool's size on this node)", size)
        return size

    def sweep(self, arguments: list[str]) -> Any:
        """Hydra's Sweeper.sweep: plan the conditions, validate every one, then launch them all
        (``launch_order``, in batches of ``max_batch_size``, or under submitit_local of the
        pool's size: ``local_bound``), each a fresh worker process.

        Args:
            arguments: the command line's overrides (fixed ones, and ``axis=v1,v2`` sweeps).

        Returns:
            The launcher's JobReturn lists, one per launch.

        Raises:
            InputRefused: bad input (a setting, an override, the baseline, a condition's config,
                a sweep with nothing to run, a directory holding another sweep), before any
                worker starts; ``sweeper.cli`` prints it and exits 2.
            Exception: whatever a launched job raised in the orchestrator (re-raised by
                ``JobReturn.return_value``).
        """
        from .inputs import check_sweep_config
        from .process import share_fork_server
        from .spec import checked_spec, launch_settings

        try:
            batches = self.job_overrides(arguments)
            launch_order([], self.order)  # checks the setting before anything starts
            check_sweep_config(self.config)
        except SpecError as exc:
            raise InputRefused(exc) from None
        # Bad input fails here, before any worker starts: the baseline itself (even when every
        # condition overrides one of its values), then every condition.
        self.check_baseline()
        if not batches:
            sweep = self.config.get("sweep")
            raise InputRefused(
                SpecError(
                    "sweep",
                    sweep.get("name") if sweep is not None else None,
                    "a sweep with values to run: sweep=batch|context|width|dtype|ovat, or lists on the command "
                    "line (batch=1,2,4); `memsweep run` measures one condition",
                )
            )
        # The fork server imports torch while the conditions are checked; the launcher's
        # worker processes will fork their runs from it too.
        share_fork_server(launch_settings(self.config)["isolation"])
        specs = [checked_spec(condition) for condition in self.conditions(batches)]
        try:  # an axis the load ignores would run the same load at every value
            for (axis, value), spec in zip(self.planned, specs, strict=True):
                if axis:
                    check_axis_read(spec, axis, axis, value)
        except SpecError as exc:
            raise InputRefused(exc) from None
        order = launch_order(specs, self.order)
        batches, specs = [batches[i] for i in order], [specs[i] for i in order]
        sweep_dir = Path(self.config.hydra.sweep.dir)
        batches, specs = self.resume_numbers(sweep_dir, batches, specs)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        log.info("ovat sweep: %d conditions -> %s", len(batches), sweep_dir)
        return self.launch_all(sweep_dir, batches, specs)

    def launch_all(self, sweep_dir: Path, batches: list, specs: list) -> list[Sequence[Any]]:
        """Launch the conditions in chunks of ``max_batch_size`` (or of the pool's size).

        Args:
            sweep_dir: the sweep's directory (job ``n`` runs in ``sweep_dir/n``).
            batches: each condition's overrides, in launch order.
            specs: each condition's RunSpec, in the same order.

        Returns:
            The launcher's JobReturn lists, one per chunk.

        Raises:
            Exception: whatever a launched job raised (``JobReturn.return_value``).
        """
        from .lost_workers import launch_surviving

        size = self.max_batch_size or self.local_bound(specs) or len(batches) or 1
        returns: list[Sequence[Any]] = []
        for start in range(0, len(batches), size):
            chunk = batches[start : start + size]
            dirs = [sweep_dir / str(start + i) for i in range(len(chunk))]  # subdir: the job number
            results = launch_surviving(self.launcher, chunk, start, sweep_dir, dirs)
            for r in results:
                _ = r.return_value  # re-raises a job that failed (bad input, refused run dir)
            returns.append(results)
        return returns
