"""The phase plan of a run: which phases (and sub-phases) run, in order, and what each one calls.

Phases, in order: ``model_load``, ``inputs``, then

* inference: ``cold_forward``, ``warmup``, ``warm_forward`` (under torch.inference_mode);
* train: ``cold_step``, ``warmup`` (whole steps), ``repeats`` steps ``warm_step``, each split
  into ``forward``, ``loss``, ``backward`` (once per micro-step) and ``optimizer_step``
  (``cold_step.forward``, ...); a user's ``workload.train_step`` is one ``user_step`` instead;
* generate: ``cold_generate``, ``warmup``, ``repeats`` ``warm_generate``, each split into
  ``prefill`` and ``decode``;

then, when asked, ``eval`` (train mode) and ``export``. A sub-phase's record names its
``parent``, ``sub_phase``, ``step`` (0-based) and ``micro_step``; null on the other phases.
The names come from ``conf.contract`` (the contract's phase tuples), never spelled here.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memsweep.conf.contract import (
    AFTER_PHASES,
    GENERATE_SUB_PHASES,
    INFERENCE_PHASES,
    PARENT_PHASES,
    STEP_SUB_PHASES,
    SUB_PHASE_FIELDS,
    USER_STEP_SUB_PHASES,
    RunSpec,
)

if TYPE_CHECKING:  # worker.workloads imports torch; the worker's command line imports this module first
    from .workloads import Workload

# The names of the phases, sub-phases and parents, unpacked from the contract's tuples (in their order).
MODEL_LOAD, INPUTS, COLD_FORWARD, WARMUP, WARM_FORWARD = INFERENCE_PHASES
COLD_STEP, WARM_STEP, COLD_GENERATE, WARM_GENERATE = PARENT_PHASES
FORWARD, LOSS, BACKWARD, OPTIMIZER_STEP = STEP_SUB_PHASES
PREFILL, DECODE = GENERATE_SUB_PHASES
(USER_STEP,) = USER_STEP_SUB_PHASES
EVAL, EXPORT = AFTER_PHASES


@dataclasses.dataclass(frozen=True)
class PhaseStep:
    """One phase or sub-phase of a run's plan: what ``run_phase`` runs and records.

    Attributes:
        name: the phase's name in the record (``model_load``, ``cold_step.forward``...).
        body: the phase body (a ``Workload`` method or a partial of one); no argument.
        iterations: how many times ``body`` runs in the phase (``spec.warmup`` for ``warmup``,
            ``spec.repeats`` for ``warm_forward``, else 1).
        parent: the parent phase of a sub-phase (``cold_step``, ``warm_generate``...), else None.
        sub_phase: the sub-phase's own name (``forward``, ``prefill``...), else None.
        step: the step's or generation's index within its parent (0-based), else None.
        micro_step: the micro-step of a forward, loss or backward sub-phase, else None.
        after: a callable returning sizes by construction (bytes) that a successful phase adds
            to its record (``gradient_bytes``, ``optimizer_state_bytes``, ``kv_cache_info``,
            ``export_info``), or None.
        release: called once the phase is recorded, outside any measured window (the end of a
            generation releases its KV cache there, after its bytes are read), or None.
    """

    name: str
    body: Callable[[], object]
    iterations: int = 1
    parent: str | None = None
    sub_phase: str | None = None
    step: int | None = None
    micro_step: int | None = None
    after: Callable[[], dict] | None = None
    release: Callable[[], None] | None = None

    @property
    def meta(self) -> dict:
        """The sub-phase fields of the phase record: parent, sub_phase, step, micro_step."""
        return {k: getattr(self, k) for k in SUB_PHASE_FIELDS}


def sub_phase(parent: str, name: str, body: Callable[[], object], step: int, **fields: Any) -> PhaseStep:
    """A sub-phase of ``parent``, recorded as ``<parent>.<name>`` (``conf.contract.sub_phase_names``).

    Args:
        parent: the parent phase (``cold_step``, ``warm_generate``...).
        name: the sub-phase (``forward``, ``prefill``...).
        body: the phase body (no argument).
        step: the step's or generation's index within the parent (0-based).
        **fields: any other field of ``PhaseStep`` (``micro_step``, ``after``, ``release``),
            as ``PhaseStep`` declares it.

    Returns:
        Its ``PhaseStep`` (one iteration).

    Raises:
        TypeError: a field ``PhaseStep`` does not declare.
    """
    return PhaseStep(f"{parent}.{name}", body, parent=parent, sub_phase=name, step=step, **fields)


def plan(spec: RunSpec, w: Workload) -> list[PhaseStep]:
    """The run's phases in order, for ``run_phase``.

    Args:
        spec: the run's spec (mode, micro_steps, warmup, repeats, eval_batch, export).
        w: the run's workload, whose methods are the phase bodies.

    Returns:
        One ``PhaseStep`` per phase and sub-phase, in the order they run.
    """
    steps = [PhaseStep(MODEL_LOAD, w.model_load), PhaseStep(INPUTS, w.inputs)]

    def train_step(parent: str, index: int) -> list[PhaseStep]:
        if spec.train_step == "user":  # the user's own step: memsweep cannot split it
            return [sub_phase(parent, USER_STEP, w.user_step, index, after=w.step_sizes)]
        out = []
        for m in range(spec.micro_steps):
            out += [
                sub_phase(parent, FORWARD, functools.partial(w.step_forward, m), index, micro_step=m),
                sub_phase(parent, LOSS, functools.partial(w.step_loss, m), index, micro_step=m),
                sub_phase(
                    parent, BACKWARD, functools.partial(w.step_backward, m), index, micro_step=m, after=w.gradient_bytes
                ),
            ]
        out.append(sub_phase(parent, OPTIMIZER_STEP, w.step_optimizer, index, after=w.optimizer_state_bytes))
        return out

    def generation(parent: str, index: int) -> list[PhaseStep]:
        return [
            sub_phase(parent, PREFILL, w.gen_prefill, index, after=w.kv_cache_info),
            sub_phase(parent, DECODE, w.gen_decode, index, after=w.kv_cache_info, release=w.end_generation),
        ]

    if spec.mode == "train":
        steps += train_step(COLD_STEP, 0)
        steps.append(PhaseStep(WARMUP, w.train_step, spec.warmup))
        for i in range(spec.repeats):
            steps += train_step(WARM_STEP, i)
    elif spec.mode == "generate":
        steps += generation(COLD_GENERATE, 0)
        steps.append(PhaseStep(WARMUP, w.generate, spec.warmup))
        for i in range(spec.repeats):
            steps += generation(WARM_GENERATE, i)
    else:
        steps += [
            PhaseStep(COLD_FORWARD, w.forward),
            PhaseStep(WARMUP, w.forward, spec.warmup),
            PhaseStep(WARM_FORWARD, w.forward, spec.repeats),
        ]
    if spec.eval_batch is not None:
        steps.append(PhaseStep(EVAL, w.evaluate))
    if spec.export:
        steps.append(PhaseStep(EXPORT, w.export, after=w.export_info))
    return steps
