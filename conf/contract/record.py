"""The run record, the result envelope and the files of a run directory.

Files of one run directory::

    spec.json     RunSpec, written by the sweeper before the worker starts
    record.json   run record, written by the worker (atomically, after every phase)
    result.json   result envelope, written by the sweeper once the worker process ended
    stdout.log / stderr.log   the worker's output streams
    exit_status.json   the worker's exit status from its handler, if its client went away

Their fields are declared once, in the JSON Schema beside this module (``SCHEMA_FILE``,
run_files.schema.json, draft 2020-12), read here into the ``*_FIELDS`` tables (``Field``: name,
JSON type, description) in the schema's order. Every field but ``schema_version`` may be null;
memory figures are integers in bytes, a missing one null, never 0 (``document_problems`` checks).
"""

from __future__ import annotations

import functools
import json
import math
import operator
import os
import stat
import tempfile
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from .errors import NewerSchemaError, RecordError
from .temps import TEMP_SUFFIX, temp_prefix
from .vocabulary import (
    DEVICE_COUNTERS,
    WORKER_OUTCOMES,
)

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


def field_names(fields: tuple[Field, ...]) -> tuple[str, ...]:
    """List the names of declared fields.

    Args:
        fields: a declaration (RECORD_FIELDS, PHASE_FIELDS...).

    Returns:
        The names, in order.
    """
    return tuple(f.name for f in fields)


SCHEMA_FILE = Path(__file__).with_name("run_files.schema.json")
"""The published JSON Schema (draft 2020-12) of record.json, result.json and exit_status.json, and
the one declaration of their fields: every ``*_FIELDS`` table below is read from it."""

_SCHEMA: dict = json.loads(SCHEMA_FILE.read_text())
"""SCHEMA_FILE, loaded: ``$defs`` holds one object schema per document and nested object, and the
groups of fields shared by several of them (``failure``, ``counter``...)."""

_JSON_TYPES = {"integer": int, "number": float, "string": str, "boolean": bool, "object": dict, "array": list}
"""The Python type (``Field.type``) of each JSON Schema type a field may declare (besides null)."""


@functools.cache
def _declared_ref(ref: str) -> dict:
    """The schema a local ``$ref`` (``#/$defs/...``, a JSON pointer, RFC 6901) names in _SCHEMA, its
    own ``$ref`` followed to the end; worked out once per ref (read-only: callers never change it)."""
    node = _SCHEMA
    for token in ref.removeprefix("#/").split("/"):
        node = node[token.replace("~1", "/").replace("~0", "~")]
    return _declared(node)


def _declared(prop: dict) -> dict:
    """A property's own keywords over those of the schema its ``$ref`` names (followed to the end)."""
    return {**_declared_ref(prop["$ref"]), **prop} if "$ref" in prop else prop


def _json_types(prop: dict) -> list[str]:
    """The JSON types a property declares: its ``type``, else those of its ``anyOf`` branches."""
    schema = _declared(prop)
    if "anyOf" in schema:
        return [t for branch in schema["anyOf"] for t in _json_types(branch)]
    types = schema["type"]
    return [types] if isinstance(types, str) else types


def _field(name: str, prop: dict) -> Field:
    """The Field a property of the schema declares (its one JSON type besides null)."""
    types = [t for t in _json_types(prop) if t != "null" and t in _JSON_TYPES]
    if len(types) != 1:
        raise RecordError(
            f"{SCHEMA_FILE}: property {name} declares {types}: expected one of {list(_JSON_TYPES)} and null"
        )
    return Field(name, _JSON_TYPES[types[0]], _declared(prop)["description"])


