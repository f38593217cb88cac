"""Adaptive frontier Sweeper for Hydra (``hydra/sweeper=frontier``).

Finds the exact success/OOM edge of one or more axes (batch, context, width), each with
everything else at the baseline, every probe a fresh worker process launched through
``self.launcher`` (basic, joblib, submitit_local, submitit_slurm: unchanged). The search
itself is ``sweeper.frontier.FrontierSearch``; this module runs its probes, reads what
they left, and writes down every decision.

Files in the sweep directory:

* one run directory per probe, named ``<axis>_<value>_<spec key>`` (a confirmation run
  adds ``_<n>``); the spec key is a hash of the run's spec.json, so running the same sweep
  again in the same directory (``hydra.sweep.dir=...``) **reuses** the runs already there
  (those with a result.json) instead of re-running them, and an attempt cut short with its
  orchestrator is resumed in its own directory (``sweeper.process.execute``); a finished
  run is never overwritten;
* ``search.jsonl``: appended, one JSON object a line: ``start`` (settings), ``probe``
  (value, why it was chosen, what the model predicted, outcome, peak, run directory,
  reused or not), ``confirm`` and ``result`` (the answer of each axis);
* ``frontier.parquet``: written at the end of the multirun by ``sweeper.callbacks``;
  ``analysis.frontier`` adds the search's columns (strategy, runs_used, upper_reached,
  stopped_by, search_status) from the ``result`` lines.

Peaks read by the model: the largest phase peak of the run, ``max_memory_reserved`` on
CUDA (the per-process memory fraction caps what the caching allocator reserves) and
``max_memory_allocated`` on the CPU (the worker's live-tensor tracker). On the CPU the
capacity is a limit on the growth of the data segment above ``capacity_baseline_bytes``
(VmData when the limit was set, see ``worker.counters.apply_cpu_capacity``); the tracker
counts only tensors created after that point, so its bytes are compared with
``capacity_bytes`` directly, and what malloc keeps beyond the tensors shows up as a lower
effective threshold, which the search learns from its probes.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from conf.contract import (RECORD_FILE, RESULT_FILE, SEARCH_LOG, SPEC_FILE, RecordError, RunSpec, SpecError, read_spec,
                           run_peak, try_read)

from .frontier import SEARCH_AXES, STOP_OUTCOMES, STRATEGIES, FrontierSearch, Lattice
from .process import RunDirError, share_fork_server, stored_spec
from .spec import launch_settings

log = logging.getLogger("memsweep")

# The light probe policy: the cold step (or forward) and one warm one.
LIGHT = ["warmup=0", "repeats=1"]


@dataclass
class FrontierSweeperConf:
    _target_: str = "hydra_plugins.memsweep.memsweep_sweepers.FrontierSweeper"
    # The axis to search (batch | context | width); `axes` searches several, one at a time.
    axis: str = "batch"
    axes: Optional[List[str]] = None
    # Search range and granularity (values are multiples of multiple_of in [lower, upper]).
    lower: int = 1
    upper: int = 65536
    multiple_of: int = 1
    # Per-axis overrides of lower/upper/multiple_of: {context: {lower: 16, multiple_of: 16}}.
    bounds: Dict[str, Any] = field(default_factory=dict)
    strategy: str = "model"  # model | bisect
    # Fresh-process re-runs of max_ok and of min_oom once found; a flip marks the edge unstable.
    confirm: int = 1
    # Probes per round; None: the launcher's parallelism (hydra.launcher.n_jobs), else 1.
    parallel: Optional[int] = None
    # Light probes: the search runs warmup=0 repeats=1 (the cold step and one warm step); the
    # edge it finds is then run with the full protocol at max_ok and min_oom (and searched
    # again with it, inside the range left, if the full protocol disagrees).
    light: bool = False
    # Before the first real probe, bisect the axis on dry runs (fake tensors, `memsweep predict`)
    # against the run's capacity and probe the predicted edge first (FrontierSearch seed).
    seed_from_dry_run: bool = False


def stored_key(run_dir: Path) -> Optional[str]:
    """``spec_key`` of the spec stored in ``run_dir`` (spec.json), or None when it has none or an
    unreadable one."""
    try:
        spec = stored_spec(run_dir)
    except RunDirError:
        return None
    return None if spec is None else spec_key(spec)


def spec_key(spec: RunSpec) -> str:
    """A short hash of the spec: equal specs (same condition) give equal keys."""
    text = json.dumps(spec.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


PEAK_COUNTERS = {
    "max_memory_reserved": "max_memory_reserved, largest phase peak (CUDA caching allocator; the emulated "
                           "capacity caps reserved memory via set_per_process_memory_fraction)",
    "max_memory_allocated": "max_memory_allocated, largest phase peak (CPU: the worker's live-tensor tracker; "
                            "the capacity bounds data-segment growth above capacity_baseline_bytes, and the "
                            "tracker counts only tensors created after that baseline, so the two are compared "
                            "directly; malloc overhead shows as a lower effective threshold)",
}


class RunIndex:
    """Completed runs of a sweep directory (spec.json and result.json present), by spec key.

    ``get(key, n)`` is the n-th run of that condition (0: the probe; 1, 2...: its
    confirmations), or None when it has not been run: a search and its confirmations, and
    several axes probing the same condition, share runs instead of repeating them.
    """

    def __init__(self, sweep_dir: Path):
        self.sweep_dir = sweep_dir
        self.runs: dict[str, list[Path]] = {}
        if not sweep_dir.is_dir():
            return
        for spec_path in sorted(sweep_dir.rglob(SPEC_FILE), key=lambda p: (len(str(p)), str(p))):
            run_dir = spec_path.parent
            if any(part.startswith(".") for part in run_dir.relative_to(sweep_dir).parts):
                continue
            if not (run_dir / RESULT_FILE).exists():
                continue  # the orchestrator stopped during this run: not a result to reuse
            try:
                spec = read_spec(run_dir)
            except (RecordError, SpecError) as exc:
                log.warning("resume: %s not reused (%s)", run_dir, exc)
                continue
            self.add(spec_key(spec), run_dir)

    def add(self, key: str, run_dir: Path) -> None:
        self.runs.setdefault(key, []).append(run_dir)

    def get(self, key: str, n: int = 0) -> Optional[Path]:
        runs = self.runs.get(key, [])
        return runs[n] if n < len(runs) else None

    def count(self) -> int:
        return sum(len(v) for v in self.runs.values())


def launcher_slots(config: DictConfig, parallel: Optional[int]) -> int:
    """Probes per round: ``parallel`` when set, else the launcher's ``n_jobs`` (joblib;
    negative counts back from the CPU count as joblib does), else 1."""
    if parallel is not None:
        return max(1, int(parallel))
    launcher = config.hydra.get("launcher") or {}
    n_jobs = launcher.get("n_jobs") if hasattr(launcher, "get") else None
    if isinstance(n_jobs, int) and not isinstance(n_jobs, bool) and n_jobs != 0:
        return n_jobs if n_jobs > 0 else max(1, (os.cpu_count() or 1) + 1 + n_jobs)
    return 1


class FrontierSweeperImpl:
    """The logic of ``hydra_plugins.memsweep.memsweep_sweepers.FrontierSweeper``."""

    def __init__(self, axis: str = "batch", axes: Optional[List[str]] = None, lower: int = 1,
                 upper: int = 65536, multiple_of: int = 1, bounds: Optional[dict] = None,
                 strategy: str = "model", confirm: int = 1, parallel: Optional[int] = None,
                 light: bool = False, seed_from_dry_run: bool = False) -> None:
        self.axes = list(axes) if axes else [axis]
        self.lower, self.upper, self.multiple_of = lower, upper, multiple_of
        self.bounds = dict(OmegaConf.to_container(bounds, resolve=True) if OmegaConf.is_config(bounds)
                           else bounds or {})
        self.strategy, self.confirm, self.parallel, self.light = strategy, confirm, parallel, light
        self.seed_from_dry_run = seed_from_dry_run
        self.config: Optional[DictConfig] = None
        self.launcher = None
        self.hydra_context: Optional[HydraContext] = None
        self.job_idx = 0
        self.session = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    # ---- settings ----------------------------------------------------------------------
    def lattices(self) -> dict[str, Lattice]:
        """Validated search range of each axis. Raises SpecError."""
        if self.strategy not in STRATEGIES:
            raise SpecError("hydra.sweeper.strategy", self.strategy, "one of " + ", ".join(STRATEGIES))
        if isinstance(self.confirm, bool) or not isinstance(self.confirm, int) or not 0 <= self.confirm <= 100:
            raise SpecError("hydra.sweeper.confirm", self.confirm, "an integer from 0 to 100")
        if self.parallel is not None and (isinstance(self.parallel, bool) or not isinstance(self.parallel, int)
                                          or self.parallel < 1):
            raise SpecError("hydra.sweeper.parallel", self.parallel, "null or a positive integer")
        unknown = [a for a in list(self.axes) + list(self.bounds) if a not in SEARCH_AXES]
        if unknown:
            raise SpecError("hydra.sweeper.axes", unknown[0], "axes among " + ", ".join(SEARCH_AXES))
        if len(set(self.axes)) != len(self.axes):
            raise SpecError("hydra.sweeper.axes", self.axes, "each axis once")
        out = {}
        for axis, b in self.bounds.items():
            extra = sorted(set(b or {}) - {"lower", "upper", "multiple_of"})
            if extra:
                raise SpecError(f"hydra.sweeper.bounds.{axis}.{extra[0]}", b[extra[0]], "lower, upper or multiple_of")
        for axis in self.axes:
            b = self.bounds.get(axis) or {}
            out[axis] = Lattice.make(b.get("lower", self.lower), b.get("upper", self.upper),
                                     b.get("multiple_of", self.multiple_of), axis)
        return out

    def fixed_overrides(self, arguments: List[str]) -> list[str]:
        """The command line's overrides; a sweep (a=1,2) is refused: the search picks values."""
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        fixed = []
        for override in parser.parse_overrides(arguments):
            if override.is_sweep_override():
                raise SpecError(override.get_key_element(), override.input_line,
                                "a single value: the frontier sweeper chooses the values of "
                                "hydra.sweeper.axis/axes itself")
            fixed.append(override.input_line)
        return fixed

    def compose(self, overrides: list[str]) -> RunSpec:
        from .spec import spec_from_config

        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        return spec_from_config(cfg)

    # ---- the sweep ---------------------------------------------------------------------
    def sweep(self, arguments: List[str]) -> Any:
        try:
            lattices = self.lattices()
            fixed = self.fixed_overrides(arguments)
            # Bad input fails here, before any worker starts: the baseline and both ends of each range.
            baseline = self.compose(fixed)
            for axis, lat in lattices.items():
                for value in (lat.lower, lat.upper):
                    self.compose(fixed + [f"{axis}={value}"])
                    if self.light:
                        self.compose(fixed + LIGHT + [f"{axis}={value}"])
            isolation = launch_settings(self.config)["isolation"]
        except SpecError as exc:
            print(f"memsweep: error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        share_fork_server(isolation)  # one server for all of the launcher's worker processes
        self.sweep_dir = Path(str(self.config.hydra.sweep.dir))
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        if not (self.sweep_dir / "multirun.yaml").exists():
            OmegaConf.save(self.config, self.sweep_dir / "multirun.yaml")
        self.index = RunIndex(self.sweep_dir)
        self.fixed = fixed
        self.slots = launcher_slots(self.config, self.parallel)
        self.returns: list = []
        self.job_idx = reusable = self.index.count()
        self.write_log({"event": "start", "axes": self.axes, "strategy": self.strategy, "light": self.light,
                        "bounds": {a: [lat.lower, lat.upper, lat.step] for a, lat in lattices.items()},
                        "confirm": self.confirm, "slots": self.slots, "overrides": fixed,
                        "reusable_runs": reusable})
        log.info("frontier sweep: axes %s, strategy %s, %d probe(s) per round, %d reusable run(s) -> %s",
                 ",".join(self.axes), self.strategy, self.slots, reusable, self.sweep_dir)
        for axis, lattice in lattices.items():
            self.search_axis(axis, lattice, baseline)
        return self.returns

    def search_axis(self, axis: str, lattice: Lattice, baseline: RunSpec) -> dict:
        """Search one axis (light probes first when asked), verify and confirm its edge, log
        the result; returns it."""
        self.counter = self.capacity = None
        extra = LIGHT if self.light else []
        seed = self.dry_run_seed(axis, lattice, baseline) if self.seed_from_dry_run else None
        search = self.run_search(axis, lattice, extra, "light probe" if self.light else "probe", seed=seed)
        result = search.result()
        runs_used, runs_reused = result["runs_used"], result["runs_reused"]
        if self.light and not result["stopped_by"]:
            result, used, reused = self.verify_full(axis, lattice, result)
            runs_used, runs_reused = runs_used + used, runs_reused + reused
        result.update(runs_used=runs_used, runs_reused=runs_reused, light=self.light)
        result.update(self.confirm_edge(axis, result))
        if not result["stable"]:  # a flip at the edge: the two values bracket no single edge
            result["exact"] = False
        fixed = {k: getattr(baseline, k) for k in ("batch", "context", "width", "dtype", "mode", "device",
                                                   "warmup", "repeats")}
        fixed[axis] = None
        self.write_log({"event": "result", **result, "workload": baseline.workload_name,
                        "capacity_bytes": self.capacity if self.capacity is not None else baseline.capacity_bytes,
                        "fixed": fixed, "peak_counter": PEAK_COUNTERS.get(self.counter, self.counter)})
        n_confirm = sum(len(v) for v in result.get("confirm_outcomes", {}).values())
        log.info("frontier %s: %s; max_ok=%s min_oom=%s after %d search run(s) (%d reused) and %d "
                 "confirmation run(s), stable=%s", axis, result["status"], result["max_ok"], result["min_oom"],
                 result["runs_used"], result["runs_reused"], n_confirm, result["stable"])
        return result

    def dry_run_seed(self, axis: str, lattice: Lattice, baseline: RunSpec) -> Optional[int]:
        """The predicted max_ok of ``axis`` at the baseline's capacity, from dry runs
        (``sweeper.predict.Predictor``, written inside the sweep in ``<sweep dir>/.dry_run``, a hidden
        directory the analysis of measured runs skips), or
        None (no capacity given, nothing fits, or a dry run failed: the search starts as usual)."""
        from .predict import Predictor

        if baseline.capacity_bytes is None:
            log.warning("seed_from_dry_run: no capacity=... given; the search starts without a prediction")
            return None
        predictor = Predictor(baseline, axis, baseline.capacity_bytes,
                              Path(self.sweep_dir) / ".dry_run" / axis, launch_settings(self.config)["isolation"],
                              upper=lattice.upper)
        start = min(max(getattr(baseline, axis), lattice.lower), lattice.upper)
        edge = predictor.search(start, lattice)
        error = edge["error"]
        self.write_log({"event": "dry_run", "axis": axis, "capacity_bytes": baseline.capacity_bytes,
                        "predicted_max_ok": edge["max_fit"], "predicted_min_oom": edge["min_miss"],
                        "dry_runs": len(predictor.runs), "dry_run_dir": str(predictor.out_dir),
                        "error": None if error is None else f"{error['error_type']}: {error['error_message']}"})
        if error is not None:
            log.warning("seed_from_dry_run: dry run at %s=%s failed (%s): real probes only", axis, error["value"],
                        error["error_type"])
            return None
        log.info("frontier dry runs (%d): predicted max_ok %s=%s", len(predictor.runs), axis, edge["max_fit"])
        return edge["max_fit"]

    def run_search(self, axis: str, lattice: Lattice, extra: list[str], event: str,
                   seed: Optional[int] = None) -> FrontierSearch:
        """Propose, run (``extra`` overrides on each probe), observe, log: to the end."""
        search = FrontierSearch(axis, lattice, self.strategy, capacity=None, seed=seed)
        while not search.done:
            probes = search.propose(self.slots)
            runs = self.run_values(axis, [(p.value, 0) for p in probes], extra)
            for probe, run in zip(probes, runs):
                peak, self.counter = run_peak(run["record"])
                self.capacity = self.capacity or run["capacity_bytes"]
                search.observe(probe.value, run["outcome"], peak, run["capacity_bytes"], run["message"],
                               run["reused"], run["run_dir"])
                self.write_log({"event": event.replace(" ", "_"), "axis": axis, **probe.to_dict(),
                                "peak_counter": self.counter, "capacity_bytes": run["capacity_bytes"],
                                "spec_key": run["key"], "overrides": extra})
                log.info("frontier %s %s=%d [%s] -> %s%s%s", event, axis, probe.value, probe.reason,
                         run["outcome"], "" if probe.expected is None or run["outcome"] == probe.expected else
                         f" (predicted {probe.expected})", " (reused)" if run["reused"] else "")
        return search

    def verify_full(self, axis: str, lattice: Lattice, light: dict) -> tuple[dict, int, int]:
        """Run the light search's max_ok and min_oom with the full protocol.

        When both agree, that is the answer. When the full protocol runs out of memory at
        max_ok (or fits at min_oom), the axis is searched again with the full protocol in
        the range left (lower..max_ok, or min_oom..upper), reusing the runs it has.

        Returns (result, runs used, runs reused) beyond the light search.
        """
        values = [v for v in (light["max_ok"], light["min_oom"]) if v is not None]
        runs = self.run_values(axis, [(v, 0) for v in values], [])
        full = {v: r["outcome"] for v, r in zip(values, runs)}
        for v, r in zip(values, runs):
            self.write_log({"event": "verify", "axis": axis, "value": v, "light_outcome":
                            "ok" if v == light["max_ok"] else "oom", "outcome": r["outcome"],
                            "message": r["message"], "run_dir": r["run_dir"], "reused": r["reused"],
                            "spec_key": r["key"]})
        used, reused = len(runs), sum(r["reused"] for r in runs)
        result = dict(light, verify_outcomes={str(v): o for v, o in full.items()})
        stop = next(((v, o) for v, o in full.items() if o in STOP_OUTCOMES), None)
        if stop is not None:
            result.update(stopped_by=stop[1], stop_value=stop[0], exact=False,
                          status=f"stopped by {stop[1]} at {axis}={stop[0]} (full protocol at the light edge)")
            return result, used, reused
        sub = None
        if light["max_ok"] is not None and full[light["max_ok"]] == "oom":
            sub = Lattice(lattice.lower, light["max_ok"], lattice.step)
        elif light["min_oom"] is not None and full[light["min_oom"]] == "ok":
            sub = Lattice(light["min_oom"], lattice.upper, lattice.step)
        if sub is None:
            result["status"] += " (light probes; verified with the full protocol)"
            return result, used, reused
        log.info("frontier %s: the full protocol disagrees with the light probes at the edge; "
                 "searching %d..%d with it", axis, sub.lower, sub.upper)
        search = self.run_search(axis, sub, [], "probe")
        again = search.result()
        again.update(verify_outcomes=result["verify_outcomes"], lower=lattice.lower, upper=lattice.upper,
                     upper_reached=bool(again["upper_reached"] and sub.upper == lattice.upper))
        again["status"] += " (full protocol, after light probes it disagreed with)"
        return again, used + again["runs_used"], reused + again["runs_reused"]

    def confirm_edge(self, axis: str, result: dict) -> dict:
        """Re-run max_ok and min_oom ``confirm`` times each in fresh processes.

        A flip (an OOM at max_ok, a success at min_oom) marks the edge unstable; an error,
        crash or timeout in a confirmation stops the axis like one in the search. After light
        probes, the full-protocol run at each edge value (the verification) is the first of
        its confirmations (at least one, whatever ``confirm`` says).
        """
        out = {"stable": True, "confirm_outcomes": {}}
        if (self.confirm <= 0 and not self.light) or result["stopped_by"]:
            return out
        first, last = (0, max(self.confirm, 1)) if self.light else (1, self.confirm + 1)
        values = [(v, side) for v, side in ((result["max_ok"], "ok"), (result["min_oom"], "oom")) if v is not None]
        wanted = [(v, n) for v, _ in values for n in range(first, last)]
        runs = self.run_values(axis, wanted, [])
        for run, (value, _) in zip(runs, wanted):
            out["confirm_outcomes"].setdefault(str(value), []).append(run["outcome"])
            self.write_log({"event": "confirm", "axis": axis, "value": value, "outcome": run["outcome"],
                            "message": run["message"], "run_dir": run["run_dir"], "reused": run["reused"],
                            "spec_key": run["key"]})
        for value, side in values:
            outcomes = out["confirm_outcomes"].get(str(value), [])
            other = [o for o in outcomes if o in STOP_OUTCOMES]
            if other and not result["stopped_by"]:
                result["stopped_by"], result["stop_value"] = other[0], value
                result["status"] += f"; confirmation stopped by {other[0]} at {axis}={value}"
            if any(o in ("ok", "oom") and o != side for o in outcomes):
                out["stable"] = False
        if not out["stable"]:
            result["status"] = (result["status"].replace("exact edge: ", "edge found by the search, not confirmed: ")
                                + "; UNSTABLE: a confirmation flipped")
        out["status"] = result["status"]
        out["stopped_by"], out["stop_value"] = result["stopped_by"], result["stop_value"]
        return out

    def run_values(self, axis: str, wanted: list[tuple[int, int]], extra: Optional[list[str]] = None) -> list[dict]:
        """The ``n``-th run of each (value, n) of ``axis``: reused when the sweep directory has
        it, else launched (fresh worker processes, at most ``slots`` per launcher call).

        Returns, per (value, n): outcome, message, record (or None), capacity_bytes,
        run_dir, reused, key.

        Raises:
            whatever a launched job raised (bad input, a refused run directory): the
            orchestrator's own failures are not probe outcomes.
        """
        out: list[Optional[dict]] = [None] * len(wanted)
        todo: list[tuple[int, list[str], Path, str]] = []
        for i, (value, n) in enumerate(wanted):
            overrides = self.fixed + list(extra or []) + [f"{axis}={value}"]
            key = spec_key(self.compose(overrides))
            stem = f"{axis}_{value}_{'light_' if extra else ''}{key}"
            run_dir = self.index.get(key, n)
            if run_dir is None:  # another orchestrator on this directory may have run it since the scan
                self.rescan(stem, key)
                run_dir = self.index.get(key, n)
            if run_dir is not None:
                out[i] = self.read_run(run_dir, key, reused=True)
                continue
            name, k = stem, 1
            while not self.free_for(self.sweep_dir / name, key) or any(t[2] == self.sweep_dir / name for t in todo):
                k += 1
                name = f"{stem}_{k}"
            todo.append((i, overrides + [f"hydra.sweep.subdir={name}"], self.sweep_dir / name, key))
        for start in range(0, len(todo), max(1, self.slots)):
            batch = todo[start:start + self.slots]
            results = self.launcher.launch([t[1] for t in batch], initial_job_idx=self.job_idx)
            self.job_idx += len(batch)
            self.returns.append(results)
            for (i, _, run_dir, key), r in zip(batch, results):
                envelope = r.return_value  # re-raises a job that failed in the orchestrator
                self.index.add(key, run_dir)
                out[i] = self.read_run(run_dir, key, reused=False, envelope=envelope)
        return out  # type: ignore[return-value]

    def rescan(self, stem: str, key: str) -> None:
        """Add to the index the finished runs of ``key`` named ``stem``, ``stem_2``... that are
        not in it: runs that another orchestrator sharing the sweep directory finished after
        this one scanned it (the per-run lock of ``sweeper.process.execute`` covers a run
        both start at once; this covers one finished before the other looks)."""
        known = set(self.index.runs.get(key, []))
        name, k = stem, 1
        while (self.sweep_dir / name).exists():
            run_dir = self.sweep_dir / name
            if run_dir not in known and (run_dir / RESULT_FILE).exists() and stored_key(run_dir) == key:
                self.index.add(key, run_dir)
            k += 1
            name = f"{stem}_{k}"

    @staticmethod
    def free_for(run_dir: Path, key: str) -> bool:
        """Can a run of ``key`` go into ``run_dir``: it does not exist, or it holds the same
        spec without a result (an attempt interrupted with its orchestrator, which
        ``sweeper.process.execute`` resumes in place)?"""
        if not run_dir.exists():
            return True
        if (run_dir / RESULT_FILE).exists():
            return False
        return stored_key(run_dir) == key

    @staticmethod
    def read_run(run_dir: Path, key: str, reused: bool, envelope: Optional[dict] = None) -> dict:
        """Outcome (result.json or the job's envelope), record and capacity of one run."""
        record, _ = try_read(run_dir, RECORD_FILE)
        if envelope is None:
            envelope, problem = try_read(run_dir, RESULT_FILE)
            if envelope is None:
                envelope = {"outcome": "crash", "error_message": problem}
        capacity = (record or {}).get("capacity_bytes")
        message = envelope.get("error_message")
        if envelope.get("failed_phase"):
            message = f"{envelope.get('failed_phase')}: {envelope.get('error_type')}: {message}"
        return {"outcome": envelope.get("outcome") or "crash", "message": message, "record": record,
                "capacity_bytes": capacity if isinstance(capacity, int) else None,
                "run_dir": str(run_dir), "reused": reused, "key": key}

    def write_log(self, event: dict) -> None:
        """Append one decision to search.jsonl (never rewritten)."""
        event = {"session": self.session, **event}
        with open(self.sweep_dir / SEARCH_LOG, "a") as f:
            f.write(json.dumps(event, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
