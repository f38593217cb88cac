"""The contract between sweeper, worker and analysis: the run spec and the run record.

Standard library only: the sweeper (Hydra process, no torch), the worker (torch) and
the analysis (pandas, no torch) all import this module, so it must pull in nothing else.

Files of one run directory::

    spec.json     RunSpec, written by the sweeper before the worker starts
    record.json   run record, written by the worker (atomically, after every phase)
    result.json   result envelope, written by the sweeper once the worker process ended
    stdout.log / stderr.log   the worker's output streams

All memory figures are integers in bytes. A missing measurement is ``None`` (JSON
``null``), never ``0``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any, Mapping

SCHEMA_VERSION = 1
"""Version of spec.json, record.json and result.json. Readers accept versions <= this."""

DTYPES = ("float32", "float16", "bfloat16")
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
MODES = ("inference", "train", "generate")
WORKLOADS = ("mlp", "transformer", "hf", "user")
GENERATE_WORKLOADS = ("transformer", "hf")  # the workloads with a KV cache
ACTIVATIONS = ("gelu", "relu", "silu", "tanh")
AXES = ("batch", "context", "width", "dtype")
OUTCOMES = ("ok", "oom", "error", "crash", "timeout")
MAX_DEVICES = 1024  # upper bound of RunSpec.devices (devices used by one run)
FAULT_KINDS = ("raise", "oom", "sigkill", "segfault", "hang", "garbage")

# Training and generation options of a run (RunSpec fields, documented there).
PRECISIONS = ("pure", "autocast")
OPTIMIZERS = ("adamw", "sgd", "adafactor", "adamw8bit")
KV_CACHES = ("dynamic", "static")
# What an emulated capacity caps (spec capacity_mode): the allocator's bytes (a GPU capacity's
# meaning; on the CPU the worker's count of live tensor storage bytes) or, on the CPU only, the
# whole process (RLIMIT_DATA: does this process fit in N bytes of RAM).
CAPACITY_MODES = ("allocator", "process")
# transformer workload settings
ATTENTIONS = ("sdpa", "eager")
NORMS = ("rmsnorm", "layernorm")
FFN_KINDS = ("gelu", "swiglu")

# Phases. A training step and a generation are split into sub-phases, each its own protocol
# window, recorded as "<parent>.<sub_phase>" (e.g. "cold_step.backward") with the fields
# parent, sub_phase, step and micro_step. warmup runs whole steps (or generations) in one
# window: the loop with its real ordering, without the sub-phase boundaries.
STEP_SUB_PHASES = ("forward", "loss", "backward", "optimizer_step")
GENERATE_SUB_PHASES = ("prefill", "decode")
DRY_RUN_WORKLOADS = ("mlp", "transformer", "user")  # mlp, transformer checked against measured runs (tests/test_dry_run.py)
AFTER_PHASES = ("eval", "export")  # optional, after the warm phase, each its own phase

# A dry run's phase peak split by category (the categories of torch.distributed._tools.mem_tracker,
# _MemRefType: PARAM, GRAD, OPT; its BUFFER, INP, ACT, TEMP and OTH are the fourth here): the
# record field of each, bytes live at the moment of the phase's predicted peak
# (max_memory_allocated); the four sum to that peak. Null in the record of a measured run.
PEAK_CATEGORIES = (("parameter", "predicted_parameter_bytes"), ("gradient", "predicted_gradient_bytes"),
                   ("optimizer_state", "predicted_optimizer_state_bytes"),
                   ("activation", "predicted_activation_bytes"))
PEAK_SPLIT_FIELDS = tuple(field for _, field in PEAK_CATEGORIES)


# A run on several devices (spec ``devices`` > 1) records, per phase, a ``devices`` list: one
# entry per device with ``device_index`` and these counters (bytes, null when unreadable).
DEVICE_COUNTERS = ("memory_allocated_start", "memory_reserved_start", "memory_allocated", "memory_reserved",
                   "max_memory_allocated", "max_memory_reserved")


def _split(parent: str, subs: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f"{parent}.{sub}" for sub in subs)


INFERENCE_PHASES = ("model_load", "inputs", "cold_forward", "warmup", "warm_forward")
TRAIN_PHASES = ("model_load", "inputs", *_split("cold_step", STEP_SUB_PHASES), "warmup",
                *_split("warm_step", STEP_SUB_PHASES))
GENERATE_PHASES = ("model_load", "inputs", *_split("cold_generate", GENERATE_SUB_PHASES), "warmup",
                   *_split("warm_generate", GENERATE_SUB_PHASES))
PARENT_PHASES = ("cold_step", "warm_step", "cold_generate", "warm_generate")
COLD_PHASES = ("cold_forward", "cold_step", "cold_generate")  # a phase, or the parent of sub-phases
WARM_PHASES = ("warm_forward", "warm_step", "warm_generate")
# Names a fault may target: a phase, or a parent (its first sub-phase is hit).
ALL_PHASES = tuple(dict.fromkeys(INFERENCE_PHASES + TRAIN_PHASES + GENERATE_PHASES + PARENT_PHASES
                                 + AFTER_PHASES))

# Worker exit codes (documented in the README).
EXIT_OK = 0
EXIT_UNAVAILABLE = 2  # PyTorch or the asked-for device is missing: nothing was measured
EXIT_OOM = 3  # a phase ran out of memory; the record says which
EXIT_ERROR = 4  # a phase raised something else; the record says which and what
EXIT_BAD_SPEC = 5  # spec.json missing, unreadable or invalid

ESTIMATE_KEYS = ("weights", "gradients", "optimizer_states", "activations", "kv_cache", "temporaries",
                 "reserve", "peak", "total")
"""Keys of a spec's ``estimate`` (analysis/estimate.py ``Breakdown.to_dict``): bytes or null."""

