"""Ready for the first GPU (issue #22), checked on the CPU: the fraction's rounding, the snapshot's
guard and order (a fake recorder and a fake torch.cuda.memory), the per-device maximum, the report's
labels, bf16 from the run's device, and `make gpu-check`'s set-up (the build line, the wheels
installed in a fresh interpreter of this CPU build, a crashed probe, the OOM match)."""

import json
import pickle
import random
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from memsweep.analysis.report.phases import decomposition, state_label
from memsweep.conf.contract import classify_run, phase_peak
from memsweep.worker.counters import allocator_limit, backend_warning, memory_fraction_for
from memsweep.worker.environment import bf16_supported
from memsweep.worker.snapshot import bounded_pickle, dump_snapshot, enable_history, save_oom_then_dump

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import gpu_check  # noqa: E402
import gpu_env  # noqa: E402

GiB = 2**30


def test_the_fraction_never_puts_the_allocator_limit_under_the_capacity():
    rng = random.Random(22)
    totals = [150_754_820_096, 85_097_971_712, 25_386_352_640, 17_179_869_184, 8_589_934_592]
    totals += [rng.randrange(2**30, 2**38) for _ in range(200)]
    truncated = 0
    for total in totals:
        for _ in range(200):
            limit = rng.randrange(1, total + 1)
            fraction = memory_fraction_for(limit, total)
            assert 0 < fraction <= 1
            assert limit <= allocator_limit(fraction, total) <= limit + 2 + total // 2**52
            truncated += allocator_limit(limit / total, total) < limit
    assert truncated > 0  # the plain quotient does land under the capacity for some pairs
    with pytest.raises(ValueError):
        memory_fraction_for(0, GiB)
    with pytest.raises(ValueError):
        memory_fraction_for(GiB + 1, GiB)


class FakeMemory:
    """torch.cuda.memory's recorder functions, recording what was asked and when."""

    def __init__(self, fail_enable=False, traces=3, entry_bytes=100, on_snapshot=None):
        self.calls, self.fail_enable, self.on_snapshot = [], fail_enable, on_snapshot
        self.traces = [[{"action": "alloc", "frames": "x" * entry_bytes} for _ in range(traces)]]

    def _record_memory_history(self, **kwargs):
        self.calls.append(("record", kwargs))
        if self.fail_enable and kwargs.get("enabled"):
            raise RuntimeError("record_context_cpp is not supported on this platform")

    def _snapshot(self):
        self.calls.append(("snapshot", None))
        if self.on_snapshot:
            self.on_snapshot()
        return {"segments": [{"address": 1}], "device_traces": [list(t) for t in self.traces]}


def test_history_is_recorded_with_python_stacks_and_a_failure_lets_the_run_go_on(capsys):
    memory = FakeMemory()
    assert enable_history(memory) is None
    assert memory.calls == [("record", {"enabled": "all", "context": "all", "stacks": "python", "max_entries": 100000})]
    problem = enable_history(FakeMemory(fail_enable=True))
    assert problem["file"] is None and "RuntimeError" in problem["problem"] and "went on" in problem["problem"]
    assert "snapshot_on_oom" in capsys.readouterr().err


class FakeRecorder:
    def __init__(self, path):
        self.path, self.data, self.saved = path, {"phases": [{"name": "cold_forward", "status": "oom"}]}, []

    def save(self):
        self.path.write_text(json.dumps(self.data))
        self.saved.append(json.loads(self.path.read_text()))

    def finish(self):
        self.data.update(outcome="oom", complete=True, exit_code=3)
        self.save()
        return 3


def test_the_oom_is_saved_before_the_snapshot_is_dumped(tmp_path):
    rec = FakeRecorder(tmp_path / "record.json")
    on_disk = []
    memory = FakeMemory(on_snapshot=lambda: on_disk.append(json.loads(rec.path.read_text())))
    assert save_oom_then_dump(rec, rec.finish, tmp_path, memory) == 3
    (seen,) = on_disk  # what a reader finds while the dump runs
    assert seen["outcome"] == "oom" and seen["complete"] and seen["oom_snapshot"]["pending"] is True
    assert seen["phases"][0]["status"] == "oom"
    assert classify_run(seen, -11, False) == "oom" and classify_run(seen, None, True) == "oom"  # died while dumping
    assert classify_run({**seen, "oom_snapshot": None}, -11, False) == "crash"
    final = rec.saved[-1]["oom_snapshot"]
    assert final["file"] == "oom_snapshot.pickle" and final["pending"] is False and final["problem"] is None
    assert ("record", {"enabled": None}) in memory.calls  # recording stopped before the pickle is built
    assert pickle.loads((tmp_path / final["file"]).read_bytes())["segments"] == [{"address": 1}]


