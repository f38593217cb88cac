"""The run record, the result envelope and the files of a run directory.

Files of one run directory::

    spec.json     RunSpec, written by the sweeper before the worker starts
    record.json   run record, written by the worker (atomically, after every phase)
    result.json   result envelope, written by the sweeper once the worker process ended
    stdout.log / stderr.log   the worker's output streams
    exit_status.json   only when the client that asked for a forked run was gone before it ended
                  (a launcher worker killed): the worker's exit status, from its handler

The fields of each document are declared here once, with the JSON type of a present value
(``Field``); every field may be null. All memory figures are integers in bytes; a missing
measurement is ``None`` (JSON ``null``), never ``0``. analysis/tables.py's Parquet schemas are
checked against these declarations (tests/test_contract.py).
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from .errors import NewerSchemaError, RecordError
from .vocabulary import DEVICE_COUNTERS, PEAK_SPLIT_FIELDS, WORKER_OUTCOMES

SCHEMA_VERSION = 1
"""Version of spec.json, record.json and result.json. Readers accept versions <= this."""

SPEC_FILE = "spec.json"
"""The run's spec (``RunSpec.to_dict``), written by the sweeper before the worker starts."""
RECORD_FILE = "record.json"
"""The worker's record (RECORD_FIELDS), rewritten atomically before and after every phase."""
RESULT_FILE = "result.json"
"""The sweeper's result envelope (RESULT_FIELDS), written once the worker process ended."""
STDOUT_FILE = "stdout.log"
"""The worker's standard output."""
STDERR_FILE = "stderr.log"
"""The worker's standard error (tracebacks of failed phases)."""

EXIT_STATUS_FILE = "exit_status.json"
"""A forked worker's exit status (EXIT_STATUS_FIELDS), written by its fork-server handler only when
the process that asked for the run (a launcher's worker, killed) was gone before the run ended:
the run went on (``ended: false`` as soon as the handler took it over, then its status once it
ended), and the sweeper that takes it over builds its result.json from this file."""

FILE_KINDS = {SPEC_FILE: "spec", RECORD_FILE: "record", RESULT_FILE: "result", EXIT_STATUS_FILE: "exit status"}
"""What each JSON file of a run directory holds, as error messages name it."""

SEARCH_LOG = "search.jsonl"
"""A frontier sweep directory's log of decisions, one JSON object a line (appended by the frontier
sweeper, read by analysis.frontier): ``start``, ``probe``, ``confirm``, ``result``..."""


class Field(NamedTuple):
    """One field of a JSON document of the contract.

    Attributes:
        name: the key.
        type: the JSON type of a present value (int, float, str, bool, dict or list; a float
            field may hold an int). Every field may also be null.
        doc: what it holds (units: bytes, seconds).
    """

    name: str
    type: type
    doc: str


def _bytes(name: str, doc: str) -> Field:
    return Field(name, int, doc + " (bytes)")


ERROR_FIELDS = (
    Field("error_type", str, "the failure's exception type name (in a result: also a signal name, ForkServerLost)"),
    Field("error_message", str, "the failure's message, in words (the worker keeps at most 4000 characters)"),
)
"""What failed, as a record, a rank, a phase and the result envelope say it (null when nothing did)."""

FAILURE_FIELDS = (
    Field("failed_phase", str, "the phase that failed, was stopped or was running when the process died; or 'setup'"),
    *ERROR_FIELDS,
)
"""Where and what a run or a rank failed: the failed phase and ERROR_FIELDS."""

COUNTER_FIELDS = tuple(_bytes(name, "counter") for name in DEVICE_COUNTERS)
"""The counters (vocabulary.DEVICE_COUNTERS) of a phase, of a phase on one device and on one rank."""


