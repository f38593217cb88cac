"""``memsweep estimate``'s output: the breakdown as a table or JSON, and a workload's phases."""

from __future__ import annotations

import json

from memsweep.conf.contract import GiB

from .breakdown import Breakdown
from .workloads import PhaseEstimate


def format_phases(phases: list[PhaseEstimate], decimals: int = 2) -> str:
    """Per-phase estimated counters (bytes, GiB) of a workload estimate.

    Args:
        phases: ``mlp_phases``'s result.
        decimals: decimals of the GiB column (at least 6 are printed).

    Returns:
        a text table, one line per phase: iterations, ``memory_allocated`` at the start,
        ``max_memory_allocated``, ``memory_allocated`` at the end (bytes), the peak in GiB.
    """
    lines = [
        "estimated counters per phase (bytes; GiB = 2^30 B):",
        f"{'phase':<14} {'iterations':>10} {'allocated_start':>16} {'max_allocated':>14} "
        f"{'allocated_end':>14} {'max_allocated GiB':>18}",
    ]
    for p in phases:
        lines.append(
            f"{p.name:<14} {p.iterations:>10} {p.start:>16} {p.peak:>14} {p.end:>14} "
            f"{p.peak / GiB:>18.{max(decimals, 6)}f}"
        )
    return "\n".join(lines)


def estimate_text(b: Breakdown, title: str, phases: list[PhaseEstimate], *, json_output: bool, decimals: int) -> str:
    """An estimate as text: the table with its hints and phases, or (``json_output``) JSON in bytes.

    Args:
        b: the breakdown, reserve included.
        title: what was estimated (one line).
        phases: a workload estimate's phases (``mlp_phases``), or [].
        json_output: JSON instead of the table.
        decimals: decimals of the GB/GiB columns.

    Returns:
        The text to print (without its final newline).
    """
    if json_output:
        return json.dumps(
            {
                "title": title,
                "estimate": b.to_dict(),
                "not_included": list(b.not_included),
                "notes": list(b.notes),
                "phases": [
                    {
                        "name": p.name,
                        "iterations": p.iterations,
                        "memory_allocated_start": p.start,
                        "max_memory_allocated": p.peak,
                        "memory_allocated": p.end,
                    }
                    for p in phases
                ],
            },
            indent=1,
        )
    lines = [b.format(f"memsweep estimate: {title}", decimals=decimals)]
    if b.not_included:
        # name only the options that add a component still missing
        hints = {
            "gradients": "--train (gradients, optimizer states)",
            "optimizer_states": None,
            "activations": "--activations",
            "kv_cache": "--kv-tokens",
        }
        asks = [hint for n in b.not_included if (hint := hints.get(n))]
        if asks:
            lines.append(f"Ask for them with {', '.join(asks)}; --workload mlp estimates a whole memsweep load.")
    if phases:
        lines.append("\n" + format_phases(phases, decimals))
    lines.append("This is a calculation, not a measurement: `memsweep run` measures the load.")
    return "\n".join(lines)
