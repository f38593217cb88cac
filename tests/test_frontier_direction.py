"""The frontier of an axis whose load per rank shrinks as it grows (issue #17: world_size under
FSDP), on made-up runs: the edge's direction, its columns and the words that show it."""

import pytest

from memsweep.analysis.frontier import FRONTIER_SCHEMA, frontier_table
from memsweep.analysis.outputs import format_frontier
from memsweep.analysis.tables import RUNS_SCHEMA, coerce_table
from memsweep.conf.contract import AXES, AXIS_DIRECTIONS, DIRECTIONS, PARALLELS, SpecError, axis_direction
from memsweep.sweeper.search.lattice import check_search_axis

BASE = dict(
    sweep_dir="s",
    workload="mlp",
    mode="train",
    device="cpu",
    capacity_bytes=128 << 20,
    batch=2,
    context=8,
    width=64,
    dtype="float32",
    source="measured",
)


def world_size_rows(parallel: str, outcomes: dict[int, str]) -> list[dict]:
    """The world_size frontier rows of runs at those world sizes (peak = 100 B per rank-share)."""
    runs = [
        dict(
            BASE,
            run_id=f"r{n}",
            parallel=parallel,
            world_size=n,
            outcome=outcome,
            failed_phase="cold_step.backward" if outcome == "oom" else None,
            max_memory_allocated=800 // n if outcome == "ok" else None,
        )
        for n, outcome in outcomes.items()
    ]
    rows = frontier_table(coerce_table(runs, RUNS_SCHEMA)).to_pylist()
    return [r for r in rows if r["axis"] == "world_size"]


def test_every_axis_has_a_direction_under_every_parallel():
    assert set(AXIS_DIRECTIONS) == set(AXES)
    for axis in AXES:
        assert set(AXIS_DIRECTIONS[axis]) == set(PARALLELS)
        assert {axis_direction(axis, p) for p in PARALLELS} <= set(DIRECTIONS)
    assert axis_direction("world_size", "fsdp") == "decreasing"
    assert axis_direction("world_size", "ddp") == "constant"
    assert axis_direction("batch", None) == axis_direction("batch", "fsdp") == "increasing"


def test_fsdp_world_size_fits_from_min_ok_and_runs_out_at_max_oom():
    (row,) = world_size_rows("fsdp", {1: "oom", 2: "oom", 4: "ok", 8: "ok"})
    assert row["direction"] == "decreasing"
    assert (row["min_ok"], row["max_oom"], row["exact"], row["monotonic"]) == (4, 2, True, True)
    assert row["max_ok"] is None and row["min_oom"] is None  # never the backwards reading
    assert row["max_ok_label"] is None and row["min_oom_label"] is None
    assert row["min_ok_max_memory_allocated"] == 800 // 4  # the peak of the run at min_ok
    assert row["max_ok_max_memory_allocated"] is None


def test_fsdp_world_size_not_neighbours_all_ok_and_non_monotonic():
    (gap,) = world_size_rows("fsdp", {1: "oom", 2: "ok", 4: "ok"})
    assert (gap["min_ok"], gap["max_oom"], gap["exact"]) == (2, 1, True)
    (apart,) = world_size_rows("fsdp", {1: "oom", 2: "error", 4: "ok"})
    assert (apart["min_ok"], apart["max_oom"], apart["exact"]) == (4, 1, False)  # an error is neither side
    (fits,) = world_size_rows("fsdp", {1: "ok", 2: "ok"})
    assert (fits["min_ok"], fits["max_oom"], fits["exact"]) == (1, None, False)
    (odd,) = world_size_rows("fsdp", {1: "ok", 2: "oom", 4: "ok"})  # an OOM above a success: flagged
    assert (odd["min_ok"], odd["max_oom"], odd["monotonic"], odd["exact"]) == (1, 2, False, False)


def test_ddp_world_size_keeps_max_ok_min_oom_and_says_constant():
    (row,) = world_size_rows("ddp", {1: "ok", 2: "ok", 4: "oom"})
    assert row["direction"] == "constant"
    assert (row["max_ok"], row["min_oom"], row["exact"]) == (2, 4, True)
    assert row["min_ok"] is None and row["max_oom"] is None


