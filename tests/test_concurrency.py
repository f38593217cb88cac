"""Concurrent writers and readers on one results directory: nothing lost, nothing run twice."""

import json
import subprocess
import time

import pyarrow.parquet as pq

from tests.data.loads import MEMSWEEP, NO_REPORT, SMALLEST_CPU


def test_two_sweeps_on_one_directory_run_each_condition_once(tmp_path):
    # each orchestrator ends with its report beside its analysis, at once: their exit statuses cover it
    sweep_dir = tmp_path / "shared"
    cmd = [MEMSWEEP, "sweep", "sweep=none", "batch=1,2,3", f"hydra.sweep.dir={sweep_dir}", *SMALLEST_CPU]
    procs = [
        subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    results = sorted(sweep_dir.glob("*/result.json"))
    assert len(results) == 3
    pids = [json.loads(r.read_text())["worker_pid"] for r in results]
    records = [json.loads((r.parent / "record.json").read_text()) for r in results]
    assert [rec["pid"] for rec in records] == pids and all(rec["complete"] for rec in records)
    assert not list(sweep_dir.glob("*/.attempts")), "no condition was started twice"
    # Each condition was run by one orchestrator and found finished by the other.
    assert sum(o.count("not run again") for o in outputs) == 3
    # One of the two analyses went to the sweep dir, the other next to it: nothing overwritten.
    assert pq.read_table(sweep_dir / "runs.parquet").num_rows == 3
    assert len(list((sweep_dir / "analysis").glob("*/runs.parquet"))) == 1


def test_analyze_while_a_sweep_writes_reads_every_record(tmp_path):
    sweep_dir = tmp_path / "live"
    sweep = subprocess.Popen(
        [MEMSWEEP, "sweep", "sweep=none", "batch=1,2,3,4", f"hydra.sweep.dir={sweep_dir}", *SMALLEST_CPU, *NO_REPORT],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    snapshots = 0
    while sweep.poll() is None and snapshots < 30:
        if sweep_dir.is_dir():
            out = tmp_path / f"snap{snapshots}"
            proc = subprocess.run(
                [MEMSWEEP, "analyze", str(sweep_dir), "--out", str(out)],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert proc.returncode == 0, proc.stderr
            assert "problem" not in proc.stdout, proc.stdout  # no torn or unreadable record, ever
            for row in pq.read_table(out / "runs.parquet").to_pylist():
                assert row["outcome"] in ("ok", None)  # finished, or still going: never a false crash
            snapshots += 1
        time.sleep(0.3)
    assert sweep.wait(timeout=600) == 0, sweep.stderr.read()
    assert snapshots >= 1
    final = pq.read_table(sweep_dir / "runs.parquet").to_pylist()
    assert sorted(r["batch"] for r in final) == [1, 2, 3, 4] and {r["outcome"] for r in final} == {"ok"}
