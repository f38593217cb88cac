"""The phases table's ``ranks`` column: a DDP/FSDP run's per-rank phase entries (no torch)."""

from __future__ import annotations

from conf.contract import PHASE_RANK_FIELDS

from .schemas import as_int


def rank_rows(value) -> list[dict] | None:
    """A phase's ``ranks`` list as rows of analysis.schemas.RANK_TYPE; null when absent (a one-process run)."""
    if not isinstance(value, list):
        return None
    out = []
    for r in value:
        if not isinstance(r, dict):
            continue
        row = {}
        for f in PHASE_RANK_FIELDS:
            v = r.get(f.name)
            if f.type is int:
                v = as_int(v)
            elif f.type is float:
                v = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
            else:
                v = v if isinstance(v, str) else None
            row[f.name] = v
        out.append(row)
    return out
