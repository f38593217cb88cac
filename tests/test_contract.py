"""The contract (conf.contract) agrees with what the processes write and read: the record's and
the result's declared fields, the Parquet schemas, the run directory reader, the run's peak, the
isolation default, the exit codes of the README, and a docstring on every public name."""

import ast
import json
import re
from pathlib import Path

import pyarrow as pa
import pytest
from omegaconf import OmegaConf

import memsweep.conf.contract as contract
from memsweep.analysis.schemas import MODEL_STATE_COLUMNS
from memsweep.analysis.tables import DEVICE_TYPE, PHASES_SCHEMA, RUNS_SCHEMA
from memsweep.analysis.throughput import THROUGHPUT_COLUMNS
from memsweep.conf.contract import (
    CAPACITY_FIELDS,
    DEFAULT_ISOLATION,
    DEVICE_FIELDS,
    ENVIRONMENT_FIELDS,
    EXIT_BAD_SPEC,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_OOM,
    EXIT_UNAVAILABLE,
    EXTRA_COUNTERS,
    MODEL_FIELDS,
    OOM_DETAIL_FIELDS,
    PEAK_COUNTERS,
    PEAK_SPLIT_FIELDS,
    PHASE_FIELDS,
    RECORD_FIELDS,
    RECORD_FILE,
    RESULT_FIELDS,
    RESULT_FILE,
    RUN_EXIT,
    SPEC_FILE,
    THROUGHPUT_FIELDS,
    RunSpec,
    field_names,
    peak_counters,
    phase_peak,
    read_run,
    run_peak,
    write_json_atomic,
)
from memsweep.estimator import ESTIMATE_COLUMNS

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = ROOT / "conf" / "contract"

ARROW = {
    int: pa.types.is_int64,
    float: pa.types.is_float64,
    str: pa.types.is_string,
    bool: pa.types.is_boolean,
    list: pa.types.is_list,
}


def declared(*groups) -> dict[str, set]:
    out: dict[str, set] = {}
    for group in groups:
        items = group.items() if isinstance(group, dict) else ((f.name, f.type) for f in group)
        for name, typ in items:
            out.setdefault(name, set()).add(typ)
    return out


def check_columns(
    schema: pa.Schema, sources: dict[str, set], renamed: dict[str, str], derived: set[str], transformed: set[str]
) -> list[str]:
    """Columns of ``schema`` taken from a declared field must have a compatible type; every other
    column must be named as derived or transformed. Returns the columns checked."""
    checked = []
    for column in schema:
        name = renamed.get(column.name, column.name)
        if column.name in derived or column.name in transformed:
            continue
        assert name in sources, f"column {column.name}: not declared in conf.contract (nor derived)"
        for typ in sources[name]:
            assert ARROW[typ](column.type), f"column {column.name} is {column.type}, declared {typ.__name__}"
        checked.append(column.name)
    return checked


def test_runs_schema_columns_from_the_record_are_declared_with_their_types():
    peaks = {
        f.name: f.type
        for f in PHASE_FIELDS
        if f.name
        in PEAK_COUNTERS + OOM_DETAIL_FIELDS + ("oom_operator", "oom_null_reason", "failure_class", "failure_wording")
    }
    sources = declared(
        RESULT_FIELDS,
        RECORD_FIELDS,
        ENVIRONMENT_FIELDS,
        CAPACITY_FIELDS,
        MODEL_FIELDS,
        THROUGHPUT_FIELDS,
        RunSpec.field_types(),
        peaks,
    )
    cold_warm = {f"{w}_{c}": c for w in ("cold", "warm", "completed") for c in PEAK_COUNTERS}
    cold_warm.update({column: key for key, column in THROUGHPUT_COLUMNS.items()})  # record.json's throughput
    derived = {
        "sweep_dir",
        "run_id",
        "run_dir",
        "workload_params",
        "n_phases",
        "source_allocated",
        "source_reserved",
        "predicted_outcome",  # a dry run's verdict (conf.contract.predicted_outcome)
        "max_outside_allocator_bytes",
        *ESTIMATE_COLUMNS,
        *MODEL_STATE_COLUMNS,
    }
    transformed = {
        "workload",  # the spec's workload mapping -> its name
        "alloc_conf",
    }  # environment mapping -> JSON text
    checked = check_columns(RUNS_SCHEMA, sources, cold_warm, derived, transformed)
    assert {
        "batch",
        "capacity_bytes",
        "outcome",
        "returncode",
        "timed_out",
        "wall_s",
        "device_kind",
        "torch",
        "isolation",
        "torch_dynamo_imported",
        "capacity_mode",
        "parameters",
        "max_memory_reserved",
        "cold_max_memory_allocated",
        "devices",
        "micro_steps",
        "checkpointing",
        "oom_operator",
        "oom_null_reason",
        "samples_per_s",
        "throughput_noise_rel",
        "throughput_iterations",
    } <= set(checked)


