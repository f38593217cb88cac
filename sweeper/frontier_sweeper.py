"""Adaptive frontier Sweeper for Hydra (``hydra/sweeper=frontier``): the logic behind the
plugin class ``hydra_plugins.memsweep.memsweep_sweepers.FrontierSweeper``.

Finds the exact success/OOM edge of one or more axes (batch, context, width), everything else
at the baseline, every probe a fresh worker process launched through ``self.launcher``. The
search is ``sweeper.search.FrontierSearch``; this module runs its probes, reads what they left
(``sweeper.frontier_runs``: one run directory per probe, reused by the same sweep run again),
and writes every decision to ``search.jsonl`` (``sweeper.frontier_log``). The settings and
their checks: ``sweeper.frontier_settings``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from memsweep.conf.contract import SOURCES, RunSpec, SpecError, check_axis_read

from .errors import InputRefused
from .frontier_log import SearchLog
from .frontier_runs import SweepRuns, axis_reading, launcher_slots, search_reading
from .frontier_settings import (
    LIGHT,
    check_search_load,
    check_settings,
    check_sweep_choice,
    frontier_conf,
    searched_axes,
)
from .frontier_throughput import fastest_inside
from .inputs import check_sweep_config
from .owner import session_id
from .predict import PredictedEdge, Predictor
from .process import share_fork_server
from .search import ERRORS_IN_A_ROW, STOP_OUTCOMES, FrontierSearch, Lattice
from .spec import launch_settings, spec_from_config

log = logging.getLogger("memsweep")


class FrontierSweeperImpl:
    """The logic of ``hydra_plugins.memsweep.memsweep_sweepers.FrontierSweeper``.

    Args:
        settings: the fields of ``FrontierSweeperConf`` (``hydra.sweeper.*``,
            ``sweeper.frontier_settings``) as Hydra passes them, kept as one ``FrontierSweeperConf``
            (``self.settings``, defaults declared there once); validated when the sweep starts
            (``lattices``).

    Raises:
        InputRefused: a setting ``FrontierSweeperConf`` does not declare (``frontier_conf``);
            ``sweeper.cli`` prints it and exits 2.
    """

    def __init__(self, **settings: Any) -> None:
        try:
            self.settings = frontier_conf(settings)
        except SpecError as exc:
            raise InputRefused(exc) from None
        self.axes_field = "hydra.sweeper.axes" if settings.get("axes") is not None else "hydra.sweeper.axis"
        # set by setup(), which Hydra calls before sweep()
        self.config: DictConfig
        self.launcher: Launcher
        self.hydra_context: HydraContext
        self.session = session_id()

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Hydra's Sweeper.setup: keep the config and context, instantiate the launcher."""
        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    # ---- settings ----------------------------------------------------------------------
    def lattices(self) -> dict[str, Lattice]:
        """The validated search range of each axis (``sweeper.frontier_settings.check_settings``).

        Returns:
            axis -> its ``Lattice`` (``bounds`` of the axis over ``lower``/``upper``/``multiple_of``).

        Raises:
            SpecError: a bad setting, naming its field and the values accepted.
        """
        self.axes = searched_axes(self.settings.axis, self.settings.axes)
        return check_settings(self.settings, self.axes, self.axes_field)

    def fixed_overrides(self, arguments: list[str]) -> list[str]:
        """The command line's overrides, each a single value.

        Args:
            arguments: the overrides Hydra passes to ``sweep``.

        Returns:
            Their input lines.

        Raises:
            SpecError: a sweep override (``a=1,2``), naming its key: the search picks the values.
        """
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        fixed = []
        for override in parser.parse_overrides(arguments):
            if override.is_sweep_override():
                raise SpecError(
                    override.get_key_element(),
                    override.input_line,
                    "a single value: the frontier sweeper chooses the values of hydra.sweeper.axis/axes itself",
                )
            fixed.append(str(override.input_line))
        return fixed

    def compose(self, overrides: list[str]) -> RunSpec:
        """The spec of the sweep's config with ``overrides`` (Hydra's sweep composition).

        Args:
            overrides: the run's overrides.

        Returns:
            Its ``RunSpec``.

        Raises:
            SpecError: bad input in the composed config.
        """
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        return spec_from_config(cfg)

    # ---- the sweep ---------------------------------------------------------------------
    def check(self, arguments: list[str]) -> tuple[dict[str, Lattice], list[str], RunSpec, str]:
        """Validate everything before any worker starts: the settings, the overrides, the
        baseline and both ends of each range (with the light protocol too when asked).

        Args:
            arguments: the overrides Hydra passes to ``sweep``.

        Returns:
            (axis -> lattice, the fixed overrides, the baseline spec, the isolation).

        Raises:
            SpecError: the first bad input, naming its field and the values accepted.
        """
        lattices = self.lattices()
        check_sweep_config(self.config)
        fixed = self.fixed_overrides(arguments)
        check_sweep_choice(fixed, self.config.get("sweep"), list(lattices))
        baseline = self.compose(fixed)
        for axis in lattices:  # an axis the load ignores has no edge to find
            check_axis_read(baseline, axis, self.axes_field)
        check_search_load(baseline, self.settings.objective)
        for axis, lat in lattices.items():
            for value in (lat.lower, lat.upper):
                self.compose(fixed + [f"{axis}={value}"])
                if self.settings.light:
                    self.compose(fixed + LIGHT + [f"{axis}={value}"])
        return lattices, fixed, baseline, launch_settings(self.config)["isolation"]

    def sweep(self, arguments: list[str]) -> Any:
        """Hydra's Sweeper.sweep: search each axis in turn (``search_axis``).

        Args:
            arguments: the command line's overrides.

        Returns:
            The launcher's JobReturn lists, one per launch.

        Raises:
            InputRefused: bad input (``check``), before any worker starts; ``sweeper.cli``
                prints it and exits 2.
            Exception: whatever a launched job raised in the orchestrator (``SweepRuns.run``).
        """
        try:
            lattices, fixed, baseline, isolation = self.check(arguments)
        except SpecError as exc:
            raise InputRefused(exc) from None
        share_fork_server(isolation)  # one server for all of the launcher's worker processes
        self.sweep_dir = Path(str(self.config.hydra.sweep.dir))
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        if not (self.sweep_dir / "multirun.yaml").exists():
            OmegaConf.save(self.config, self.sweep_dir / "multirun.yaml")
        self.search_log = SearchLog(self.sweep_dir, self.session)
        # the report's margin (checked before any run, sweeper.inputs.check_report_margin): its edge is searched too
        from memsweep.estimator.margin import parse_margin

        self.margin_of = parse_margin(OmegaConf.select(self.config, "hydra.callbacks.analyze.margin")).bytes_for
        self.slots = launcher_slots(self.config, self.settings.parallel)
        self.runs = SweepRuns(self.sweep_dir, self.launcher, self.compose, fixed, self.slots)
        reusable = self.runs.job_idx
        self.search_log.write(
            {
                "event": "start",
                "axes": self.axes,
                "strategy": self.settings.strategy,
                "objective": self.settings.objective,
                "light": self.settings.light,
                "bounds": {a: [lat.lower, lat.upper, lat.step] for a, lat in lattices.items()},
                "confirm": self.settings.confirm,
                "slots": self.slots,
                "overrides": fixed,
                "reusable_runs": reusable,
            }
        )
        log.info(
            "frontier sweep: axes %s, strategy %s, %d probe(s) per round, %d reusable run(s) -> %s",
            ",".join(self.axes),
            self.settings.strategy,
            self.slots,
            reusable,
            self.sweep_dir,
        )
        for axis, lattice in lattices.items():
            self.search_axis(axis, lattice, baseline)
        return self.runs.returns

    def search_axis(self, axis: str, lattice: Lattice, baseline: RunSpec) -> dict:
        """Search one axis (light probes first when asked), verify and confirm its edge, log
        the result.

        Args:
            axis: the axis to search.
            lattice: its values.
            baseline: the spec of the other axes' values.

        Returns:
            ``FrontierSearch.result()`` as a dict, with the verification's and confirmations' fields
            (runs_used, runs_reused, light, stable, confirm_outcomes...) and ``source``
            (``conf.contract.SOURCES``: ``predicted`` when the probes are dry runs, which are
            never confirmed: a dry run is deterministic, its re-run repeats the same prediction);
            with ``objective=throughput``, ``throughput``: the fastest value inside the margin
            (``sweeper.frontier_throughput.fastest_inside``).
        """
        self.counter: str | None = None  # the peak counter the probes read (search_reading)
        self.dry_run = bool(baseline.dry_run)  # predicted peaks: no margin edge to measure
        self.capacity: int | None = None  # the capacity they report (bytes)
        extra = LIGHT if self.settings.light else []
        seed = self.dry_run_seed(axis, lattice, baseline) if self.settings.seed_from_dry_run else None
        search = self.run_search(axis, lattice, extra, "light probe" if self.settings.light else "probe", seed=seed)
        result = search.result().to_dict()
        runs_used, runs_reused = result["runs_used"], result["runs_reused"]
        if self.settings.light and not result["stopped_by"]:
            result, used, reused = self.verify_full(axis, lattice, result)
            runs_used, runs_reused = runs_used + used, runs_reused + reused
        source = SOURCES[1] if baseline.dry_run else SOURCES[0]  # predicted: dry runs, nothing measured
        result.update(runs_used=runs_used, runs_reused=runs_reused, light=self.settings.light, source=source)
        if baseline.dry_run:  # deterministic: a re-run repeats the same prediction, so nothing to confirm
            result.update(stable=None, confirm_outcomes={})
        else:
            result.update(self.confirm_edge(axis, result))
        if result["stable"] is False:  # a flip at the edge: the two values bracket no single edge
            result["exact"] = False
        if self.settings.objective == "throughput":  # the fastest value inside the margin (check: no dry run)
            known = [] if self.settings.light else [p.value for p in search.probes if p.outcome == "ok"]
            result["throughput"] = fastest_inside(self.runs, self.search_log, axis, lattice, result, known)
        self.search_log.result(axis, result, baseline, self.capacity, self.counter)
        return result

    def dry_run_seed(self, axis: str, lattice: Lattice, baseline: RunSpec) -> int | None:
        """The predicted max_ok of ``axis`` at the baseline's capacity, from dry runs
        (``sweeper.predict.Predictor``, written inside the sweep in ``<sweep dir>/.dry_run``, a
        hidden directory the analysis of measured runs skips).

        Args:
            axis: the axis to predict.
            lattice: its values (the prediction is one of them).
            baseline: the load; its ``capacity_bytes`` is the capacity (bytes).

        Returns:
            The predicted max_ok, or None (no capacity given, nothing fits, a dry run failed,
            or the dry run refuses the load, a ``SpecError`` such as ``export``, ``fault`` or
            ``compile`` with ``dry_run=true``: the search starts as usual, with real probes, and
            the ``dry_run`` event of ``search.jsonl`` says why).
        """
        if baseline.capacity_bytes is None:
            log.warning("seed_from_dry_run: no capacity=... given; the search starts without a prediction")
            return None
        predictor = Predictor(
            baseline,
            axis,
            baseline.capacity_bytes,
            Path(self.sweep_dir) / ".dry_run" / axis,
            launch_settings(self.config)["isolation"],
            upper=lattice.upper,
        )
        start = min(max(getattr(baseline, axis) or lattice.lower, lattice.lower), lattice.upper)
        try:
            edge = predictor.search(start, lattice)
            error = edge.error
            why = None if error is None else f"{error['error_type']}: {error['error_message']}"
            said = None if error is None else f"dry run at {axis}={error['value']} failed ({error['error_type']})"
        except SpecError as exc:  # a load the dry run refuses (export, fault, compile...): no prediction
            why, said = f"SpecError: {exc}", f"the dry run refuses this load, no seed ({exc})"
            edge = PredictedEdge(max_fit=None, min_miss=None, exact=False, upper=lattice.upper, upper_reached=False)
        self.search_log.write(
            {
                "event": "dry_run",
                "axis": axis,
                "capacity_bytes": baseline.capacity_bytes,
                "predicted_max_ok": edge.max_fit,
                "predicted_min_oom": edge.min_miss,
                "dry_runs": len(predictor.runs),
                "dry_run_dir": str(predictor.out_dir),
                "error": why,
            }
        )
        if said is not None:
            log.warning("seed_from_dry_run: %s: real probes only", said)
            return None
        log.info("frontier dry runs (%d): predicted max_ok %s=%s", len(predictor.runs), axis, edge.max_fit)
        return edge.max_fit

    def run_search(
        self, axis: str, lattice: Lattice, extra: list[str], event: str, seed: int | None = None
    ) -> FrontierSearch:
        """Propose, run, observe, log: to the end of one search.

        Args:
            axis: the axis searched.
            lattice: its values.
            extra: overrides added to each probe (the light protocol).
            event: the name of the probes in the log (``probe``, ``light probe``).
            seed: a predicted max_ok to probe first.

        Returns:
            The finished search.
        """
        margin_of = None if extra or self.dry_run else self.margin_of  # the margin edge: full-protocol real runs
        search = FrontierSearch(
            axis, lattice, self.settings.strategy, None, seed, errors_in_a_row=ERRORS_IN_A_ROW, margin_of=margin_of
        )
        while not search.done:
            probes = search.propose(self.slots)
            runs = self.runs.run(axis, [(p.value, 0) for p in probes], extra)
            for probe, run in zip(probes, runs):
                reading, self.counter = search_reading(run, axis, self.settings.suspect)
                self.capacity = self.capacity or reading.capacity
                search.observe(probe.value, reading)
                self.search_log.probe(event, axis, probe, run, self.counter, extra, reading.outcome)
        return search

    def verify_full(self, axis: str, lattice: Lattice, light: dict) -> tuple[dict, int, int]:
        """Run the light search's max_ok and min_oom with the full protocol.

        When both agree, that is the answer. When the full protocol runs out of memory at
        max_ok (or fits at min_oom), the axis is searched again with the full protocol in
        the range left (lower..max_ok, or min_oom..upper), reusing the runs it has.

        Args:
            axis: the axis searched.
            lattice: its values.
            light: the light search's result.

        Returns:
            (result, runs used, runs reused) beyond the light search; the result has
            ``verify_outcomes`` (value -> full-protocol outcome).
        """
        values = [v for v in (light["max_ok"], light["min_oom"]) if v is not None]
        runs = self.runs.run(axis, [(v, 0) for v in values], [])
        full = {v: axis_reading(r, axis, self.settings.suspect)[0] for v, r in zip(values, runs)}
        for v, r in zip(values, runs):
            self.search_log.edge_run(
                "verify", axis, v, r, full[v], light_outcome="ok" if v == light["max_ok"] else "oom"
            )
        used, reused = len(runs), sum(r["reused"] for r in runs)
        result = dict(light, verify_outcomes={str(v): o for v, o in full.items()})
        stop = next(((v, o) for v, o in full.items() if o in STOP_OUTCOMES), None)
        if stop is not None:
            result.update(
                stopped_by=stop[1],
                stop_value=stop[0],
                exact=False,
                status=f"stopped by {stop[1]} at {axis}={stop[0]} (full protocol at the light edge)",
            )
            return result, used, reused
        sub = None
        if light["max_ok"] is not None and full[light["max_ok"]] == "oom":
            sub = Lattice(lattice.lower, light["max_ok"], lattice.step)
        elif light["min_oom"] is not None and full[light["min_oom"]] == "ok":
            sub = Lattice(light["min_oom"], lattice.upper, lattice.step)
        if sub is None:
            result["status"] += " (light probes; verified with the full protocol)"
            return result, used, reused
        log.info(
            "frontier %s: the full protocol disagrees with the light probes at the edge; searching %d..%d with it",
            axis,
            sub.lower,
            sub.upper,
        )
        search = self.run_search(axis, sub, [], "probe")
        again = search.result().to_dict()
        again.update(
            verify_outcomes=result["verify_outcomes"],
            lower=lattice.lower,
            upper=lattice.upper,
            upper_reached=bool(again["upper_reached"] and sub.upper == lattice.upper),
        )
        again["status"] += " (full protocol, after light probes it disagreed with)"
        return again, used + again["runs_used"], reused + again["runs_reused"]

    def confirm_edge(self, axis: str, result: dict) -> dict:
        """Re-run max_ok and min_oom ``confirm`` times each in fresh processes.

        A flip (an OOM at max_ok, a success at min_oom) marks the edge unstable; an error,
        crash or timeout in a confirmation stops the axis like one in the search. After light
        probes the confirmations come after the full-protocol run at each edge value (the
        verification, a search run): ``confirm`` more fresh runs each, none with ``confirm=0``.

        Args:
            axis: the axis searched.
            result: the search's result; its status and stop fields are updated in place.

        Returns:
            {"stable" (None when nothing was re-run: not checked), "confirm_outcomes" (value ->
            outcomes)}, and when confirmations ran,
            "status", "stopped_by" and "stop_value".
        """
        out: dict[str, Any] = {"stable": None, "confirm_outcomes": {}}  # None: nothing re-run, not checked
        if self.settings.confirm <= 0 or result["stopped_by"]:
            return out
        out["stable"] = True
        values = [(v, side) for v, side in ((result["max_ok"], "ok"), (result["min_oom"], "oom")) if v is not None]
        wanted = [(v, n) for v, _ in values for n in range(1, self.settings.confirm + 1)]  # n=0: the search's run
        runs = self.runs.run(axis, wanted, [])
        for run, (value, _) in zip(runs, wanted):
            outcome = axis_reading(run, axis, self.settings.suspect)[0]
            out["confirm_outcomes"].setdefault(str(value), []).append(outcome)
            self.search_log.edge_run("confirm", axis, value, run, outcome)
        for value, side in values:
            outcomes = out["confirm_outcomes"].get(str(value), [])
            other = [o for o in outcomes if o in STOP_OUTCOMES]
            if other and not result["stopped_by"]:
                result["stopped_by"], result["stop_value"] = other[0], value
                result["status"] += f"; confirmation stopped by {other[0]} at {axis}={value}"
            if any(o in ("ok", "oom") and o != side for o in outcomes):
                out["stable"] = False
        if out["stable"] is False:
            result["status"] = (
                result["status"].replace("exact edge: ", "edge found by the search, not confirmed: ")
                + "; UNSTABLE: a confirmation flipped"
            )
        out["status"] = result["status"]
        out["stopped_by"], out["stop_value"] = result["stopped_by"], result["stop_value"]
        return out
