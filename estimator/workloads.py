"""memsweep's own workloads, exactly: an allocation-by-allocation replay of the mlp's PyTorch ops.

The counterpart of ``worker/workloads/mlp.py``: ``mlp_phases`` gives the counters each protocol
phase would record, ``estimate_mlp`` the breakdown at the run's peak, ``estimate_for_spec``
the estimate the sweeper puts into a spec.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from memsweep.conf.contract import CUDA_BLOCK_BYTES
from memsweep.conf.contract.spec import resolve_precision

from .breakdown import COMPONENTS, Breakdown, ceil_div, check_int
from .formats import DTYPE_BYTES


@dataclasses.dataclass(frozen=True)
class PhaseEstimate:
    """Estimated counters of one protocol phase (bytes): ``memory_allocated`` at its start
    and end, ``max_memory_allocated`` over it (the peak is reset at the phase's start, so it
    includes what was already allocated), and the breakdown at the peak.

    Attributes:
        name: the phase (``model_load``, ``inputs``, ``cold_forward``, ``warmup``,
            ``warm_forward``, ``cold_step.forward``, ...), as the worker names it.
        iterations: iterations the phase runs (warmup, repeats), 1 for the others.
        start: estimated ``memory_allocated`` at the phase's start, bytes.
        end: estimated ``memory_allocated`` at its end, bytes.
        peak: estimated ``max_memory_allocated`` over the phase, bytes.
        at_peak: the live bytes by component at that peak (``at_peak.peak == peak``).
    """

    name: str
    iterations: int
    start: int
    end: int
    peak: int
    at_peak: Breakdown


class _Tape:
    """Replays allocations and frees; tracks live bytes by category and the peak.

    On ``cuda`` each allocation is rounded up to ``CUDA_BLOCK_BYTES`` bytes (an empty one stays 0),
    as the caching allocator's ``memory_allocated`` counts it; on ``cpu`` sizes are exact.
    """

    def __init__(self, device_kind: str):
        self.round = (
            (lambda n: ceil_div(n, CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES if n else 0)
            if device_kind == "cuda"
            else (lambda n: n)
        )
        self.live: dict[str, tuple[int, str]] = {}
        self.by_cat = {c: 0 for c in COMPONENTS}
        self.total = 0
        self.peak = 0
        self.peak_cats = dict(self.by_cat)

    def alloc(self, name: str, nbytes: int, category: str) -> None:
        """A new live storage ``name`` of ``nbytes`` (rounded) in ``category`` (a COMPONENT)."""
        assert name not in self.live, name
        n = self.round(nbytes)
        self.live[name] = (n, category)
        self.by_cat[category] += n
        self.total += n
        if self.total > self.peak:
            self.peak, self.peak_cats = self.total, dict(self.by_cat)

    def free(self, name: str) -> None:
        """Release the live storage ``name``."""
        n, category = self.live.pop(name)
        self.by_cat[category] -= n
        self.total -= n

    def rename(self, old: str, new: str) -> None:
        """Call the live storage ``old`` ``new`` (same bytes, same category)."""
        self.live[new] = self.live.pop(old)

    def has(self, name: str) -> bool:
        """Whether ``name`` is live."""
        return name in self.live

    def reset_peak(self) -> None:
        """Start a new peak at what is live now (``reset_peak_memory_stats``)."""
        self.peak, self.peak_cats = self.total, dict(self.by_cat)


def mlp_param_shapes(width: int, hidden: int, depth: int) -> list[tuple[int, ...]]:
    """Shapes of the mlp's parameters in ``model.parameters()`` order: per block
    (hidden, width) weight, (hidden,) bias, (width, hidden) weight, (width,) bias.

    Args:
        width: the block's input and output features.
        hidden: the first Linear's output features.
        depth: blocks.

    Returns:
        ``4 * depth`` shapes (nn.Linear's weight is (out_features, in_features)).
    """
    return [s for _ in range(depth) for s in ((hidden, width), (hidden,), (width, hidden), (width,))]


ACTIVATION_SAVES_OUTPUT = {"relu": True, "tanh": True, "gelu": False, "silu": False}
"""What autograd saves for each activation (PyTorch tools/autograd/derivatives.yaml): relu
and tanh save their output, gelu and silu their input."""


@dataclasses.dataclass(frozen=True)
class _MlpLoad:
    """The checked arguments of ``mlp_phases``: sizes are counts, ``elem`` bytes per value."""

    rows: int  # batch x context
    width: int
    hidden: int
    depth: int
    elem: int
    train: bool
    device_kind: str  # "cpu" or "cuda"
    foreach: bool
    saves_output: bool
    numels: tuple[int, ...]


def _mlp_load(
    batch: int,
    context: int,
    width: int,
    dtype: str,
    mode: str,
    depth: int,
    hidden: int | None,
    activation: str,
    device: str,
    warmup: int,
    repeats: int,
    foreach: bool | None,
) -> _MlpLoad:
    """Check ``mlp_phases``'s arguments (in its order) and resolve its defaults.

    Raises:
        ValueError: as ``mlp_phases``.
    """
    for name, v in (("batch", batch), ("context", context), ("width", width), ("depth", depth)):
        check_int(name, v, 1)
    if dtype not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype!r}")
    if mode not in ("inference", "train"):
        raise ValueError(f"mode must be inference or train, got {mode!r}")
    if activation not in ACTIVATION_SAVES_OUTPUT:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATION_SAVES_OUTPUT)}, got {activation!r}")
    check_int("warmup", warmup)
    check_int("repeats", repeats, 1)
    hidden = 4 * width if hidden is None else check_int("hidden", hidden, 1)
    kind = "cuda" if device.startswith("cuda") else "cpu"
    return _MlpLoad(
        rows=batch * context,
        width=width,
        hidden=hidden,
        depth=depth,
        elem=DTYPE_BYTES[dtype],
        train=mode == "train",
        device_kind=kind,
        foreach=(kind == "cuda") if foreach is None else foreach,
        saves_output=ACTIVATION_SAVES_OUTPUT[activation],
        numels=tuple(math.prod(s) for s in mlp_param_shapes(width, hidden, depth)),
    )


class _MlpReplay:
    """The storages the mlp workload's PyTorch ops create and free, replayed on a ``_Tape``
    phase by phase (PyTorch eager mode, the storage bytes each operator returns).

    A training step is the worker's four sub-phases: forward (``zero_grad`` first), loss,
    backward, optimizer_step (the loss released at its end).
    """

    def __init__(self, load: _MlpLoad):
        self.load = load
        self.tape = _Tape(load.device_kind)
        self.phases: list[PhaseEstimate] = []

    def phase(self, name: str, iterations: int, body: Callable[[], None]) -> None:
        """Run ``body`` as the protocol phase ``name`` (peak reset at its start) and record it."""
        t = self.tape
        t.reset_peak()
        start = t.total
        for _ in range(min(iterations, 2)):  # from the second iteration on, every one is the same
            body()
        live: dict[str, Any] = {c: t.peak_cats[c] for c in COMPONENTS}
        at_peak = Breakdown(**live)
        self.phases.append(PhaseEstimate(name, iterations, start, t.total, t.peak, at_peak))

    def model_load(self) -> None:
        """Each Linear's ``empty`` weight and bias in fp32 (the default dtype), in ``parameters()``
        order, then ``.to(dtype)`` one at a time (new copy, old storage freed). On CUDA only the
        device copies count (the model is built on the CPU and moved)."""
        t, e = self.tape, self.load.elem
        if self.load.device_kind == "cuda":
            for i, n in enumerate(self.load.numels):
                t.alloc(f"p{i}", n * e, "weights")
            return
        for i, n in enumerate(self.load.numels):
            t.alloc(f"p{i}", n * 4, "weights")
        if e != 4:
            for i, n in enumerate(self.load.numels):
                t.alloc(f"p{i}.to", n * e, "weights")
                t.free(f"p{i}")
                t.rename(f"p{i}.to", f"p{i}")

    def inputs(self) -> None:
        """x of (batch, context, width); in train mode also the target."""
        s = self.load
        self.tape.alloc("x", s.rows * s.width * s.elem, "activations")
        if s.train:
            self.tape.alloc("target", s.rows * s.width * s.elem, "activations")

    def forward_inference(self) -> None:
        """One ``inference_mode`` iteration: per block the first Linear's output (batch, context,
        hidden), the activation's output, then the second Linear's output; nn.Sequential holds
        the block input until the block returns."""
        t, s = self.tape, self.load
        block_in = "x"
        for k in range(s.depth):
            t.alloc("h", s.rows * s.hidden * s.elem, "activations")
            t.alloc("g", s.rows * s.hidden * s.elem, "activations")
            t.free("h")
            t.alloc(f"out{k}", s.rows * s.width * s.elem, "activations")
            t.free("g")
            if block_in != "x":
                t.free(block_in)
            block_in = f"out{k}"
        t.free(block_in)  # del y

    def step_forward(self) -> None:
        """``zero_grad(set_to_none=True)`` frees the gradients; forward keeps for backward, per
        block, the first Linear's output (gelu/silu save their input), the activation output and
        the block output."""
        t, s = self.tape, self.load
        for i in range(len(s.numels)):
            if t.has(f"grad{i}"):
                t.free(f"grad{i}")
        for k in range(s.depth):
            t.alloc(f"h{k}", s.rows * s.hidden * s.elem, "activations")
            t.alloc(f"g{k}", s.rows * s.hidden * s.elem, "activations")
            if s.saves_output:
                t.free(f"h{k}")
            t.alloc(f"out{k}", s.rows * s.width * s.elem, "activations")

    def step_loss(self) -> None:
        """``mse_loss`` returns a 0-dim loss whose storage holds (batch, context, width) values."""
        self.tape.alloc("loss", self.load.rows * self.load.width * self.load.elem, "activations")

    def step_backward(self) -> None:
        """The grad seed (one value), the MSE gradient, then per block in reverse
        ``_backward_block``; each saved tensor is freed once its node ran."""
        t, s = self.tape, self.load
        t.alloc("seed", s.elem, "temporaries")  # ones_like(loss)
        t.alloc("grad_out", s.rows * s.width * s.elem, "temporaries")  # mse_loss_backward
        t.free(f"out{s.depth - 1}")  # MseLossBackward releases y
        for k in reversed(range(s.depth)):
            self._backward_block(k)
        t.free("seed")

    def _backward_block(self, k: int) -> None:
        """Block ``k``'s backward: per Linear the input gradient, weight and bias gradients."""
        t, s = self.tape, self.load
        p = 4 * k  # W1, b1, W2, b2 of block k
        # second Linear: AddmmBackward0 -> grad of its input, weight, bias (sum)
        t.alloc("grad_g", s.rows * s.hidden * s.elem, "temporaries")
        t.alloc(f"grad{p + 2}", s.numels[p + 2] * s.elem, "gradients")
        t.alloc(f"grad{p + 3}", s.numels[p + 3] * s.elem, "gradients")
        t.free("grad_out")
        if not s.saves_output:
            t.free(f"g{k}")
        # activation backward
        t.alloc("grad_h", s.rows * s.hidden * s.elem, "temporaries")
        t.free("grad_g")
        t.free(f"g{k}" if s.saves_output else f"h{k}")
        # first Linear
        if k > 0:
            t.alloc("grad_out", s.rows * s.width * s.elem, "temporaries")
        t.alloc(f"grad{p}", s.numels[p] * s.elem, "gradients")
        t.alloc(f"grad{p + 1}", s.numels[p + 1] * s.elem, "gradients")
        t.free("grad_h")
        if k > 0:
            t.free(f"out{k - 1}")

    def step_optimizer(self) -> None:
        """``torch.optim.AdamW`` with its defaults: on the first step ``step`` (an fp32 scalar, on
        the CPU), ``exp_avg`` and ``exp_avg_sq`` (param dtype) per parameter; then the update
        (``_adamw_scratch``); the loss is released at the end (``del loss``)."""
        t, s = self.tape, self.load
        if not t.has("exp_avg0"):
            for i, n in enumerate(s.numels):
                if s.device_kind == "cpu":
                    t.alloc(f"step{i}", 4, "optimizer_states")
                t.alloc(f"exp_avg{i}", n * s.elem, "optimizer_states")
                t.alloc(f"exp_avg_sq{i}", n * s.elem, "optimizer_states")
        self._adamw_scratch()
        t.free("loss")  # del loss

    def _adamw_scratch(self) -> None:
        """AdamW's update temporaries: with ``foreach`` (the CUDA default) one ``_foreach_sqrt``
        over all parameters; single-tensor (the CPU default) two per parameter (``sqrt``, its
        quotient) while the previous ``denom`` lives."""
        t, s = self.tape, self.load
        if s.foreach:
            for i, n in enumerate(s.numels):
                t.alloc(f"sqrt{i}", n * s.elem, "temporaries")
            for i in range(len(s.numels)):
                t.free(f"sqrt{i}")
            return
        for i, n in enumerate(s.numels):
            t.alloc("sqrt", n * s.elem, "temporaries")
            t.alloc("div", n * s.elem, "temporaries")
            t.free("sqrt")
            if i:
                t.free("denom")
            t.rename("div", "denom")
        t.free("denom")

    def sub_phases(self) -> tuple[tuple[str, Callable[[], None]], ...]:
        """The sub-phases of a training step, in order, as the worker names them."""
        return (
            ("forward", self.step_forward),
            ("loss", self.step_loss),
            ("backward", self.step_backward),
            ("optimizer_step", self.step_optimizer),
        )

    def train_step(self) -> None:
        """One whole training step (warmup iterations)."""
        for _, body in self.sub_phases():
            body()

    def run(self, warmup: int, repeats: int) -> list[PhaseEstimate]:
        """Every protocol phase in order; returns ``phases``."""
        self.phase("model_load", 1, self.model_load)
        self.phase("inputs", 1, self.inputs)
        if self.load.train:
            for name, body in self.sub_phases():
                self.phase(f"cold_step.{name}", 1, body)
            self.phase("warmup", warmup, self.train_step)
            for _ in range(repeats):
                for name, body in self.sub_phases():
                    self.phase(f"warm_step.{name}", 1, body)
        else:
            self.phase("cold_forward", 1, self.forward_inference)
            self.phase("warmup", warmup, self.forward_inference)
            self.phase("warm_forward", repeats, self.forward_inference)
        return self.phases