def schema_fields(definition: str, group: str | None = None) -> tuple[Field, ...]:
    """Read a declaration from the schema (SCHEMA_FILE).

    Args:
        definition: a ``$defs`` entry: a document or nested object (``record``, ``phase``...: its
            ``properties``) or a group of shared fields (``failure``, ``counter``...: its ``$defs``).
        group: keep only the properties that ``$ref`` a field of this group (``oom_detail``...).

    Returns:
        One Field per property, in the schema's order: its name, the Python type of its JSON type
        (integer: int, number: float, string: str, boolean: bool, object: dict, array: list), and
        its ``description`` (its own, else the one of the field it refers to).

    Raises:
        KeyError: no such definition.
        RecordError: a property that does not declare one JSON type besides null.
    """
    schema = _SCHEMA["$defs"][definition]
    props = schema.get("properties", schema.get("$defs"))
    return tuple(
        _field(name, prop)
        for name, prop in props.items()
        if group is None or prop.get("$ref", "").startswith(f"#/$defs/{group}/$defs/")
    )


RECORD_FIELDS = schema_fields("record")
"""Top-level fields of record.json (in the schema's order; the worker may write them in another)."""

RANK_FIELDS = schema_fields("rank")
"""Fields of each entry of record.json's ``ranks`` (a DDP or FSDP run, worker/ranks.py)."""

PHASE_RANK_FIELDS = schema_fields("phase_rank")
"""Fields of each entry of a phase's ``ranks`` (a DDP or FSDP run)."""

ENVIRONMENT_FIELDS = schema_fields("environment")
"""Fields of record.json's ``environment``."""

CAPACITY_FIELDS = schema_fields("capacity")
"""Fields of record.json's ``capacity``."""

DEVICE_NOT_FREE_BYTES = 2 * 2**30
"""A CUDA run whose device already has more than this many bytes in use outside its caching
allocator once its context exists (total - free - reserved, its own context and handles
included) is flagged ``device_not_free``: another process holds memory there."""

MODEL_FIELDS = schema_fields("model")
"""Fields of record.json's ``model`` (sizes by construction, not counters)."""

THROUGHPUT_FIELDS = schema_fields("throughput")
"""Fields of record.json's ``throughput``: the warm phases' rates (conf.contract.throughput)."""

PHASE_COUNTERS = DEVICE_COUNTERS
"""The counter fields of a phase (bytes): see vocabulary.DEVICE_COUNTERS."""

PHASE_FIELDS = schema_fields("phase")
"""Fields of each entry of record.json's ``phases``."""

EXTRA_COUNTERS = field_names(schema_fields("extra_counter"))
"""Per phase, where the backend has them (null otherwise): the allocator's retries and OOMs
(torch.cuda.memory_stats), inactive split bytes, device free and total memory (bytes), and the
device memory used outside this process's caching allocator at the phase's end (bytes): total -
free - memory_reserved, i.e. the CUDA context, library handles and lazily loaded kernels (and any
other process on the device)."""

PER_DEVICE_EXTRAS = field_names(schema_fields("phase_device", "extra_counter"))
"""The extra counters a run on several devices also records per device (``devices`` entries)."""

SIZE_FIELDS = field_names(schema_fields("size"))
"""Per phase, sizes by construction summed by the worker at a successful phase's end (bytes;
kv_cache_tokens a count), not counters."""

OOM_DETAIL_FIELDS = field_names(schema_fields("oom_detail"))
"""What an OOM says (bytes; each null unless the failure stated it): the request refused, the bytes
already allocated when it was asked, the device's free and total memory, the bytes reserved but
unallocated, and the allowed limit (a memory fraction, MPS's high watermark, the CPU allocator
capacity). From the CPU allocator capacity's tracker (capacity_mode=allocator: exact bytes), else
parsed from the message by worker.classify.WORDINGS (CUDA, HIP, XPU, MPS, cudaMallocAsync,
NCCL and the CPU allocator's wordings; ``format_size`` prints 2 decimals of KiB/MiB/GiB, so a
parsed size is accurate to half a unit of its last digit). A printed figure outside a field's
range (an unset limit printed as SIZE_MAX) is null, the phase's ``oom_null_reason`` saying why."""

FAILURE_CLASSES = ("oom", "memory_suspect", "error")
"""The class of a failed phase (``failure_class``, worker.classify): ``oom`` (the allocator said it
could not serve a request), ``memory_suspect`` (a failure that usually means memory but does not
say so: a library that could not get its workspace; the phase's status stays ``error``), ``error``."""

