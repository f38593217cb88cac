"""Errors that depend on the value's shape, not on memory: the frontier search steps past them,
names them, and finds the edge above; a few errors in a row still stop it, saying so.

The real case: a user's classifier with BatchNorm1d (tests/data/batchnorm_model.py) in train mode
refuses a batch of one ("Expected more than 1 value per channel when training"); every batch from 2
up runs. Searched by the real frontier sweeper on the CPU at an emulated capacity (the tracker caps
the tensor bytes, ``capacity_mode=allocator``: the same edge on every machine).
"""

import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from memsweep.conf.contract import read_json
from memsweep.sweeper.search import ERRORS_IN_A_ROW, FrontierSearch, Lattice, run_search
from tests.data.loads import MEMSWEEP, search_events

DATA = Path(__file__).parent / "data"
USER_BN = [
    "workload=user",
    "workload.model={_target_:batchnorm_model.build}",
    "workload.inputs={_target_:batchnorm_model.inputs}",
    "workload.loss={_target_:batchnorm_model.loss}",
    f"workload.path=[{DATA}]",
    "mode=train",
    "width=64",
    "device=cpu",
    "capacity=2MiB",
    "warmup=1",
    "repeats=1",
    "threads=1",
]
"""The user's BatchNorm1d classifier in train mode on the CPU at 2 MiB."""


@pytest.fixture(scope="module")
def bn_sweep(tmp_path_factory):
    sweep_dir = tmp_path_factory.mktemp("bn") / "sweep"
    args = ["hydra.sweeper.lower=1", "hydra.sweeper.upper=1024", "hydra.sweeper.confirm=0"]
    proc = subprocess.run(
        [MEMSWEEP, "sweep", "hydra/sweeper=frontier", *USER_BN, *args, f"hydra.sweep.dir={sweep_dir}"],
        cwd=sweep_dir.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep_dir, proc


def test_batchnorm_at_batch_1_is_stepped_past_and_the_edge_found_above(bn_sweep):
    sweep_dir, proc = bn_sweep
    (result,) = search_events(sweep_dir, "result")
    assert result["stopped_by"] is None and result["error_values"] == [1]
    assert result["exact"] and result["min_oom"] == result["max_ok"] + 1 and result["max_ok"] > 2
    probes = {p["value"]: p for p in search_events(sweep_dir, "probe")}
    assert probes[1]["outcome"] == "error" and "Expected more than 1 value per channel" in probes[1]["message"]
    assert probes[2]["outcome"] == "ok"  # the next value past the error
    # the edge's two sides are real runs, read back from the run directories
    outcome = {}
    for spec_path in sweep_dir.glob("*/spec.json"):
        outcome[read_json(spec_path, "spec")["batch"]] = read_json(spec_path.parent / "result.json", "result")[
            "outcome"
        ]
    assert outcome[1] == "error" and outcome[result["max_ok"]] == "ok" and outcome[result["min_oom"]] == "oom"
    assert "stepped past errors" in result["status"] and "batch=1" in result["status"]


def test_the_error_is_named_in_the_frontier_and_the_report_and_never_counted(bn_sweep):
    sweep_dir, proc = bn_sweep
    (row,) = [r for r in pq.read_table(sweep_dir / "frontier.parquet").to_pylist() if r["axis"] == "batch"]
    assert row["error_values"] == "1" and row["stopped_by"] is None and row["n_other"] == 1
    assert row["exact"] and row["max_ok"] > 1 and row["min_oom"] > 1  # the error is neither side
    assert row["n_ok"] + row["n_oom"] + row["n_other"] == row["n_runs"]
    report = (sweep_dir / "report.md").read_text()
    assert "batch=1 raised an error that is not memory" in report
    assert "stepped past errors" in proc.stdout


def oracle(errors, limit=300):
    """Errors at ``errors`` (a set or a predicate), else ok up to ``limit`` (peak = value bytes), oom above."""

    def answer(x):
        if (x in errors) if isinstance(errors, (set, frozenset)) else errors(x):
            return "error", None, 1000
        return ("ok", x, 1000) if x <= limit else ("oom", None, 1000)

    return answer


@pytest.mark.parametrize("strategy", ["model", "bisect"])
@pytest.mark.parametrize("errors", [{1}, {1, 2}, {7, 8}, {150, 151}, {301}, {300}, {1024}])
def test_errors_of_shape_are_stepped_past_and_never_read_as_ok_or_oom(strategy, errors):
    s = FrontierSearch("batch", Lattice.make(1, 1024), strategy, errors_in_a_row=ERRORS_IN_A_ROW)
    r = run_search(s, oracle(errors))
    ok, oom = {p.value for p in s.probes if p.outcome == "ok"}, {p.value for p in s.probes if p.outcome == "oom"}
    assert r.stopped_by is None and set(r.error_values) <= errors and not (ok | oom) & errors
    assert r.max_ok in ok and r.min_oom in oom and r.max_ok <= 300 < r.min_oom
    if 300 in errors:  # the edge's own value errors: the values around it, the error between them
        assert (r.max_ok, r.min_oom, r.exact) == (299, 301, False)
        assert r.status.startswith("edge: batch=299 fits, 301 does not; every value between raised an error")
    elif 301 in errors:
        assert (r.max_ok, r.min_oom, r.exact) == (300, 302, False)
    else:
        assert (r.max_ok, r.min_oom, r.exact) == (300, 301, True) and r.status.startswith("exact edge")
    if r.error_values:
        assert "stepped past errors" in r.status


def test_errors_in_a_row_stop_the_search_naming_them():
    s = FrontierSearch("batch", Lattice.make(1, 1024), "model", errors_in_a_row=ERRORS_IN_A_ROW)
    r = run_search(s, oracle(lambda x: True))
    assert r.runs_used == ERRORS_IN_A_ROW and r.stopped_by == "error" and r.stop_value == 1
    assert r.error_values == [1, 2, 3] and r.max_ok is None and r.min_oom is None and not r.exact
    assert r.status == "stopped by error at batch=1: 3 values in a row raised errors (1, 2, 3)"
    assert s.propose() == []


def test_errors_above_a_success_stop_after_the_bound():
    # ok below 8, an error at every value from 8 on: never an OOM, never a success
    s = FrontierSearch("batch", Lattice.make(1, 4096), "model", errors_in_a_row=ERRORS_IN_A_ROW)
    r = run_search(s, oracle(lambda x: x >= 8))
    assert r.stopped_by == "error" and r.stop_value >= 8 and r.max_ok < 8 and r.min_oom is None
    assert [p.outcome for p in s.probes[-ERRORS_IN_A_ROW:]] == ["error"] * ERRORS_IN_A_ROW


def test_without_the_bound_the_first_error_stops_the_search():
    s = FrontierSearch("batch", Lattice.make(1, 1024), "model")
    r = run_search(s, oracle({1}))
    assert r.runs_used == 1 and r.stopped_by == "error" and r.status == "stopped by error at batch=1"


def test_only_errors_below_the_smallest_oom_means_the_lower_bound_does_not_fit():
    s = FrontierSearch("batch", Lattice.make(1, 1024), "bisect", errors_in_a_row=ERRORS_IN_A_ROW)
    r = run_search(s, oracle({1}, limit=0))
    assert r.max_ok is None and r.min_oom == 2 and r.stopped_by is None
    assert r.status.startswith("lower bound does not fit: batch=2 is out of memory and every value below it raised")