def mlp_phases(
    batch: int,
    context: int,
    width: int,
    *,
    dtype: str = "float32",
    mode: str = "inference",
    depth: int = 4,
    hidden: int | None = None,
    activation: str = "gelu",
    device: str = "cpu",
    warmup: int = 3,
    repeats: int = 5,
    foreach: bool | None = None,
) -> list[PhaseEstimate]:
    """Estimated counters of every phase of memsweep's mlp workload (worker/workloads/mlp.py).

    A replay, allocation by allocation, of the storages the workload's PyTorch ops create
    and free, in order (PyTorch eager mode; the rules are ``_MlpReplay``'s methods).

    Args:
        batch, context, width: input shape (batch, context, width).
        dtype: ``float32``, ``float16`` or ``bfloat16``.
        mode: ``inference`` or ``train``.
        depth, hidden (default 4 x width), activation: the workload's parameters.
        device: ``cpu`` (the worker's tracker) or ``cuda``/``cuda:N`` (the caching
            allocator: 512-byte rounding). The CUDA figures do not model kernel-internal
            temporaries and cuBLAS workspaces.
        warmup, repeats: iterations of the warmup and warm phases.
        foreach: AdamW implementation; default as PyTorch's (foreach on CUDA, single-tensor
            on the CPU).

    Returns:
        one PhaseEstimate per phase, in protocol order (model_load, inputs, cold_forward,
        warmup, warm_forward; in train mode the sub-phases cold_step.forward, .loss,
        .backward, .optimizer_step, warmup, then those of each of the ``repeats`` warm_steps).

    Raises:
        ValueError: a bad size, dtype, mode or activation.
    """
    load = _mlp_load(batch, context, width, dtype, mode, depth, hidden, activation, device, warmup, repeats, foreach)
    return _MlpReplay(load).run(warmup, repeats)