SPEC_FILE = "spec.json"
RECORD_FILE = "record.json"
RESULT_FILE = "result.json"
STDOUT_FILE = "stdout.log"
STDERR_FILE = "stderr.log"

GB = 10**9
GiB = 2**30


def gib(value: int | float | None) -> str:
    """Bytes -> GiB (2^30 B) text for printing: 3 decimals from 1 GiB up, 6 below; missing
    (None, NaN) -> '-'. Bytes stay integers everywhere else; this is the one conversion."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    x = value / GiB
    return f"{x:.3f}" if abs(x) >= 1 else f"{x:.6f}"


def bytes_text(value: int | None) -> str:
    """Bytes -> 'N B = x GB = y GiB' for printing (both units named); None -> 'null'."""
    return "null" if value is None else f"{value} B = {value / GB:.3f} GB = {value / GiB:.3f} GiB"


_UNITS = {
    "B": 1,
    "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
}


class SpecError(ValueError):
    """Bad input: names the field, the value given and what is accepted."""

    def __init__(self, field: str, value: Any, accepted: str):
        self.field, self.value, self.accepted = field, value, accepted
        super().__init__(f"invalid {field}={value!r}: expected {accepted}")


class RecordError(ValueError):
    """A record or spec file that cannot be read: corrupt, truncated or of an unknown version."""


def parse_size(text: Any, field: str = "capacity") -> int:
    """Parse a memory size into an exact integer number of bytes.

    Accepts an integer (bytes) or a string ``<number><unit>`` with unit one of
    B, kB/KB, MB, GB, TB (powers of 1000, SI) or KiB, MiB, GiB, TiB (powers of 1024,
    IEC 80000-13 / NIST binary prefixes). ``"24GB"`` is 24 * 10**9 bytes, ``"2GiB"``
    is 2 * 2**30 bytes; a decimal number is allowed when the result is a whole number
    of bytes (``"1.5GiB"`` = 1610612736).

    Raises:
        SpecError: not a positive whole number of bytes, or an unknown unit.
    """
    accepted = ("a positive size such as 2GiB, 1500MB, 24GB or a byte count "
                "(units B, kB, MB, GB, TB = 10^3n; KiB, MiB, GiB, TiB = 2^10n)")
    if isinstance(text, bool):
        raise SpecError(field, text, accepted)
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
        if not m or (m.group(2) or "B") not in _UNITS:
            raise SpecError(field, text, accepted)
        exact = Fraction(m.group(1)) * _UNITS[m.group(2) or "B"]
        if exact.denominator != 1:
            raise SpecError(field, text, accepted + " (a whole number of bytes)")
        value = int(exact)
    if value <= 0:
        raise SpecError(field, text, accepted)
    return value


def _positive_int(name: str, value: Any, maximum: int = 2**40) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise SpecError(name, value, f"an integer from 1 to {maximum}")
    return value


def _nonneg_int(name: str, value: Any, maximum: int = 10**6) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise SpecError(name, value, f"an integer from 0 to {maximum}")
    return value


def _choice(name: str, value: Any, accepted: tuple[str, ...]) -> str:
    if value not in accepted:
        raise SpecError(name, value, "one of " + ", ".join(accepted))
    return value


def validate_estimate(value: Any) -> dict | None:
    """Accept ``None`` or a mapping of ESTIMATE_KEYS to byte counts (ints >= 0) or ``None``.

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


