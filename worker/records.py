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
MODES = ("inference", "train")
WORKLOADS = ("mlp",)
ACTIVATIONS = ("gelu", "relu", "silu", "tanh")
AXES = ("batch", "context", "width", "dtype")
OUTCOMES = ("ok", "oom", "error", "crash", "timeout")
FAULT_KINDS = ("raise", "oom", "sigkill", "segfault", "hang", "garbage")

INFERENCE_PHASES = ("model_load", "inputs", "cold_forward", "warmup", "warm_forward")
TRAIN_PHASES = ("model_load", "inputs", "cold_step", "warmup", "warm_step")
ALL_PHASES = tuple(dict.fromkeys(INFERENCE_PHASES + TRAIN_PHASES))

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


WORKLOAD_PARAMS = {
    # name: (accepted parameter names, validator returning the params with defaults filled)
    "mlp": (("depth", "hidden", "activation"), _mlp_params),
}


def validate_workload(workload: Any) -> dict:
    """Check a workload description ``{"name": ..., <params>}``; returns it with defaults.

    mlp params: ``depth`` (blocks), ``hidden`` (null = 4 * width), ``activation``.

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
    ``fault`` injects a failure into one phase, for testing memsweep itself:
    ``{"phase": "cold_forward", "kind": "sigkill"}`` (kinds: FAULT_KINDS).
    ``estimate`` is the calculated memory of this load (analysis/estimate.py, bytes by
    component, see ESTIMATE_KEYS) or ``None``; the worker does not use it.
    """

    batch: int
    context: int
    width: int
    dtype: str = "float32"
    mode: str = "inference"
    device: str = "cpu"
    workload: dict = dataclasses.field(default_factory=lambda: {"name": "mlp"})
    capacity_bytes: int | None = None
    warmup: int = 3
    repeats: int = 5
    timeout_s: float = 600.0
    seed: int = 0
    threads: int | None = None
    fault: dict | None = None
    estimate: dict | None = None
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
        object.__setattr__(self, "estimate", validate_estimate(self.estimate))
        if self.schema_version != SCHEMA_VERSION:
            raise SpecError("schema_version", self.schema_version, str(SCHEMA_VERSION))

    @property
    def workload_name(self) -> str:
        return self.workload["name"]

    @property
    def phases(self) -> tuple[str, ...]:
        return TRAIN_PHASES if self.mode == "train" else INFERENCE_PHASES

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