RECORD_FIELDS = (
    Field("schema_version", int, "SCHEMA_VERSION of the writer"),
    Field("spec", dict, "the spec as read from spec.json"),
    Field("pid", int, "the worker's process id"),
    Field("pid_identity", str, "the worker's process identity (host.process_identity: boot id, start time)"),
    Field("started_at", str, "UTC ISO 8601 time the worker started"),
    Field("updated_at", str, "UTC ISO 8601 time of the last rewrite"),
    Field("complete", bool, "the worker finished the record (a killed worker leaves false)"),
    Field("outcome", str, "one of WORKER_OUTCOMES, once complete"),
    Field("exit_code", int, "the worker's exit status (conf.contract.exits)"),
    *FAILURE_FIELDS,
    Field("device", str, "the resolved device: cpu or cuda:N"),
    Field("device_kind", str, "torch.device.type: cpu or cuda (ROCm included)"),
    Field("counter_sources", dict, "counter name -> where its value comes from"),
    _bytes("capacity_bytes", "the capacity the run was limited to (emulated, else the device's total)"),
    Field("capacity", dict, "how the capacity was applied: CAPACITY_FIELDS"),
    _bytes("device_total_memory", "the device's total memory (host MemTotal on the CPU)"),
    _bytes("device_free_memory_start", "free device memory before the first phase"),
    Field("device_index", int, "the CUDA device index; null on the CPU"),
    Field("environment", dict, "versions, device, allocator settings, host: ENVIRONMENT_FIELDS"),
    Field("model", dict, "sizes by construction: MODEL_FIELDS"),
    Field(
        "train_step",
        str,
        "mode=train: who ran the steps, one of TRAIN_STEP_KINDS (user: workload.train_step, one "
        "sub-phase user_step per step); null otherwise",
    ),
    Field("current_phase", str, "the phase about to run or running; null between phases and at the end"),
    Field("phases", list, "one PHASE_FIELDS object per phase run, in order"),
    Field("source", str, "measured or predicted (a dry run: fake tensors)"),
    Field("prediction_rounding", str, "a dry run's accounting of storage bytes; null when measured"),
    Field("cuda_initialized", bool, "torch.cuda.is_initialized() at the end; null when torch was not imported"),
    Field("oom_snapshot", dict, "the CUDA allocator snapshot written at an OOM (spec snapshot_on_oom)"),
    Field("world_size", int, "rank processes of the run (spec world_size; 1 without parallel)"),
    Field("parallel", str, "none, ddp or fsdp (spec parallel)"),
    Field("global_batch", int, "samples per optimizer step over every rank: batch * world_size * micro_steps"),
    Field("ranks", list, "a DDP/FSDP run: one RANK_FIELDS object per rank, in rank order"),
    Field("failed_rank", int, "a DDP/FSDP run that failed: the rank whose failure ended it (root cause)"),
    Field("peak_rank", int, "a DDP/FSDP run: the rank with the largest max_memory_allocated (the fullest)"),
)
"""Top-level fields of record.json, in the order the worker writes them."""

RANK_FIELDS = (
    Field("rank", int, "the rank (0-based)"),
    Field("device", str, "the rank's device: cpu or cuda:N"),
    Field("pid", int, "the rank process's id"),
    Field("outcome", str, "ok, oom or error as the rank recorded it; aborted (stopped by the run), crash"),
    Field("exit_code", int, "the rank process's exit status (negative: killed by that signal)"),
    *FAILURE_FIELDS,
    _bytes("local_parameter_bytes", "the rank's own parameter storage after model_load (FSDP: its shards)"),
    _bytes("max_memory_allocated", "the rank's largest phase peak"),
    _bytes("max_memory_reserved", "the rank's largest reserved peak"),
    Field("record", str, "the rank's own record, relative to the run directory (ranks/rank_N.json)"),
)
"""Fields of each entry of record.json's ``ranks`` (a DDP or FSDP run, worker/ranks.py)."""

PHASE_RANK_FIELDS = (
    Field("rank", int, "the rank"),
    Field("status", str, "ok, oom or error"),
    *COUNTER_FIELDS,
    Field("duration_s", float, "wall time of the phase on that rank (seconds)"),
    Field("gradient_bytes", int, "size by construction on that rank (its shards under FSDP)"),
    Field("optimizer_state_bytes", int, "size by construction on that rank (its shards under FSDP)"),
)
"""Fields of each entry of a phase's ``ranks`` (a DDP or FSDP run)."""