def validate_device(value: Any) -> str:
    """Accept ``auto``, ``cpu``, ``cuda`` or ``cuda:N``; raise SpecError otherwise."""
    if isinstance(value, str) and re.fullmatch(r"auto|cpu|cuda(:\d+)?", value):
        return value
    raise SpecError("device", value, "one of auto, cpu, cuda, cuda:N")


def _mlp_params(params: dict) -> dict:
    out = {"depth": 4, "hidden": None, "activation": "gelu"}
    out.update(params)
    _positive_int("workload.depth", out["depth"], 10_000)
    if out["hidden"] is not None:
        _positive_int("workload.hidden", out["hidden"])
    _choice("workload.activation", out["activation"], ACTIVATIONS)
    return out


def _optional_positive(name: str, value: Any, maximum: int = 2**40) -> int | None:
    return None if value is None else _positive_int(name, value, maximum)


def _transformer_params(params: dict) -> dict:
    """Defaults and per-field checks; the checks that need the load's width are in RunSpec."""
    out = {"layers": 2, "hidden": None, "heads": 4, "kv_heads": None, "head_dim": None,
           "ffn_hidden": None, "vocab": 32000, "attention": "sdpa", "norm": "rmsnorm",
           "ffn": "gelu", "tie_embeddings": False}
    out.update(params)
    _positive_int("workload.layers", out["layers"], 10_000)
    _optional_positive("workload.hidden", out["hidden"])
    _positive_int("workload.heads", out["heads"], 10_000)
    _optional_positive("workload.kv_heads", out["kv_heads"], 10_000)
    _optional_positive("workload.head_dim", out["head_dim"], 2**16)
    _optional_positive("workload.ffn_hidden", out["ffn_hidden"])
    _positive_int("workload.vocab", out["vocab"], 2**31 - 1)
    _choice("workload.attention", out["attention"], ATTENTIONS)
    _choice("workload.norm", out["norm"], NORMS)
    _choice("workload.ffn", out["ffn"], FFN_KINDS)
    if not isinstance(out["tie_embeddings"], bool):
        raise SpecError("workload.tie_embeddings", out["tie_embeddings"], "true or false")
    heads, kv_heads = out["heads"], out["kv_heads"]
    if kv_heads is not None and heads % kv_heads:
        raise SpecError("workload.kv_heads", kv_heads, f"a divisor of heads={heads} (grouped-query "
                        "attention shares each K/V head among heads/kv_heads query heads)")
    if out["head_dim"] is not None and out["head_dim"] % 2:
        raise SpecError("workload.head_dim", out["head_dim"], "an even number (rotary position embedding)")
    return out


_CONFIG_CLASS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*Config")
_MODEL_TYPE = re.compile(r"[a-z0-9][a-z0-9_\-]*")


def hf_config_kind(config: str) -> str:
    """How the hf workload reads ``config``: ``"class"`` (a transformers config class name
    such as ``LlamaConfig``), ``"path"`` (a local config.json or a directory holding one) or
    ``"model_type"`` (a registered model type such as ``gpt2``, via AutoConfig.for_model)."""
    if "/" in config or config.endswith(".json") or config.startswith("."):
        return "path"
    if _CONFIG_CLASS.fullmatch(config):
        return "class"
    return "model_type"


