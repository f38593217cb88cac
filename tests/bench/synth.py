"""Synthesized sweeps of many runs, made from the run directories of one real tiny sweep.

``synthesize(real_sweep, out, n_runs)`` writes ``n_runs`` run directories under ``out``: loads of
``per_load`` runs each, one axis (batch) over ``per_load`` values, every load with its own context
and capacity. Each run is a copy of the real run whose batch ranks alike (the smaller batches copy
the real sweep's ok runs, the larger its OOMs), with the spec's and record's batch, context and
capacity rewritten and its counters scaled by the batch, so the frontier, curves and outliers
are those of a real sweep, many times over. A few runs are made failures (crash, error) and a few
peaks outliers, so a report must name them. Like a real sweep's directory, it has a manifest
(``sweep.json``, conf.contract.sweep) listing every run with its overrides, unless asked for none
(a sweep made before manifests: its runs are found by a walk). Used by tests/bench/bench_scale.py
and tests.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from memsweep.conf.contract import SWEEP_FILE, find_run_dirs, write_json_atomic
from memsweep.conf.contract.sweep import MANIFEST_VERSION, read_manifest

COUNTER_KEYS = ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved")


def _templates(real_sweep: Path) -> list[tuple[int, Path, dict, dict, dict]]:
    """The real runs (batch, dir, spec, record, result), by batch."""
    out = []
    for d in find_run_dirs([real_sweep]):
        docs = [json.loads((d / n).read_text()) for n in ("spec.json", "record.json", "result.json")]
        out.append((int(docs[0]["batch"]), d, *docs))
    return sorted(out, key=lambda t: t[0])


def _scale(record: dict, factor: float) -> None:
    """Scale the record's phase counters (bytes) by ``factor``, in place."""
    for p in record.get("phases") or []:
        for k in COUNTER_KEYS:
            if isinstance(p.get(k), int):
                p[k] = int(p[k] * factor)


def _fault(i: int, record: dict, result: dict) -> None:
    """Make every 997th run a crash and every 1499th an error; every 251st peak an outlier."""
    if i % 997 == 5:
        result.update(outcome="crash", returncode=-9, signal=9, error_message="killed by signal 9 (synthesized)")
        record["complete"] = False
    elif i % 1499 == 7:
        result.update(outcome="error", error_type="RuntimeError", error_message="synthesized error")
        record.update(outcome="error", error_type="RuntimeError", error_message="synthesized error")
    elif i % 251 == 3:
        _scale(record, 1.5)


def _overrides(template: list[str], batch: int, context: int, capacity: int) -> list[str]:
    """A real run's overrides (its manifest entry) with the synthesized run's batch, context and capacity."""
    new = {"batch": f"batch={batch}", "context": f"context={context}", "capacity": f"capacity={capacity}B"}
    kept = [o for o in template if o.split("=")[0] not in new]
    return kept + list(new.values())


def synthesize(real_sweep: Path, out: Path, n_runs: int, per_load: int = 20, manifest: bool = True) -> Path:
    """Write a sweep of ``n_runs`` run directories under ``out`` (see the module's docstring).

    Args:
        real_sweep: a finished sweep of one axis (batch) with ok and oom runs.
        out: the new sweep directory (created; must not exist).
        n_runs: how many run directories.
        per_load: runs per load (batch values per context).
        manifest: write the sweep's manifest (sweep.json) listing every run, as a real sweep has;
            False: none (the runs are then every run directory found under ``out``).

    Returns:
        ``out``.
    """
    templates = _templates(Path(real_sweep))
    listed = {r["run_id"]: r.get("overrides") or [] for r in (read_manifest(real_sweep) or {"runs": []})["runs"]}
    out = Path(out)
    out.mkdir(parents=True)
    runs = []
    for i in range(n_runs):
        load, k = divmod(i, per_load)
        batch_t, src, spec, record, result = templates[min(k * len(templates) // per_load, len(templates) - 1)]
        spec, record, result = json.loads(json.dumps(spec)), json.loads(json.dumps(record)), dict(result)
        batch, context, capacity = k + 1, 64 + load, spec["capacity_bytes"] + 4096 * load
        spec.update(batch=batch, context=context, capacity_bytes=capacity)
        record.update(capacity_bytes=capacity)
        if isinstance(record.get("spec"), dict):
            record["spec"].update(batch=batch, context=context, capacity_bytes=capacity)
        _scale(record, batch / max(batch_t, 1))
        _fault(i, record, result)
        d = out / str(i)
        d.mkdir()
        for name, doc in (("spec.json", spec), ("record.json", record), ("result.json", result)):
            (d / name).write_text(json.dumps(doc))
        for extra in ("stderr.log", "stdout.log"):
            if (src / extra).exists():
                shutil.copyfile(src / extra, d / extra)
        overrides = _overrides(listed.get(src.name, []), batch, context, capacity)
        runs.append({"run_id": str(i), "overrides": overrides, "session": "synthesized"})
    if manifest:
        write_json_atomic(out / SWEEP_FILE, {"schema_version": MANIFEST_VERSION, "kind": "sweep", "runs": runs})
    return out
