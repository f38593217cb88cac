"""torch._dynamo: imported before the phases when a run needs it, never inside one, and not at
all by the CPU inference/generate runs of the built-in workloads (conf.contract.needs_dynamo),
so that the fork server need not import it for a CPU inference sweep."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memsweep.conf.contract import RunSpec, needs_dynamo

ROOT = Path(__file__).resolve().parents[1]
TRANSFORMER = {"name": "transformer", "layers": 1, "hidden": 16, "heads": 2, "vocab": 64}

# Runs the worker in a fresh interpreter (no fork server: nothing imported beforehand) and
# reports whether torch._dynamo was imported at all. PATCH=1 makes needs_dynamo say no.
SCRIPT = """
import json, sys
import memsweep.worker.main as m
import memsweep.worker.measure as measure
if sys.argv[2] == "1":
    measure.needs_dynamo = lambda spec: False
code = m.main([sys.argv[1]])
print(json.dumps({"code": code, "dynamo": "torch._dynamo" in sys.modules}))
"""


def _run(tmp_path, spec: dict, patch: bool = False) -> tuple[dict, dict]:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "spec.json").write_text(json.dumps(RunSpec.from_dict(spec).to_dict()))
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(run_dir / "spec.json"), "1" if patch else "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    said = json.loads(out.stdout.strip().splitlines()[-1])
    record = json.loads((run_dir / "record.json").read_text())
    assert said["code"] == 0 and record["outcome"] == "ok", record.get("error_message")
    return said, record


EAGER_SWIGLU = dict(TRANSFORMER, attention="eager", ffn="swiglu", norm="layernorm", kv_heads=1)


@pytest.mark.parametrize(
    "workload, mode, extra",
    [
        ({"name": "mlp", "depth": 1}, "inference", {}),
        ({"name": "mlp", "depth": 1}, "inference", dict(precision="autocast", dtype="bfloat16")),
        (TRANSFORMER, "inference", {}),
        (TRANSFORMER, "generate", {}),
        (EAGER_SWIGLU, "generate", dict(kv_cache="static", dtype="bfloat16")),
    ],
)
def test_cpu_inference_of_builtin_workloads_never_imports_dynamo(tmp_path, tiny, workload, mode, extra):
    few_tokens = {"new_tokens": 2} if mode == "generate" else {}  # an option of generate only (refused elsewhere)
    spec = dict(tiny, workload=workload, mode=mode, **few_tokens, **extra)
    assert not needs_dynamo(RunSpec.from_dict(spec))
    said, record = _run(tmp_path, spec)
    assert said["dynamo"] is False
    assert "imported_during_phases" not in record["environment"]


def test_train_imports_dynamo_before_the_phases(tmp_path, tiny):
    spec = dict(tiny, mode="train")
    assert needs_dynamo(RunSpec.from_dict(spec))  # the first optimizer step imports it
    said, record = _run(tmp_path, spec)
    assert said["dynamo"] is True
    assert "imported_during_phases" not in record["environment"]


def test_a_wrong_no_is_caught_and_recorded(tmp_path, tiny):
    """The check that keeps needs_dynamo honest: a train run told it needs no Dynamo imports it
    in its first optimizer step, and the record says so."""
    said, record = _run(tmp_path, dict(tiny, mode="train"), patch=True)
    assert said["dynamo"] is True
    assert record["environment"]["imported_during_phases"].startswith("torch._dynamo (before ")


@pytest.mark.parametrize(
    "change",
    [
        dict(mode="train"),
        dict(dry_run=True),
        dict(device="cuda"),
        dict(export=True),
        dict(workload={"name": "hf", "config": "GPT2Config"}),
    ],
)
def test_needs_dynamo_is_conservative(tiny, change):
    spec = dict(tiny, **change)
    assert needs_dynamo(RunSpec.from_dict(spec)), change