def test_the_snapshot_is_bounded_before_its_file_is_built(tmp_path):
    memory = FakeMemory(traces=5000, entry_bytes=1000)  # about 5 MB of trace entries
    result = dump_snapshot(tmp_path, memory, max_bytes=1_000_000)
    assert result["file"] and 0 < result["bytes"] <= 1_000_000 and result["dropped_entries"] > 2500
    kept = pickle.loads((tmp_path / result["file"]).read_bytes())["device_traces"][0]
    assert len(kept) == 5000 - result["dropped_entries"]
    data, dropped = bounded_pickle({"segments": ["y" * 5000], "device_traces": [[1, 2]]}, max_bytes=1000)
    assert data is None  # the segments alone are too large: no file at all
    assert not list(tmp_path.glob(".oom_snapshot*"))  # no temporary file left behind


def test_the_capacity_is_compared_with_the_fullest_device():
    phases = [
        {"name": "inputs", "max_memory_reserved": 4 * GiB, "devices": [{"max_memory_reserved": 4 * GiB}, {}]},
        {"name": "cold_forward", "max_memory_reserved": 5 * GiB, "devices": [{"max_memory_reserved": 5 * GiB}]},
        {
            "name": "warm_forward",
            "max_memory_reserved": 3 * GiB,
            "devices": [{"max_memory_reserved": 3 * GiB}, {"max_memory_reserved": 7 * GiB}],
        },
    ]
    assert phase_peak(phases, "max_memory_reserved") == 7 * GiB
    assert phase_peak(phases, "max_memory_reserved", ("cold_forward",)) == 5 * GiB


def test_the_report_names_cublas_workspaces_not_state_in_inference():
    assert "(gradients" not in state_label("inference") and "cuBLAS" in state_label("inference")
    assert "gradients, optimizer states" in state_label("train") and "cuBLAS" in state_label("train")
    phases = [
        {"phase": "model_load", "phase_index": 0, "memory_allocated_start": 0, "memory_allocated": 100},
        {"phase": "cold_forward", "phase_index": 1, "memory_allocated_start": 100, "memory_allocated": 132},
    ]
    (name, kept) = decomposition(phases, None, "inference")[1]
    assert kept == 32 and name.startswith("kept after the first pass/step (cuBLAS")


def test_bf16_is_read_from_the_runs_own_device(monkeypatch):
    majors = {0: 7, 1: 9}  # cuda:0 a Volta, cuda:1 a Hopper
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(major=majors[i]))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert bf16_supported(torch.device("cuda", 1)) is True
    assert bf16_supported(torch.device("cuda", 0)) is False
    assert bf16_supported(torch.device("cpu")) is True


def test_a_non_native_allocator_backend_is_flagged():
    assert backend_warning("native") is None and backend_warning(None) is None
    assert "max_memory_allocated" in backend_warning("cudaMallocAsync")


