"""Static and file-level safety rules: no pickle, no shell, versioned records, corrupt files skipped."""

import json
import re
from pathlib import Path

from memsweep.analysis.cli import analyze
from memsweep.conf.contract import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [p for d in ("worker", "sweeper", "analysis", "hydra_plugins") for p in (ROOT / d).rglob("*.py")]


def test_no_pickle_and_no_shell_anywhere():
    assert len(SOURCES) > 10
    for path in SOURCES:
        text = path.read_text()
        assert not re.search(r"\bpickle\.load|cloudpickle|shell=True|os\.system\(|os\.popen\(", text), path
        # Nothing unpickles. Only the OOM snapshot writes a pickle (pytorch.org/memory_viz reads that format).
        if path.name != "snapshot.py":
            assert not re.search(r"\bimport pickle\b", text), path


def test_worker_imports_only_torch_and_the_standard_library():
    allowed_third_party = {"torch"}
    # Optional packages a spec may ask for (workload=hf, LoRA, QLoRA, optimizer=adamw8bit, compile on
    # CUDA): imported lazily,
    # inside a function of the worker/workloads/ package (or of worker/count.py, the worker's
    # parameter counter of a transformers config), never at module level.
    optional = {"transformers", "bitsandbytes", "peft", "triton"}
    for path in (ROOT / "worker").rglob("*.py"):
        for match in re.finditer(r"^(\s*)(?:from|import)\s+([A-Za-z_][\w]*)", path.read_text(), re.M):
            indent, name = match.groups()
            if name in allowed_third_party or name in ("worker", "__future__"):
                continue
            if name in optional:
                assert indent and (path.parent.name == "workloads" or path.name == "count.py"), (path, name)
                continue
            __import__(name)  # a standard-library module imports on any Python
            assert name not in ("hydra", "omegaconf", "pandas", "pyarrow", "filelock", "sweeper", "analysis"), path


def test_analysis_never_imports_torch():
    for path in (ROOT / "analysis").rglob("*.py"):
        assert not re.search(r"^\s*(from|import)\s+torch\b", path.read_text(), re.M), path


def _run_dir(root, name, batch, record=None, result=None):
    d = root / name
    d.mkdir(parents=True)
    (d / "spec.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "batch": batch,
                "context": 8,
                "width": 16,
                "dtype": "float32",
                "mode": "inference",
                "device": "cpu",
                "workload": {"name": "mlp"},
            }
        )
    )
    if record is not None:
        (d / "record.json").write_text(record)
    if result is not None:
        (d / "result.json").write_text(json.dumps(result))
    return d


def test_corrupt_and_newer_records_are_reported_and_the_rest_analyzed(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    good = {"schema_version": 1, "complete": True, "outcome": "ok", "phases": []}
    _run_dir(sweep, "0", 1, json.dumps(good), {"schema_version": 1, "outcome": "ok"})
    _run_dir(sweep, "1", 2, '{"schema_version": 1, "phases": [{"na', {"schema_version": 1, "outcome": "crash"})
    _run_dir(sweep, "2", 4, json.dumps(dict(good, schema_version=SCHEMA_VERSION + 1)))
    bad_spec = sweep / "3"
    bad_spec.mkdir()
    (bad_spec / "spec.json").write_text("{truncated")
    tables = analyze([sweep], out_dir=tmp_path / "out")
    out = capsys.readouterr().out
    assert "corrupt or truncated" in out and "newer than this memsweep" in out and "unreadable spec.json" in out
    rows = {r["run_id"]: r for r in tables["runs.parquet"].to_pylist()}
    assert set(rows) == {"0", "1", "2"}  # the run with an unreadable spec is skipped, the rest analyzed
    assert rows["0"]["outcome"] == "ok"
    assert rows["1"]["outcome"] == "crash" and "corrupt" in rows["1"]["record_problem"]
    assert rows["2"]["outcome"] is None and "newer" in rows["2"]["record_problem"]