def run_peak(phases: Sequence[PhaseEstimate]) -> PhaseEstimate:
    """The phase with the largest estimated ``max_memory_allocated`` (the first of equals).

    Args:
        phases: ``mlp_phases``'s result (or any non-empty sequence of PhaseEstimates).

    Returns:
        that PhaseEstimate.

    Raises:
        ValueError: ``phases`` is empty.
    """
    return max(phases, key=lambda p: p.peak)


def estimate_mlp(batch: int, context: int, width: int, **kw: Any) -> Breakdown:
    """The mlp workload's estimated peak allocated memory, by component, at its peak.

    Same arguments as ``mlp_phases``. The breakdown is taken at the moment of the run's
    largest phase peak, so ``peak`` equals the largest estimated ``max_memory_allocated``.

    Args:
        batch, context, width: input shape (batch, context, width).
        **kw: the keyword arguments of ``mlp_phases``.

    Returns:
        a Breakdown, bytes (reserve 0), with a note naming the phase of the peak.

    Raises:
        ValueError: as ``mlp_phases``.
    """
    return _mlp_estimate_of(mlp_phases(batch, context, width, **kw))


def _mlp_estimate_of(phases: Sequence[PhaseEstimate]) -> Breakdown:
    """The Breakdown of ``estimate_mlp`` from the phases of ``mlp_phases`` (bytes)."""
    top = run_peak(phases)
    note = (
        f"mlp workload, exact replay of its PyTorch ops; peak in phase {top.name}; each component is what is "
        f"live at that moment"
    )
    at = top.at_peak
    if at.gradients is not None and at.weights is not None and 0 < at.gradients < at.weights:
        # the peak comes in backward, before every parameter has its gradient (a gradient has its
        # parameter's dtype and size: all of them take the weights' bytes)
        note += f" (gradients: the {at.gradients} B created by then, of the model's {at.weights} B of gradients)"
    return at.with_note(note)