ENVIRONMENT_FIELDS = (
    Field("python", str, "Python version"),
    Field("torch", str, "torch.__version__"),
    Field("cuda", str, "torch.version.cuda"),
    Field("hip", str, "torch.version.hip"),
    Field("backend", str, "cuda, hip or cpu"),
    Field("device", str, "the resolved device"),
    Field("device_name", str, "the device's name (the CPU's processor on the CPU)"),
    _bytes("total_memory", "the device's total memory"),
    Field("driver", str, "the NVIDIA driver's version line"),
    Field("allocator_backend", str, "torch.cuda.get_allocator_backend()"),
    Field("alloc_conf", dict, "the allocator's environment settings (PYTORCH_CUDA_ALLOC_CONF...)"),
    Field("host", str, "host name"),
    Field("platform", str, "platform.platform()"),
    Field("cpu_count", int, "os.cpu_count()"),
    Field("torch_threads", int, "torch.get_num_threads()"),
    Field("cpu_affinity", list, "the CPU cores the worker may run on"),
    Field("cuda_visible_devices", str, "CUDA_VISIBLE_DEVICES"),
    Field("isolation", str, "how the worker was started: one of ISOLATIONS"),
    Field("lease", str, "the device or core lease of the run (sweeper pool)"),
    Field("capability", str, "CUDA compute capability, major.minor"),
    Field("fake_cuda_guard", str, "a CUDA dry run: how PyTorch had a CUDA device guard"),
    _bytes("ballast_bytes", "non-tensor memory the worker held (tests and benches)"),
    Field("torch_dynamo_imported", bool, "torch._dynamo imported before the first phase"),
    Field("imported_during_phases", str, "what was imported inside a phase, when needs_dynamo missed it"),
    Field("cublas_workspace_config", str, "CUBLAS_WORKSPACE_CONFIG (cuBLAS workspaces: the allocator's memory)"),
)
"""Fields of record.json's ``environment``."""

CAPACITY_FIELDS = (
    Field("capacity_mode", str, "one of CAPACITY_MODES"),
    Field("capacity_method", str, "how the capacity was applied, in words"),
    _bytes("capacity_baseline_bytes", "capacity_mode=process: VmData when the limit was set"),
    _bytes("rlimit_data_bytes", "capacity_mode=process: the RLIMIT_DATA set"),
    Field("memory_fraction", float, "CUDA: torch.cuda.set_per_process_memory_fraction's fraction"),
    Field("memory_fractions", list, "CUDA, several devices: one fraction per device"),
    Field("memory_fraction_nominal", float, "CUDA: capacity / total_memory, before the footprint is taken off"),
    _bytes("outside_allocator_start_bytes", "CUDA: total - free - reserved once the context exists, at set-up"),
    _bytes("allocator_limit_bytes", "CUDA: the caching allocator's limit, floor(memory_fraction * total)"),
    Field("device_not_free", str, "CUDA: why the device was not free enough at the start (flag), else null"),
    Field("allocator_backend_warning", str, "CUDA: a non-native allocator backend and what it changes"),
)
"""Fields of record.json's ``capacity``."""

DEVICE_NOT_FREE_BYTES = 2 * 2**30
"""A CUDA run whose device already has more than this many bytes in use outside its caching
allocator once its context exists (total - free - reserved: its own context and handles take
about 0.5 GiB on Hopper) is flagged ``device_not_free``: another process holds memory there."""

