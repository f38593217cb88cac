"""The published JSON Schema of a run directory's files (conf/contract/run_files.schema.json): a
valid draft 2020-12 schema, the one declaration the Field tables are read from, and what a real
worker writes validates against it."""

import copy
import json
from collections import Counter

import pytest

from memsweep.conf.contract import record as contract_record
from memsweep.conf.contract import vocabulary

jsonschema = pytest.importorskip(
    "jsonschema", reason="jsonschema is not installed: install memsweep's test extra (pip install -e '.[test]')"
)
referencing = pytest.importorskip("referencing", reason="referencing (a jsonschema dependency) is not installed")
from referencing.jsonschema import DRAFT202012  # noqa: E402

SCHEMA = json.loads(contract_record.SCHEMA_FILE.read_text())
REGISTRY = referencing.Registry().with_resource(SCHEMA["$id"], DRAFT202012.create_resource(SCHEMA))
RESOLVER = REGISTRY.resolver(base_uri=SCHEMA["$id"])
PYTHON = {"integer": int, "number": float, "string": str, "boolean": bool, "object": dict, "array": list}
TABLES = {
    "record": contract_record.RECORD_FIELDS,
    "result": contract_record.RESULT_FIELDS,
    "exit_status": contract_record.EXIT_STATUS_FIELDS,
    "phase": contract_record.PHASE_FIELDS,
    "phase_device": contract_record.DEVICE_FIELDS,
    "phase_rank": contract_record.PHASE_RANK_FIELDS,
    "rank": contract_record.RANK_FIELDS,
    "environment": contract_record.ENVIRONMENT_FIELDS,
    "capacity": contract_record.CAPACITY_FIELDS,
    "model": contract_record.MODEL_FIELDS,
    "throughput": contract_record.THROUGHPUT_FIELDS,
}


def resolved(schema: dict) -> dict:
    """The schema's own keywords over those its $ref names, resolved by the referencing library
    (not by conf.contract.record's reader, which this test checks)."""
    if "$ref" not in schema:
        return schema
    return {**resolved(RESOLVER.lookup(schema["$ref"]).contents), **schema}


def json_types(schema: dict) -> set[str]:
    schema = resolved(schema)
    if "anyOf" in schema:
        return set().union(*(json_types(branch) for branch in schema["anyOf"]))
    return set([schema["type"]] if isinstance(schema["type"], str) else schema["type"])


def declarations():
    """(where, name, schema) of every field declared in place: document properties and group members."""
    for def_name, definition in SCHEMA["$defs"].items():
        members = definition.get("properties") or definition.get("$defs") or {def_name: definition}
        for name, schema in members.items():
            if "$ref" not in schema:
                yield def_name, name, schema


def refs(node):
    if isinstance(node, dict):
        if "$ref" in node:
            yield node["$ref"]
        for value in node.values():
            yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def test_the_schema_is_a_valid_draft_2020_12_schema_and_every_ref_resolves():
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert SCHEMA["$id"] and SCHEMA["title"] and SCHEMA["description"]
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    found = list(refs(SCHEMA))
    assert len(found) > 50
    for ref in found:
        assert isinstance(RESOLVER.lookup(ref).contents, dict), ref
    with pytest.raises(referencing.exceptions.Unresolvable):
        RESOLVER.lookup("#/$defs/phase/properties/no_such_field")


def test_the_field_tables_are_the_schemas_properties():
    documents = [name for name, definition in SCHEMA["$defs"].items() if "properties" in definition]
    assert sorted(documents) == sorted(TABLES)
    for def_name, fields in TABLES.items():
        definition = SCHEMA["$defs"][def_name]
        assert definition["type"] == "object" and definition["additionalProperties"] is True
        expected = []
        for name, prop in definition["properties"].items():
            (json_type,) = json_types(prop) - {"null"}
            # every field may be null, but the one a document requires (schema_version)
            assert "null" in json_types(prop) or name in definition.get("required", ()), (
                def_name,
                name,
            )
            expected.append(contract_record.Field(name, PYTHON[json_type], resolved(prop)["description"]))
        assert fields == tuple(expected), def_name


