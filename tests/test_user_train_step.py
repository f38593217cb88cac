"""The user's own training step (``workload.train_step``, issue 19): gradient clipping and two
optimizers in the user's function, run by real worker processes on the CPU under a small
emulated capacity. The step is one sub-phase ``user_step`` (forward, loss, backward and
optimizer_step are not recorded), the record says the step was the user's, an OOM inside it is
an ``oom`` of that sub-phase, a dry run predicts it, and a bad train_step is refused before any
worker starts, naming the field.
"""

import json
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from memsweep.conf.contract import (
    COUNTERS,
    STEP_SUB_PHASES,
    USER_STEP_SUB_PHASES,
    USER_TRAIN_PHASES,
    RunSpec,
    SpecError,
    sub_phase_names,
)
from memsweep.sweeper.process import execute
from tests.data.loads import MEMSWEEP

MODULE = "memsweep_user_step_example"
SOURCE = '''
import torch
import torch.nn.functional as F
from torch import nn

HIDDEN, CLASSES = 16, 4


def build(load):
    return nn.Sequential(nn.Linear(load.width, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def inputs(load):
    x = torch.randn(load.batch, load.width, dtype=load.dtype, device=load.device, generator=load.generator)
    y = torch.randint(0, CLASSES, (load.batch,), device=load.device, generator=load.generator)
    return x, y


def two_optimizers(params):
    """SGD with momentum on the first Linear, AdamW on the second."""
    params = list(params)
    return [torch.optim.SGD(params[:2], lr=0.1, momentum=0.9), torch.optim.AdamW(params[2:])]


def train_step(model, batch, optimizer, max_norm=0.5):
    x, y = batch
    for opt in optimizer:
        opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    for opt in optimizer:
        opt.step()
    return loss


def greedy_step(model, batch, optimizer, scratch_bytes):
    train_step(model, batch, optimizer)
    return torch.empty(scratch_bytes, dtype=torch.uint8)


def two_arguments(model, batch):
    pass


not_a_function = 3
'''
WIDTH, HIDDEN, CLASSES = 8, 16, 4  # the module's shapes (width is the load's)
CAPACITY = 2**20  # 1 MiB: the tiny model's step needs a few KiB


def _workload(root, step="train_step", **step_kwargs):
    return {
        "name": "user",
        "model": {"_target_": f"{MODULE}.build"},
        "inputs": {"_target_": f"{MODULE}.inputs"},
        "optimizer": {"_target_": f"{MODULE}.two_optimizers"},
        "train_step": {"_target_": f"{MODULE}.{step}", **step_kwargs},
        "path": [str(root)],
    }


def _spec(root, **fields):
    base = dict(batch=2, context=1, width=WIDTH, device="cpu", mode="train", warmup=1, repeats=2, threads=1)
    base.update(timeout_s=120, capacity_bytes=CAPACITY, workload=_workload(root))
    return RunSpec.from_dict({**base, **fields})


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("user_step")
    (root / f"{MODULE}.py").write_text(textwrap.dedent(SOURCE))
    return root


@pytest.fixture(scope="module")
def runs(root):
    specs = {
        "ok": _spec(root),
        # the user's step allocates twice the capacity after its optimizer steps
        "oom": _spec(root, workload=_workload(root, "greedy_step", scratch_bytes=2 * CAPACITY)),
        "dry": _spec(root, dry_run=True, capacity_bytes=None),
    }
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(execute, spec, root / "sweep" / name) for name, spec in specs.items()}
        return {
            name: (f.result(), json.loads((root / "sweep" / name / "record.json").read_text()))
            for name, f in futures.items()
        }


def test_the_users_step_runs_as_one_sub_phase_and_the_record_says_so(runs):
    result, record = runs["ok"]
    assert result["outcome"] == "ok", result
    assert record["train_step"] == "user"
    names = [p["name"] for p in record["phases"]]
    cold, warmup, warm = (
        sub_phase_names("cold_step", USER_STEP_SUB_PHASES)
        + ("warmup",)
        + sub_phase_names("warm_step", USER_STEP_SUB_PHASES)
    )
    assert names == ["model_load", "inputs", cold, warmup, warm, warm]  # repeats=2
    assert set(names) == set(USER_TRAIN_PHASES)
    # what memsweep cannot see inside the user's function is not recorded: no row, not a zero
    hidden = set(sub_phase_names("cold_step", STEP_SUB_PHASES) + sub_phase_names("warm_step", STEP_SUB_PHASES))
    assert not hidden & set(names)
    for phase in record["phases"]:
        assert phase["status"] == "ok"
        assert all(isinstance(phase[c], int) for c in COUNTERS), phase
    steps = [p for p in record["phases"] if p["sub_phase"] == "user_step"]
    assert [(p["parent"], p["step"]) for p in steps] == [("cold_step", 0), ("warm_step", 0), ("warm_step", 1)]
    # sizes by construction after the user's step: a gradient per parameter (float32), SGD's
    # momentum buffer for the first Linear, AdamW's exp_avg and exp_avg_sq for the second plus
    # one float32 `step` scalar per parameter (torch.optim.AdamW's state)
    first, second = 4 * (WIDTH * HIDDEN + HIDDEN), 4 * (HIDDEN * CLASSES + CLASSES)
    assert record["model"]["parameter_bytes"] == first + second
    for p in steps:
        assert p["gradient_bytes"] == first + second
        assert p["optimizer_state_bytes"] == first + 2 * second + 2 * 4
        assert p["max_memory_allocated"] >= 2 * (first + second) + p["optimizer_state_bytes"]
    assert record["model"]["optimizer"] == f"{MODULE}.two_optimizers -> list[SGD, AdamW]"


