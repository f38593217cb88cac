"""conf.contract.document_problems' compiled check (record._valid, record._object_valid), which
passes a valid document without working out any words: on every document of JSON's own types it
says valid exactly when the worded check (record._object_problems) finds nothing, so that no invalid
record goes through it and a valid one never pays for the words."""

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from memsweep.conf.contract import document_problems
from memsweep.conf.contract import record as contract_record

DEFS = contract_record._SCHEMA["$defs"]
OBJECTS = ("record", "result", "exit_status", "phase", "phase_device", "phase_rank", "rank", "environment", "capacity")


def valid_value(prop: dict):
    """A value the property accepts (not null where it can be anything else)."""
    check = contract_record._check(prop)
    schema = check.schema
    if "anyOf" in schema:
        return valid_value(next(b for b in schema["anyOf"] if contract_record._json_types(b) != ["null"]))
    if "enum" in schema:
        return next(e for e in schema["enum"] if e is not None)
    kind = check.types[0] if check.types else None
    if kind == "object":
        return valid_document(schema) if "properties" in schema else {}
    if kind == "array":
        return [valid_value(schema["items"])] if "items" in schema else [0.5]
    return {"integer": schema.get("minimum", 3), "number": 0.5, "string": "x", "boolean": True, None: None}[kind]


def valid_document(schema: dict) -> dict:
    """A document with every declared property of ``schema`` set to a valid value."""
    return {name: valid_value(prop) for name, prop in schema["properties"].items()}


TRICKY = st.sampled_from(
    [None, True, False, 0, -1, 1, 2**63 - 1, 2**63, -(2**63) - 1, 10**400, 1.5, 1.0, -0.5]
    + [float("nan"), float("inf"), float("-inf"), "", "ok", "oom", "x", [], [1], [None], ["x"], {}, {"a": 1}]
)
"""Values of JSON's own types that break some declared property or other (and some that do not)."""


def agree(doc: dict, definition: str) -> None:
    schema = DEFS[definition]
    worded = contract_record._object_problems(doc, schema, "")
    assert contract_record._object_valid(schema)(doc) == (worded == []), (definition, worded)
    assert document_problems(doc, definition) == worded


def test_a_valid_document_of_each_definition_passes_both_checks():
    for definition in OBJECTS:
        doc = valid_document(DEFS[definition])
        assert contract_record._object_problems(doc, DEFS[definition], "") == [], definition
        agree(doc, definition)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), definition=st.sampled_from(OBJECTS))
def test_the_compiled_check_says_valid_exactly_when_no_problem_is_found(data, definition):
    doc = valid_document(DEFS[definition])
    names = st.sampled_from([*DEFS[definition]["properties"], "not_declared"])
    doc.update(data.draw(st.dictionaries(names, TRICKY, max_size=3)))
    for name in data.draw(st.lists(st.sampled_from(list(doc)), max_size=2)):
        doc.pop(name, None)  # an absent key is not checked; an absent required one is a problem
    agree(doc, definition)


@settings(max_examples=100, deadline=None)
@given(name=st.sampled_from(list(DEFS["phase"]["properties"])), value=TRICKY, at=st.integers(0, 2))
def test_a_bad_value_deep_in_a_record_is_found(name, value, at):
    """A phase's (or one of its devices') value: the record's check reaches it through the lists."""
    record = valid_document(DEFS["record"])
    record["phases"] = [copy.deepcopy(record["phases"][0]) for _ in range(3)]
    record["phases"][at][name] = value
    agree(record, "record")
    record["phases"][at]["devices"] = [{**valid_document(DEFS["phase_device"]), "memory_allocated": value}]
    agree(record, "record")


def test_a_mapping_that_is_not_a_dict_gets_the_worded_check():
    from types import MappingProxyType

    doc = valid_document(DEFS["result"])
    assert document_problems(MappingProxyType(doc), "result") == []
    assert document_problems(MappingProxyType({**doc, "returncode": "x"}), "result")