MODEL_FIELDS = (
    Field("parameters", int, "number of parameters"),
    Field("trainable_parameters", int, "number of parameters with requires_grad"),
    Field("frozen_parameters", int, "number of parameters without requires_grad (a LoRA base)"),
    _bytes("parameter_bytes", "storage of the parameters"),
    _bytes("trainable_parameter_bytes", "storage of the parameters with requires_grad"),
    _bytes("frozen_parameter_bytes", "storage of the parameters without requires_grad"),
    _bytes("local_parameter_bytes", "a DDP/FSDP rank: storage of its own parameters (FSDP: its shards)"),
    _bytes("buffer_bytes", "storage of the buffers"),
    Field("param_dtype", str, "dtype of the weights"),
    Field("compute_dtype", str, "dtype of the computation"),
    Field("lora", dict, "LoRA adapters (hf lora_rank): settings, adapted modules, peft's own counts"),
    Field("checkpoint", dict, "the local checkpoint loaded (hf pretrained): path, files, bytes, quantization"),
    Field("compile", str, "the torch.compile mode the model runs under, or false"),
    Field("optimizer", str, "the user's own optimizer factory (dotted path) and the class it built; null otherwise"),
)
"""Fields of record.json's ``model`` (sizes by construction, not counters)."""

PHASE_COUNTERS = DEVICE_COUNTERS
"""The counter fields of a phase (bytes): see vocabulary.DEVICE_COUNTERS."""

EXTRA_COUNTERS = (
    "num_alloc_retries",
    "num_ooms",
    "inactive_split_bytes",
    "device_free_memory",
    "device_total_memory",
    "outside_allocator_bytes",
)
"""Per phase, where the backend has them (null otherwise): the allocator's retries and OOMs
(torch.cuda.memory_stats), inactive split bytes, device free and total memory (bytes), and the
device memory used outside this process's caching allocator at the phase's end (bytes): total -
free - memory_reserved, i.e. the CUDA context, library handles and lazily loaded kernels (and any
other process on the device)."""

PER_DEVICE_EXTRAS = ("num_ooms", "device_free_memory", "outside_allocator_bytes")
"""The extra counters a run on several devices also records per device (``devices`` entries)."""

SIZE_FIELDS = ("gradient_bytes", "optimizer_state_bytes", "kv_cache_bytes", "kv_cache_tokens", "export_bytes")
"""Per phase, sizes by construction summed by the worker at a successful phase's end (bytes;
kv_cache_tokens a count), not counters."""

OOM_DETAIL_FIELDS = (
    "oom_request_bytes",
    "oom_allocated_bytes",
    "oom_free_bytes",
    "oom_total_bytes",
    "oom_reserved_unallocated_bytes",
    "oom_limit_bytes",
)
"""What an OOM says (bytes; each null unless the failure stated it): the request refused, the bytes
already allocated when it was asked, the device's free and total memory, the bytes reserved but
unallocated, and the allowed limit (a memory fraction, MPS's high watermark, the CPU allocator
capacity). From the CPU allocator capacity's tracker (capacity_mode=allocator: exact bytes), else
parsed from the message by worker.classify.WORDINGS (CUDA, HIP, XPU, MPS, cudaMallocAsync and
the CPU allocator's wordings; ``format_size`` prints 2 decimals of KiB/MiB/GiB, so a parsed size
is accurate to half a unit of its last digit)."""

FAILURE_CLASSES = ("oom", "memory_suspect", "error")
"""The class of a failed phase (``failure_class``, worker.classify): ``oom`` (the allocator said it
could not serve a request), ``memory_suspect`` (a failure that usually means memory but does not
say so: a library that could not get its workspace; the phase's status stays ``error``), ``error``."""

SUB_PHASE_FIELDS = ("parent", "sub_phase", "step", "micro_step")
"""Per phase: where a sub-phase sits (null on the other phases)."""

