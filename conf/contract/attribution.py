"""Which load variable a failure is counted against (phase attribution).

A run that runs out of memory says "does not fit" only for the variables that set the size of
the phase that failed (``vocabulary.PHASE_SIZE_VARIABLES``): a training run that trains fine and
runs out of memory in ``eval`` is an OOM of ``eval_batch``, not of ``batch``. Used by the
analysis (the frontier table) and the frontier sweeper (which outcome a probe gives the
search), so both read a failure the same way. Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence

from .vocabulary import (
    AXES,
    GENERATE_PHASES,
    INFERENCE_PHASES,
    PHASE_SIZE_VARIABLES,
    TRAIN_PHASES,
    USER_TRAIN_PHASES,
)

ALL_VARIABLES = (*AXES, "new_tokens")
"""Every load variable a phase's size may follow (the axes and generate's ``new_tokens``)."""

ATTRIBUTIONS = ("axis", "past", "short")
"""How an OOM reads for one axis (``oom_attribution``): ``axis``, an OOM of that axis (the failed
phase scales with it); ``past``, the failed phase does not scale with it and every phase that
does ran ok before it (for that axis the run fits); ``short``, the failed phase does not scale
with it and a phase that does never ran (for that axis the run says nothing)."""


def phase_key(phase: str | None) -> str | None:
    """The name a phase is looked up by in PHASE_SIZE_VARIABLES.

    Args:
        phase: a recorded phase name (``cold_step.backward``, ``eval``...), or None.

    Returns:
        A sub-phase's own name (``backward``), else the name itself (None stays None).
    """
    return phase.rsplit(".", 1)[-1] if phase else phase


def phase_variables(phase: str | None) -> tuple[str, ...]:
    """The load variables that set a phase's size, the one that names the phase first.

    Args:
        phase: a recorded phase name, or None.

    Returns:
        ``PHASE_SIZE_VARIABLES`` of the phase; ``ALL_VARIABLES`` for a phase not listed there
        (``setup``, None): a failure nobody can place is counted against every variable, as
        before phase attribution.
    """
    return PHASE_SIZE_VARIABLES.get(phase_key(phase) or "", ALL_VARIABLES)


def scales_with(phase: str | None, variable: str) -> bool:
    """Whether ``variable`` sets the size of ``phase``.

    Args:
        phase: a recorded phase name, or None.
        variable: a load variable (``batch``, ``eval_batch``...).

    Returns:
        True when ``variable`` is among ``phase_variables(phase)``.
    """
    return variable in phase_variables(phase)


def oom_attribution(failed_phase: str | None, axis: str, planned: Sequence[str]) -> str:
    """How an OOM in ``failed_phase`` reads on ``axis``.

    Args:
        failed_phase: the phase that ran out of memory (a recorded name), or None.
        axis: the swept variable (one of AXES).
        planned: the run's phases in order (``RunSpec.phases``; ``planned_phases``).

    Returns:
        One of ATTRIBUTIONS: ``axis`` when the failed phase scales with ``axis`` (or cannot be
        placed); ``past`` when it does not and every planned phase that does comes before it
        (those ran ok: the run is a point that fits, for this axis); ``short`` otherwise.
    """
    if scales_with(failed_phase, axis) or failed_phase not in planned:
        return "axis"
    after = planned[planned.index(failed_phase) + 1 :]
    return "short" if any(scales_with(p, axis) for p in after) else "past"


def planned_phases(
    mode: str | None, eval_batch: int | None, export: bool | None, train_step: str | None = None
) -> tuple[str, ...]:
    """The phases a run of ``mode`` records, in order (as ``RunSpec.phases``, from a runs-table row).

    Args:
        mode: inference, train or generate (anything else reads as inference).
        eval_batch: the eval phase's batch, or None (no eval phase).
        export: whether the run exports its model.
        train_step: who runs a training run's steps (TRAIN_STEP_KINDS; the record's
            ``train_step``): ``user`` gives the user's one sub-phase per step (USER_TRAIN_PHASES);
            anything else memsweep's split steps.

    Returns:
        The phase names, in order.
    """
    train = USER_TRAIN_PHASES if train_step == "user" else TRAIN_PHASES
    base = {"train": train, "generate": GENERATE_PHASES}.get(mode or "", INFERENCE_PHASES)
    return base + (("eval",) if eval_batch is not None else ()) + (("export",) if export else ())


def failure_words(failed_phase: str, values: dict) -> str:
    """The phase and the variable that names it, in words: ``eval at eval_batch=4096``.

    Args:
        failed_phase: the phase that ran out of memory.
        values: the run's load (variable -> value); a variable without a value is left out.

    Returns:
        ``"<phase> at <variable>=<value>"``, or the phase alone when its naming variable has no
        value (or the phase is not in PHASE_SIZE_VARIABLES).
    """
    variables = PHASE_SIZE_VARIABLES.get(phase_key(failed_phase) or "")
    if not variables or values.get(variables[0]) is None:
        return failed_phase
    return f"{failed_phase} at {variables[0]}={values[variables[0]]}"
