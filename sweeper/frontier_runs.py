"""The frontier sweeper's runs: the key of a probe's spec, the index of the runs a sweep
directory holds (reused instead of run again), what a finished run says, and the launching
of the others (``SweepRuns``).

A probe's run directory is ``<axis>_<value>_<spec key>`` (a light probe's
``<axis>_<value>_light_<spec key>``; a second run of the same condition adds ``_<n>``); the
spec key is a hash of the run's spec.json. The peak the model reads is
``conf.contract.run_peak``: ``max_memory_reserved`` on CUDA, ``max_memory_allocated`` on the CPU.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from memsweep.conf.contract import (
    RECORD_FILE,
    RESULT_FILE,
    SPEC_FILE,
    RecordError,
    RunSpec,
    SpecError,
    failure_words,
    oom_attribution,
    planned_phases,
    read_spec,
    run_peak,
    try_read,
    usable_cores,
)

from .launcher_bounds import resolved_n_jobs
from .lost_workers import launch_surviving
from .process import RunDirError, stored_spec
from .search import Reading

log = logging.getLogger("memsweep")

PEAK_COUNTERS = {
    "max_memory_reserved": "max_memory_reserved, largest phase peak (CUDA caching allocator; the emulated "
    "capacity caps reserved memory via set_per_process_memory_fraction)",
    "max_memory_allocated": "max_memory_allocated, largest phase peak (CPU: the worker's live-tensor tracker, "
    "which capacity_mode=allocator caps exactly; under capacity_mode=process the "
    "capacity bounds data-segment growth, and malloc overhead shows as a lower "
    "effective threshold)",
}


def spec_key(spec: RunSpec) -> str:
    """A short hash of the spec: equal specs (same condition) give equal keys.

    Args:
        spec: the run's spec.

    Returns:
        12 hexadecimal digits of the SHA-256 of its canonical JSON.
    """
    text = json.dumps(spec.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def stored_key(run_dir: Path) -> str | None:
    """The key of the spec stored in a run directory.

    Args:
        run_dir: a run directory.

    Returns:
        ``spec_key`` of its spec.json, or None when it has none or an unreadable one.
    """
    try:
        spec = stored_spec(run_dir)
    except RunDirError:
        return None
    return None if spec is None else spec_key(spec)


class RunIndex:
    """Completed runs of a sweep directory (spec.json and result.json present), by spec key.

    ``get(key, n)`` is the n-th run of that condition (0: the probe; 1, 2...: its
    confirmations), or None when it has not been run: a search and its confirmations, and
    several axes probing the same condition, share runs instead of repeating them. Runs
    under a hidden directory (``.submitit``, ``.dry_run``) and runs without a result.json
    (the orchestrator stopped during them) are left out; an unreadable spec is logged and
    left out.

    Args:
        sweep_dir: the sweep directory (scanned now; nothing when it does not exist).
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
            if spec is None:  # its spec.json went away since it was listed
                continue
            self.add(spec_key(spec), run_dir)

    def add(self, key: str, run_dir: Path) -> None:
        """Count ``run_dir`` as the next run of the condition ``key``."""
        self.runs.setdefault(key, []).append(run_dir)

    def get(self, key: str, n: int = 0) -> Path | None:
        """The ``n``-th run (0: the first) of the condition ``key``: its directory, or None."""
        runs = self.runs.get(key, [])
        return runs[n] if n < len(runs) else None

    def count(self) -> int:
        """How many runs the index holds."""
        return sum(len(v) for v in self.runs.values())

    def rescan(self, stem: str, key: str) -> None:
        """Add the finished runs of ``key`` named ``stem``, ``stem_2``... that are not in the
        index: runs that another orchestrator sharing the sweep directory finished after
        this one scanned it (the per-run lock of ``sweeper.process.execute`` covers a run
        both start at once; this covers one finished before the other looks)."""
        known = set(self.runs.get(key, []))
        name, k = stem, 1
        while (self.sweep_dir / name).exists():
            run_dir = self.sweep_dir / name
            if run_dir not in known and (run_dir / RESULT_FILE).exists() and stored_key(run_dir) == key:
                self.add(key, run_dir)
            k += 1
            name = f"{stem}_{k}"