def test_other_axes_read_increasing():
    runs = [
        dict(BASE, run_id=f"b{b}", batch=b, parallel="fsdp", world_size=2, outcome=o)
        for b, o in ((2, "ok"), (4, "oom"))
    ]
    rows = [r for r in frontier_table(coerce_table(runs, RUNS_SCHEMA)).to_pylist() if r["axis"] == "batch"]
    assert [(r["direction"], r["max_ok"], r["min_oom"], r["min_ok"]) for r in rows] == [("increasing", 2, 4, None)]


def test_searching_world_size_is_refused_saying_why():
    with pytest.raises(SpecError) as err:
        check_search_axis("world_size", "hydra.sweeper.axes")
    assert err.value.field == "hydra.sweeper.axes" and "world_size=1,2,4" in str(err.value)
    assert check_search_axis("batch", "axis") == "batch"


def test_the_frontier_text_says_the_decreasing_edge():
    rows = world_size_rows("fsdp", {1: "oom", 2: "ok"})
    text = format_frontier(coerce_table(rows, FRONTIER_SCHEMA))
    assert "world_size decreasing under parallel=fsdp" in text
    assert "fits from world_size=2 (min_ok); 1 runs out of memory (max_oom)" in text


def test_the_frontier_of_a_small_sweep_raises_no_pandas_warning():
    """frontier_table reads every run's outcome beside the runs table's columns (more than 100 of
    them) without inserting a column into it: no PerformanceWarning ("DataFrame is highly
    fragmented") on every analyse and sweep."""
    import warnings

    import pandas as pd

    runs = [
        dict(BASE, run_id=f"r{b}", batch=b, outcome=o, failed_phase=None if o == "ok" else "cold_step.forward")
        for b, o in ((1, "ok"), (2, "ok"), (4, "oom"))
    ]
    assert len(RUNS_SCHEMA) > 100
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.PerformanceWarning)
        rows = frontier_table(coerce_table(runs, RUNS_SCHEMA)).to_pylist()
    (row,) = [r for r in rows if r["axis"] == "batch"]
    assert (row["max_ok"], row["min_oom"], row["exact"]) == (2, 4, True)


def test_a_ddp_and_an_fsdp_load_of_the_same_sizes_never_read_alike():
    """The one load label (estimator.labels): a non-default parallel is named, with world_size, and
    a training run's precision recipe in Lightning's words, in the frontier's fixed load column, the
    per-run console line (with the rank whose failure ended the run) and the report's summary card;
    a one-process run shows no world_size=1."""
    from pathlib import Path

    from memsweep.analysis.report import build_report, parse_margin
    from memsweep.analysis.tables import PHASES_SCHEMA
    from memsweep.conf.contract import RunSpec
    from memsweep.estimator.labels import load_words
    from memsweep.sweeper.job import outcome_line

    runs = [
        dict(BASE, sweep_dir=p, run_id=f"b{b}", run_dir=f"{p}/{b}", batch=b, parallel=p, world_size=2, outcome="ok")
        | dict(precision="autocast" if p == "fsdp" else "pure", max_memory_allocated=100 * b)
        | dict(dtype="bfloat16" if p == "fsdp" else "float32")
        for p in ("ddp", "fsdp")
        for b in (2, 4)
    ]
    text = format_frontier(frontier_table(coerce_table(runs, RUNS_SCHEMA)))
    lines = [line for line in text.splitlines() if line.startswith("batch")]
    assert [line.split("      ")[0] for line in lines] == [
        "batch    mlp train cpu context=8 width=64 dtype=float32 precision=32-true parallel=ddp world_size=2",
        "batch    mlp train cpu context=8 width=64 dtype=bfloat16 precision=bf16-mixed parallel=fsdp world_size=2",
    ]
    assert load_words(dict(BASE, mode="inference", parallel="none", world_size=1, precision="pure")) == [
        "batch=2",
        "context=8",
        "width=64",
        "dtype=float32",
    ]
    spec = RunSpec.from_dict(
        dict(mode="train", parallel="fsdp", world_size=2, batch=2, context=8, width=64, device="cpu")
    )
    line = outcome_line(spec, Path("r/0"), {"outcome": "oom", "failed_phase": "cold_step"}, {"failed_rank": 1})
    head = "r/0: batch=2 context=8 width=64 dtype=float32 precision=32-true parallel=fsdp world_size=2"
    head += " mode=train device=cpu"
    assert line == f"{head} -> oom in cold_step on rank 1"
    fsdp = coerce_table([r for r in runs if r["parallel"] == "fsdp"], RUNS_SCHEMA)
    report = build_report(
        fsdp, coerce_table([], PHASES_SCHEMA), frontier_table(fsdp), parse_margin(None), render_plots=False
    )
    (load_row,) = [b for b in report.doc.blocks if b[0] == "table" and "load (observed)" in str(b)]
    assert "precision `bf16-mixed`, parallel `fsdp`" in str(load_row)