def test_a_name_declared_with_two_scalar_types_gets_no_column_type():
    """memsweep.analysis.schemas types a column by its declarations: two that disagree are refused, and a
    list or mapping (an object, not a column: the phases' ``devices``) is no column type."""
    from memsweep.analysis.schemas import declared_types

    with pytest.raises(TypeError, match="field width: declared both int64 and double"):
        declared_types({"width": int}, (contract.Field("width", float, "a width"),))
    assert declared_types({"devices": int}, (contract.Field("devices", list, "one per device"),)) == {
        "devices": pa.int64()
    }


def test_phases_schema_columns_from_the_record_are_declared_with_their_types():
    sources = declared(
        PHASE_FIELDS,
        {
            k: v
            for k, v in RunSpec.field_types().items()
            if k in ("batch", "context", "width", "dtype", "mode", "device")
        },
        {"source": str},
    )
    checked = check_columns(PHASES_SCHEMA, sources, {"phase": "name"}, {"sweep_dir", "run_id", "phase_index"}, set())
    assert set(field_names(PHASE_FIELDS)) - set(checked) <= {"name", "error_message", "iteration_s"}
    struct = DEVICE_TYPE.value_type
    assert [f.name for f in struct] == list(field_names(DEVICE_FIELDS))
    assert all(pa.types.is_int64(f.type) for f in struct) and {f.type for f in DEVICE_FIELDS} == {int}


def test_the_worker_writes_the_declared_record_fields():
    from memsweep.worker.measure import Recorder

    written = Recorder(Path("/nonexistent/record.json"), None).data
    # oom_snapshot: at an OOM; world_size, parallel, global_batch: by worker/main.py once the spec is
    # read (worker.measure.run_shape; tests/test_worker_runs.py checks every real record holds them);
    # the DDP/FSDP fields: by worker/ranks.py (a run with parallel)
    later = {"oom_snapshot", "world_size", "parallel", "global_batch", "ranks", "failed_rank", "peak_rank"}
    assert list(written) == [n for n in field_names(RECORD_FIELDS) if n not in later]


class FakeCounters:
    """The counter protocol of worker.protocol.run_phase, with fixed values (bytes)."""

    def synchronize(self):
        pass

    def reset_peak_memory_stats(self):
        pass

    def memory_allocated(self):
        return 10

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    def extra(self):
        return dict.fromkeys(EXTRA_COUNTERS + PEAK_SPLIT_FIELDS)

    def oom_detail(self):
        return {"oom_request_bytes": 4096, "oom_allocated_bytes": 10, "oom_operator": "aten.gelu.default"}


def test_the_worker_writes_the_declared_phase_fields(tmp_path):
    from memsweep.worker.protocol import run_phase

    def refuse():
        raise MemoryError("can't allocate memory")

    ok = run_phase(
        FakeCounters(),
        "cold_step.forward",
        lambda: None,
        1,
        None,
        tmp_path / RECORD_FILE,
        {"parent": "cold_step", "sub_phase": "forward", "step": 0, "micro_step": 0},
        after=lambda: {"gradient_bytes": 8, "kv_cache_bytes": 4, "kv_cache_tokens": 2},
    ).record
    refused = run_phase(FakeCounters(), "cold_forward", refuse, 1, None, tmp_path / RECORD_FILE)
    assert isinstance(refused.error, MemoryError)
    oom = refused.record
    assert oom["status"] == "oom"
    for phase in (ok, oom):
        assert set(phase) <= set(field_names(PHASE_FIELDS)), set(phase) - set(field_names(PHASE_FIELDS))


def test_the_counters_extra_fields_are_the_declared_ones():
    from memsweep.worker import counters

    assert tuple(counters.NO_EXTRA) == EXTRA_COUNTERS
    assert tuple(counters.NO_PEAK_SPLIT) == PEAK_SPLIT_FIELDS


def test_the_result_envelope_has_the_declared_fields(tmp_path, tiny):
    """A finished worker's run directory without result.json (its orchestrator died) is finalized
    by execute without starting a worker: the envelope written is the declared one, in order."""
    from memsweep.sweeper.process import execute

    spec = RunSpec.from_dict(tiny)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_json_atomic(run_dir / SPEC_FILE, spec.to_dict())
    write_json_atomic(
        run_dir / RECORD_FILE,
        {"schema_version": 1, "complete": True, "outcome": "ok", "exit_code": 0, "pid": None, "phases": []},
    )
    envelope = execute(spec, run_dir, isolation="spawn")
    assert envelope["resumed"] is True and envelope["outcome"] == "ok"
    written = json.loads((run_dir / RESULT_FILE).read_text())
    assert list(written) == list(field_names(RESULT_FIELDS))
    assert written["predicted_outcome"] is None  # a measured run has no verdict of a prediction


