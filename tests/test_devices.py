"""Several devices per run (spec ``devices``, issue #8): validation, the pool's GPU groups, the
per-device counters through the phase protocol, and the phases table's nested ``devices`` column.

No GPU here: the per-device counters are fakes (or the real CudaCounters over a fake allocator
API); the pool uses a fake probe, as tests/test_scale.py does. tests/gpu_check.py checks a real
devices=2 run when a machine with 2+ GPUs is lent.
"""

import json
import subprocess
import threading
from pathlib import Path

import pytest
import torch

from memsweep.analysis.tables import DEVICE_TYPE, PHASES_SCHEMA, coerce_table, phase_rows
from memsweep.conf.contract import DEVICE_COUNTERS, PER_DEVICE_EXTRAS, Run, RunSpec, SpecError
from memsweep.sweeper.pool import gpu_slots, lease, placement
from memsweep.sweeper.process import RunDirError, check_resumable
from memsweep.worker.counters import CudaCounters, MultiDeviceCounters, allocator_limit, cuda_capacity, make_counters
from memsweep.worker.protocol import run_phase
from tests.data.loads import MEMSWEEP

MiB = 2**20
BASE = dict(batch=2, context=8, width=16)


# --- spec validation -------------------------------------------------------------------------


def test_devices_defaults_to_one_and_is_in_the_spec_json():
    spec = RunSpec(**BASE)
    assert spec.devices == 1 and spec.to_dict()["devices"] == 1
    assert RunSpec.from_dict({**BASE, "device": "cuda:0", "devices": 2}).devices == 2


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"devices": 0}, "invalid devices=0: expected an integer from 1 to"),
        ({"devices": -1}, "invalid devices=-1"),
        ({"devices": True, "device": "cuda:0"}, "invalid devices=True: expected an integer"),
        ({"devices": "2", "device": "cuda:0"}, "invalid devices='2': expected an integer"),
        ({"devices": 1.0}, "invalid devices=1.0"),
        ({"devices": 2}, "invalid devices=2: expected 1 with device=cpu"),
        ({"devices": 2, "device": "cuda:1"}, "invalid device='cuda:1': expected cuda:0 with devices=2"),
    ],
)
def test_bad_devices_names_the_field_and_what_is_accepted(fields, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(")) as info:
        RunSpec.from_dict({**BASE, **fields})
    assert info.value.field in ("devices", "device")


def test_spec_from_config_reads_devices_and_checks_the_visible_gpus(monkeypatch):
    from hydra import compose, initialize_config_module

    from memsweep.sweeper.spec import spec_from_config

    fake = {
        "requested": "cuda",
        "device": "cuda:0",
        "device_kind": "cuda",
        "available": True,
        "reason": None,
        "total_memory": 80 * 2**30,
        "device_name": "fake",
        "bf16_supported": True,
        "device_count": 2,
    }
    monkeypatch.setenv("MEMSWEEP_PROBE_cuda", json.dumps(fake))
    with initialize_config_module(config_module="memsweep.conf", version_base="1.3"):
        assert compose(config_name="config").devices == 1  # the baseline
        spec = spec_from_config(compose(config_name="config", overrides=["device=cuda", "devices=2"]))
        assert (spec.device, spec.devices) == ("cuda:0", 2)
        with pytest.raises(SpecError, match="invalid devices=3: expected at most the 2 GPU"):
            spec_from_config(compose(config_name="config", overrides=["device=cuda", "devices=3"]))
        with pytest.raises(SpecError, match="invalid devices=2: expected 1 with device=cpu"):
            spec_from_config(compose(config_name="config", overrides=["device=cpu", "devices=2"]))


def test_memsweep_run_devices_2_on_the_cpu_is_refused_before_any_worker(tmp_path):
    proc = subprocess.run(
        [MEMSWEEP, "run", "device=cpu", "devices=2", f"results_dir={tmp_path}/res"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "invalid devices=2: expected 1 with device=cpu" in proc.stderr
    assert not list(tmp_path.rglob("spec.json"))


def test_a_spec_json_written_before_devices_still_resumes_as_the_same_condition(tmp_path):
    import json

    spec = RunSpec(**BASE)
    old = spec.to_dict()
    del old["devices"]
    assert old != spec.to_dict()
    (tmp_path / "same").mkdir()
    (tmp_path / "same" / "spec.json").write_text(json.dumps(old))
    check_resumable(spec, tmp_path / "same")  # the same condition, written before `devices` existed
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "spec.json").write_text(json.dumps({**old, "batch": 3}))
    with pytest.raises(RunDirError, match="another condition"):
        check_resumable(spec, tmp_path / "other")


# --- pool ------------------------------------------------------------------------------------


def test_gpu_slots_group_visible_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    probe = {"device_count": 4}
    assert gpu_slots(probe) == ["0", "1", "2", "3"]
    assert gpu_slots(probe, 2) == ["0,1", "2,3"]
    assert gpu_slots({"device_count": 5}, 2) == ["0,1", "2,3"]  # GPU 4 left over
    assert gpu_slots(probe, 4) == ["0,1,2,3"]
    with pytest.raises(SpecError, match="invalid devices=5: expected at most the 4 GPU"):
        gpu_slots(probe, 5)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6")  # physical ids, as the orchestrator sees them
    assert gpu_slots(probe, 2) == ["3,5"]


def test_concurrent_devices_2_leases_get_disjoint_pairs(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    probe = {"device_count": 4}
    with placement("gpus", "cuda:0", 1, probe, tmp_path, devices=2) as first:
        assert first["CUDA_VISIBLE_DEVICES"] in ("0,1", "2,3")
        assert first["MEMSWEEP_LEASE"] == "gpu:" + first["CUDA_VISIBLE_DEVICES"]
        with placement("gpus", "cuda:0", 1, probe, tmp_path, devices=2) as second:
            assert {first["CUDA_VISIBLE_DEVICES"], second["CUDA_VISIBLE_DEVICES"]} == {"0,1", "2,3"}
            # all four GPUs are held: a third run (of either size) waits for one to end
            got = []
            t = threading.Thread(target=lambda: _take(tmp_path, probe, 1, got), daemon=True)
            t.start()
            t.join(1.0)
            assert got == []
        t.join(10)
        assert len(got) == 1 and set(got[0].split(",")) <= set(second["CUDA_VISIBLE_DEVICES"].split(","))
    with pytest.raises(SpecError, match="devices"):
        with placement("gpus", "cuda:0", 1, {"device_count": 1}, tmp_path, devices=2):
            pass


def _take(lease_dir, probe, devices, got):
    with placement("gpus", "cuda:0", 1, probe, lease_dir, devices=devices) as env:
        got.append(env["CUDA_VISIBLE_DEVICES"])


def test_a_pair_and_a_single_gpu_never_share_a_member(tmp_path):
    with lease("gpu", ["1"], tmp_path):
        with lease("gpu", ["0,1", "2,3"], tmp_path) as pair:
            assert pair == "2,3"  # "0,1" would share GPU 1
            with lease("gpu", ["0", "1", "2", "3"], tmp_path) as single:
                assert single == "0"  # 1 is held alone, 2 and 3 by the pair
    with lease("gpu", ["0,1"], tmp_path) as pair:  # everything released, including the partial tries
        assert pair == "0,1"


# --- counters through the phase protocol -----------------------------------------------------


class FakeDevice:
    """One device's counters (the CudaCounters interface) over a fake allocator: ``alloc``
    bytes live, ``reserved`` = alloc rounded up to 2 MiB, peaks since the last reset."""

    def __init__(self, index, alloc=0, broken=()):
        self.index, self.alloc, self.broken = index, alloc, set(broken)
        self.peak = self.alloc
        self.sources = {"memory_allocated": f"fake: cuda:{index}"}
        self.calls = []

    def allocate(self, n):
        self.alloc += n
        self.peak = max(self.peak, self.alloc)

    def _value(self, name, value):
        if name in self.broken:
            raise RuntimeError(f"{name} unreadable on cuda:{self.index}")
        return value

    def start(self):
        self.calls.append("start")

    def synchronize(self):
        self.calls.append("synchronize")

    def reset_peak_memory_stats(self):
        self.calls.append("reset")
        self.peak = self.alloc

    def memory_allocated(self):
        return self._value("memory_allocated", self.alloc)

    def memory_reserved(self):
        return self._value("memory_reserved", -(-self.alloc // (2 * MiB)) * 2 * MiB)

    def max_memory_allocated(self):
        return self._value("max_memory_allocated", self.peak)

    def max_memory_reserved(self):
        return self._value("max_memory_reserved", -(-self.peak // (2 * MiB)) * 2 * MiB)

    def extra(self):
        return {"num_ooms": 0 if self.index == 0 else 99}


def test_per_device_readings_land_per_device_and_main_counters_are_device_0(tmp_path):
    d0, d1 = FakeDevice(0, alloc=10 * MiB), FakeDevice(1, alloc=1 * MiB, broken={"max_memory_reserved"})
    counters = MultiDeviceCounters([d0, d1])

    def body():  # a data-parallel step: a transient on each device, some of it kept
        d0.allocate(7 * MiB), d1.allocate(5 * MiB)
        d0.allocate(-4 * MiB), d1.allocate(-5 * MiB)

    phase = run_phase(counters, "cold_forward", body, 1, None, tmp_path / "record.json").record
    assert phase["status"] == "ok"
    first, second = phase["devices"]
    assert first == {
        "device_index": 0,
        "memory_allocated_start": 10 * MiB,
        "memory_reserved_start": 10 * MiB,
        "memory_allocated": 13 * MiB,
        "memory_reserved": 14 * MiB,
        "max_memory_allocated": 17 * MiB,
        "max_memory_reserved": 18 * MiB,
        "num_ooms": 0,  # the per-device extras (PER_DEVICE_EXTRAS) from each device's extra()
        "device_free_memory": None,
        "outside_allocator_bytes": None,
    }
    assert second == {
        "device_index": 1,
        "memory_allocated_start": 1 * MiB,
        "memory_reserved_start": 2 * MiB,
        "memory_allocated": 1 * MiB,
        "memory_reserved": 2 * MiB,
        "max_memory_allocated": 6 * MiB,
        "max_memory_reserved": None,
        "num_ooms": 99,
        "device_free_memory": None,
        "outside_allocator_bytes": None,
    }  # unreadable: null, not 0
    for name in DEVICE_COUNTERS:  # the run's main counters are cuda:0's
        assert phase[name] == first[name] and isinstance(phase[name], int)
    assert phase["num_ooms"] == 0  # extra() of cuda:0 too
    for d in (d0, d1):  # every device synchronized and its peak reset, in the protocol's order
        assert d.calls[:2] == ["synchronize", "reset"] and d.calls.count("reset") == 1


def test_a_failing_phase_still_records_every_device(tmp_path):
    d0, d1 = FakeDevice(0), FakeDevice(1, broken={"memory_allocated"})

    def body():
        d1.allocate(3 * MiB)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1)")

    phase = run_phase(MultiDeviceCounters([d0, d1]), "cold_forward", body, 1, None, tmp_path / "r.json").record
    assert phase["status"] == "oom"
    assert [d["device_index"] for d in phase["devices"]] == [0, 1]
    assert phase["devices"][1]["max_memory_allocated"] == 3 * MiB
    assert phase["devices"][1]["memory_allocated"] is None and phase["devices"][1]["memory_allocated_start"] is None


def test_single_device_counters_record_devices_null(tmp_path):
    phase = run_phase(FakeDevice(0), "inputs", lambda: None, 1, None, tmp_path / "r.json").record
    assert "devices" in phase and phase["devices"] is None


class FakeAllocatorApi:
    """Stands in for torch.accelerator / torch.cuda under CudaCounters: per-index values, calls logged."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def call(index):
            self.calls.append((name, index))
            return {
                "memory_allocated": 1000,
                "memory_reserved": 2000,
                "max_memory_allocated": 3000,
                "max_memory_reserved": 4000,
            }.get(name, 0) * (index + 1)

        return call


def test_the_real_cuda_counters_read_each_device_by_its_index(tmp_path):
    counters = make_counters(torch.device("cuda", 0), 3)  # constructs only: no CUDA call here
    assert isinstance(counters, MultiDeviceCounters) and counters.index == 0
    assert [d.index for d in counters.per_device()] == [0, 1, 2]
    assert all(isinstance(d, CudaCounters) for d in counters.per_device())
    api = FakeAllocatorApi()
    for d in counters.per_device():
        d._api = api
    phase = run_phase(counters, "inputs", lambda: None, 1, None, tmp_path / "r.json").record
    assert [(d["device_index"], d["max_memory_allocated"], d["max_memory_reserved"]) for d in phase["devices"]] == [
        (0, 3000, 4000),
        (1, 6000, 8000),
        (2, 9000, 12000),
    ]
    assert (phase["memory_allocated"], phase["max_memory_reserved"]) == (1000, 4000)
    assert {i for name, i in api.calls if name == "reset_peak_memory_stats"} == {0, 1, 2}
    assert {i for name, i in api.calls if name == "synchronize"} == {0, 1, 2}
    assert counters.sources["memory_allocated"].endswith("memory_allocated") and "devices" in counters.sources
    with pytest.raises(ValueError, match="CUDA"):
        make_counters(torch.device("cpu"), 2)


def test_capacity_is_applied_to_each_device(monkeypatch):
    """Each device's allocator gets the capacity minus its own footprint outside the allocator
    (total - free - reserved: 1 GiB on cuda:0, 3 GiB on cuda:1, flagged as not free)."""
    set_calls = []
    totals = {0: 80 * 2**30, 1: 40 * 2**30}
    outside = {0: 2**30, 1: 3 * 2**30}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (totals[i] - outside[i], totals[i]))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, i: set_calls.append((i, f)))
    counters = make_counters(torch.device("cuda", 0), 2)
    for d in counters.per_device():
        d._api = FakeAllocatorApi()
        d.memory_reserved = lambda: 0
    capacity = cuda_capacity(counters, 8 * 2**30)
    assert [i for i, _ in set_calls] == [0, 1]
    assert [allocator_limit(f, totals[i]) for i, f in set_calls] == [7 * 2**30, 5 * 2**30]
    assert capacity["memory_fractions"] == [f for _, f in set_calls] and capacity["memory_fraction_nominal"] == 0.1
    assert capacity["outside_allocator_start_bytes"] == 3 * 2**30  # the largest over the devices
    assert capacity["device_not_free"].startswith("cuda:1: 3221225472 B in use outside")  # above 2 GiB: flagged
    assert capacity["allocator_limit_bytes"] == 7 * 2**30
    with pytest.raises(ValueError, match="exceeds"):
        cuda_capacity(counters, 50 * 2**30)  # more than cuda:1 has


# --- analysis --------------------------------------------------------------------------------


def _run(phases):
    spec = {**BASE, "dtype": "float32", "mode": "inference", "device": "cuda:0", "devices": 2}
    return Run(Path("/s/0"), spec, record={"schema_version": 1, "source": "measured", "phases": phases})


def test_phases_table_has_the_nested_devices_column():
    assert PHASES_SCHEMA.field("devices").type == DEVICE_TYPE
    entry = {"device_index": 1, **{name: i * MiB for i, name in enumerate(DEVICE_COUNTERS)}}
    with_devices = {
        "name": "cold_forward",
        "status": "ok",
        "max_memory_allocated": 5,
        "devices": [{**entry, "device_index": 0}, {**entry, "max_memory_reserved": None}],
    }
    without = {"name": "inputs", "status": "ok", "max_memory_allocated": 3}  # a record from before: no key
    single = {"name": "warmup", "status": "ok", "devices": None}
    table = coerce_table(phase_rows(_run([with_devices, without, single]), "0", Path("/s")), PHASES_SCHEMA)
    assert table.schema.equals(PHASES_SCHEMA)
    devices = table.column("devices").to_pylist()
    assert devices[1] is None and devices[2] is None
    assert [d["device_index"] for d in devices[0]] == [0, 1]
    assert devices[0][1]["max_memory_reserved"] is None and devices[0][1]["memory_reserved_start"] == MiB
    assert devices[0][0] == {**entry, "device_index": 0, **dict.fromkeys(PER_DEVICE_EXTRAS)}


def test_a_corrupt_devices_entry_is_null_not_zero():
    bad = {
        "name": "inputs",
        "devices": [{"device_index": 0, "memory_allocated": "12", "max_memory_allocated": True}, "garbage"],
    }
    (row,) = phase_rows(_run([bad]), "0", Path("/s"))
    assert row["devices"] == [{"device_index": 0, **dict.fromkeys(DEVICE_COUNTERS + PER_DEVICE_EXTRAS)}]
    assert coerce_table([{**row, "devices": "x"}], PHASES_SCHEMA).column("devices").to_pylist() == [None]


def test_a_user_workload_is_told_how_many_devices_it_has():
    from memsweep.worker.workloads import build_workload

    user = {"name": "user", "model": {"_target_": "mymodels.build"}, "inputs": {"_target_": "mymodels.inputs"}}
    spec = RunSpec.from_dict({**BASE, "device": "cuda:0", "devices": 2, "workload": user})
    load = build_workload(spec, torch.device("cuda", 0)).load(2, None)  # builds the Load only: no CUDA call
    assert (load.devices, load.device) == (2, torch.device("cuda", 0))
    assert not torch.cuda.is_initialized()


def test_runs_on_one_and_on_two_devices_are_separate_frontiers():
    from memsweep.analysis.frontier import frontier_table
    from memsweep.analysis.tables import RUNS_SCHEMA, run_row

    runs = []
    for i, (batch, devices, outcome) in enumerate([(4, 1, "ok"), (8, 1, "oom"), (4, 2, "ok"), (8, 2, "ok")]):
        spec = {
            **BASE,
            "batch": batch,
            "dtype": "float32",
            "mode": "inference",
            "device": "cuda:0",
            "workload": {"name": "mlp"},
            "warmup": 1,
            "repeats": 1,
            "seed": 0,
        }
        if devices > 1:  # the one-device specs predate the field: no key at all
            spec["devices"] = devices
        record = {"schema_version": 1, "complete": True, "outcome": outcome, "phases": []}
        runs.append(run_row(Run(Path(f"/s/{i}"), spec, record=record), Path("/s")))
    assert [r["devices"] for r in runs] == [1, 1, 2, 2]
    rows = [r for r in frontier_table(coerce_table(runs, RUNS_SCHEMA)).to_pylist() if r["axis"] == "batch"]
    assert sorted((r["devices"], r["max_ok"], r["min_oom"]) for r in rows) == [(1, 4, 8), (2, 8, None)]
