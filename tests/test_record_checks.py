"""What the analysis makes of a run directory whose record.json breaks the published schema
(conf/contract/run_files.schema.json) deep inside: a crash row naming the field, the rest of the
sweep analysed; and the OOM's operator in both tables. Two real worker runs (a 1 MiB capacity on
the CPU: one fits, one is refused by the capacity tracker), copied and edited by hand."""

import json
import shutil

import pytest

from memsweep.analysis.outputs import summary_text, write_tables
from memsweep.analysis.tables import build_tables
from memsweep.conf.contract import RECORD_FILE, RESULT_FILE, SCHEMA_VERSION, RunSpec

MiB = 2**20


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A sweep directory of two real runs of tests/conftest.py's TINY load (context 8, width 16,
    float32) under a 1 MiB capacity: ``ok`` (batch 2) and ``oom`` (batch 4096: its inputs alone,
    4096 x 8 x 16 x 4 B = 2 MiB, pass the capacity, so the capacity tracker refuses them)."""
    from conftest import TINY

    from memsweep.sweeper.process import execute

    root = tmp_path_factory.mktemp("sweep")
    for name, batch in (("ok", 2), ("oom", 4096)):
        execute(RunSpec.from_dict(dict(TINY, batch=batch, capacity_bytes=MiB)), root / name)
    outcomes = {d: json.loads((root / d / RESULT_FILE).read_text())["outcome"] for d in ("ok", "oom")}
    assert outcomes == {"ok": "ok", "oom": "oom"}, outcomes
    return root


def edited(sweep, tmp_path, edit, files=(RECORD_FILE,)):
    """A copy of the sweep whose ``ok`` run's files are changed by ``edit(document)``."""
    copy = tmp_path / "sweep"
    shutil.copytree(sweep, copy)
    for name in files:
        path = copy / "ok" / name
        doc = json.loads(path.read_text())
        edit(doc)
        path.write_text(json.dumps(doc))
    return copy


def test_the_oom_operator_is_a_column_of_both_tables(sweep):
    runs, phases, problems = build_tables([sweep])
    assert problems == []
    rows = {r["run_id"]: r for r in runs.to_pylist()}
    record = json.loads((sweep / "oom" / RECORD_FILE).read_text())
    (failed,) = [p for p in record["phases"] if p["status"] == "oom"]
    assert isinstance(failed["oom_operator"], str) and failed["oom_operator"].startswith("aten.")
    assert rows["oom"]["oom_operator"] == failed["oom_operator"] and rows["ok"]["oom_operator"] is None
    assert runs.schema.field("oom_operator").type == "string"
    by_phase = {(r["run_id"], r["phase"]): r["oom_operator"] for r in phases.to_pylist()}
    assert by_phase[("oom", failed["name"])] == failed["oom_operator"]
    assert {v for k, v in by_phase.items() if k != ("oom", failed["name"])} == {None}  # null unless an OOM named it


def set_in(path, value):
    def edit(doc):
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return edit


@pytest.mark.parametrize(
    "path, value, named",
    [
        (("phases", 2, "max_memory_allocated"), 2**63, "phases[2].max_memory_allocated=9223372036854775808"),
        (("phases", 2, "max_memory_allocated"), "123", "phases[2].max_memory_allocated='123': expected int"),
        (("phases", 3, "memory_allocated"), 1.5, "phases[3].memory_allocated=1.5: expected int"),
        (("phases", 1, "memory_reserved"), -1, "phases[1].memory_reserved=-1"),
        (("phases", 1, "status"), "fine", "phases[1].status='fine': expected one of ok, oom, error"),
        (("outcome",), "banana", "outcome='banana': expected one of ok, oom, error"),
        (("environment", "isolation"), "thread", "environment.isolation='thread'"),
        (("capacity", "capacity_mode"), 1, "capacity.capacity_mode=1: expected str"),
        (("model", "parameters"), "many", "model.parameters='many'"),
    ],
)
def test_a_record_that_breaks_the_schema_deep_inside_is_a_crash_naming_the_field(sweep, tmp_path, path, value, named):
    runs, phases, problems = build_tables([edited(sweep, tmp_path, set_in(path, value))])
    rows = {r["run_id"]: r for r in runs.to_pylist()}
    assert rows["ok"]["outcome"] == "crash" and named in rows["ok"]["record_problem"]
    assert any(named in p for p in problems)
    assert rows["oom"]["outcome"] == "oom" and rows["oom"]["record_problem"] is None  # the rest is analysed
    assert phases.num_rows > 0


def test_a_newer_memsweeps_run_is_counted_in_words(sweep, tmp_path):
    copy = edited(sweep, tmp_path, set_in(("schema_version",), SCHEMA_VERSION + 1), files=(RECORD_FILE, RESULT_FILE))
    tables, problems = write_tables([copy], tmp_path / "out")
    rows = {r["run_id"]: r for r in tables["runs.parquet"].to_pylist()}
    assert rows["ok"]["outcome"] is None and "newer" in rows["ok"]["record_problem"]
    assert "newer" in rows["ok"]["error_message"]  # not "the run is still going"
    first = summary_text(tables, problems, tmp_path / "out").splitlines()[0]
    assert "2 runs (" in first and "unreadable: 1" in first and "oom: 1" in first and "None" not in first
