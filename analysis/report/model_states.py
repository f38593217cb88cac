"""The report's "Model states per rank" table: each DDP/FSDP run's parameters, gradients and
optimizer states on its fullest rank, as recorded, beside the estimator's ZeRO figure (stage 0 for
ddp, 3 for fsdp) at its world size.

The columns are runs.parquet's ``analysis.ranks.MODEL_STATE_COLUMNS``: the estimate is
calculated (before the run, from the load's description), the recorded sizes and the allocator's
figure come from the run. Shown when some run is a DDP/FSDP run; nothing otherwise.
"""

from __future__ import annotations

from memsweep.conf.contract import gib

from ..doc import Doc
from .fmt import nbytes


def _ratio(value: float | None) -> str | None:
    """A ratio printed to four decimals; None when missing."""
    return None if value is None else f"{value:.4f}"


def _row(r: dict) -> list:
    """The table's row of one DDP/FSDP run: estimated, recorded and allocator figures (bytes)."""
    est = r.get("estimated_model_states_bytes")
    return [
        r.get("run_id"),
        r.get("parallel"),
        r.get("world_size"),
        r.get("model_states_zero_stage"),
        nbytes(est),
        gib(est),
        nbytes(r.get("model_states_bytes")),
        _ratio(r.get("model_states_ratio")),
        nbytes(r.get("model_states_allocated_bytes")),
        _ratio(r.get("model_states_allocated_ratio")),
        nbytes(r.get("max_memory_allocated")),
        gib(r.get("max_memory_allocated")),
    ]


def model_states_section(doc: Doc, runs: list[dict]) -> None:
    """Append the "Model states per rank" table, one row per DDP/FSDP run (world size, then run
    id, in order); nothing when no run is one.

    Args:
        doc: the document appended to.
        runs: the measured run rows (runs.parquet's columns; a dry run is not among them).
    """
    rows = sorted(
        (r for r in runs if r.get("model_states_zero_stage") is not None),
        key=lambda r: (str(r.get("parallel")), r.get("world_size") or 0, str(r.get("run_id"))),
    )
    if not rows:
        return
    doc.h(2, "Model states per rank beside the ZeRO estimate (DDP/FSDP)")
    doc.p(
        "Parameters + gradients + optimizer states of each DDP/FSDP run on its fullest rank. "
        "**Estimated**: calculated from the load's description, one whole replica partitioned at "
        "ZeRO stage 0 (ddp: every rank keeps a replica) or 3 (fsdp: all three sharded) over the "
        "world size (Rajbhandari et al. 2020). **Recorded**: the storage of the rank's own tensors "
        "of each kind (its shards under FSDP), summed by the worker after model_load, the last "
        "backward and the last optimizer step. **Allocator**: `memory_allocated` after the last "
        "optimizer step less what the inputs added: the model states plus what the wrapper keeps "
        "beside them (DDP's gradient buckets; FSDP's device mesh)."
    )
    table = [_row(r) for r in rows]
    doc.table(
        [
            "run",
            "parallel",
            "world_size",
            "ZeRO stage",
            "estimated B",
            "GiB",
            "recorded B",
            "recorded / estimated",
            "allocator B",
            "allocator / estimated",
            "fullest rank's peak B",
            "GiB",
        ],
        table,
        note="A figure is '-' when the run, or one of its ranks, did not get through an optimizer step, "
        "or its spec has no estimate. FSDP2 pads each parameter's first dimension to a multiple of "
        "the world size, and Adam's per-tensor step stays whole on every rank: both make the "
        "recorded shards slightly larger than the formula's share.",
    )
