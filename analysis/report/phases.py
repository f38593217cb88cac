"""Phases: their order, how much each raised a run's peak, and what the peak consists of.

Everything here reads phase rows (analysis.tables.PHASES_SCHEMA as dicts); sizes are bytes.
"""

from __future__ import annotations

from memsweep.conf.contract import COLD_PHASES

COLD_WARM_FLAG = 1.2
"""A cold peak (first pass, step or generation) above this many times the warm one is called out."""


def phase_order(phases: list[dict]) -> list[str]:
    """Phase names in the order runs went through them.

    Args:
        phases: phase rows of any number of runs (``phase``, ``phase_index``).

    Returns:
        Each phase name once, by its smallest ``phase_index`` over the rows (then by name); a
        row without an index sorts last.
    """
    first: dict[str, int] = {}
    for p in phases:
        name = p.get("phase")
        if name is None:
            continue
        index = p.get("phase_index")
        idx: int = index if index is not None else 10**6
        first[name] = min(first.get(name, idx), idx)
    return sorted(first, key=lambda n: (first[n], n))


def peak_increments(run_phases: list[dict], order: list[str], counter: str) -> list[int | None]:
    """How much each phase raised the running maximum of ``counter``.

    Args:
        run_phases: the phase rows of one run.
        order: the phase names to report, in order (``phase_order``).
        counter: a peak counter column, e.g. ``max_memory_reserved``.

    Returns:
        One entry per name in ``order``: bytes by which that phase raised the run's peak
        above every phase before it (0 when it did not), None when the phase did not run or
        has no value. A phase recorded several times (a sub-phase of every warm step) counts
        with its largest peak.
    """
    peaks: dict[str, int] = {}
    for p in run_phases:
        if p.get(counter) is not None:
            peaks[p["phase"]] = max(peaks.get(p["phase"], p[counter]), p[counter])
    running, out = 0, []  # type: int, list[int | None]
    for name in order:
        if name not in peaks:
            out.append(None)
            continue
        out.append(max(0, peaks[name] - running))
        running = max(running, peaks[name])
    return out


PART_NAMES = {
    "weights": "weights (left by model_load)",
    "inputs": "inputs (left by inputs)",
    "state": "kept after the first pass/step",
    "transient": "transient at the peak (activations, temporaries)",
}
"""The parts of ``decomposition``, by key, as the report names them (a part's name starts so)."""

STATE_CONTENTS = {
    "train": "(gradients, optimizer states, cuBLAS workspaces)",
    None: "(cuBLAS workspaces, autotuning and other lazily created buffers: no gradients nor optimizer states)",
}
"""What the memory kept after the first pass/step holds, by mode (``train``, else any other).

cuBLAS allocates its workspace through the caching allocator at its first matrix product on a
stream (aten/src/ATen/cuda/CublasHandlePool.cpp, ``getCurrentCUDABlasHandle`` and
``getCUDABlasLtWorkspace``; size from CUBLAS_WORKSPACE_CONFIG, 32 MiB per handle and stream by
default on Hopper, one more for backward's thread) and keeps it: memory_allocated after the cold
phase includes it in every mode, so an inference run keeps tens of MiB that are no state at all."""


def state_label(mode: str | None) -> str:
    """The name of the "kept after the first pass/step" part for a run of ``mode``.

    Args:
        mode: the run's mode (``inference``, ``train``, ``generate``) or None.

    Returns:
        ``PART_NAMES["state"]`` followed by what it holds in that mode (``STATE_CONTENTS``).
    """
    return f"{PART_NAMES['state']} {STATE_CONTENTS.get(mode, STATE_CONTENTS[None])}"


OBSERVED_COUNTERPART = {
    "weights": "weights",
    "gradients": "state",
    "optimizer_states": "state",
    "activations": "transient",
    "temporaries": "transient",
}
"""Estimator component (``est_<component>_bytes``) -> the key of the observed part (PART_NAMES) it is compared with."""


def decomposition(run_phases: list[dict], peak: int | None, mode: str | None = None) -> list[tuple[str, int]]:
    """Observed split of a run's peak allocated bytes, from the counters between phases.

    weights = what model_load left allocated; inputs = what the inputs phase left;
    kept after the first step = what cold_forward/cold_step left (gradients and optimizer
    states in training; cuBLAS workspaces in every mode); transient = the peak minus what was live when its phase began
    (activations, temporaries). Whatever else was live at the peak's phase start is 'other'.

    Args:
        run_phases: the phase rows of one run (``memory_allocated_start``, ``memory_allocated``,
            ``max_memory_allocated``, bytes).
        peak: the run's peak ``max_memory_allocated`` (bytes); None leaves out the transient
            and other parts.
        mode: the run's mode: names what the kept part holds (``state_label``).

    Returns:
        (part name, bytes) pairs in the order above; a part whose counters are missing is left out.
    """
    ordered = sorted(run_phases, key=lambda p: p.get("phase_index") or 0)
    out = []

    def delta(*names):
        """memory_allocated at the end of the phase (or of its last sub-phase) minus at its start."""
        rows = [p for p in ordered if str(p.get("phase")).split(".")[0] in names]
        if rows and rows[-1].get("memory_allocated") is not None and rows[0].get("memory_allocated_start") is not None:
            return rows[-1]["memory_allocated"] - rows[0]["memory_allocated_start"]
        return None

    parts = [
        (PART_NAMES["weights"], delta("model_load")),
        (PART_NAMES["inputs"], delta("inputs")),
        (state_label(mode), delta(*COLD_PHASES)),
    ]
    if peak is None:
        return [(n, v) for n, v in parts if v is not None]
    peak_phase = next(
        (
            p
            for p in sorted(run_phases, key=lambda p: p.get("phase_index") or 0)
            if p.get("max_memory_allocated") == peak
        ),
        None,
    )
    live = peak_phase.get("memory_allocated_start") if peak_phase else None
    known = sum(v for _, v in parts if v is not None)
    for name, v in parts:
        if v is not None:
            out.append((name, v))
    if live is not None and peak_phase is not None:
        if live - known > 0:
            out.append(("other live bytes when the peak's phase began", live - known))
        out.append((f"{PART_NAMES['transient']} in {peak_phase['phase']}", peak - live))
    return out