SUB_PHASE_FIELDS = field_names(schema_fields("sub_phase"))
"""Per phase: where a sub-phase sits (null on the other phases)."""

DEVICE_FIELDS = schema_fields("phase_device")
"""Fields of each entry of a phase's ``devices`` (a run on several devices)."""

RESULT_FIELDS = schema_fields("result")
"""Fields of result.json, the sweeper's envelope of one run (``sweeper.process.execute``; the
envelope it returns adds ``resumed: true`` when the run was found rather than run)."""

EXIT_STATUS_FIELDS = schema_fields("exit_status")
"""Fields of exit_status.json (``EXIT_STATUS_FILE``), written by ``worker.forkserver``'s handler."""


class _Check(NamedTuple):
    """A property of the schema, worked out once (``_check``) for ``_value_problems``."""

    schema: dict  # its keywords, ``$ref`` followed
    types: list[str]  # its JSON types but null
    accepted: tuple[type, ...]  # the Python types of a present value of those (a float takes an int)
    takes_bool: bool  # a bool is one of them
    nullable: bool  # null is one of its types


_CHECKS: dict[int, _Check] = {}


def _check(prop: dict) -> _Check:
    """``prop`` worked out once (read-only, as the schema: keyed by the object's identity)."""
    found = _CHECKS.get(id(prop))
    if found is None:
        schema = _declared(prop)
        every = [] if "anyOf" in schema else _json_types(schema)
        types = [t for t in every if t != "null"]
        py = tuple(_JSON_TYPES[t] for t in types)
        accepted = tuple(t for t in py if t is not bool) + ((int,) if float in py else ())
        found = _CHECKS[id(prop)] = _Check(schema, types, accepted, bool in py, len(types) < len(every))
    return found


def _value_problems(value: object, prop: dict, where: str) -> list[str]:
    """What a value breaks of a property of the schema (the keywords SCHEMA_FILE uses: type,
    anyOf, enum, minimum, maximum, items, properties, required; ``$ref`` followed)."""
    check = _check(prop)
    schema, types = check.schema, check.types
    if "anyOf" in schema:  # a nested object or null: the problems of the branch that is not null
        found = [_value_problems(value, branch, where) for branch in schema["anyOf"]]
        if [] in found:
            return []
        return next((f for f, b in zip(found, schema["anyOf"]) if _json_types(b) != ["null"]), found[0])
    if value is None and check.nullable:
        return []
    if value is None or not (check.takes_bool if isinstance(value, bool) else isinstance(value, check.accepted)):
        return [f"{where}={value!r:.60}: expected {' or '.join(_JSON_TYPES[t].__name__ for t in types)}"]
    if "enum" in schema and value not in schema["enum"]:
        accepted = ", ".join(str(e) for e in schema["enum"] if e is not None)
        return [f"{where}={value!r:.60}: expected one of {accepted}"]
    if isinstance(value, (int, float)) and not schema.get("minimum", value) <= value <= schema.get("maximum", value):
        return [f"{where}={value!r}: expected from {schema.get('minimum', '-inf')} to {schema.get('maximum', 'inf')}"]
    if isinstance(value, Mapping) and "properties" in schema:
        return _object_problems(value, schema, f"{where}.")
    if isinstance(value, list) and "items" in schema:
        return [p for i, item in enumerate(value) for p in _value_problems(item, schema["items"], f"{where}[{i}]")]
    return []


def _object_problems(doc: Mapping, schema: dict, prefix: str) -> list[str]:
    """What an object breaks of its schema (its required and declared properties), each named ``prefix + key``."""
    problems = [f"{prefix}{name}: required" for name in schema.get("required", ()) if name not in doc]
    for name, prop in schema["properties"].items():
        if name in doc:  # an absent key is not checked (null is a value)
            problems += _value_problems(doc[name], prop, prefix + name)
    return problems


Valid = Callable[[object], bool]
"""A compiled check of a property (``_valid``): True only when ``_value_problems`` finds nothing."""