PHASE_FIELDS = (
    Field("name", str, "the phase (vocabulary: INFERENCE_PHASES...)"),
    Field("parent", str, "a sub-phase's parent phase (cold_step...)"),
    Field("sub_phase", str, "a sub-phase's name (backward...)"),
    Field("step", int, "a sub-phase's step, 0-based within the parent"),
    Field("micro_step", int, "a sub-phase's micro-step (gradient accumulation)"),
    Field("status", str, "ok, oom or error"),
    Field("iterations", int, "times the phase's body ran"),
    *COUNTER_FIELDS[:2],
    Field("duration_s", float, "wall time of the phase (seconds)"),
    Field("iteration_s", list, "wall time of each iteration (seconds)"),
    *COUNTER_FIELDS[2:],
    Field("devices", list, "a run on several devices: one DEVICE_FIELDS object per device"),
    Field("rank", int, "a DDP/FSDP run: the rank whose counters the phase's own fields are (0, or the failed one)"),
    Field("peak_rank", int, "a DDP/FSDP run: the rank with the phase's largest max_memory_allocated"),
    Field("ranks", list, "a DDP/FSDP run: one PHASE_RANK_FIELDS object per rank that recorded the phase"),
    *[Field(name, int, "allocator counter") for name in EXTRA_COUNTERS[:2]],
    *[_bytes(name, "allocator or device figure") for name in EXTRA_COUNTERS[2:]],
    *[_bytes(name, "a dry run's peak split (PEAK_CATEGORIES)") for name in PEAK_SPLIT_FIELDS],
    *ERROR_FIELDS,
    *[Field(name, int, "size by construction") for name in SIZE_FIELDS],
    *[_bytes(name, "what the OOM said (OOM_DETAIL_FIELDS)") for name in OOM_DETAIL_FIELDS],
    Field("oom_operator", str, "the operator the CPU allocator capacity refused"),
    Field(
        "dynamo_graphs_compiled",
        int,
        "graphs torch.compile (Dynamo) compiled during the phase; null when torch._dynamo was not imported",
    ),
    Field("failure_class", str, "a failed phase: one of FAILURE_CLASSES"),
    Field("failure_wording", str, "a failed phase: the worker.classify.WORDINGS row its message matched"),
)
"""Fields of each entry of record.json's ``phases``."""

DEVICE_FIELDS = (
    Field("device_index", int, "the CUDA device index"),
    *COUNTER_FIELDS,
    Field("num_ooms", int, "allocator counter of this device"),
    *[_bytes(name, "device figure") for name in PER_DEVICE_EXTRAS[1:]],
)
"""Fields of each entry of a phase's ``devices`` (a run on several devices)."""

RESULT_FIELDS = (
    Field("schema_version", int, "SCHEMA_VERSION of the writer"),
    Field("outcome", str, "one of OUTCOMES"),
    *FAILURE_FIELDS,
    Field("returncode", int, "the worker's exit status (negative: killed by that signal)"),
    Field("signal", int, "the signal that killed the worker"),
    Field("timed_out", bool, "killed by the sweeper at timeout_s"),
    Field("wall_s", float, "seconds from the worker's start to its end"),
    Field("worker_pid", int, "the worker's process id"),
    Field("record_problem", str, "why record.json could not be read"),
)
"""Fields of result.json, the sweeper's envelope of one run (``sweeper.process.execute``; the
envelope it returns adds ``resumed: true`` when the run was found rather than run)."""

EXIT_STATUS_FIELDS = (
    RESULT_FIELDS[0],
    Field("ended", bool, "the worker has ended (false: its handler took the run over and it still runs)"),
    *(f for f in RESULT_FIELDS if f.name in ("returncode", "timed_out", "wall_s", "worker_pid")),
    Field("handler_pid", int, "the fork-server handler that kept the run (it writes the final status)"),
    Field("handler_identity", str, "its process_identity: a reused pid is not the handler"),
    Field("note", str, "why the handler wrote this file (its client went away), in words"),
)
"""Fields of exit_status.json (``EXIT_STATUS_FILE``), written by ``worker.forkserver``'s handler."""


def field_names(fields: tuple[Field, ...]) -> tuple[str, ...]:
    """List the names of declared fields.

    Args:
        fields: a declaration (RECORD_FIELDS, PHASE_FIELDS...).

    Returns:
        The names, in order.
    """
    return tuple(f.name for f in fields)


