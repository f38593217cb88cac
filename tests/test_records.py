"""The contract: size parsing, spec validation, versioned JSON reading, run classification."""

import json

import pytest

from memsweep.conf.contract import (
    SCHEMA_VERSION,
    RecordError,
    RunSpec,
    SpecError,
    classify_run,
    parse_size,
    read_json,
    write_json_atomic,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2GiB", 2 * 2**30),
        ("1500MB", 1_500_000_000),
        ("24GB", 24 * 10**9),
        ("24GiB", 24 * 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5GiB", 1_610_612_736),
        ("0.5GB", 500_000_000),
        ("4096B", 4096),
    ],
)
def test_parse_size_exact(text, expected):
    assert parse_size(text) == expected


def test_gb_and_gib_differ():
    """24 GB = 24e9 B is about 22.35 GiB: the two units are never confused."""
    assert parse_size("24GB") != parse_size("24GiB")
    assert parse_size("24GiB") - parse_size("24GB") == 24 * (2**30 - 10**9)


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "12XB",
        "GiB",
        "-1GB",
        "0",
        "0GiB",
        "1.3B",
        "2 gigs",
        "2gib",
        "1e9",
        "nan",
        True,
        -5,
        0,
        "1,5GB",
        None,
        "4096",
        4096,
        "256",
    ],
)
def test_parse_size_rejects_garbage(garbage):
    with pytest.raises(SpecError) as err:
        parse_size(garbage)
    assert "capacity" in str(err.value) and "GiB" in str(err.value)


@pytest.mark.parametrize(
    "field, value, accepted",
    [
        ("batch", 0, "integer"),
        ("batch", -3, "integer"),
        ("batch", 1.5, "integer"),
        ("batch", "8", "integer"),
        ("batch", True, "integer"),
        ("context", 0, "integer"),
        ("width", -1, "integer"),
        ("dtype", "float8", "float32, float16, bfloat16"),
        ("mode", "serve", "inference, train"),
        ("device", "tpu", "cuda:N"),
        ("device", "cuda:x", "cuda:N"),
        ("warmup", -1, "integer"),
        ("repeats", 0, "integer"),
        ("timeout_s", 0, "seconds"),
        ("capacity_bytes", "lots", "GiB"),
        ("workload", {"name": "resnet"}, "mlp"),
        ("workload", "mlp", "name"),
        ("fault", {"phase": "nowhere", "kind": "raise"}, "model_load"),
    ],
)
def test_spec_rejects_bad_field(tiny, field, value, accepted):
    data = dict(tiny, **{field: value})
    with pytest.raises(SpecError) as err:
        RunSpec.from_dict(data)
    message = str(err.value)
    assert field.split("_bytes")[0] in message and accepted in message


def test_spec_rejects_unknown_workload_param_and_field(tiny):
    with pytest.raises(SpecError, match="workload.heads"):
        RunSpec.from_dict(dict(tiny, workload={"name": "mlp", "heads": 4}))
    with pytest.raises(SpecError, match="batchsize"):
        RunSpec.from_dict(dict(tiny, batchsize=4))


def test_spec_round_trip_fills_defaults(tiny):
    spec = RunSpec.from_dict(tiny)
    again = RunSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec
    assert spec.workload == {"name": "mlp", "depth": 2, "hidden": None, "activation": "gelu"}


def test_read_json_versions_and_corruption(tmp_path):
    good = tmp_path / "good.json"
    write_json_atomic(good, {"schema_version": SCHEMA_VERSION, "x": 1})
    assert read_json(good, "record")["x"] == 1
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(RecordError, match="newer"):
        read_json(newer, "record")
    truncated = tmp_path / "truncated.json"
    truncated.write_text('{"schema_version": 1, "phases": [{"na')
    with pytest.raises(RecordError, match="corrupt or truncated"):
        read_json(truncated, "record")
    with pytest.raises(RecordError, match="cannot be read"):
        read_json(tmp_path / "missing.json", "record")
    assert not list(tmp_path.glob(".*.tmp")), "atomic writes leave no temporary file behind"


@pytest.mark.parametrize(
    "record, returncode, timed_out, expected",
    [
        ({"complete": True, "outcome": "ok"}, 0, False, "ok"),
        ({"complete": True, "outcome": "oom"}, 3, False, "oom"),
        ({"complete": True, "outcome": "error"}, 4, False, "error"),
        ({"complete": False, "outcome": None}, -9, False, "crash"),
        ({"complete": True, "outcome": "ok"}, -11, False, "crash"),
        (None, 1, False, "crash"),
        ({"complete": False}, -9, True, "timeout"),
    ],
)
def test_classify_run(record, returncode, timed_out, expected):
    assert classify_run(record, returncode, timed_out) == expected
