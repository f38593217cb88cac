"""Per phase, the peak split into parameters, gradients, optimizer states and activations
(calculated), drawn against the capacity.

The split is never measured: a real run's counters hold only the total. It comes, in order of
preference, from a dry run of the same load (``predicted_*_bytes`` of its phases, the
categories of torch.distributed._tools.mem_tracker), from the estimator's replay of the mlp
workload per phase (``analysis.estimate.mlp_phases_for_spec``; a whole replica, so not for an FSDP
run), or from the estimate of the whole run (the runs table's ``est_*`` columns, one bar; one rank's
for a DDP/FSDP run). Bytes throughout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memsweep.conf.contract import PEAK_CATEGORIES, PEAK_CATEGORY_WORDS, PEAK_SPLIT_FIELDS
from memsweep.estimator import PARALLEL_ZERO_STAGE, mlp_phases_for_spec

from ..doc import Doc, Image
from .fmt import axis_label, nbytes, workload_params
from .stats import AxisResult

PARTS = tuple(PEAK_CATEGORY_WORDS[category] for category, _ in PEAK_CATEGORIES)
"""The four parts of the split, in stacking order: conf.contract.PEAK_CATEGORIES, in their order,
named by PEAK_CATEGORY_WORDS."""

_DRY_RUN_FIELDS = dict(zip(PARTS, PEAK_SPLIT_FIELDS, strict=True))
_ESTIMATE_COMPONENTS = dict(
    zip(
        PARTS,
        (("weights",), ("gradients",), ("optimizer_states",), ("activations", "kv_cache", "temporaries")),
        strict=True,
    )
)


@dataclass
class Split:
    """The calculated split of one run's peak, per phase.

    Attributes:
        value: the value of the swept axis it is for.
        source: where the split comes from, in words (a dry run, the estimator's replay, the
            whole-run estimate).
        phases: the phase names, in protocol order.
        parts: part (PARTS) -> bytes per phase (None: not known).
        observed: the measured ``max_memory_allocated`` of each phase (bytes; None when the
            phase was not measured), shown beside the calculated bars, never added to them.
    """

    value: object
    source: str
    phases: list[str]
    parts: dict[str, list[int | None]]
    observed: list[int | None]


def _spec_of(run: dict) -> dict:
    """The spec fields of a runs-table row that the estimator reads."""
    spec = {k: run.get(k) for k in ("batch", "context", "width", "dtype", "mode", "device", "warmup", "repeats")}
    spec["workload"] = {"name": run.get("workload"), **workload_params(run)}
    for k in ("precision", "optimizer", "checkpointing", "micro_steps", "eval_batch", "export"):
        if run.get(k) is not None:
            spec[k] = run[k]
    return {k: v for k, v in spec.items() if v is not None}


def _observed(run: dict, names: list[str]) -> list[int | None]:
    peaks: dict[str, int] = {}
    for p in run.get("_phases") or []:
        v = p.get("max_memory_allocated")
        if v is not None:
            peaks[p["phase"]] = max(peaks.get(p["phase"], v), v)
    return [peaks.get(n) for n in names]


def _from_dry_run(a: AxisResult, value, predicted: list[dict], predicted_phases: list[dict]) -> Split | None:
    keys = ("workload", "workload_params", "mode", "batch", "context", "width", "dtype")
    target = {**a.fixed, a.axis: value}
    base = a.runs[0] if a.runs else {}
    for r in predicted:
        if any(r.get(k) != (target[k] if k in target else base.get(k)) for k in keys):
            continue
        rows = [p for p in predicted_phases if p["sweep_dir"] == r["sweep_dir"] and p["run_id"] == r["run_id"]]
        rows = sorted(rows, key=lambda p: p.get("phase_index") or 0)
        rows = [p for p in rows if p.get(_DRY_RUN_FIELDS[PARTS[-1]]) is not None]
        if not rows:
            continue
        names = list(dict.fromkeys(p["phase"] for p in rows))
        best: dict[str, dict] = {}
        for p in rows:  # a phase recorded several times: the row of its largest peak
            peak = p.get("max_memory_allocated") or 0
            if p["phase"] not in best or peak > (best[p["phase"]].get("max_memory_allocated") or 0):
                best[p["phase"]] = p
        parts = {part: [best[n].get(field) for n in names] for part, field in _DRY_RUN_FIELDS.items()}
        return Split(value, f"dry run `{r['run_id']}` (fake tensors, predicted)", names, parts, [])
    return None


def _from_replay(run: dict, value) -> Split | None:
    if PARALLEL_ZERO_STAGE.get(str(run.get("parallel")), 0) > 0:  # the replay is of a whole replica, not a shard
        return None
    spec = _spec_of(run)
    try:
        phases = mlp_phases_for_spec(spec)
    except (KeyError, TypeError, ValueError):
        return None
    if phases is None:
        return None
    best: dict[str, Any] = {}
    for p in phases:
        if p.name not in best or p.peak > best[p.name].peak:
            best[p.name] = p
    names = list(best)
    parts = {
        part: [sum(getattr(best[n].at_peak, c) or 0 for c in comps) for n in names]
        for part, comps in _ESTIMATE_COMPONENTS.items()
    }
    source = "the estimator's replay of the mlp workload, phase by phase"
    return Split(value, source, names, parts, _observed(run, names))


def _from_estimate(run: dict, value) -> Split | None:
    cols = {c: run.get(f"est_{c}_bytes") for comps in _ESTIMATE_COMPONENTS.values() for c in comps}
    if all(v is None for v in cols.values()):
        return None
    parts = {part: [sum(cols[c] or 0 for c in comps)] for part, comps in _ESTIMATE_COMPONENTS.items()}
    stage = PARALLEL_ZERO_STAGE.get(str(run.get("parallel")))
    per_rank = "" if stage is None else f"; one rank's, model states at ZeRO stage {stage} over {run.get('world_size')}"
    return Split(
        value,
        f"the estimate of the whole run (runs.parquet `est_*`: at the run's peak{per_rank})",
        ["whole run"],
        parts,
        [run.get("max_memory_allocated")],
    )


def calculated_split(a: AxisResult, predicted: list[dict], predicted_phases: list[dict]) -> Split | None:
    """The calculated split of the peak at the recommended value (else the edge, ``max_ok`` or ``min_ok``, else the
    smallest value run) of one axis.

    Args:
        a: the axis result.
        predicted: the dry-run rows of the runs table (source ``predicted``).
        predicted_phases: their phase rows (``predicted_*_bytes``).

    Returns:
        The split, or None when neither a dry run, the estimator nor an estimate covers the load.
    """
    value = next((v for v in (a.recommended, a.edge) if v is not None), a.values[0].value if a.values else None)
    st = a.stat(value)
    if st is None:
        return None
    run = next((r for r in st.runs if r.get("outcome") == "ok"), st.runs[0])
    split = _from_dry_run(a, value, predicted, predicted_phases)
    if split is not None:
        split.observed = _observed(run, split.phases)
        return split
    return _from_replay(run, value) or _from_estimate(run, value)


def split_section(doc: Doc, axes: list[AxisResult], predicted: list[dict], predicted_phases: list[dict], plots) -> None:
    """Append "The peak by phase, split (calculated)": per axis a stacked bar per phase of the
    calculated split at the chosen value, against the capacity, with the observed peaks beside.

    Args:
        doc: the document appended to.
        axes: the axis results.
        predicted, predicted_phases: the dry runs and their phase rows (may be empty).
        plots: ``analysis.plots``, or a stand-in whose every figure is empty bytes.
    """
    doc.h(2, "The peak by phase: parameters, gradients, optimizer states, activations")
    shown = False
    for i, a in enumerate(axes):
        split = calculated_split(a, predicted, predicted_phases)
        if split is None:
            continue
        shown = True
        totals = [sum(v[j] or 0 for v in split.parts.values()) for j in range(len(split.phases))]
        top = max(range(len(totals)), key=lambda j: totals[j])
        doc.p(
            f"{a.title}, at {axis_label(a.axis, split.value)}: the split is **calculated** from {split.source}; "
            f"the counters of a real run hold only the total (shown beside as observed). Largest calculated "
            f"phase peak: {split.phases[top]}, {nbytes(totals[top])} B, of which "
            + ", ".join(f"{p} {nbytes(split.parts[p][top])} B" for p in PARTS)
            + "."
        )
        doc.image(
            Image(
                f"split{i}_{a.axis}.png",
                plots.split_plot(
                    split.phases,
                    {p: split.parts[p] for p in PARTS},
                    split.observed or [None] * len(split.phases),
                    a.capacity,
                    a.margin_bytes,
                    f"calculated split of the peak by phase, {axis_label(a.axis, split.value)}, against the capacity",
                    "observed max_memory_allocated (measured)",
                ),
                f"Per phase, the peak split into parameters, gradients, optimizer states and activations "
                f"(calculated from {split.source}) against the capacity; black diamonds: the measured "
                "`max_memory_allocated` of the phase (observed).",
            )
        )
    if not shown:
        doc.p(
            "No split available: no dry run of these loads, and no estimate (the estimator covers the mlp "
            "workload with its default mode options; `dry_run=true` splits any load)."
        )