def field_problems(doc: Mapping, fields: tuple[Field, ...]) -> list[str]:
    """Check the present values of a document's declared fields against their JSON types.

    Args:
        doc: the document (a record, a result envelope).
        fields: its declaration (RECORD_FIELDS, RESULT_FIELDS).

    Returns:
        One ``name=value: expected TYPE`` per field of the wrong type (a bool is not a number; a
        float field may hold an int); empty when every field is null or of its type.
    """
    problems = []
    for f in fields:
        value = doc.get(f.name)
        if value is None:
            continue
        ok = isinstance(value, f.type) and (f.type is bool or not isinstance(value, bool))
        if f.type is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            problems.append(f"{f.name}={value!r:.60}: expected {f.type.__name__}")
    return problems


ATOMIC_TEMP_SUFFIX = ".tmp"
"""``write_json_atomic``'s temporary file for ``NAME`` is ``.NAME.<random>.tmp`` beside it."""


def remove_stale_temps(directory: Path | str, names: tuple[str, ...]) -> list[Path]:
    """Remove the temporary files ``write_json_atomic`` left for ``names`` in ``directory`` when its
    writer was killed mid-write (SIGKILL: a timeout, a handler dying with its server), which no
    ``finally`` can clean. Call it only when no writer of these files can still run.

    Args:
        directory: the directory (a run directory).
        names: the files whose temporaries are removed (``RECORD_FILE``...).

    Returns:
        The files removed.
    """
    removed = []
    for name in names:
        for tmp in Path(directory).glob(f".{glob.escape(name)}.*{ATOMIC_TEMP_SUFFIX}"):
            try:
                tmp.unlink()
                removed.append(tmp)
            except FileNotFoundError:
                pass
    return removed


def write_json_atomic(path: Path | str, data: Any) -> None:
    """Write JSON through a temporary file in the same directory, then rename over ``path``.

    A reader sees either the previous complete file or the new complete file, never a
    partial one (POSIX rename is atomic within a file system).

    Args:
        path: the file to write.
        data: a JSON-able value (NaN and infinities refused).

    Raises:
        OSError: the directory cannot be written.
        ValueError, TypeError: ``data`` is not JSON-able (the temporary file is removed).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=ATOMIC_TEMP_SUFFIX, dir=path.parent)
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

    Args:
        path: the file.
        kind: what it holds (``spec``, ``record``, ``result``), for the error message.

    Returns:
        The document, a dict with an integer ``schema_version`` <= SCHEMA_VERSION.

    Raises:
        RecordError: unreadable, not JSON, not an object, or without a valid schema_version.
        NewerSchemaError: a schema_version newer than this memsweep understands (upgrade
            memsweep to read it); a subclass of RecordError.
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
        raise NewerSchemaError(
            f"{kind} {path}: schema_version {version} is newer than this memsweep "
            f"reads ({SCHEMA_VERSION}); upgrade memsweep"
        )
    return data


def classify_run(record: Mapping | None, returncode: int | None, timed_out: bool) -> str:
    """Decide the outcome of one worker process from what it left behind.

    Args:
        record: the worker's record (None when missing or unreadable).
        returncode: the worker's exit status (negative: killed by that signal); None when unknown.
        timed_out: the sweeper killed it at ``timeout_s``.

    Returns:
        ``timeout`` when it was killed at its timeout; ``crash`` when it died by a signal or
        left no complete record (a process that died mid-run leaves its complete phases, but
        the run did not finish); otherwise the outcome the worker recorded: ``ok``, ``oom`` or
        ``error``. A crash or an error is never an OOM. A complete record whose ``oom_snapshot``
        is still ``pending`` keeps its outcome whatever happened after: the worker had saved its
        OOM before it began the snapshot's dump (worker/snapshot.py).
    """
    snapshot = record.get("oom_snapshot") if record else None
    if record and isinstance(snapshot, Mapping) and snapshot.get("pending") and record.get("complete"):
        if record.get("outcome") in WORKER_OUTCOMES:
            return record["outcome"]  # saved before its snapshot's dump, which then died or hung
    if timed_out:
        return "timeout"
    if returncode is not None and returncode < 0:
        return "crash"
    if not record or not record.get("complete") or record.get("outcome") not in WORKER_OUTCOMES:
        return "crash"
    return record["outcome"]