def estimate_for_spec(spec: Any) -> Breakdown | None:
    """The estimate of a RunSpec (or its dict): the built-in workloads, else ``None``.

    Only ``mlp`` with the default mode options is known exactly; anything else returns ``None``
    (not estimated).

    Args:
        spec: a ``conf.contract.RunSpec`` (anything with ``to_dict``) or a mapping of its
            fields; ``batch``, ``context`` and ``width`` are required for an mlp, the other
            fields default as in RunSpec.

    Returns:
        the Breakdown of ``estimate_mlp``, bytes, or ``None`` (not estimated): another
        workload, or a mode option the replay does not model (precision other than pure,
        an optimizer other than adamw, checkpointing, micro_steps > 1, eval_batch, export).

    Raises:
        KeyError: a mapping without ``batch``, ``context`` or ``width``.
        ValueError: as ``mlp_phases``.
    """
    phases = mlp_phases_for_spec(spec)
    return None if phases is None else _mlp_estimate_of(phases)


def mlp_phases_for_spec(spec: Any) -> list[PhaseEstimate] | None:
    """The phases of ``mlp_phases`` for a RunSpec (or its dict), or ``None`` as ``estimate_for_spec``.

    Raises:
        as ``estimate_for_spec``.
    """
    data = spec.to_dict() if hasattr(spec, "to_dict") else dict(spec)
    workload = data.get("workload") or {"name": "mlp"}
    if workload.get("name") != "mlp":
        return None
    data = {
        **data,
        "precision": resolve_precision(
            data.get("precision", "auto"), data.get("mode", "inference"), data.get("dtype", "float32")
        ),
    }
    # Mode options the replay does not model (conf.contract.RunSpec): not estimated.
    defaults = {
        "precision": "pure",
        "optimizer": "adamw",
        "checkpointing": False,
        "micro_steps": 1,
        "eval_batch": None,
        "export": False,
    }
    if any(data.get(k, v) != v for k, v in defaults.items()):
        return None
    return mlp_phases(
        data["batch"],
        data["context"],
        data["width"],
        dtype=data.get("dtype", "float32"),
        mode=data.get("mode", "inference"),
        depth=workload.get("depth", 4),
        hidden=workload.get("hidden"),
        activation=workload.get("activation", "gelu"),
        device=data.get("device", "cpu"),
        warmup=data.get("warmup", 3),
        repeats=data.get("repeats", 5),
    )