def _hf_params(params: dict) -> dict:
    out = {"config": None, "overrides": {}, "attention": "sdpa"}
    out.update(params)
    config = out["config"]
    accepted = ("a transformers config class name (LlamaConfig), a registered model type (gpt2) "
                "or a local config.json path")
    if not isinstance(config, str) or not config.strip():
        raise SpecError("workload.config", config, accepted)
    if hf_config_kind(config) == "model_type" and not _MODEL_TYPE.fullmatch(config):
        raise SpecError("workload.config", config, accepted)
    overrides = {} if out["overrides"] is None else out["overrides"]
    if not isinstance(overrides, Mapping) or not all(isinstance(k, str) for k in overrides):
        raise SpecError("workload.overrides", overrides, "a mapping of config attribute -> value")
    out["overrides"] = dict(overrides)
    _choice("workload.attention", out["attention"], ATTENTIONS)
    return out


_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")


def _target(name: str, value: Any, required: bool) -> dict | None:
    """A Hydra-style call description ``{_target_: "pkg.module.function", **kwargs}``."""
    accepted = "a mapping {_target_: package.module.function, <keyword arguments>}"
    if value is None and not required:
        return None
    if not isinstance(value, Mapping) or not isinstance(value.get("_target_"), str):
        raise SpecError(name, value, accepted + ("" if required else " or null"))
    if not _DOTTED.fullmatch(value["_target_"]):
        raise SpecError(f"{name}._target_", value["_target_"], "a dotted path package.module.function")
    bad = [k for k in value if not isinstance(k, str) or (k.startswith("_") and k != "_target_")]
    if bad:
        raise SpecError(f"{name}.{bad[0]}", value[bad[0]], "keyword arguments (Hydra's _args_, _partial_ "
                        "and other _special_ keys are not supported)")
    return dict(value)


def _user_params(params: dict) -> dict:
    out = {"model": None, "inputs": None, "loss": None, "path": None}
    out.update(params)
    out["model"] = _target("workload.model", out["model"], True)
    out["inputs"] = _target("workload.inputs", out["inputs"], True)
    out["loss"] = _target("workload.loss", out["loss"], False)
    path = out["path"]
    if path is not None and (not isinstance(path, (list, tuple)) or not all(isinstance(d, str) for d in path)):
        raise SpecError("workload.path", path, "null or a list of directories to put on sys.path")
    out["path"] = None if path is None else list(path)
    return out


WORKLOAD_PARAMS = {
    # name: (accepted parameter names, validator returning the params with defaults filled)
    "mlp": (("depth", "hidden", "activation"), _mlp_params),
    "transformer": (("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "vocab", "attention",
                     "norm", "ffn", "tie_embeddings"), _transformer_params),
    "hf": (("config", "overrides", "attention"), _hf_params),
    "user": (("model", "inputs", "loss", "path"), _user_params),
}