_VALID: dict[int, Valid] = {}


def _valid(prop: dict) -> Valid:
    """``prop``'s compiled check, made once (keyed by the schema object's identity, as ``_check``).

    The check is ``_value_problems``'s rules on the exact types ``json.loads`` gives (dict, list,
    str, int, float, bool, None): True means the value breaks nothing; False means it may, and
    ``document_problems`` asks ``_value_problems`` for the words (a value of any other type, a
    subclass or another Mapping, is always sent there)."""
    found = _VALID.get(id(prop))
    if found is None:
        found = _VALID[id(prop)] = _compile(prop)
    return found


def _accepted(check: _Check) -> frozenset[type]:
    """The exact Python types a present value of a property may have (a number may be an int)."""
    declared = {_JSON_TYPES[t] for t in check.types}
    return frozenset(declared | ({int} if float in declared else set()))


def _compile(prop: dict) -> Valid:
    """``_valid``'s check of one property: of each ``anyOf`` branch, or of its type, enum, range
    (a NaN is never within one, as in ``_value_problems``), nested object and items."""
    check = _check(prop)
    schema = check.schema
    if "anyOf" in schema:
        branches = tuple(_valid(b) for b in schema["anyOf"])
        if len(branches) == 2:  # an object or null
            first, second = branches
            return lambda v: first(v) or second(v)
        return lambda v: any(b(v) for b in branches)
    types = _accepted(check)
    nullable, enum = check.nullable, schema.get("enum")
    low, high = schema.get("minimum", -math.inf), schema.get("maximum", math.inf)
    obj = _object_valid(schema) if "properties" in schema else None
    items = _valid(schema["items"]) if "items" in schema else None
    if enum is None and obj is None and items is None and types <= {int, float, bool}:
        return lambda v: (v is None and nullable) or (type(v) in types and low <= v <= high)  # type: ignore[operator]
    if enum is None and obj is None and items is None and not types & {int, float, bool}:
        return lambda v: (v is None and nullable) or type(v) in types
    if enum is None and obj is not None and types == {dict}:  # a nested object (or null)
        return lambda v: (v is None and nullable) or (type(v) is dict and obj(v))
    if enum is None and items is not None and types == {list}:  # a list of items (or null)
        return lambda v: (v is None and nullable) or (type(v) is list and all(map(items, v)))

    def valid(v: object) -> bool:
        if v is None:
            return nullable
        t = type(v)
        if t not in types or (enum is not None and v not in enum):
            return False
        if t in (int, float, bool) and not low <= v <= high:  # type: ignore[operator]
            return False
        if t is dict:
            return obj is None or obj(v)
        return t is not list or items is None or all(map(items, v))  # type: ignore[call-overload]

    return valid


class _Plain(NamedTuple):
    """A nullable property without ``anyOf``, nested object or items, as ``_plan`` checks it."""

    types: frozenset[type]  # the exact types of its value, None's included
    enum: tuple | None  # the values it accepts, None included; None when any
    bounds: tuple[float, float] | None  # (minimum, maximum) of a number; None when unbounded or not one
    numbers: bool  # it holds numbers only (a float, a NaN, is within no range; an int is not one)


_NUMBERS = frozenset({int, float, bool})


def _plain(prop: dict) -> _Plain | None:
    """``prop`` as a ``_Plain``, or None when it is not one (not nullable, an ``anyOf``, a nested
    object or items, or numbers and other types at once): ``_valid`` checks it."""
    check = _check(prop)
    accepted, keywords = _accepted(check), check.schema
    if not check.nullable or {"anyOf", "properties", "items"} & keywords.keys():
        return None
    numbers = accepted <= _NUMBERS
    if accepted & _NUMBERS and not numbers:
        return None
    bounds = (keywords.get("minimum", -math.inf), keywords.get("maximum", math.inf))
    enum = (*keywords["enum"], None) if "enum" in keywords else None
    return _Plain(
        accepted | {type(None)}, enum, bounds if numbers and bounds != (-math.inf, math.inf) else None, numbers
    )