def free_for(run_dir: Path, key: str) -> bool:
    """Whether a run of ``key`` may go into ``run_dir``.

    Args:
        run_dir: the candidate run directory.
        key: the run's spec key.

    Returns:
        True when it does not exist, or holds the same spec without a result (an attempt
        interrupted with its orchestrator, which ``sweeper.process.execute`` resumes in
        place).
    """
    if not run_dir.exists():
        return True
    if (run_dir / RESULT_FILE).exists():
        return False
    return stored_key(run_dir) == key


def read_run(run_dir: Path, key: str, reused: bool, envelope: dict | None = None) -> dict:
    """What one finished run says: its outcome, record and capacity.

    Args:
        run_dir: the run's directory.
        key: its spec key (passed through).
        reused: it was found in the sweep directory, not run now (passed through).
        envelope: the job's result envelope; None: read result.json (a crash when it cannot
            be read).

    Returns:
        {"outcome" (ok, oom, error, crash or timeout; for a dry run, ``conf.contract.predicted_outcome``:
        oom when its predicted peak is above the capacity), "failed_phase" (or None), "message" (the error message, with
        the failed phase and error type when known), "record" (record.json, or None),
        "capacity_bytes" (the record's, or None), "run_dir", "reused", "key"}.
    """
    record, _ = try_read(run_dir, RECORD_FILE)
    if envelope is None:
        envelope, problem = try_read(run_dir, RESULT_FILE)
        if envelope is None:
            envelope = {"outcome": "crash", "error_message": problem}
    capacity = (record or {}).get("capacity_bytes")
    message = envelope.get("error_message")
    if envelope.get("failed_phase"):
        message = f"{envelope.get('failed_phase')}: {envelope.get('error_type')}: {message}"
    outcome = envelope.get("outcome") or "crash"
    if (record or {}).get("source") == "predicted":
        # a dry run never runs out of memory: its verdict is its predicted peak against the capacity
        peak, _ = run_peak(record)
        # result.json holds it (sweeper.process); a run without a readable result.json crashed
        verdict = envelope.get("predicted_outcome", outcome)
        if verdict is None:
            verdict, message = "error", "a dry run without a capacity or a predicted peak: no verdict"
        elif verdict == "oom":
            message = f"predicted peak {peak} B above the capacity {capacity} B (dry run)"
        outcome = verdict
    return {
        "outcome": outcome,
        "failed_phase": envelope.get("failed_phase"),
        "message": message,
        "record": record,
        "capacity_bytes": capacity if isinstance(capacity, int) else None,
        "run_dir": str(run_dir),
        "reused": reused,
        "key": key,
    }


def axis_reading(run: dict, axis: str, suspect: str = "stop") -> tuple[str, int | None, str, str | None]:
    """What one finished run (``read_run``) tells a search along ``axis``.

    An OOM is an OOM of ``axis`` only when the phase that failed scales with it
    (``conf.contract.oom_attribution``): an OOM in a later phase that does not (an eval after
    training, in a batch search) reads ``ok``, since every phase of ``axis`` ran ok; one before a
    phase of ``axis`` reads ``oom_elsewhere``, which stops the search (the frontier of ``axis`` is
    not reached: another variable runs out of memory first).

    An ``error`` whose failed phase is marked ``memory_suspect`` (worker.classify: probably memory,
    not said) reads ``memory_suspect``, which stops the search like an error, or, with
    ``suspect="oom"``, ``oom`` (then attributed as any OOM).

    Args:
        run: ``read_run``'s dict.
        axis: the axis searched.
        suspect: ``stop`` or ``oom`` (``hydra.sweeper.suspect``).

    Returns:
        (outcome for the search, peak in bytes of the phases that scale with ``axis`` and ran ok
        or None, the peak's counter name, message).
    """
    peak, counter = run_peak(run["record"], axis)
    outcome, message = run["outcome"], run["message"]
    phases = (run["record"] or {}).get("phases") or []
    failed = next((p for p in phases if isinstance(p, dict) and p.get("status") == "error"), {})
    if outcome == "error" and failed.get("failure_class") == "memory_suspect":
        outcome = "oom" if suspect == "oom" else "memory_suspect"
    if outcome == "oom":
        spec = (run["record"] or {}).get("spec") or {}
        planned = planned_phases(
            spec.get("mode"), spec.get("eval_batch"), spec.get("export"), (run["record"] or {}).get("train_step")
        )
        how = oom_attribution(run.get("failed_phase"), axis, planned)
        if how != "axis":
            outcome = "ok" if how == "past" else "oom_elsewhere"
            words = failure_words(str(run.get("failed_phase")), spec)
            message = f"{words} runs out of memory, a phase that does not scale with {axis} ({message})"
    return outcome, peak, counter, message