def test_the_shared_groups_agree_with_the_vocabulary():
    group = {name: tuple(SCHEMA["$defs"][name]["$defs"]) for name in ("counter", "peak_split")}
    assert group["counter"] == vocabulary.DEVICE_COUNTERS == contract_record.PHASE_COUNTERS
    assert group["peak_split"] == vocabulary.PEAK_SPLIT_FIELDS
    phase = SCHEMA["$defs"]["phase"]["properties"]
    for name in vocabulary.DEVICE_COUNTERS + vocabulary.PEAK_SPLIT_FIELDS + contract_record.OOM_DETAIL_FIELDS:
        assert phase[name]["$ref"].rsplit("/", 1)[1] == name


def test_each_field_is_declared_once_and_every_byte_field_says_so():
    declared = Counter(
        (name, json.dumps(schema.get("type")), schema.get("description")) for _, name, schema in declarations()
    )
    assert [key for key, count in declared.items() if count > 1] == []
    byte_fields = 0
    for where, name, schema in declarations():
        if schema.get("description", "").endswith("(bytes)") or name.endswith("_bytes"):
            byte_fields += 1
            assert schema.get("unit") == "bytes", (where, name)
        if schema.get("unit") == "bytes":
            assert schema["type"] == ["integer", "null"], (where, name)  # bytes are integers
    assert byte_fields > 30


SIGNED_BYTES = ("outside_allocator_start_bytes", "outside_allocator_bytes", "oom_reserved_unallocated_bytes")
"""The byte fields that are differences of figures read one after the other: no minimum."""


def test_schema_version_is_required_and_pinned_to_the_readers_versions():
    version = SCHEMA["$defs"]["schema_version"]
    assert version["type"] == "integer" and version["minimum"] == 1
    assert version["maximum"] == contract_record.SCHEMA_VERSION
    for kind in ("record", "result", "exit_status"):
        assert SCHEMA["$defs"][kind]["required"] == ["schema_version"], kind
        assert SCHEMA["$defs"][kind]["properties"]["schema_version"] == {"$ref": "#/$defs/schema_version"}
        validator = jsonschema.Draft202012Validator({"$ref": f"{SCHEMA['$id']}#/$defs/{kind}"}, registry=REGISTRY)
        assert validator.is_valid({"schema_version": 1})
        for wrong in ({}, {"schema_version": None}, {"schema_version": 0}, {"schema_version": version["maximum"] + 1}):
            assert not validator.is_valid(wrong), (kind, wrong)
            assert contract_record.document_problems(wrong, kind), (kind, wrong)  # memsweep's own check agrees


ENUMS = {  # (definition, property) -> the vocabulary constant its enum lists (plus null)
    ("record", "outcome"): vocabulary.WORKER_OUTCOMES,
    ("record", "train_step"): vocabulary.TRAIN_STEP_KINDS,
    ("record", "source"): vocabulary.SOURCES,
    ("record", "parallel"): vocabulary.PARALLELS,
    ("result", "outcome"): vocabulary.OUTCOMES,
    ("phase", "status"): vocabulary.WORKER_OUTCOMES,
    ("phase", "failure_class"): contract_record.FAILURE_CLASSES,
    ("environment", "isolation"): vocabulary.ISOLATIONS,
    ("capacity", "capacity_mode"): vocabulary.CAPACITY_MODES,
}


def test_each_enum_of_the_schema_is_its_vocabulary_constant():
    found = {}
    for where, name, schema in declarations():
        if "enum" in schema:
            found[(where, name)] = schema["enum"]
    assert found == {key: [*values, None] for key, values in ENUMS.items()}
    assert resolved(SCHEMA["$defs"]["phase_rank"]["properties"]["status"])["enum"] == found[("phase", "status")]


def test_byte_fields_are_int64_and_never_negative_but_for_differences():
    from memsweep.analysis.schemas import INT64_RANGE

    signed = []
    for where, name, schema in declarations():
        if schema.get("unit") == "bytes":
            assert schema["maximum"] == INT64_RANGE[1] == 2**63 - 1, (where, name)
            if "minimum" in schema:
                assert schema["minimum"] == 0, (where, name)
            else:
                signed.append(name)
        else:
            assert "minimum" not in schema or name == "schema_version", (where, name)
    assert sorted(signed) == sorted(SIGNED_BYTES)


