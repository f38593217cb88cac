"""torch.compile runs (spec ``compile``) on the CPU: the cold phase holds the compilation, apart
from the warm phases, and both peaks are recorded. Slow-ish (Inductor compiles C++: tens of
seconds on a shared 2-core machine); skipped where no C++ compiler is found (the sweeper refuses
such a run, tests/test_finetune.py)."""

import json
import os
import shutil
import subprocess

import pytest

from tests.data.loads import MEMSWEEP


@pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile on the CPU needs a C++ compiler (g++)")
def test_cpu_compile_run_records_cold_and_warm_peaks(tmp_path):
    results = tmp_path / "res"
    # Inductor's own cache in this test's folder: a real compilation every time, not a cache hit
    # left by an earlier run in /tmp (a hit shrinks the cold phase to a fraction of a second)
    cache = tmp_path / "inductor"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    proc = subprocess.run(
        [MEMSWEEP, "run", "workload=mlp", "workload.depth=1", "compile=default", "mode=inference", "device=cpu"]
        + ["batch=2", "context=8", "width=16", "warmup=1", "repeats=1", "threads=1", f"results_dir={results}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record_path,) = list(results.rglob("record.json"))
    record = json.loads(record_path.read_text())
    assert record["outcome"] == "ok" and record["model"]["compile"] == "default"
    assert record["environment"]["torch_dynamo_imported"] is True  # imported before the first phase
    phases = {p["name"]: p for p in record["phases"]}
    cold, warm = phases["cold_forward"], phases["warm_forward"]
    for phase in (cold, warm):
        assert isinstance(phase["max_memory_allocated"], int) and phase["max_memory_allocated"] > 0
        assert isinstance(phase["max_memory_reserved"], int) and phase["max_memory_reserved"] > 0
    assert any(cache.rglob("*.py")), "Inductor compiled (its generated code is in the cache)"
    # compilation is in the cold window only: Dynamo captured the model's graph there, and the
    # warm phase ran the compiled code without capturing (or recompiling) anything
    assert cold["dynamo_graphs_compiled"] >= 1, cold
    assert warm["dynamo_graphs_compiled"] == 0, warm
    print(f"cold {cold['duration_s']:.2f} s, warm {warm['duration_s']:.4f} s")  # for the log, not asserted