def oom_said(run: dict, counter: str) -> tuple[int | None, int | None]:
    """What a run's OOM said it held and asked, in the units of the peak counter the search reads.

    The failed phase's ``oom_allocated_bytes`` (A) and ``oom_request_bytes`` (R)
    (``conf.contract.OOM_DETAIL_FIELDS``: exact from the CPU allocator capacity's tracker, else
    parsed from the allocator's message). On a device whose peak counter is
    ``max_memory_reserved`` (CUDA, HIP, XPU), what was held is A plus the bytes reserved but
    unallocated (the caching allocator's message says both), so that held + R is what the
    reserved memory would have been; without that figure nothing is said. The search reads
    held as a floor of the usable capacity and held + R as its ceiling
    (``FrontierSearch.usable``).

    Args:
        run: ``read_run``'s dict (an ``oom`` run; any other gives nothing).
        counter: the peak counter the search reads (``conf.contract.run_peak``).

    Returns:
        (held bytes, asked bytes), or (None, None) when the OOM did not say both.
    """
    phases = (run.get("record") or {}).get("phases") or []
    failed = next((p for p in phases if isinstance(p, dict) and p.get("status") == "oom"), None)
    if run.get("outcome") != "oom" or failed is None:
        return None, None
    held, asked = failed.get("oom_allocated_bytes"), failed.get("oom_request_bytes")
    if counter == "max_memory_reserved":
        unallocated = failed.get("oom_reserved_unallocated_bytes")
        held = held + unallocated if isinstance(held, int) and isinstance(unallocated, int) else None
    if not (isinstance(held, int) and isinstance(asked, int)) or held < 0 or asked <= 0:
        return None, None
    return held, asked


def search_reading(run: dict, axis: str, suspect: str = "stop") -> tuple[Reading, str]:
    """What one finished run tells the search along ``axis``, as ``FrontierSearch.observe`` takes it.

    Args:
        run: ``read_run``'s dict.
        axis: the axis searched.
        suspect: ``stop`` or ``oom`` (``hydra.sweeper.suspect``).

    Returns:
        (the ``Reading``: ``axis_reading``'s outcome, peak and message, the run's capacity in bytes,
        reused and directory, for an ``oom`` what it held and asked, ``oom_said``, and the run's
        peak over every phase, ``conf.contract.run_peak``; the name of the peak's counter).
    """
    outcome, peak, counter, message = axis_reading(run, axis, suspect)
    held, asked = oom_said(run, counter) if outcome == "oom" else (None, None)
    whole, _ = run_peak(run["record"])  # every phase: the peak the report holds against its margin
    reading = Reading(outcome, peak, run["capacity_bytes"], message, run["reused"], run["run_dir"], held, asked, whole)
    return reading, counter


def launcher_slots(config: DictConfig, parallel: int | None) -> int:
    """Probes per round.

    Args:
        config: the sweep's config (``hydra.launcher``).
        parallel: ``hydra.sweeper.parallel`` (None: not set).

    Returns:
        ``parallel`` when set (at least 1), else the launcher's ``n_jobs`` (joblib; negative
        counts back from the CPU count as joblib does) up to the usable cores (the most launcher
        workers a launch gets, ``sweeper.launcher_bounds``), else 1.
    """
    if parallel is not None:
        return max(1, int(parallel))
    launcher = config.hydra.get("launcher") or {}
    n_jobs = launcher.get("n_jobs") if hasattr(launcher, "get") else None
    return min(resolved_n_jobs(n_jobs) or 1, usable_cores())  # no more probes at once than the pool runs


