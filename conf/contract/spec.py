"""The run spec: one condition to measure, validated field by field.

``RunSpec`` is what the sweeper writes to spec.json and the worker reads: plain JSON-able
values, checked when built (``SpecError`` names the field, the value and what is accepted).
Standard library only: the sweeper builds specs without torch.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from .attribution import planned_phases
from .checks import check_process_capacity, choice, int_in_range, positive_int
from .errors import SpecError
from .finetune import check_run_options, normalise_compile
from .parallel import check_parallel
from .record import SCHEMA_VERSION
from .units import check_bytes
from .vocabulary import (
    ALL_PHASES,
    CAPACITY_MODES,
    DRY_RUN_WORKLOADS,
    DTYPES,
    DYNAMO_FREE_WORKLOADS,
    ESTIMATE_KEYS,
    FAULT_KINDS,
    GENERATE_WORKLOADS,
    KV_CACHES,
    MODES,
    OPTIMIZERS,
    PRECISION_ALIASES,
    PRECISIONS,
    RECIPE_DTYPES,
    RECIPE_KINDS,
)
from .workload import validate_workload

MAX_DEVICES = 1024
"""Upper bound of ``RunSpec.devices`` (devices used by one run)."""


def validate_estimate(value: Any) -> dict | None:
    """Check a spec's ``estimate``: ``None`` or a mapping of ESTIMATE_KEYS to bytes.

    Args:
        value: the estimate (estimator/ ``Breakdown.to_dict``): key -> bytes (int >= 0) or None.

    Returns:
        A plain dict copy, or None.

    Raises:
        SpecError: not a mapping, an unknown key, or a value that is not a byte count.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SpecError("estimate", value, "null or a mapping of " + ", ".join(ESTIMATE_KEYS) + " to bytes")
    for key, v in value.items():
        if key not in ESTIMATE_KEYS:
            raise SpecError(f"estimate.{key}", v, "one of the estimate keys " + ", ".join(ESTIMATE_KEYS))
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise SpecError(f"estimate.{key}", v, "null or an integer number of bytes >= 0")
    return dict(value)


def resolve_precision(precision: Any, mode: Any, dtype: Any, workload: Mapping | None = None) -> str:
    """The ``precision`` a run uses: ``auto`` and the aliases resolved, the others as given.

    ``auto`` is what "16-bit training" means in Hugging Face's Trainer (``bf16=True``) and
    Lightning (``precision="bf16-mixed"``): ``autocast`` (float32 master weights, gradients and
    optimizer states, 16-bit compute) for mode=train with dtype float16 or bfloat16, unless the
    trainable weights are not the model's: LoRA adapters (``workload.lora_rank``: the frozen base
    stays in ``dtype``, peft casts the adapters to float32), a 4-bit base
    (``workload.quantization``) or a user's own ``workload.train_step``; ``pure`` otherwise.

    Args:
        precision: one of PRECISIONS.
        mode: the run's mode (MODES).
        dtype: the run's dtype (DTYPES).
        workload: the run's workload settings (None: no LoRA, quantization or train_step).

    Returns:
        ``pure`` or ``autocast``: what a spec stores (spec.json, the record, the runs table).

    Raises:
        SpecError: ``precision`` not one of PRECISIONS (a Lightning name such as ``bf16-mixed``
            gets the dtype and precision that say it).
    """
    if precision not in PRECISIONS:
        kind = {f"{p}-{k}": (d, r) for d, p in RECIPE_DTYPES.items() for r, k in RECIPE_KINDS.items()}
        hint = (
            f" ({precision} is dtype={kind[precision][0]} precision={kind[precision][1]})" if precision in kind else ""
        )
        raise SpecError("precision", precision, "one of " + ", ".join(PRECISIONS) + hint)
    if precision != "auto":
        return PRECISION_ALIASES.get(precision, precision)
    w = workload or {}
    own_weights = all(w.get(k) is None for k in ("lora_rank", "quantization", "train_step"))
    return "autocast" if mode == "train" and dtype in ("float16", "bfloat16") and own_weights else "pure"


_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")
"""The device strings a spec takes (``validate_device``)."""


def validate_device(value: Any) -> str:
    """Check a device string.

    Args:
        value: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.

    Returns:
        ``value``, unchanged.

    Raises:
        SpecError: anything else.
    """
    if isinstance(value, str) and _DEVICE.fullmatch(value):
        return value
    raise SpecError("device", value, "one of auto, cpu, cuda, cuda:N")


