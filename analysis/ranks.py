"""The phases table's ``ranks`` column: a DDP/FSDP run's per-rank phase entries (no torch)."""

from __future__ import annotations

import pyarrow as pa

from conf.contract import PHASE_RANK_FIELDS

RANK_TYPES = {int: pa.int64(), float: pa.float64(), str: pa.string()}
RANK_TYPE = pa.list_(pa.struct([(f.name, RANK_TYPES[f.type]) for f in PHASE_RANK_FIELDS]))
"""Type of the phases table's ``ranks`` column: one struct per rank of a DDP/FSDP run."""


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def rank_rows(value) -> list[dict] | None:
    """A phase's ``ranks`` list as rows of RANK_TYPE; null when absent (a one-process run)."""
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
                v = _int(v)
            elif f.type is float:
                v = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
            else:
                v = v if isinstance(v, str) else None
            row[f.name] = v
        out.append(row)
    return out