class SweepRuns:
    """The runs of one frontier sweep: reused when the sweep directory has them, else launched.

    Args:
        sweep_dir: the sweep directory (scanned now for reusable runs, ``RunIndex``).
        launcher: the Hydra launcher that runs jobs (``launch(job_overrides, initial_job_idx)``).
        compose: overrides -> the run's ``RunSpec`` (the sweeper's composition; SpecError on
            bad input).
        fixed: the command line's overrides, on every run.
        slots: at most this many jobs per launcher call.

    Attributes:
        index: the runs the sweep directory holds, by spec key.
        job_idx: the next job index for the launcher (starts after the reusable runs).
        returns: the launcher's JobReturn lists, one per launch.
        keys: overrides -> spec key, of every run asked for (``key_of``).
    """

    def __init__(
        self, sweep_dir: Path, launcher: Any, compose: Callable[[list[str]], RunSpec], fixed: list[str], slots: int
    ):
        self.sweep_dir, self.launcher, self.compose, self.fixed, self.slots = sweep_dir, launcher, compose, fixed, slots
        self.index = RunIndex(sweep_dir)
        self.job_idx = self.index.count()
        self.returns: list = []
        self.keys: dict[tuple[str, ...], str] = {}

    def key_of(self, overrides: list[str]) -> str:
        """The spec key of the run with ``overrides``, composed once per distinct overrides (a
        confirmation, a verification or another axis asks again for a value already probed)."""
        if tuple(overrides) not in self.keys:
            self.keys[tuple(overrides)] = spec_key(self.compose(overrides))
        return self.keys[tuple(overrides)]

    def run(self, axis: str, wanted: list[tuple[int, int]], extra: list[str] | None = None) -> list[dict]:
        """The ``n``-th run of each (value, n) of ``axis``: reused when the sweep directory has
        it, else launched (fresh worker processes, at most ``slots`` per launcher call).

        Args:
            axis: the axis.
            wanted: (value, n) pairs; n = 0: the probe, 1, 2...: its confirmations.
            extra: overrides added to each run (the light protocol).

        Returns:
            Per (value, n), ``read_run``'s dict: outcome, message, record (or None),
            capacity_bytes, run_dir, reused, key.

        Raises:
            Exception: whatever a launched job raised (bad input, a refused run directory):
                the orchestrator's own failures are not probe outcomes.
        """
        out: list[dict | None] = [None] * len(wanted)
        todo: list[tuple[int, list[str], Path, str]] = []
        for i, (value, n) in enumerate(wanted):
            overrides = self.fixed + list(extra or []) + [f"{axis}={value}"]
            key = self.key_of(overrides)
            stem = f"{axis}_{value}_{'light_' if extra else ''}{key}"
            run_dir = self.index.get(key, n)
            if run_dir is None:  # another orchestrator on this directory may have run it since the scan
                self.index.rescan(stem, key)
                run_dir = self.index.get(key, n)
            if run_dir is not None:
                out[i] = read_run(run_dir, key, reused=True)
                continue
            name, k = stem, 1
            while not free_for(self.sweep_dir / name, key) or any(t[2] == self.sweep_dir / name for t in todo):
                k += 1
                name = f"{stem}_{k}"
            todo.append((i, overrides + [f"hydra.sweep.subdir={name}"], self.sweep_dir / name, key))
        for start in range(0, len(todo), max(1, self.slots)):
            batch = todo[start : start + self.slots]
            results = launch_surviving(
                self.launcher, [t[1] for t in batch], self.job_idx, self.sweep_dir, [t[2] for t in batch]
            )
            self.job_idx += len(batch)
            self.returns.append(results)
            for (i, _, run_dir, key), r in zip(batch, results):
                envelope = r.return_value  # re-raises a job that failed in the orchestrator
                self.index.add(key, run_dir)
                out[i] = read_run(run_dir, key, reused=False, envelope=envelope)
        return out  # type: ignore[return-value]