SWEEP_TOKEN_KEY = "sweep_token"
"""The key of spec.json that is no field of the spec: the token the sweep's manifest gave the run's
entry (``conf.contract.sweep.register_run``), which tells the sweep's own run from one copied in
from elsewhere; absent from a run outside a sweep and from a run written by an older memsweep."""


def spec_settings(data: Mapping) -> Mapping:
    """spec.json's settings: its document without the sweep's bookkeeping (``SWEEP_TOKEN_KEY``).

    Args:
        data: a spec.json document, as read.

    Returns:
        ``data`` itself when it holds no token, else a copy without it.
    """
    return {k: v for k, v in data.items() if k != SWEEP_TOKEN_KEY} if SWEEP_TOKEN_KEY in data else data


class _InitField(NamedTuple):
    """One parameter of a dataclass's ``__init__``, as ``_arguments`` fills it."""

    name: str
    default: Any  # dataclasses.MISSING when it has none
    factory: Any  # the default_factory, or dataclasses.MISSING


class _Fields(NamedTuple):
    """A dataclass's fields, worked out once per class (``_fields``)."""

    params: tuple[_InitField, ...]  # its ``__init__``'s parameters, in order
    defaults: Mapping[str, Any]  # name -> default (dataclasses.MISSING where it has none or a factory)


_FIELDS: dict[type, _Fields] = {}


def _fields(cls: type) -> _Fields:
    """A dataclass's fields, worked out once per class (a spec read per run asks every time)."""
    found = _FIELDS.get(cls)
    if found is None:
        params = tuple(_InitField(f.name, f.default, f.default_factory) for f in dataclasses.fields(cls))
        found = _FIELDS[cls] = _Fields(params, MappingProxyType({f.name: f.default for f in params}))
    return found