Values = tuple
"""An object's values, in its keys' order (``tuple(doc.values())``)."""


class _Plan(NamedTuple):
    """What is left to check of an object whose keys and value types are known (its shape):
    the values ``_object_valid`` looks at, picked by their place."""

    ranges: tuple[tuple[float, float, Callable[[Values], tuple]], ...]  # (minimum, maximum, picker)
    floats: Callable[[Values], tuple] | None  # the float values (a NaN is never valid)
    checks: tuple[tuple[int, Valid], ...]  # (place, its check: an enum's, a nested property's ``_valid``)


def _picker(places: list[int]) -> Callable[[Values], tuple] | None:
    """A function that picks the values at ``places`` as a tuple; None when there are none."""
    if not places:
        return None
    if len(places) == 1:
        (place,) = places
        return lambda values: (values[place],)
    return operator.itemgetter(*places)


def _plan(schema: dict, keys: tuple, types: tuple) -> _Plan | None:
    """The checks left for the values of an object of ``schema`` with these keys and value types,
    in order; None when the shape alone breaks the schema (a required key absent, a value of a
    type the property does not take, a null where it takes none)."""
    place = {key: i for i, key in enumerate(keys)}
    if any(name not in place for name in schema.get("required", ())):
        return None
    ranges: dict[tuple[float, float], list[int]] = {}
    floats, checks = [], []
    for name, prop in schema["properties"].items():
        i = place.get(name)
        if i is None:  # an absent key is not checked
            continue
        plain = _plain(prop)
        if plain is None and types[i] is type(None):  # its check of a null says the same each time
            if not _valid(prop)(None):
                return None
        elif plain is None:
            checks.append((i, _valid(prop)))
        elif types[i] not in plain.types:
            return None
        elif types[i] is not type(None):
            if plain.enum is not None:
                checks.append((i, plain.enum.__contains__))
            if plain.bounds is not None:
                ranges.setdefault(plain.bounds, []).append(i)
            if types[i] is float:
                floats.append(i)
    pickers = tuple((low, high, _picker(at)) for (low, high), at in ranges.items())
    return _Plan(pickers, _picker(floats), tuple(checks))  # type: ignore[arg-type]


_OBJECTS: dict[int, Valid] = {}

MAX_SHAPES = 256
"""The plans (``_plan``) one object schema keeps, one per shape of object met: a record's phases
and the records of one sweep have a few; the others are worked out each time."""


def _object_valid(schema: dict) -> Valid:
    """The compiled check of an object schema (its ``required`` and declared ``properties``; an
    absent key is not checked), made once per schema; True only when ``_object_problems`` finds
    nothing. What the object's keys and their values' types decide is decided once per shape
    (``_plan``); then its values' enums, ranges, NaNs and nested objects are checked."""
    found = _OBJECTS.get(id(schema))
    if found is not None:
        return found
    plans: dict[tuple[tuple, tuple], _Plan | None] = {}
    missing = object()

    def check_object(doc: object) -> bool:
        obj = typing.cast(dict, doc)  # (a dict: document_problems and _compile give no other type)
        values = tuple(obj.values())
        shape = (tuple(obj), tuple(map(type, values)))
        plan = plans.get(shape, missing)
        if plan is missing:
            plan = _plan(schema, *shape)
            if len(plans) < MAX_SHAPES:
                plans[shape] = plan
        return plan is not None and _values_valid(plan, values)  # type: ignore[arg-type]

    _OBJECTS[id(schema)] = check_object
    return check_object


def _values_valid(plan: _Plan, values: Values) -> bool:
    """An object's values keep what ``plan`` (its shape's) leaves to check."""
    for low, high, pick in plan.ranges:
        picked = pick(values)
        if not low <= min(picked) <= max(picked) <= high:
            return False
    if plan.floats is not None:
        picked = plan.floats(values)
        if not all(map(operator.eq, picked, picked)):  # a NaN is not equal to itself
            return False
    for i, valid in plan.checks:
        if not valid(values[i]):
            return False
    return True