def test_read_run_tells_damage_from_a_newer_memsweep(tmp_path):
    spec = {"schema_version": 1, "batch": 1, "context": 1, "width": 1}
    corrupt, newer, missing, fine = (tmp_path / n for n in ("corrupt", "newer", "missing", "fine"))
    for d in (corrupt, newer, missing, fine):
        d.mkdir()
        write_json_atomic(d / SPEC_FILE, spec)
    (corrupt / RECORD_FILE).write_text('{"schema_version": 1, "phases": [{"na')
    write_json_atomic(newer / RECORD_FILE, {"schema_version": 99})
    write_json_atomic(missing / RESULT_FILE, {"schema_version": 1, "outcome": "ok"})
    write_json_atomic(fine / RECORD_FILE, {"schema_version": 1, "phases": []})
    assert read_run(corrupt).record_damage == "corrupt"
    assert read_run(newer).record_damage is None and "newer" in read_run(newer).problems[0]
    assert read_run(missing).record_damage == "missing"
    run = read_run(fine)
    assert (run.record_damage, run.problems, run.spec) == (None, [], spec)
    assert set(run.unreadable) == {RESULT_FILE}  # missing: not a problem, but said
    assert read_run(tmp_path / "none").unreadable.keys() == {SPEC_FILE, RECORD_FILE, RESULT_FILE}


def test_one_peak_compared_with_the_capacity():
    from memsweep.analysis.report import basis

    assert peak_counters("cpu") == ("max_memory_allocated", "max_memory_reserved")
    assert peak_counters("cuda") == ("max_memory_reserved", "max_memory_allocated")
    assert peak_counters("cuda", "predicted")[0] == "max_memory_allocated"  # a dry run predicts allocated only
    for kind in ("cpu", "cuda", "unknown"):
        assert basis(kind) == peak_counters(kind)
    phases = [
        {"name": "cold_step.forward", "parent": "cold_step", "max_memory_reserved": 70},
        {"name": "warm_step.forward", "parent": "warm_step", "max_memory_reserved": 50},
        {"name": "inputs", "max_memory_reserved": True},
    ]  # a bool is no byte count
    assert phase_peak(phases, "max_memory_reserved") == 70
    assert phase_peak(phases, "max_memory_reserved", ("warm_step",)) == 50
    assert run_peak({"device_kind": "cuda", "phases": phases}) == (70, "max_memory_reserved")
    assert run_peak({"device_kind": "cuda", "source": "predicted", "phases": phases}) == (None, "max_memory_allocated")


def test_the_isolation_default_is_the_configs():
    assert OmegaConf.load(ROOT / "conf" / "config.yaml").isolation == DEFAULT_ISOLATION


def test_the_readme_states_the_exit_codes():
    readme = (ROOT / "README.md").read_text()
    worker = readme[readme.index("Worker exit codes:") : readme.index("`memsweep run` exits with")]
    for code, words in (
        (EXIT_OK, "ok"),
        (EXIT_UNAVAILABLE, "missing"),
        (EXIT_OOM, "out of memory"),
        (EXIT_ERROR, "another error"),
        (EXIT_BAD_SPEC, "bad spec"),
    ):
        assert re.search(rf"`{code}` [^`]*{words}", worker), (code, words)
    run = readme[readme.index("`memsweep run` exits with") :]
    assert dict((o, int(c)) for c, o in re.findall(r"`(\d+)` (ok|oom|error|crash|timeout)", run)[:5]) == RUN_EXIT


def public_nodes():
    for path in sorted(CONTRACT.glob("*.py")):
        tree = ast.parse(path.read_text())
        body = tree.body
        for i, node in enumerate(body):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                yield path.name, node.name, node
                if isinstance(node, ast.ClassDef):
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef) and not item.name.startswith("_"):
                            yield path.name, f"{node.name}.{item.name}", item
            elif isinstance(node, ast.Assign) and path.name != "__init__.py":
                names = [t.id for t in node.targets if isinstance(t, ast.Name) and not t.id.startswith("_")]
                after = body[i + 1] if i + 1 < len(body) else None
                documented = (
                    isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)
                )
                for name in names:
                    yield path.name, name, documented


def test_every_public_name_of_the_contract_is_documented():
    missing = []
    for module, name, node in public_nodes():
        if isinstance(node, bool):
            if not node:
                missing.append(f"{module}: {name} (constant without a docstring)")
            continue
        doc = ast.get_docstring(node)
        params = (
            [a.arg for a in node.args.args + node.args.kwonlyargs if a.arg not in ("self", "cls")]
            if isinstance(node, ast.FunctionDef)
            else []
        )
        if not doc:
            missing.append(f"{module}: {name} (no docstring)")
        elif params and "Args:" not in doc:
            missing.append(f"{module}: {name} (no Args: section)")
    assert not missing, "\n".join(missing)
    assert all(getattr(contract, name) is not None for name in contract.__all__)
