"""Fault matrix with real processes: every injected fault gets the right outcome, the complete
phases are kept, the sweep goes on or resumes, and no record is lost, duplicated or torn."""

import json
import os
import shutil
import signal
import subprocess
import time
import uuid

import pyarrow.parquet as pq
import pytest

from memsweep.conf.contract import INFERENCE_PHASES
from tests.data.loads import MEMSWEEP, NO_REPORT, SMALLEST_CPU
from tests.test_process_faults import TAG, _tagged

MATRIX_TAG = uuid.uuid4().hex

# (fault kind, phase) -> expected outcome. OOMs are injected as torch.OutOfMemoryError in each phase.
MATRIX = [(kind, phase) for kind in ("sigkill", "oom") for phase in INFERENCE_PHASES] + [
    ("segfault", "cold_forward"),
    ("raise", "warm_forward"),
    ("garbage", "inputs"),
    ("orphans", "warm_forward"),  # children left behind (one in a session of its own), then SIGKILL: a crash
    # (none left: test_process_faults; the sweep's own processes after the matrix: test_fault_matrix)
]
# A hang past timeout_s is in tests/test_worker_runs.py (its short timeout_s would race slow starts here).
EXPECTED = {
    "sigkill": "crash",
    "oom": "oom",
    "segfault": "crash",
    "raise": "error",
    "garbage": "crash",
    "orphans": "crash",
}


@pytest.fixture(scope="module")
def matrix_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    faults = ",".join(f"{{phase:{phase},kind:{kind}}}" for kind, phase in MATRIX)
    proc = subprocess.run(
        [
            MEMSWEEP,
            "sweep",
            "hydra/sweeper=basic",
            f"fault={faults}",
            "batch=2",
            f"hydra.sweep.dir={root}/s",
            *SMALLEST_CPU,
        ],
        cwd=root,
        env={**os.environ, TAG: MATRIX_TAG},
        capture_output=True,
        text=True,
        timeout=900,
    )
    return proc, root / "s"


def test_fault_matrix(matrix_sweep):
    proc, sweep_dir = matrix_sweep
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {r["run_id"]: r for r in pq.read_table(sweep_dir / "runs.parquet").to_pylist()}
    handled, lost = 0, 0
    for index, (kind, phase) in enumerate(MATRIX):
        row = runs.get(str(index))
        if row is None or row["outcome"] is None:
            lost += 1
            continue
        assert row["outcome"] == EXPECTED[kind], (kind, phase, row)
        spec = json.loads((sweep_dir / str(index) / "spec.json").read_text())
        assert spec["fault"] == {"phase": phase, "kind": kind}
        if kind != "garbage":
            record = json.loads((sweep_dir / str(index) / "record.json").read_text())
            done = list(INFERENCE_PHASES[: INFERENCE_PHASES.index(phase)])
            names = [p["name"] for p in record["phases"]]
            if kind in ("oom", "raise"):
                assert names == done + [phase] and record["phases"][-1]["status"] == EXPECTED[kind]
                assert row["failed_phase"] == phase
                if kind == "oom":  # a CPU run: the injected OOM quotes no CUDA allocator
                    assert "CUDA" not in record["error_message"], record["error_message"]
            else:  # killed or hung: the phases completed before the fault are all there, and ok
                assert names == done and all(p["status"] == "ok" for p in record["phases"])
                assert row["failed_phase"] == phase
        else:
            assert "corrupt" in row["record_problem"]
        handled += 1
    print(f"\nfault matrix: faults injected {len(MATRIX)}, handled {handled}, records lost {lost}")
    assert handled == len(MATRIX) and lost == 0
    assert not list(sweep_dir.rglob(".record.json.*.tmp")), "no half-written record left behind"
    left = _tagged(MATRIX_TAG)
    for pid, _ in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes of the sweep left running: {left}"