def _arguments(cls: type, data: Mapping) -> list | None:
    """``cls(**data)``'s arguments in order: what ``data`` gives, else the field's default (its
    factory called); None when a field without any is missing (``cls(**data)`` says which). Passed
    by place, they need no matching of keyword to parameter, which a JSON key (a string of its
    own, not the parameter's) makes a comparison of text per parameter tried."""
    args = []
    for f in _fields(cls).params:
        if f.name in data:
            args.append(data[f.name])
        elif f.default is not dataclasses.MISSING:
            args.append(f.default)
        elif f.factory is not dataclasses.MISSING:
            args.append(f.factory())
        else:
            return None
    return args


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One condition to measure: everything the worker needs, as plain JSON-able values.

    Shapes: the mlp workload's inputs are (batch, context, width); each of its ``depth``
    blocks is Linear(width -> hidden) -> activation -> Linear(hidden -> width).
    ``workload`` is ``{"name": ..., <params>}`` (see ``validate_workload``).
    ``capacity_bytes`` is the emulated capacity in bytes, ``None`` for the device's own.
    ``capacity_mode`` (CAPACITY_MODES): what the capacity caps. ``allocator`` (default): what
    the allocator hands out, as on a GPU (CUDA: ``set_per_process_memory_fraction``; CPU: the
    worker's count of live tensor storage bytes, an operator past it raises
    ``torch.OutOfMemoryError``), the same answer on every machine. ``process`` (CPU only):
    RLIMIT_DATA on the worker process, for "does this process fit in N bytes of RAM"; it also
    charges malloc's arenas, thread stacks and library buffers, so its edge moves from machine
    to machine.
    ``fault`` injects a failure into one phase, for testing memsweep itself:
    ``{"phase": "cold_forward", "kind": "sigkill"}`` (kinds: FAULT_KINDS); a parent such as
    ``cold_step`` hits its first sub-phase.

    Mode options (ignored where they do not apply; a non-default value where it cannot apply
    is a SpecError):

    * ``precision``: ``pure`` = weights, inputs and compute in ``dtype`` (in training, the
      gradients and optimizer states too: Lightning's ``bf16-true``); ``autocast`` (alias
      ``mixed``) = float32 (master) weights, gradients and optimizer states, compute under
      ``torch.autocast(dtype)`` (dtype float16 or bfloat16; float16 training adds a GradScaler;
      Lightning's ``bf16-mixed``); ``auto`` (default) = ``resolve_precision``: autocast for a
      16-bit training run of the model's own weights, else pure. The spec stores the resolved
      value.
    * ``optimizer`` (train): ``adamw`` | ``sgd`` (plain, no momentum: no state) |
      ``adafactor`` (torch.optim.Adafactor) | ``adamw8bit`` (bitsandbytes.optim.AdamW8bit).
    * ``checkpointing`` (train): activation checkpointing of every block.
    * ``micro_steps`` (train): gradient accumulation; ``batch`` is the micro-batch, what is in
      memory at once; one optimizer step sees batch * micro_steps samples.
    * ``eval_batch`` (train): batch of an evaluation pass after training (phase ``eval``);
      null = no eval phase.
    * ``export``: save the state dict to a temporary file after the run (phase ``export``).
    * ``new_tokens`` (generate): tokens decoded after the prefill of ``context`` tokens; the
      KV cache then holds context + new_tokens tokens.
    * ``kv_cache`` (generate): ``dynamic`` (grows with every token) | ``static`` (preallocated
      for context + new_tokens tokens at the prefill).

    ``estimate`` is the calculated memory of this load (estimator/, bytes by
    component, see ESTIMATE_KEYS) or ``None``; the worker does not use it.
    ``estimate_missing_reason``: why ``estimate`` is null, or which components of the run it
    leaves out (e.g. inference activations), in words; ``None`` when it is complete.

    ``devices``: how many devices the run uses (default 1). More than 1 only on a CUDA device,
    with ``device="cuda:0"``: the run sees cuda:0 .. cuda:devices-1 (with pool=gpus, the GPUs it
    leased) and records every phase's counters per device (phase field ``devices``); the run's
    main counters stay those of cuda:0, the run's device.

    ``dry_run``: run the same phases on fake tensors (``FakeTensorMode``: shapes and dtypes,
    no storage) and record each phase's *predicted* live tensor bytes (record ``source``
    ``"predicted"``); device cpu or cuda:N (fake CUDA tensors, no GPU needed; storages counted
    in the CUDA caching allocator's 512 B blocks), no export, no fault, devices 1; no capacity
    limit is applied.

    ``compile``: ``false`` (eager) or a ``torch.compile`` mode (default, reduce-overhead,
    max-autotune) applied to the model in model_load; compilation happens in the cold phase
    (``cold_forward`` / ``cold_step.*``), apart from the warm ones. Inference and train only.
    The fine-tuning options (LoRA, a local checkpoint, a 4-bit base) are hf workload settings,
    checked with the others in ``conf.contract.finetune``.
    ``parallel`` (PARALLELS): ``none`` (one process), ``ddp``
    (``torch.nn.parallel.DistributedDataParallel``) or ``fsdp`` (FSDP2,
    ``torch.distributed.fsdp.fully_shard`` on every block of ``model.blocks`` and at the root;
    ``reshard_after_forward`` is its resharding choice: True frees the gathered parameters after
    each block's forward, False keeps them until the backward). ``world_size``: rank processes
    of the run (default 1), started fresh for it (worker/ranks.py), one device each (gloo on the
    CPU, nccl on cuda:0..world_size-1); more than 1 needs ddp or fsdp. ddp/fsdp: mode=train, a
    workload of PARALLEL_WORKLOADS, not a dry run, devices 1. ``batch`` is each rank's
    micro-batch; the run's global batch is batch * world_size * micro_steps. ``fault.rank``
    (optional) injects the fault in that rank only. ``nodes`` and ``tasks_per_node``: a run whose
    ranks are the tasks of a SLURM job (``+cluster=slurm``; worker/slurm.py maps SLURM's
    environment to torch.distributed's ``env://`` rendezvous), each task one rank on
    ``cuda:<SLURM_LOCALID>``; ``nodes * tasks_per_node`` must equal ``world_size``. Without
    ``tasks_per_node`` (default; ``+cluster=slurm`` sets 1) the worker forks the ranks itself on one
    machine, ``nodes`` 1.
    """

    batch: int
    context: int
    width: int
    dtype: str = "float32"
    mode: str = "inference"
    device: str = "cpu"
    workload: dict = dataclasses.field(default_factory=lambda: {"name": "mlp"})
    capacity_bytes: int | None = None
    capacity_mode: str = "allocator"
    warmup: int = 3
    repeats: int = 5
    timeout_s: float = 600.0
    seed: int = 0
    threads: int | None = None
    fault: dict | None = None
    # mode options (workloads issue)
    precision: str = "auto"
    optimizer: str = "adamw"
    checkpointing: bool = False
    micro_steps: int = 1
    eval_batch: int | None = None
    export: bool = False
    new_tokens: int = 16
    kv_cache: str = "dynamic"
    estimate: dict | None = None
    estimate_missing_reason: str | None = None
    dry_run: bool = False
    snapshot_on_oom: bool = False
    devices: int = 1
    compile: str = "false"
    parallel: str = "none"
    world_size: int = 1
    reshard_after_forward: bool = True
    nodes: int = 1
    tasks_per_node: int | None = None
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        positive_int("batch", self.batch)
        positive_int("context", self.context)
        positive_int("width", self.width)
        choice("dtype", self.dtype, DTYPES)
        choice("mode", self.mode, MODES)
        validate_device(self.device)
        if self.device == "auto":
            raise SpecError("device", self.device, "a resolved device (cpu or cuda:N) in a run spec")
        object.__setattr__(self, "workload", validate_workload(self.workload))
        self._check_capacity()
        int_in_range("warmup", self.warmup, 0, 10**6)
        positive_int("repeats", self.repeats, 10**6)
        if (
            isinstance(self.timeout_s, bool)
            or not isinstance(self.timeout_s, (int, float))
            or not 0 < self.timeout_s <= 7 * 24 * 3600
        ):
            raise SpecError("timeout_s", self.timeout_s, "a number of seconds in (0, 604800]")
        int_in_range("seed", self.seed, 0, 2**63 - 1)
        if self.threads is not None:
            positive_int("threads", self.threads, 1024)
        self._check_fault()
        self._check_mode_options()
        object.__setattr__(self, "compile", normalise_compile(self.compile))
        check_run_options(self)
        self._check_workload_shape()
        self._check_dry_run()
        self._check_snapshot()
        self._check_devices()
        check_parallel(self)
        object.__setattr__(self, "estimate", validate_estimate(self.estimate))
        if self.estimate_missing_reason is not None and not isinstance(self.estimate_missing_reason, str):
            raise SpecError("estimate_missing_reason", self.estimate_missing_reason, "null or a text")
        if self.schema_version != SCHEMA_VERSION:
            raise SpecError("schema_version", self.schema_version, str(SCHEMA_VERSION))

    def _check_capacity(self) -> None:
        """``capacity_bytes`` (a size) and ``capacity_mode`` (process: a measured CPU run only)."""
        if self.capacity_bytes is not None:
            check_bytes(self.capacity_bytes)
        choice("capacity_mode", self.capacity_mode, CAPACITY_MODES)
        if self.capacity_mode == "process" and (not self.device.startswith("cpu") or self.dry_run):
            raise SpecError(
                "capacity_mode",
                self.capacity_mode,
                "allocator here: process (RLIMIT_DATA on the worker process) is a CPU setting of a "
                "measured run; a GPU capacity caps the caching allocator "
                "(torch.cuda.set_per_process_memory_fraction), a dry run limits nothing",
            )
        check_process_capacity(self.capacity_mode, self.capacity_bytes)

    def _check_fault(self) -> None:
        """``fault``: null or ``{phase, kind[, rank]}`` of known phases and kinds."""
        if self.fault is None:
            return
        if not isinstance(self.fault, Mapping) or not {"phase", "kind"} <= set(self.fault) <= {
            "phase",
            "kind",
            "rank",
        }:
            raise SpecError("fault", self.fault, "null or {phase: <phase>, kind: <kind>[, rank: <rank>]}")
        choice("fault.phase", self.fault["phase"], ALL_PHASES)
        choice("fault.kind", self.fault["kind"], FAULT_KINDS)

    def _check_snapshot(self) -> None:
        """``snapshot_on_oom``: a bool; true only on a CUDA device in a measured run."""
        if not isinstance(self.snapshot_on_oom, bool):
            raise SpecError("snapshot_on_oom", self.snapshot_on_oom, "true or false")
        if self.snapshot_on_oom and (not self.device.startswith("cuda") or self.dry_run):
            raise SpecError(
                "snapshot_on_oom",
                self.snapshot_on_oom,
                "false here: memory snapshots record the CUDA caching allocator (a cuda device, not a dry run)",
            )

    def _check_devices(self) -> None:
        """``devices``: an int >= 1; more than 1 only on a CUDA device, and then the run's device
        is cuda:0 (it uses cuda:0 .. cuda:devices-1; with pool=gpus those are its leased GPUs)."""
        if positive_int("devices", self.devices, MAX_DEVICES) == 1:
            return
        if not self.device.startswith("cuda"):
            raise SpecError(
                "devices", self.devices, f"1 with device={self.device} (several devices per run need a CUDA device)"
            )
        if self.device != "cuda:0":
            raise SpecError(
                "device",
                self.device,
                f"cuda:0 with devices={self.devices} (the run uses cuda:0 to "
                f"cuda:{self.devices - 1}; choose the GPUs with pool=gpus or CUDA_VISIBLE_DEVICES)",
            )

    @property
    def ranks_per_node(self) -> int:
        """Ranks on one machine: ``tasks_per_node``, else every rank (the worker forks them all)."""
        return self.tasks_per_node if self.tasks_per_node is not None else self.world_size

    @property
    def global_batch(self) -> int:
        """Samples of one optimizer step over every rank: batch * world_size * micro_steps."""
        return self.batch * self.world_size * self.micro_steps

    def _check_mode_options(self) -> None:
        object.__setattr__(self, "precision", resolve_precision(self.precision, self.mode, self.dtype, self.workload))
        if self.precision == "autocast" and self.dtype == "float32":
            raise SpecError(
                "precision",
                self.precision,
                "pure with dtype=float32 (autocast computes in dtype=float16 or bfloat16 with float32 weights)",
            )
        choice("optimizer", self.optimizer, OPTIMIZERS)
        if not isinstance(self.checkpointing, bool):
            raise SpecError("checkpointing", self.checkpointing, "true or false")
        positive_int("micro_steps", self.micro_steps, 10**6)
        if self.eval_batch is not None:
            positive_int("eval_batch", self.eval_batch)
        if not isinstance(self.export, bool):
            raise SpecError("export", self.export, "true or false")
        positive_int("new_tokens", self.new_tokens, 10**7)
        choice("kv_cache", self.kv_cache, KV_CACHES)
        # an option that cannot apply to the mode is refused, never silently ignored
        only = {
            "train": ("optimizer", "checkpointing", "micro_steps", "eval_batch"),
            "generate": ("new_tokens", "kv_cache"),
        }
        defaults = _fields(type(self)).defaults
        for mode, options in only.items():
            if self.mode == mode:
                continue
            for name in options:
                default = defaults[name]
                if getattr(self, name) != default:
                    raise SpecError(
                        name,
                        getattr(self, name),
                        f"{json.dumps(default)} with mode={self.mode} ({name} applies to mode={mode})",
                    )
        if self.mode == "generate" and self.workload_name not in GENERATE_WORKLOADS:
            raise SpecError(
                "mode",
                self.mode,
                f"inference or train for workload={self.workload_name} "
                f"(generate needs a KV cache: workload " + " or ".join(GENERATE_WORKLOADS) + ")",
            )

    def _check_dry_run(self) -> None:
        """A dry run runs the phases on fake tensors (shapes, no storage) of the spec's device, cpu
        or cuda:N (fake CUDA tensors need no GPU: nothing is allocated, CUDA is never
        initialised); it predicts tensor bytes, so nothing that needs real data or a real
        device may be asked of it: no export, no fault, one device.

        Raises:
            SpecError: ``dry_run`` not a bool; a device other than cpu or cuda:N; export, fault
            or devices > 1 with a dry run; a workload dry runs do not cover.
        """
        if not isinstance(self.dry_run, bool):
            raise SpecError("dry_run", self.dry_run, "true or false")
        if not self.dry_run:
            return
        if not re.fullmatch(r"cpu|cuda:\d+", self.device):
            raise SpecError(
                "device",
                self.device,
                "cpu or cuda:N with dry_run=true (a dry run runs fake tensors of that device; a CUDA one needs no GPU)",
            )
        if self.devices != 1:
            raise SpecError("devices", self.devices, "1 with dry_run=true (a dry run predicts one device)")
        if self.export:
            raise SpecError("export", self.export, "false with dry_run=true (export writes the real weights)")
        if self.fault is not None:
            raise SpecError("fault", self.fault, "null with dry_run=true")
        if self.workload_name not in DRY_RUN_WORKLOADS:
            raise SpecError(
                "dry_run",
                self.dry_run,
                "false for workload=" + self.workload_name + " (dry runs: " + ", ".join(DRY_RUN_WORKLOADS) + ")",
            )

    def _check_workload_shape(self) -> None:
        """Cross-field checks of the transformer's shape (hidden defaults to the load's width)."""
        if self.workload_name != "transformer":
            return
        w = self.workload
        hidden = w["hidden"] if w["hidden"] is not None else self.width
        if w["head_dim"] is None:
            if hidden % w["heads"]:
                raise SpecError(
                    "workload.heads", w["heads"], f"a divisor of hidden={hidden} (or set workload.head_dim explicitly)"
                )
            if (hidden // w["heads"]) % 2:
                raise SpecError(
                    "workload.heads",
                    w["heads"],
                    f"a value giving an even head_dim = "
                    f"hidden / heads (hidden={hidden}; rotary position embedding), "
                    "or set workload.head_dim",
                )

    @property
    def workload_name(self) -> str:
        """The workload's name (one of WORKLOADS)."""
        return self.workload["name"]

    @property
    def train_step(self) -> str | None:
        """Who runs this spec's training steps (TRAIN_STEP_KINDS): ``user`` when a user workload
        names its own ``workload.train_step``, else ``memsweep``; None outside mode=train."""
        if self.mode != "train":
            return None
        return "user" if self.workload.get("train_step") is not None else "memsweep"

    @property
    def phases(self) -> tuple[str, ...]:
        """Names of the phases this spec records, in order (each distinct name once)."""
        return planned_phases(self.mode, self.eval_batch, self.export, self.train_step)

    def to_dict(self) -> dict:
        """The spec as a JSON-able dict (what spec.json holds)."""
        return dataclasses.asdict(self)

    @classmethod
    def field_types(cls) -> dict[str, type]:
        """The spec's fields with the JSON type of a present value, as ``Field.type`` declares the
        record's (analysis.schemas types its Parquet columns from both).

        Returns:
            field name -> type, in declaration order; ``int | None`` gives ``int``.
        """
        hints = typing.get_type_hints(cls)
        return {
            f.name: next(t for t in typing.get_args(hints[f.name]) or (hints[f.name],) if t is not type(None))
            for f in dataclasses.fields(cls)
        }

    @classmethod
    def from_dict(cls, data: Any) -> RunSpec:
        """Build and validate a spec from a mapping (spec.json's content).

        Fields a spec written before them lacks take their defaults (additive changes); spec.json's
        ``SWEEP_TOKEN_KEY`` is no field and is left out.

        Args:
            data: field -> value; ``batch``, ``context`` and ``width`` are required.

        Returns:
            The validated spec.

        Raises:
            SpecError: not a mapping, an unknown or missing field, or a bad value (naming it).
        """
        if not isinstance(data, Mapping):
            raise SpecError("spec", type(data).__name__, "a JSON object")
        data = spec_settings(data)  # spec.json's bookkeeping is no field of the condition
        names = _fields(cls).defaults.keys()
        unknown = sorted(set(data).difference(names))
        if unknown:
            raise SpecError(unknown[0], data[unknown[0]], "one of the spec fields " + ", ".join(sorted(names)))
        missing = [n for n in ("batch", "context", "width") if n not in data]
        if missing:
            raise SpecError(missing[0], None, "a value (required)")
        args = _arguments(cls, data)
        try:
            return cls(**data) if args is None else cls(*args)
        except TypeError as exc:  # e.g. an unhashable where a string was expected
            raise SpecError("spec", dict(data), str(exc)) from None


def needs_dynamo(spec: RunSpec) -> bool:
    """Tell whether a run of ``spec`` may import ``torch._dynamo`` lazily, inside a measured phase.

    That import takes CPU time and host memory, so the worker imports it before
    its first phase (``worker.measure.measure``) when this says True, and the fork server may as
    well import it once for every run (the sweeper's client tells it, ``sweeper.process``).

    PyTorch imports it on the first optimizer step, ``torch.utils.checkpoint``, ``torch.export``,
    ``FakeTensorMode`` (dry runs) and in code memsweep does not own (transformers, a user's
    module); on a CUDA device conservatively too. A CPU inference or generate run of a built-in
    mlp or transformer measured without those does not: memsweep's own dispatch mode is declared
    never compiled (``LiveTensorTracker._should_skip_dynamo``), so its first operator no longer
    imports Dynamo. Conservative (True) whenever unsure; stdlib only (the sweeper and the fork
    server call it without torch).

    Args:
        spec: the run.

    Returns:
        True when the run may import ``torch._dynamo``.
    """
    # (checkpointing is a train option: mode != "train" excludes it)
    return not (
        spec.device == "cpu"
        and spec.mode != "train"
        and not spec.dry_run
        and not spec.export
        and spec.compile == "false"
        and spec.workload_name in DYNAMO_FREE_WORKLOADS
    )