def test_the_users_step_reaches_the_runs_table(runs, root):
    from memsweep.analysis.tables import build_tables

    runs_table, phases_table, _ = build_tables([root / "sweep"])
    by_dir = {row["run_dir"].rsplit("/", 1)[-1]: row for row in runs_table.to_pylist()}
    assert by_dir["ok"]["train_step"] == "user" and by_dir["ok"]["outcome"] == "ok"
    ok_phases = [r for r in phases_table.to_pylist() if r["run_id"] == by_dir["ok"]["run_id"]]
    assert {r["sub_phase"] for r in ok_phases if r["parent"]} == set(USER_STEP_SUB_PHASES)


def test_an_oom_inside_the_users_step_is_an_oom_of_that_sub_phase(runs):
    result, record = runs["oom"]
    assert result["outcome"] == "oom", result
    assert record["outcome"] == "oom" and record["train_step"] == "user"
    assert result["failed_phase"] == record["failed_phase"] == "cold_step.user_step"
    failed = record["phases"][-1]
    assert (failed["name"], failed["status"], failed["failure_class"]) == ("cold_step.user_step", "oom", "oom")
    assert failed["oom_request_bytes"] == 2 * CAPACITY  # what the CPU capacity's tracker refused


def test_a_dry_run_predicts_the_users_step(runs):
    (result, dry), (_, measured) = runs["dry"], runs["ok"]
    assert result["outcome"] == "ok", result
    assert dry["source"] == "predicted" and dry["train_step"] == "user"
    assert [p["name"] for p in dry["phases"]] == [p["name"] for p in measured["phases"]]
    # fake tensors: the same storage bytes as the CPU's live-tensor count of the measured run
    for predicted, seen in zip(dry["phases"], measured["phases"]):
        assert predicted["max_memory_allocated"] == seen["max_memory_allocated"], predicted["name"]


@pytest.mark.parametrize(
    "step, kwargs, field, words",
    [
        ("two_arguments", {}, "workload.train_step", "train_step(model, batch, optimizer)"),
        ("train_step", {"clip": 1.0}, "workload.train_step", "train_step(model, batch, optimizer, clip=...)"),
        ("not_a_function", {}, "workload.train_step._target_", "no callable 'not_a_function'"),
        ("no_such_name", {}, "workload.train_step._target_", "no callable 'no_such_name'"),
    ],
)
def test_a_bad_train_step_is_found_by_the_workers_check(root, monkeypatch, step, kwargs, field, words):
    from memsweep.worker.workloads.user import check_user_targets

    monkeypatch.setattr(sys, "path", list(sys.path))  # check_user_targets puts workload.path first
    answer = check_user_targets(_workload(root, step, **kwargs))
    assert answer["field"] == field and words in answer["accepted"], answer
    assert check_user_targets(_workload(root)) == {"ok": True}


def test_a_bad_train_step_is_refused_before_any_worker_starts(root):
    import subprocess

    results = root / "refused"
    args = [
        "run",
        "workload=user_convnet",
        "mode=train",
        f"workload.model._target_={MODULE}.build",
        f"workload.inputs._target_={MODULE}.inputs",
        "~workload.model.blocks",
        "~workload.model.classes",
        "~workload.inputs.classes",
        "workload.loss=null",
        f"+workload.train_step._target_={MODULE}.two_arguments",
        f"width={WIDTH}",
        f"results_dir={results}",
    ]
    proc = subprocess.run([MEMSWEEP, *args], capture_output=True, text=True, cwd=root, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"invalid workload.train_step='{MODULE}.two_arguments'" in proc.stderr
    assert "train_step(model, batch, optimizer)" in proc.stderr
    assert not list(results.rglob("record.json"))  # no worker ran


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"mode": "inference"}, "workload.train_step"),
        ({"micro_steps": 2}, "micro_steps"),
        ({"precision": "autocast", "dtype": "bfloat16"}, "precision"),
    ],
)
def test_options_memsweep_cannot_apply_to_the_users_step_are_refused(root, fields, field):
    workload = {k: v for k, v in _workload(root).items() if k != "optimizer"}  # the step alone
    with pytest.raises(SpecError) as err:
        _spec(root, workload=workload, **fields)
    assert err.value.field == field


def test_the_planned_phases_follow_who_runs_the_step(root):
    assert _spec(root).phases == USER_TRAIN_PHASES
    assert _spec(root).train_step == "user"
    plain = {k: v for k, v in _workload(root).items() if k != "train_step"}
    assert _spec(root, workload=plain).train_step == "memsweep"
    del plain["optimizer"]  # train mode only
    assert _spec(root, workload=plain, mode="inference").train_step is None


@pytest.mark.parametrize("held", [None, [], {}])
def test_no_torch_optimizer_means_no_optimizer_state_bytes_not_zero(held):
    """A user's optimizer factory that returned None (or an empty collection) leaves no torch
    optimizer to read: the step's optimizer_state_bytes is null, never 0; a torch optimizer
    without state yet reads 0 bytes."""
    import torch

    from memsweep.worker.workloads.base import Workload

    class Held:  # the three methods read only what the workload holds
        optimizer_items = Workload.optimizer_items
        optimizers = Workload.optimizers
        optimizer_state_bytes = Workload.optimizer_state_bytes
        _state_tensors = Workload._state_tensors
        device = torch.device("cpu")

    w = Held()
    w.optimizer = held
    assert w.optimizer_state_bytes() == {"optimizer_state_bytes": None}
    w.optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(4))], lr=0.1)
    assert w.optimizer_state_bytes() == {"optimizer_state_bytes": 0}