def test_the_console_frontier_names_the_margin_edge_and_the_fastest_value_where_known():
    from memsweep.analysis.outputs import _answer_notes

    row = {"axis": "batch", "device": "cpu", "margin_edge": 96, "fastest_label": "64", "fastest_samples_per_s": 812.0}
    edge, fast = _answer_notes(row)
    assert edge.startswith("margin edge: batch=96")
    assert fast.startswith("fastest inside the margin: batch=64, 812 samples/s (measured, timed on CPU; another")
    (_, noisy) = _answer_notes({**row, "fastest_noise_rel": 0.068})
    assert "timed on CPU; noise 6.8 % within its run;" in noisy
    row.update(margin_edge=None, device="cuda:0")
    (fast,) = _answer_notes(row)
    assert fast.startswith("fastest among the ok runs: batch=64") and "timed on cuda" in fast
    assert _answer_notes({"axis": "batch", "margin_edge": None, "fastest_label": None}) == []


class _Reads(dict):
    """A run row that notes every key read from it (``get``, ``[]``, ``in``)."""

    read: set[str] = set()

    def get(self, key, default=None):
        _Reads.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        _Reads.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        _Reads.read.add(key)
        return super().__contains__(key)


def _varied_rows() -> list[dict]:
    """Runs of two loads, with every outcome the frontier tells apart and measured rates."""
    from tests.test_report_unit import make

    runs, _ = make("/s", [(v, "ok" if v <= 8 else "oom", v << 24, v << 23) for v in (1, 2, 4, 8, 16, 32)])
    more, _ = make("/s", [(v, "ok" if v <= 4 else "oom", v << 24, v << 23) for v in (1, 2, 4, 8)], axis="context")
    runs += [dict(r, run_id=f"c{r['run_id']}", run_dir=f"/s/c{r['run_id']}") for r in more]
    runs[1].update(outcome="error", failed_phase="warm_forward", failure_class="memory_suspect")
    runs[2].update(outcome="crash", failed_phase=None)
    runs[5].update(failed_phase="optimizer_step")  # an OOM in a phase the axis does not size
    for r in runs:
        ok = r["outcome"] == "ok"
        r.update(samples_per_s=100.0 * r["batch"] if ok else None, throughput_noise_rel=0.02 if ok else None)
    return runs


def test_the_frontier_reads_only_the_runs_columns_it_is_handed():
    """frontier_table hands frontier_rows only FRONTIER_INPUTS (to convert fewer columns): every
    runs-table column the frontier reads must be one of them, and the frontier be the same as from
    every column."""
    from memsweep.analysis.frontier import FRONTIER_INPUTS, frontier_rows

    table = coerce_table(_varied_rows(), RUNS_SCHEMA)
    _Reads.read = set()
    whole = frontier_rows([_Reads(r) for r in table.to_pylist()])
    assert len(whole) >= 2, whole  # both loads gave a row
    unlisted = (_Reads.read & set(RUNS_SCHEMA.names)) - set(FRONTIER_INPUTS)
    assert not unlisted, f"read by the frontier but not handed to it: {sorted(unlisted)}"
    assert frontier_table(table).to_pylist() == coerce_table(whole, FRONTIER_SCHEMA).to_pylist()