def document_problems(doc: Mapping, definition: str) -> list[str]:
    """Check a document against its definition in the published schema (SCHEMA_FILE), nested
    objects included, with the standard library only.

    Checks the keywords the schema uses: ``required``, each declared property's JSON type
    (integer, number, string, boolean, object, array, null), ``enum`` (a vocabulary constant:
    WORKER_OUTCOMES, OUTCOMES...), ``minimum`` / ``maximum`` (bytes: 0 to 2^63 - 1), and,
    recursively, the declared objects a property holds (``phases`` and their ``devices`` and
    ``ranks``, ``ranks``, ``environment``, ``capacity``, ``model``). Keys not declared are
    allowed, as the schema's ``additionalProperties`` says.

    Args:
        doc: the document (a record, a result envelope, an exit status).
        definition: its ``$defs`` entry: ``record``, ``result``, ``exit_status`` (or a nested
            object's: ``phase``...).

    Returns:
        One ``path=value: what was expected`` per problem, the path naming nested fields as
        ``phases[2].max_memory_allocated``; empty when the document is valid.

    Raises:
        KeyError: no such definition.
    """
    schema = _SCHEMA["$defs"][definition]
    if type(doc) is dict and _object_valid(schema)(doc):  # the compiled check, for a valid document
        return []
    return _object_problems(doc, schema, "")


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
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name), suffix=TEMP_SUFFIX, dir=path.parent)
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


MAX_DOCUMENT_BYTES = 64 * 2**20
"""The largest spec.json, record.json or result.json read (bytes, 64 MiB): a record of thousands of
phases and ranks stays far below it; a larger file is refused (``read_json``), never read whole."""


_KINDS = (
    (stat.S_ISREG, "a regular file"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def path_kind(path: Path | str) -> str | None:
    """What ``path`` is, in words, for a message that refuses it (``a FIFO``, ``a directory``, ``a
    regular file``...; a symbolic link is what it points to); None when nothing is there.

    Args:
        path: the path given.

    Returns:
        The words, or None (no such file; a link to nothing is ``a symbolic link to nothing``).
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a symbolic link to nothing" if os.path.islink(path) else None
    except OSError as exc:  # a path through a file, a loop of links, no permission
        return f"not reachable ({exc.strerror})"
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def bounded_bytes(path: Path | str, kind: str) -> bytes:
    """The bytes of ``path`` when it is a regular file (a symbolic link to one included) of at most
    ``MAX_DOCUMENT_BYTES``.

    Args:
        path: the file.
        kind: what it holds (``spec``, ``record``, ``config.json``), for the error message.

    Raises:
        RecordError: not a regular file (a FIFO, a device such as /dev/zero, a directory), or larger
            than the cap; the message names the file.
        OSError: it cannot be opened or read (missing, no permission).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens without waiting for a writer
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RecordError(f"{kind} {path}: not a regular file (a FIFO, device or directory; refused)")
        if st.st_size > MAX_DOCUMENT_BYTES:
            raise RecordError(
                f"{kind} {path}: {st.st_size} bytes, more than the {MAX_DOCUMENT_BYTES} bytes "
                f"a {kind} may hold (refused)"
            )
        chunks, size = [], 0
        while size <= MAX_DOCUMENT_BYTES:  # the file's size and a byte more (it ends), or past the cap
            want = st.st_size + 1 - size if size <= st.st_size else 2**16  # grown since fstat: read on
            chunk = os.read(fd, min(want, MAX_DOCUMENT_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_DOCUMENT_BYTES:  # grew while read
        raise RecordError(f"{kind} {path}: more than the {MAX_DOCUMENT_BYTES} bytes a {kind} may hold (refused)")
    return data


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
    try:  # (``path`` as given: a str is not made a Path, whose message reads the same)
        data = json.loads(bounded_bytes(path, kind))
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"{kind} {path}: cannot be read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise RecordError(f"{kind} {path}: corrupt or truncated JSON ({exc})") from None
    except RecursionError:
        raise RecordError(f"{kind} {path}: JSON nested too deeply to be a {kind} (refused)") from None
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