def _wait_for(path_glob, root, count, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(list(root.glob(path_glob))) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {count} x {path_glob}")


def test_orchestrator_killed_mid_sweep_resumes_without_running_a_finished_run_twice(tmp_path):
    sweep_dir = tmp_path / "s"
    cmd = [MEMSWEEP, "sweep", "sweep=none", "batch=1,2,3,4", f"hydra.sweep.dir={sweep_dir}", *SMALLEST_CPU]
    cmd += NO_REPORT  # killed mid-run, then resumed: the runs are checked, not the report
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for("*/result.json", sweep_dir, 2)
    _wait_for("2/record.json", sweep_dir, 1)  # the third run's worker is going
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = {p.parent.name: json.loads(p.read_text()) for p in sweep_dir.glob("*/result.json")}
    assert len(finished) >= 2
    time.sleep(1.0)  # the orphaned worker gets PDEATHSIG'd; let it go
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    runs = pq.read_table(sweep_dir / "runs.parquet").to_pylist()
    assert sorted(r["batch"] for r in runs) == [1, 2, 3, 4], "no run lost, none duplicated"
    assert all(r["outcome"] == "ok" for r in runs)
    for name, before in finished.items():  # finished runs were not run again
        after = json.loads((sweep_dir / name / "result.json").read_text())
        assert after["worker_pid"] == before["worker_pid"]
    assert "not run again" in again.stderr + again.stdout


class _NoTracker:
    """A CUDA-like counters object: the OOM's figures come from its message alone."""

    def oom_detail(self):
        return None


# The OOM wordings whose figures no record field holds as printed, each from its source's format.
UNRECORDABLE_OOMS = [
    pytest.param(
        "Allocation on device 0 would exceed allowed memory. (out of memory)\nCurrently allocated     : 79.00 GiB\n"
        "Requested               : 2.00 GiB\nDevice limit            : 79.11 GiB\nFree (according to CUDA): 0 bytes\n"
        "PyTorch limit (set by user-supplied memory fraction)\n                        : 17179869184.00 GiB",
        id="CUDAMallocAsyncAllocator.cpp-no-memory-fraction",
    ),
    pytest.param(
        "CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 79.10 GiB of which 0 bytes is "
        "free. Of the allocated memory 70.00 GiB is allocated by PyTorch, and 17179869183.00 GiB is reserved by "
        "PyTorch but unallocated.",
        id="CUDACachingAllocator.cpp-wrapped-difference",
    ),
]


@pytest.mark.parametrize("message", UNRECORDABLE_OOMS)
def test_an_oom_whose_figures_no_field_holds_reads_back_as_an_oom(tmp_path, message):
    """The worker's phase and record for such an OOM are valid: read back, the run is an ``oom``,
    never a ``crash`` (a damaged record), the figure null and its reason recorded."""
    import torch

    from memsweep.conf.contract import EXIT_OOM, RECORD_FILE, classify_run, document_problems, try_read
    from memsweep.worker.measure import Recorder
    from memsweep.worker.protocol import _record_outcome

    phase: dict = {"name": "cold_forward"}
    error = torch.OutOfMemoryError(message)
    _record_outcome(_NoTracker(), phase, error, None)  # type: ignore[arg-type]
    recorder = Recorder(tmp_path / RECORD_FILE, None)
    recorder.data["phases"].append(phase)
    recorder.finish("oom", EXIT_OOM, phase="cold_forward", exc=error)
    record, problem = try_read(tmp_path, RECORD_FILE)
    assert problem is None and record is not None and document_problems(record, "record") == []
    assert classify_run(record, EXIT_OOM, False) == "oom"
    saved = record["phases"][0]
    assert saved["status"] == "oom" and saved["oom_null_reason"], saved
    assert [k for k, v in saved.items() if k.startswith("oom_") and k.endswith("_bytes") and v is None]


# ---- a sweep's directory, its lock, and the steps after its runs -------------------------------

HOLD_LOCK = (
    "import sys, time\n"
    "from memsweep.conf.contract import hold_sweep_lock\n"
    "hold_sweep_lock(sys.argv[1]); print('held', flush=True); time.sleep(120)\n"
)


def _one_line_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("memsweep")]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def test_a_second_sweep_and_an_analysis_into_a_running_sweep_are_refused_in_one_line(tmp_path):
    import sys

    sweep_dir = tmp_path / "s"
    (sweep_dir / "0").mkdir(parents=True)
    (sweep_dir / "0" / "spec.json").write_text('{"schema_version": 1}')
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(sweep_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted((p.name, p.stat().st_mtime_ns) for p in sweep_dir.iterdir())
        cmd = [MEMSWEEP, "sweep", "sweep=none", "batch=1,2", f"hydra.sweep.dir={sweep_dir}", *SMALLEST_CPU]
        proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and "invalid hydra.sweep.dir=" in _one_line_error(proc.stderr)
        analyze = subprocess.run([MEMSWEEP, "analyze", str(sweep_dir)], capture_output=True, text=True, timeout=300)
        assert analyze.returncode == 2 and "still running" in _one_line_error(analyze.stderr)
        assert sorted((p.name, p.stat().st_mtime_ns) for p in sweep_dir.iterdir()) == before, "nothing written"
    finally:
        holder.kill()
        holder.wait()


def test_an_analysis_that_fails_at_the_sweeps_end_fails_the_command_in_one_line(tmp_path):
    sweep_dir = tmp_path / "s"
    sweep_dir.mkdir()
    (sweep_dir / "runs.parquet").write_text("an analysis already here")  # the new one goes to analysis/<time>/
    (sweep_dir / "analysis").write_text("a file where that folder goes")  # ... which cannot be made
    cmd = [MEMSWEEP, "sweep", "sweep=none", "batch=1,2", f"hydra.sweep.dir={sweep_dir}", *SMALLEST_CPU]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 8, proc.stderr[-3000:]
    line = [x for x in proc.stderr.splitlines() if x.startswith("memsweep: error:")]
    assert len(line) == 1 and "the sweep's analysis failed" in line[0] and "Traceback" not in proc.stderr
    assert all((sweep_dir / n / "result.json").is_file() for n in ("0", "1")), "the runs are kept"
    manifest = json.loads((sweep_dir / "sweep.json").read_text())
    assert [r["run_id"] for r in manifest["runs"]] == ["0", "1"]


def test_a_sweep_analyses_only_its_own_runs(tmp_path):
    sweep_dir = tmp_path / "s"
    (sweep_dir / "7").mkdir(parents=True)  # a run directory this sweep never launched
    (sweep_dir / "7" / "spec.json").write_text('{"schema_version": 1, "batch": 4096}')
    cmd = [
        MEMSWEEP,
        "sweep",
        "hydra/sweeper=basic",
        "batch=1,2",
        f"hydra.sweep.dir={sweep_dir}",
        *SMALLEST_CPU,
        *NO_REPORT,
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = pq.read_table(sweep_dir / "runs.parquet").to_pylist()
    assert sorted(r["batch"] for r in runs) == [1, 2], "nothing foreign mixed in"
    entries = json.loads((sweep_dir / "sweep.json").read_text())["runs"]
    for entry in entries:  # each run's spec.json holds its manifest entry's token (a copy of another's would not)
        spec = json.loads((sweep_dir / entry["run_id"] / "spec.json").read_text())
        assert entry["token"] and spec["sweep_token"] == entry["token"], (entry, spec)
    assert len({e["token"] for e in entries}) == 2


def test_a_run_directory_deleted_mid_run_stops_the_sweep_in_one_line(tmp_path):
    """The run's directory removed while its worker runs: the orchestrator cannot write its result;
    it says so in one line (exit 1, documented), with no traceback, and leaves no worker running."""
    sweep_dir = tmp_path / "s"
    cmd = [
        MEMSWEEP,
        "sweep",
        "sweep=none",
        "batch=choice(2)",
        "fault={phase:warm_forward,kind:hang}",
        f"hydra.sweep.dir={sweep_dir}",
        *SMALLEST_CPU,
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for("0/record.json", sweep_dir, 1)
        worker = json.loads((sweep_dir / "0" / "record.json").read_text())["pid"]
        os.rename(sweep_dir / "0", tmp_path / "gone")  # at once: the worker still writes into it
        os.kill(worker, signal.SIGKILL)
        shutil.rmtree(tmp_path / "gone")
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in out + err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("memsweep: error:")]
    assert len(errors) == 1 and "No such file or directory" in errors[0] and "resumes" in errors[0], err[-3000:]
    assert not os.path.exists(f"/proc/{worker}") or open(f"/proc/{worker}/stat").read().split()[2] == "Z"