def test_the_build_line_names_a_cpu_only_build_and_no_gpu():
    assert "CPU-only build" in gpu_env.describe_build({"torch": "2.13.0+cpu", "cuda": None, "hip": None})[1]
    usable, line = gpu_env.describe_build({"torch": "2.11.0+cu130", "cuda": "13.0", "device_count": 0})
    assert not usable and "no GPU visible" in line and "CUDA 13.0" in line
    assert "too old" in gpu_env.describe_build({"torch": "2.3.1", "cuda": "12.1", "device_count": 1})[1]
    usable, line = gpu_env.describe_build({"torch": "2.11.0", "cuda": "13.0", "device_count": 1, "names": ["H200"]})
    assert usable and "1 GPU(s) visible (H200)" in line
    proc = subprocess.run([sys.executable, "tests/gpu_check.py"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "CPU-only build" in proc.stdout  # this machine: the CPU build


def test_gpu_check_matches_oom_in_any_case_and_survives_a_crashed_probe(monkeypatch):
    assert gpu_check.is_cuda_oom("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert gpu_check.is_cuda_oom("torch.OutOfMemoryError: Out Of Memory") and not gpu_check.is_cuda_oom(None)
    crashed = subprocess.CompletedProcess([], -11, stdout="", stderr="Fatal Python error: Segmentation fault\n")
    monkeypatch.setattr(gpu_check.subprocess, "run", lambda *a, **k: crashed)
    info: dict = {}
    assert gpu_check.probe_line(info) == "" and info["available"] is False
    assert "crashed (exit -11)" in info["reason"]


def _wheel(folder: Path, dist: str, module: str) -> Path:
    path = folder / f"{dist.replace('-', '_')}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{module}/__init__.py", "VALUE = 22\n")
        zf.writestr(f"{dist.replace('-', '_')}-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n")
    return path


INSTALL = """
import sys, json
sys.path.insert(0, {tests!r})
import gpu_env
from pathlib import Path
installed = gpu_env.install_missing(Path({wheels!r}), Path({site!r}), {needed!r})
{after}
print(json.dumps(installed))
"""


def test_missing_modules_are_installed_from_the_wheels_in_a_fresh_interpreter(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "memsweep-probe-dist", "memsweep_probe_mod")
    code = INSTALL.format(
        tests=str(ROOT / "tests"),
        wheels=str(wheels),
        site=str(tmp_path / "site"),
        needed={"memsweep_probe_mod": "memsweep-probe-dist", "json": "json-is-there"},
        after="import memsweep_probe_mod, torch; assert memsweep_probe_mod.VALUE == 22 and torch.version.cuda is None",
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == ["memsweep_probe_dist-1.0-py3-none-any.whl"]  # json: present
    code = INSTALL.format(
        tests=str(ROOT / "tests"),
        wheels=str(wheels),
        site=str(tmp_path / "site2"),
        needed={"memsweep_absent_mod": "not-brought"},
        after="",
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "make gpu-wheels" in proc.stderr


def _wheels_of_this_venv(folder: Path, dists: list[str]) -> Path:
    """Pure wheels repacked from this venv's installed distributions (their files as RECORD lists
    them under site-packages, the dist-info's own WHEEL included): no package index needed."""
    from importlib import metadata

    folder.mkdir()
    for name in dists:
        dist = metadata.distribution(name)
        base = Path(dist.locate_file(""))
        wheel = folder / f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            for file in dist.files or []:
                if file.parts[0] == ".." or "__pycache__" in file.parts:
                    continue  # scripts outside site-packages, bytecode
                zf.write(base / file, str(file))
    return folder


def test_the_real_wheels_give_hydra_to_an_interpreter_without_it(tmp_path):
    """A fresh interpreter without site-packages (-S) gets hydra-core, omegaconf and antlr4 from
    the wheels alone, then composes memsweep's config (PyYAML taken from this venv after). The
    wheels are .gpu-wheels/ (`make gpu-wheels`, which needs a package index) where it exists, and
    otherwise the same distributions repacked from this venv, so that this runs everywhere."""
    import site as site_module

    needed = {k: v for k, v in gpu_env.NEEDED.items() if k in ("hydra", "omegaconf", "antlr4")}
    wheels = ROOT / ".gpu-wheels"
    if not wheels.is_dir():
        wheels = _wheels_of_this_venv(tmp_path / "wheels", list(needed.values()))

    packages = site_module.getsitepackages()[0]
    after = (
        f"sys.path.append({packages!r}); sys.path.insert(0, {str(gpu_env.package_dir(tmp_path / 'package'))!r})\n"
        "import hydra, omegaconf, antlr4\n"
        f"assert all(m.__file__.startswith({str(tmp_path / 'site')!r}) for m in (hydra, omegaconf, antlr4))\n"
        "from hydra import compose, initialize_config_module\n"
        "with initialize_config_module(config_module='memsweep.conf', version_base='1.3'):\n"
        "    cfg = compose(config_name='config')\n"
        "assert 'capacity' in cfg and 'capacity_mode' in cfg, cfg\n"
    )
    code = INSTALL.format(
        tests=str(ROOT / "tests"),
        wheels=str(wheels),
        site=str(tmp_path / "site"),
        needed=needed,
        after=after,
    )
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(json.loads(proc.stdout.splitlines()[-1])) == 3


def test_a_wheel_fits_when_pure_or_built_for_this_interpreter(monkeypatch):
    major, minor = sys.version_info[:2]
    monkeypatch.setattr(gpu_env.sys, "platform", "linux")
    monkeypatch.setattr(gpu_env.platform, "machine", lambda: "x86_64")
    linux = "manylinux_2_17_x86_64.manylinux2014_x86_64"
    assert gpu_env.wheel_fits("peft-0.21.2-py3-none-any.whl")
    assert gpu_env.wheel_fits("shellingham-1.5.4-py2.py3-none-any.whl")
    assert gpu_env.wheel_fits(f"regex-1-cp{major}{minor}-cp{major}{minor}-{linux}.whl")
    assert gpu_env.wheel_fits(f"tokenizers-0.23.3-cp3{minor - 1}-abi3-{linux}.whl")  # the stable ABI, older
    assert not gpu_env.wheel_fits(f"regex-1-cp{major}{minor + 1}-cp{major}{minor + 1}-{linux}.whl")
    assert not gpu_env.wheel_fits(f"regex-1-cp{major}{minor}-cp{major}{minor}-manylinux2014_aarch64.whl")
    assert not gpu_env.wheel_fits(f"regex-1-cp{major}{minor}-cp{major}{minor}-win_amd64.whl")
    assert not gpu_env.wheel_fits("old-1.0-py2-none-any.whl")


def test_the_finetune_wheels_are_unpacked_where_a_distribution_is_missing(tmp_path):
    """Every brought wheel that fits and whose distribution is missing is unpacked (a ``.data``
    purelib moved up), one that does not fit is left; nothing when the check's distributions are there."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "memsweep-probe-ft", "memsweep_probe_ft")
    with zipfile.ZipFile(wheels / "memsweep_probe_data-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr("memsweep_probe_data-1.0.data/purelib/memsweep_probe_data.py", "VALUE = 36\n")
        zf.writestr("memsweep_probe_data-1.0.dist-info/METADATA", "Name: memsweep-probe-data\nVersion: 1.0\n")
        zf.writestr("memsweep_probe_data-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n")
    (wheels / "memsweep_probe_other-1.0-cp27-cp27m-win32.whl").write_bytes(b"not read")
    code = (
        f"import sys, json; sys.path.insert(0, {str(ROOT / 'tests')!r}); import gpu_env; from pathlib import Path\n"
        f"got = gpu_env.install_finetune(Path({str(wheels)!r}), Path({str(tmp_path / 'site')!r}), "
        "('memsweep-probe-ft',))\n"
        "import memsweep_probe_ft, memsweep_probe_data; assert memsweep_probe_data.VALUE == 36\n"
        f"none = gpu_env.install_finetune(Path({str(wheels)!r}), Path({str(tmp_path / 'site2')!r}), ('torch',))\n"
        "print(json.dumps([got, none]))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got, none = json.loads(proc.stdout.splitlines()[-1])
    assert got == ["memsweep_probe_data-1.0-py3-none-any.whl", "memsweep_probe_ft-1.0-py3-none-any.whl"]
    assert none == []
    assert not list((tmp_path / "site").glob("*.data"))


def test_the_two_rank_gpu_check_skips_on_one_gpu_saying_so(tmp_path, capsys):
    import gpu_cases

    assert gpu_cases.check_ranks({"device_count": 1}, tmp_path) == []
    assert "needs two (skipped)" in capsys.readouterr().out
    assert not any(tmp_path.iterdir())  # nothing was run


def test_the_throughput_gpu_case_runs_on_the_cpu_and_prints_each_rate(tmp_path, capsys):
    """``make gpu-check``'s throughput case, on the CPU at a tiny load: every ok run has its rates,
    printed with where they were timed (the CPU, never called a GPU figure)."""
    import gpu_cases

    load = ("context=8", "width=16", "workload.depth=2", "warmup=1", "repeats=2", "threads=1")
    assert gpu_cases.check_throughput(tmp_path / "t", device="cpu", load=load, batches=(2, 4)) == []
    printed = capsys.readouterr().out
    assert "batch=2      ok    " in printed and "samples/s" in printed and "(timed on CPU)" in printed


def test_the_throughput_gpu_case_flags_missing_and_misplaced_rates():
    import gpu_cases

    spec = {"batch": 8, "repeats": 5}
    ok = {"spec": spec, "outcome": "ok", "device_kind": "cuda", "throughput": {"samples_per_s": None}}
    oom = {"spec": {**spec, "batch": 16}, "outcome": "oom", "throughput": {"samples_per_s": 3.0}}
    lines, failures = gpu_cases.throughput_lines([oom, ok])
    assert lines[0].startswith("  batch=8") and "timed on cuda" in lines[0]
    assert len(failures) == 2 and "an ok run without its rates" in failures[0] and "oom run with rates" in failures[1]
