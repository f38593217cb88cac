"""memsweep's own workloads, exactly: an allocation-by-allocation replay of the mlp's PyTorch ops.

The counterpart of ``worker/workloads/mlp.py``: ``mlp_phases`` gives the counters each protocol
phase would record, ``estimate_mlp`` the breakdown at the run's peak, ``estimate_for_spec``
the estimate the sweeper puts into a spec.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from memsweep.conf.contract import CUDA_BLOCK_BYTES

from .breakdown import COMPONENTS, Breakdown, ceil_div, check_int
from .formats import DTYPE_BYTES


@dataclasses.dataclass(frozen=True)
class PhaseEstimate:
    """Estimated counters of one protocol phase (bytes): ``memory_allocated`` at its start
    and end, ``max_memory_allocated`` over it (the seed-003 protocol resets the peak at the
    start, so the peak includes what was already allocated), and the breakdown at the peak.

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

    A replay, allocation by allocation, of the storages the PyTorch ops of the workload
    create and free, in order (PyTorch 2.13 eager mode; each rule below was read off the
    worker's CPU tracker, which counts the storage bytes every operator returns):

    * model_load: each Linear's ``empty`` weight and bias in fp32 (default dtype), in
      ``parameters()`` order; then ``.to(dtype)`` converts them one at a time (new copy,
      old storage freed). On CUDA only the device copies count (the model is built on the
      CPU and moved).
    * inputs: x (batch, context, width); in train mode also the target.
    * inference iteration (``inference_mode``): per block the first Linear's output
      (batch, context, hidden), the activation's output, then the second Linear's output;
      nn.Sequential holds the block input until the block returns.
    * train step: ``zero_grad(set_to_none=True)`` frees the gradients; forward keeps for
      backward, per block, the first Linear's output (gelu/silu save their input) and the
      activation output, and the block output; ``mse_loss`` returns a 0-dim loss whose
      storage holds (batch, context, width) values; backward (grad seed of one value, the
      MSE gradient, per Linear the input gradient, weight and bias gradients; each saved
      tensor freed once its node ran); AdamW (``torch.optim.AdamW`` defaults): on the
      first step ``step`` (fp32 scalar, on the CPU), ``exp_avg`` and ``exp_avg_sq``
      (param dtype) per parameter; single-tensor update (CPU default) with two scratch
      tensors per parameter (``sqrt``, its quotient) while the previous ``denom`` lives,
      or, with ``foreach`` (the CUDA default), one ``_foreach_sqrt`` over all parameters.

    Args:
        batch, context, width: input shape (batch, context, width).
        dtype: ``float32``, ``float16`` or ``bfloat16``.
        mode: ``inference`` or ``train``.
        depth, hidden (default 4 x width), activation: the workload's parameters.
        device: ``cpu`` (the worker's tracker) or ``cuda``/``cuda:N`` (the caching
            allocator: 512-byte rounding). The CUDA figures do not model kernel-internal
            temporaries and cuBLAS workspaces and have not been checked on a GPU yet.
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
    foreach = (kind == "cuda") if foreach is None else foreach
    e = DTYPE_BYTES[dtype]
    A, W, H = batch * context, width, hidden
    shapes = mlp_param_shapes(W, H, depth)
    numels = [math.prod(s) for s in shapes]
    t = _Tape(kind)
    phases: list[PhaseEstimate] = []

    def phase(name: str, iterations: int, body) -> None:
        t.reset_peak()
        start = t.total
        for _ in range(min(iterations, 2)):  # from the second iteration on, every one is the same
            body()
        phases.append(
            PhaseEstimate(
                name, iterations, start, t.total, t.peak, Breakdown(**{c: t.peak_cats[c] for c in COMPONENTS})
            )
        )

    def model_load() -> None:
        if kind == "cuda":
            for i, n in enumerate(numels):
                t.alloc(f"p{i}", n * e, "weights")
            return
        for i, n in enumerate(numels):
            t.alloc(f"p{i}", n * 4, "weights")
        if e != 4:
            for i, n in enumerate(numels):
                t.alloc(f"p{i}.to", n * e, "weights")
                t.free(f"p{i}")
                t.rename(f"p{i}.to", f"p{i}")

    def inputs() -> None:
        t.alloc("x", A * W * e, "activations")
        if mode == "train":
            t.alloc("target", A * W * e, "activations")

    def forward_inference() -> None:
        block_in = "x"
        for k in range(depth):
            t.alloc("h", A * H * e, "activations")
            t.alloc("g", A * H * e, "activations")
            t.free("h")
            t.alloc(f"out{k}", A * W * e, "activations")
            t.free("g")
            if block_in != "x":
                t.free(block_in)
            block_in = f"out{k}"
        t.free(block_in)  # del y

    saves_output = ACTIVATION_SAVES_OUTPUT[activation]

    # The worker records a training step as four sub-phases (worker/plan.py):
    # forward (zero_grad first), loss, backward, optimizer_step (the loss released at its end).
    def step_forward() -> None:
        for i in range(len(numels)):  # zero_grad(set_to_none=True)
            if t.has(f"grad{i}"):
                t.free(f"grad{i}")
        for k in range(depth):  # forward, keeping what autograd saves
            t.alloc(f"h{k}", A * H * e, "activations")
            t.alloc(f"g{k}", A * H * e, "activations")
            if saves_output:
                t.free(f"h{k}")
            t.alloc(f"out{k}", A * W * e, "activations")

    def step_loss() -> None:
        t.alloc("loss", A * W * e, "activations")  # mse_loss: 0-dim view of an A*W buffer

    def step_backward() -> None:
        t.alloc("seed", e, "temporaries")  # ones_like(loss)
        t.alloc("grad_out", A * W * e, "temporaries")  # mse_loss_backward
        t.free(f"out{depth - 1}")  # MseLossBackward releases y
        for k in reversed(range(depth)):
            p = 4 * k  # W1, b1, W2, b2 of block k
            # second Linear: AddmmBackward0 -> grad of its input, weight, bias (sum)
            t.alloc("grad_g", A * H * e, "temporaries")
            t.alloc(f"grad{p + 2}", numels[p + 2] * e, "gradients")
            t.alloc(f"grad{p + 3}", numels[p + 3] * e, "gradients")
            t.free("grad_out")
            if not saves_output:
                t.free(f"g{k}")
            # activation backward
            t.alloc("grad_h", A * H * e, "temporaries")
            t.free("grad_g")
            t.free(f"g{k}" if saves_output else f"h{k}")
            # first Linear
            if k > 0:
                t.alloc("grad_out", A * W * e, "temporaries")
            t.alloc(f"grad{p}", numels[p] * e, "gradients")
            t.alloc(f"grad{p + 1}", numels[p + 1] * e, "gradients")
            t.free("grad_h")
            if k > 0:
                t.free(f"out{k - 1}")
        t.free("seed")

    def step_optimizer() -> None:  # AdamW step
        first = not t.has("exp_avg0")
        if first:
            for i, n in enumerate(numels):
                if kind == "cpu":
                    t.alloc(f"step{i}", 4, "optimizer_states")
                t.alloc(f"exp_avg{i}", n * e, "optimizer_states")
                t.alloc(f"exp_avg_sq{i}", n * e, "optimizer_states")
        if foreach:
            for i, n in enumerate(numels):
                t.alloc(f"sqrt{i}", n * e, "temporaries")
            for i in range(len(numels)):
                t.free(f"sqrt{i}")
        else:
            for i, n in enumerate(numels):
                t.alloc("sqrt", n * e, "temporaries")
                t.alloc("div", n * e, "temporaries")
                t.free("sqrt")
                if i:
                    t.free("denom")
                t.rename("div", "denom")
            t.free("denom")
        t.free("loss")  # del loss

    sub_phases = (
        ("forward", step_forward),
        ("loss", step_loss),
        ("backward", step_backward),
        ("optimizer_step", step_optimizer),
    )

    def train_step() -> None:
        for _, body in sub_phases:
            body()

    phase("model_load", 1, model_load)
    phase("inputs", 1, inputs)
    if mode == "train":
        for name, body in sub_phases:
            phase(f"cold_step.{name}", 1, body)
        phase("warmup", warmup, train_step)
        for _ in range(repeats):
            for name, body in sub_phases:
                phase(f"warm_step.{name}", 1, body)
    else:
        phase("cold_forward", 1, forward_inference)
        phase("warmup", warmup, forward_inference)
        phase("warm_forward", repeats, forward_inference)
    return phases


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