def validate_workload(workload: Any) -> dict:
    """Check a workload description ``{"name": ..., <params>}``; returns it with defaults.

    mlp params: ``depth`` (blocks), ``hidden`` (null = 4 * width), ``activation``.
    transformer params: ``layers``, ``hidden`` (null = width), ``heads``, ``kv_heads`` (null =
    heads), ``head_dim`` (null = hidden / heads), ``ffn_hidden`` (null = 4 * hidden), ``vocab``,
    ``attention`` (sdpa | eager), ``norm`` (rmsnorm | layernorm), ``ffn`` (gelu | swiglu),
    ``tie_embeddings``.
    hf params: ``config`` (class name, model type or config.json path), ``overrides``
    (config attributes), ``attention`` (sdpa | eager).
    user params: ``model``, ``inputs``, ``loss`` (Hydra-style ``{_target_: dotted.path, **kwargs}``;
    loss may be null), ``path`` (directories put on sys.path before importing the targets).

    Raises:
        SpecError: unknown workload name, unknown parameter or bad value.
    """
    if not isinstance(workload, Mapping) or "name" not in workload:
        raise SpecError("workload", workload, "a mapping with a name: one of " + ", ".join(WORKLOADS))
    name = workload["name"]
    if name not in WORKLOAD_PARAMS:
        raise SpecError("workload", name, "one of " + ", ".join(WORKLOADS))
    accepted, check = WORKLOAD_PARAMS[name]
    params = {k: v for k, v in workload.items() if k != "name"}
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise SpecError(f"workload.{unknown[0]}", params[unknown[0]],
                        f"one of the {name} settings " + ", ".join(accepted))
    return {"name": name, **check(params)}


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

    * ``precision``: ``pure`` = weights, inputs and compute in ``dtype``; ``autocast`` =
      float32 (master) weights, compute under ``torch.autocast(dtype)`` (dtype float16 or
      bfloat16; float16 training adds a GradScaler).
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

    ``estimate`` is the calculated memory of this load (analysis/estimate.py, bytes by
    component, see ESTIMATE_KEYS) or ``None``; the worker does not use it.

    ``devices``: how many devices the run uses (default 1). More than 1 only on a CUDA device,
    with ``device="cuda:0"``: the run sees cuda:0 .. cuda:devices-1 (with pool=gpus, the GPUs it
    leased) and records every phase's counters per device (phase field ``devices``); the run's
    main counters stay those of cuda:0, the run's device.

    ``dry_run``: run the same phases on fake tensors (``FakeTensorMode``: shapes and dtypes,
    no storage) and record each phase's *predicted* live tensor bytes (record ``source``
    ``"predicted"``); device cpu or cuda:N (fake CUDA tensors, no GPU needed; storages counted
    in the CUDA caching allocator's 512 B blocks), no export, no fault, devices 1; no capacity
    limit is applied.
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
    precision: str = "pure"
    optimizer: str = "adamw"
    checkpointing: bool = False
    micro_steps: int = 1
    eval_batch: int | None = None
    export: bool = False
    new_tokens: int = 16
    kv_cache: str = "dynamic"
    estimate: dict | None = None
    dry_run: bool = False
    snapshot_on_oom: bool = False
    devices: int = 1
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        _positive_int("batch", self.batch)
        _positive_int("context", self.context)
        _positive_int("width", self.width)
        _choice("dtype", self.dtype, DTYPES)
        _choice("mode", self.mode, MODES)
        validate_device(self.device)
        if self.device == "auto":
            raise SpecError("device", self.device, "a resolved device (cpu or cuda:N) in a run spec")
        object.__setattr__(self, "workload", validate_workload(self.workload))
        if self.capacity_bytes is not None:
            parse_size(self.capacity_bytes)
        _choice("capacity_mode", self.capacity_mode, CAPACITY_MODES)
        if self.capacity_mode == "process" and (not self.device.startswith("cpu") or self.dry_run):
            raise SpecError("capacity_mode", self.capacity_mode,
                            "allocator here: process (RLIMIT_DATA on the worker process) is a CPU setting of a "
                            "measured run; a GPU capacity caps the caching allocator "
                            "(torch.cuda.set_per_process_memory_fraction), a dry run limits nothing")
        _nonneg_int("warmup", self.warmup)
        _positive_int("repeats", self.repeats, 10**6)
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) \
                or not 0 < self.timeout_s <= 7 * 24 * 3600:
            raise SpecError("timeout_s", self.timeout_s, "a number of seconds in (0, 604800]")
        _nonneg_int("seed", self.seed, 2**63 - 1)
        if self.threads is not None:
            _positive_int("threads", self.threads, 1024)
        if self.fault is not None:
            if not isinstance(self.fault, Mapping) or set(self.fault) != {"phase", "kind"}:
                raise SpecError("fault", self.fault, "null or {phase: <phase>, kind: <kind>}")
            _choice("fault.phase", self.fault["phase"], ALL_PHASES)
            _choice("fault.kind", self.fault["kind"], FAULT_KINDS)
        self._check_mode_options()
        self._check_workload_shape()
        self._check_dry_run()
        if not isinstance(self.snapshot_on_oom, bool):
            raise SpecError("snapshot_on_oom", self.snapshot_on_oom, "true or false")
        if self.snapshot_on_oom and (not self.device.startswith("cuda") or self.dry_run):
            raise SpecError("snapshot_on_oom", self.snapshot_on_oom,
                            "false here: memory snapshots record the CUDA caching allocator (a cuda device, "
                            "not a dry run)")
        self._check_devices()
        object.__setattr__(self, "estimate", validate_estimate(self.estimate))
        if self.schema_version != SCHEMA_VERSION:
            raise SpecError("schema_version", self.schema_version, str(SCHEMA_VERSION))

    def _check_devices(self) -> None:
        """``devices``: an int >= 1; more than 1 only on a CUDA device, and then the run's device
        is cuda:0 (it uses cuda:0 .. cuda:devices-1; with pool=gpus those are its leased GPUs)."""
        n = self.devices
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_DEVICES:
            raise SpecError("devices", self.devices, f"an integer from 1 to {MAX_DEVICES}")
        if self.devices == 1:
            return
        if not self.device.startswith("cuda"):
            raise SpecError("devices", self.devices, f"1 with device={self.device} (several devices per run "
                            "need a CUDA device)")
        if self.device != "cuda:0":
            raise SpecError("device", self.device, f"cuda:0 with devices={self.devices} (the run uses cuda:0 to "
                            f"cuda:{self.devices - 1}; choose the GPUs with pool=gpus or CUDA_VISIBLE_DEVICES)")

    def _check_mode_options(self) -> None:
        _choice("precision", self.precision, PRECISIONS)
        if self.precision == "autocast" and self.dtype == "float32":
            raise SpecError("precision", self.precision, "pure with dtype=float32 (autocast computes in "
                            "dtype=float16 or bfloat16 with float32 weights)")
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        if not isinstance(self.checkpointing, bool):
            raise SpecError("checkpointing", self.checkpointing, "true or false")
        _positive_int("micro_steps", self.micro_steps, 10**6)
        if self.eval_batch is not None:
            _positive_int("eval_batch", self.eval_batch)
        if not isinstance(self.export, bool):
            raise SpecError("export", self.export, "true or false")
        _positive_int("new_tokens", self.new_tokens, 10**7)
        _choice("kv_cache", self.kv_cache, KV_CACHES)
        if self.mode != "train":
            for name, default in (("checkpointing", False), ("micro_steps", 1), ("eval_batch", None)):
                if getattr(self, name) != default:
                    raise SpecError(name, getattr(self, name), f"{json.dumps(default)} with mode={self.mode} "
                                    f"({name} applies to mode=train)")
        if self.mode == "generate" and self.workload_name not in GENERATE_WORKLOADS:
            raise SpecError("mode", self.mode, f"inference or train for workload={self.workload_name} "
                            f"(generate needs a KV cache: workload " + " or ".join(GENERATE_WORKLOADS) + ")")

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
            raise SpecError("device", self.device, "cpu or cuda:N with dry_run=true (a dry run runs fake tensors "
                            "of that device; a CUDA one needs no GPU)")
        if self.devices != 1:
            raise SpecError("devices", self.devices, "1 with dry_run=true (a dry run predicts one device)")
        if self.export:
            raise SpecError("export", self.export, "false with dry_run=true (export writes the real weights)")
        if self.fault is not None:
            raise SpecError("fault", self.fault, "null with dry_run=true")
        if self.workload_name not in DRY_RUN_WORKLOADS:
            raise SpecError("dry_run", self.dry_run, "false for workload=" + self.workload_name + " (dry runs: "
                            + ", ".join(DRY_RUN_WORKLOADS) + ")")

    def _check_workload_shape(self) -> None:
        """Cross-field checks of the transformer's shape (hidden defaults to the load's width)."""
        if self.workload_name != "transformer":
            return
        w = self.workload
        hidden = w["hidden"] if w["hidden"] is not None else self.width
        if w["head_dim"] is None:
            if hidden % w["heads"]:
                raise SpecError("workload.heads", w["heads"], f"a divisor of hidden={hidden} "
                                "(or set workload.head_dim explicitly)")
            if (hidden // w["heads"]) % 2:
                raise SpecError("workload.heads", w["heads"], f"a value giving an even head_dim = "
                                f"hidden / heads (hidden={hidden}; rotary position embedding), "
                                "or set workload.head_dim")

    @property
    def workload_name(self) -> str:
        return self.workload["name"]

    @property
    def phases(self) -> tuple[str, ...]:
        """Names of the phases this spec records, in order (each distinct name once)."""
        base = {"train": TRAIN_PHASES, "generate": GENERATE_PHASES}.get(self.mode, INFERENCE_PHASES)
        after = (("eval",) if self.eval_batch is not None else ()) + (("export",) if self.export else ())
        return base + after

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "RunSpec":
        """Build and validate a spec; raises SpecError naming the bad field."""
        if not isinstance(data, Mapping):
            raise SpecError("spec", type(data).__name__, "a JSON object")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise SpecError(unknown[0], data[unknown[0]], "one of the spec fields " + ", ".join(sorted(names)))
        missing = [n for n in ("batch", "context", "width") if n not in data]
        if missing:
            raise SpecError(missing[0], None, "a value (required)")
        try:
            return cls(**data)
        except TypeError as exc:  # e.g. an unhashable where a string was expected
            raise SpecError("spec", dict(data), str(exc)) from None


# The built-in workloads whose CPU runs never reach torch._dynamo (checked by
# tests/test_dynamo_import.py for every mode but train).
DYNAMO_FREE_WORKLOADS = ("mlp", "transformer")


def needs_dynamo(spec: "RunSpec") -> bool:
    """Whether a run of ``spec`` may import ``torch._dynamo`` (seconds of CPU and ~70 MB of host
    memory) lazily, inside a measured phase, so that the worker must import it before its first
    phase (``worker.main.measure``) and the fork server may as well import it once for every run.

    PyTorch imports it on the first optimizer step, ``torch.utils.checkpoint``, ``torch.export``,
    ``FakeTensorMode`` (dry runs) and in code memsweep does not own (transformers, a user's
    module); on a CUDA device conservatively too. A CPU inference or generate run of a built-in
    mlp or transformer measured without those does not: memsweep's own dispatch mode is declared
    never compiled (``LiveTensorTracker._should_skip_dynamo``), so its first operator no longer
    imports Dynamo. Conservative (True) whenever unsure; stdlib only (the sweeper and the fork
    server call it without torch)."""
    # (checkpointing is a train option: mode != "train" excludes it)
    return not (spec.device == "cpu" and spec.mode != "train" and not spec.dry_run and not spec.export
                and spec.workload_name in DYNAMO_FREE_WORKLOADS)


def proc_kb_field(path: str, key: str) -> int | None:
    """A ``kB`` field of a /proc file (/proc/self/status VmRSS, VmHWM, VmData; /proc/meminfo
    MemTotal, MemAvailable) in bytes, or None when it cannot be read (proc(5))."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def meminfo_bytes(key: str) -> int | None:
    """A ``kB`` field of /proc/meminfo (MemTotal, MemAvailable) in bytes, or None."""
    return proc_kb_field("/proc/meminfo", key)


def write_json_atomic(path: Path | str, data: Any) -> None:
    """Write JSON through a temporary file in the same directory, then rename over ``path``.

    A reader sees either the previous complete file or the new complete file, never a
    partial one (POSIX rename is atomic within a file system).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=False, allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_json(path: Path | str, kind: str) -> dict:
    """Read one versioned JSON document (spec, record or result).

    Raises:
        RecordError: unreadable, not JSON, not an object, or a schema_version newer than
            this memsweep understands (upgrade memsweep to read it).
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"{kind} {path}: cannot be read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise RecordError(f"{kind} {path}: corrupt or truncated JSON ({exc})") from None
    if not isinstance(data, dict):
        raise RecordError(f"{kind} {path}: expected a JSON object, found {type(data).__name__}")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise RecordError(f"{kind} {path}: missing or invalid schema_version {version!r}")
    if version > SCHEMA_VERSION:
        raise RecordError(f"{kind} {path}: schema_version {version} is newer than this memsweep "
                          f"reads ({SCHEMA_VERSION}); upgrade memsweep")
    return data


def classify_run(record: Mapping | None, returncode: int | None, timed_out: bool) -> str:
    """Outcome of one worker process, from what it left behind.

    ``timeout`` when the sweeper killed it at ``timeout_s``; ``crash`` when it died by a
    signal or left no complete record (a process that died mid-run leaves its complete
    phases, but the run did not finish); otherwise the outcome the worker recorded:
    ``ok``, ``oom`` or ``error``. A crash or an error is never an OOM.
    """
    if timed_out:
        return "timeout"
    if returncode is not None and returncode < 0:
        return "crash"
    if not record or not record.get("complete") or record.get("outcome") not in ("ok", "oom", "error"):
        return "crash"
    return record["outcome"]