def test_the_schema_does_not_claim_the_writers_key_order():
    """The worker writes model.compile, phase.dynamo_graphs_compiled, a rank's record... elsewhere
    than their place in the tables (the Parquet columns' order): the schema, record.py and the
    README say the order is the tables', not the writers'."""
    from pathlib import Path

    root = Path(contract_record.__file__).parents[2]
    texts = [SCHEMA["description"], *(d.get("description", "") for d in SCHEMA["$defs"].values())]
    texts += [Path(contract_record.__file__).read_text(), (root / "README.md").read_text()]
    for text in texts:
        assert "order the writers write" not in text and "order the worker writes" not in text
    assert "a writer may write" in SCHEMA["description"]


def dotted(path: tuple) -> str:
    """A path into a document as conf.contract.document_problems names it: phases[2].status."""
    return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path).lstrip(".")


@pytest.mark.parametrize(
    "mode, fault, outcome, workload",
    [
        ("train", None, "ok", None),
        ("inference", {"phase": "cold_forward", "kind": "raise"}, "error", None),
        ("inference", None, "ok", {"name": "transformer", "layers": 1, "heads": 2, "vocab": 32}),
    ],
)
def test_a_real_runs_files_validate_and_a_wrong_type_does_not(tmp_path, tiny, mode, fault, outcome, workload):
    from memsweep.conf.contract import RunSpec
    from memsweep.sweeper.process import execute

    spec = RunSpec.from_dict(dict(tiny, mode=mode, fault=fault, workload=workload or tiny["workload"]))
    execute(spec, tmp_path / "run")
    run_dir = tmp_path / "run"
    files = {
        kind: json.loads((run_dir / name).read_text())
        for name, kind in contract_record.FILE_KINDS.items()
        if kind in ("record", "result")
    }
    assert files["result"]["outcome"] == outcome and files["record"]["phases"]
    validators = {
        kind: jsonschema.Draft202012Validator({"$ref": f"{SCHEMA['$id']}#/$defs/{kind}"}, registry=REGISTRY)
        for kind in files
    }
    for kind, doc in files.items():
        assert list(validators[kind].iter_errors(doc)) == [], kind
        assert contract_record.document_problems(doc, kind) == [], kind  # memsweep's own check agrees
        assert validators[kind].is_valid({**doc, "written_by_a_newer_memsweep": 1})  # unknown keys: accepted
    record = files["record"]
    model = set(contract_record.field_names(contract_record.MODEL_FIELDS))
    assert set(record["model"]) <= model, set(record["model"]) - model  # dims (transformer) declared
    assert record["model"]["compile"] == "false"  # the string, as the schema says
    last = len(record["phases"]) - 1
    wrong_values = {  # where in record.json -> a value the schema refuses
        ("pid",): "x",
        ("phases", 0, "memory_allocated"): "x",  # phase -> the counter group
        ("environment", "cpu_count"): "x",  # a nullable nested object
        ("phases", last, "error_type"): 1,  # phase -> the failure group
        ("phases", last, "duration_s"): True,  # a bool is not a number
        ("phases", 0, "max_memory_allocated"): 2**63,  # bytes: int64
        ("phases", 1, "memory_reserved_start"): -1,  # bytes: never negative
        ("outcome",): "banana",  # enum: WORKER_OUTCOMES
        ("phases", 0, "status"): "fine",
        ("environment", "isolation"): "thread",
        ("capacity", "capacity_mode"): "device",
        ("model", "parameter_bytes"): 1.5,
    }
    for path, value in wrong_values.items():
        wrong = copy.deepcopy(record)
        parent = wrong
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = value
        error = jsonschema.exceptions.best_match(validators["record"].iter_errors(wrong))
        assert error is not None and tuple(error.absolute_path) == path, (path, error)
        problems = contract_record.document_problems(wrong, "record")
        assert [p.split("=")[0] for p in problems] == [dotted(path)], (path, problems)
