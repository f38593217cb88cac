"""What the analysis presents as observed: damaged run directories, dry runs (predictions),
summaries of several loads in one directory. Run directories are written by hand (no worker)."""

import json
from pathlib import Path

from memsweep.analysis.cli import analyze
from memsweep.analysis.frontier import frontier_table
from memsweep.analysis.outputs import format_frontier
from memsweep.analysis.report import build_report, parse_margin
from memsweep.analysis.tables import build_tables

MiB = 2**20


def write_run(
    run_dir, *, batch, outcome="ok", peak=4 * MiB, capacity=64 * MiB, dry_run=False, depth=2, record=True, result=True
):
    run_dir.mkdir(parents=True)
    spec = {
        "schema_version": 1,
        "workload": {"name": "mlp", "depth": depth},
        "mode": "inference",
        "batch": batch,
        "context": 16,
        "width": 32,
        "dtype": "float32",
        "warmup": 1,
        "repeats": 1,
        "seed": 0,
        "device": "cpu",
        "capacity_bytes": capacity,
        "dry_run": dry_run,
    }
    (run_dir / "spec.json").write_text(json.dumps(spec))
    phases = [
        {"name": "model_load", "status": "ok", "max_memory_allocated": MiB, "max_memory_reserved": 2 * MiB},
        {"name": "cold_forward", "status": outcome, "max_memory_allocated": peak, "max_memory_reserved": peak + MiB},
    ]
    if record:
        (run_dir / "record.json").write_text(
            json.dumps(
                {
                    "schema_version": 1,
                    "complete": True,
                    "outcome": outcome,
                    "phases": phases,
                    "device_kind": "cpu",
                    "capacity_bytes": capacity,
                    "source": "predicted" if dry_run else "measured",
                    "failed_phase": None if outcome == "ok" else "cold_forward",
                    "counter_sources": {
                        "max_memory_allocated": "cpu: tracked tensors",
                        "max_memory_reserved": "cpu: rss",
                    },
                }
            )
        )
    if result:
        (run_dir / "result.json").write_text(
            json.dumps(
                {
                    "schema_version": 1,
                    "outcome": outcome,
                    "returncode": 0,
                    "timed_out": False,
                    "wall_s": 1.0,
                    "failed_phase": None if outcome == "ok" else "cold_forward",
                }
            )
        )


def rows_by_id(runs):
    return {r["run_id"]: r for r in runs.to_pylist()}


# ---- 3. damaged run directories ------------------------------------------------------------


def test_missing_or_corrupt_record_is_a_crash_whatever_result_json_says(tmp_path):
    write_run(tmp_path / "0", batch=1)
    write_run(tmp_path / "1", batch=2)
    write_run(tmp_path / "2", batch=4)
    (tmp_path / "1" / "record.json").unlink()
    (tmp_path / "2" / "record.json").write_text('{"schema_version": 1, "phases": [')
    runs, _, problems = build_tables([tmp_path])
    rows = rows_by_id(runs)
    assert rows["0"]["outcome"] == "ok" and rows["0"]["record_problem"] is None
    assert rows["1"]["outcome"] == "crash" and "missing" in rows["1"]["record_problem"]
    assert rows["2"]["outcome"] == "crash" and "corrupt" in rows["2"]["record_problem"]
    assert rows["1"]["max_memory_allocated"] is None  # missing stays null, never 0
    assert any("missing" in p for p in problems) and any("corrupt" in p for p in problems)
    # the frontier does not take the damaged runs as successes
    (row,) = [r for r in frontier_table(runs).to_pylist() if r["axis"] == "batch"]
    assert (row["n_ok"], row["n_other"], row["max_ok"]) == (1, 2, 1)
    _, md = report_md([tmp_path])  # and the report's summary counts them as crashes
    assert "| runs (observed) | 3: crash 2, ok 1 |" in md


def test_run_still_going_without_record_is_not_a_crash(tmp_path):
    write_run(tmp_path / "0", batch=1, record=False, result=False)
    (row,) = build_tables([tmp_path])[0].to_pylist()
    assert row["outcome"] is None and row["record_problem"] is None


# ---- 1. dry runs are predictions, never observations ---------------------------------------


def report_md(sweep_dirs):
    from memsweep.analysis.doc import to_markdown

    runs, phases, _ = build_tables(sweep_dirs)
    report = build_report(runs, phases, frontier_table(runs), parse_margin(None), sweep_dirs, render_plots=False)
    return report, to_markdown(report.doc, "plots")


def test_a_dry_run_only_report_shows_no_observation(tmp_path):
    for i, batch in enumerate((1, 2)):
        write_run(tmp_path / str(i), batch=batch, dry_run=True)
    report, md = report_md([tmp_path])
    assert report.runs == [] and len(report.predicted) == 2
    assert "(observed)" not in md and "tracked by the worker" not in md
    assert "2 dry runs" in md and "Predicted (dry runs)" in md and "nothing was measured" in md
    assert "verdict (predicted peak vs capacity)" in md and str(4 * MiB) in md  # the predicted peak, labelled
    assert "| fits |" in md  # 4 MiB predicted against 64 MiB


def test_a_dry_run_predicted_above_the_capacity_does_not_fit(tmp_path):
    # the worker's outcome of a dry run is ok (fake tensors never run out of memory): the verdict
    # is the predicted peak against the capacity, in the report and in the analysis's summary
    write_run(tmp_path / "0", batch=1, dry_run=True, peak=100 * MiB)
    _, md = report_md([tmp_path])
    predicted = md.split("# Predicted (dry runs)")[1]
    assert "| does not fit |" in predicted and "| fits |" not in predicted
    import io

    from memsweep.analysis.cli import analyze

    out = io.StringIO()
    analyze([tmp_path], out_dir=tmp_path / "a", stream=out)
    assert "predicted outcomes oom: 1" in out.getvalue(), out.getvalue()


def test_a_dry_run_is_not_counted_among_the_observed_runs(tmp_path):
    write_run(tmp_path / "0", batch=1)
    write_run(tmp_path / "1", batch=2, outcome="oom", peak=60 * MiB)
    write_run(tmp_path / "2", batch=4, dry_run=True, peak=7 * MiB)
    report, md = report_md([tmp_path])
    assert "| runs (observed) | 2: " in md
    assert [r["run_id"] for r in report.runs] == ["0", "1"]
    assert "1 dry run (source `predicted`)" in md
    observed = md.split("# Predicted (dry runs)")[0]
    assert str(7 * MiB) not in observed  # the predicted peak appears only in its own section
    assert str(7 * MiB) in md.split("# Predicted (dry runs)")[1]


def test_analyze_of_dry_runs_says_there_is_no_measured_frontier_because_they_are_predictions(tmp_path):
    import io

    for i, batch in enumerate((1, 2)):
        write_run(tmp_path / str(i), batch=batch, dry_run=True)
    out = io.StringIO()
    analyze([tmp_path], tmp_path / "out", stream=out)
    text = out.getvalue()
    assert "no measured frontier: the 2 runs are dry runs (predictions" in text
    assert "no variable was swept" not in text
    assert "no measured run, 2 dry runs (predicted" in text
    assert "CPU run(s)" not in text


# ---- 2. summaries per load, never across loads ---------------------------------------------


def card_rows(md):
    card = md.split("# Summary card")[1].split("\n# ")[0]
    return [line for line in card.splitlines() if line.startswith("| ")]


def test_summary_values_are_per_load_and_missing_is_a_dash(tmp_path):
    # two loads in one directory, the same axes: depth 2 fits every batch, depth 8 only batch 1
    for i, (batch, outcome, peak) in enumerate([(1, "ok", 5 * MiB), (2, "ok", 6 * MiB), (4, "ok", 7 * MiB)]):
        write_run(tmp_path / f"a{i}", batch=batch, outcome=outcome, peak=peak, depth=2)
    for i, (batch, outcome, peak) in enumerate([(1, "ok", 3 * MiB), (2, "oom", 60 * MiB), (4, "oom", 60 * MiB)]):
        write_run(tmp_path / f"b{i}", batch=batch, outcome=outcome, peak=peak, depth=8)
    report, md = report_md([tmp_path])
    (a,) = [x for x in report.axes if x.max_ok == 4]  # the depth-2 load
    (b,) = [x for x in report.axes if x.max_ok == 1]  # the depth-8 load
    # each value's runs are of its own load only
    assert {r["workload_params"] for r in a.runs} == {'{"depth": 2}'} and a.stat(4).status == "ok"
    assert {r["workload_params"] for r in b.runs} == {'{"depth": 8}'}
    assert (a.max_ok, a.min_oom, a.used_at_edge) == (4, None, 7 * MiB)
    assert (b.max_ok, b.min_oom, b.used_at_edge) == (1, 2, 3 * MiB)  # not the other load's 5 MiB
    assert a.title != b.title and "depth" in a.title
    rows = card_rows(md)
    (b_row,) = [line for line in rows if line.startswith("| largest batch that ran") and 'depth": 8' in line]
    assert f"batch=1: peak `max_memory_allocated` {3 * MiB} B" in b_row and "ran out of memory: 2" in b_row


def test_a_missing_peak_is_printed_as_a_dash_never_none(tmp_path):
    write_run(tmp_path / "0", batch=1)
    write_run(tmp_path / "1", batch=2, outcome="oom")
    record = json.loads((tmp_path / "0" / "record.json").read_text())
    record["phases"] = []  # a complete ok record without a counter: the peak is unknown
    (tmp_path / "0" / "record.json").write_text(json.dumps(record))
    _, md = report_md([tmp_path])
    (row,) = [line for line in card_rows(md) if line.startswith("| largest batch that ran")]
    assert "None" not in md and "peak `max_memory_allocated` - B (- GiB)" in row


def test_the_console_frontier_names_what_tells_two_loads_apart(tmp_path):
    """Two loads of one axis in one directory (depth 2 and 8): their rows in the printed table
    must not read alike; a table of one load names nothing extra."""
    for i, (batch, outcome) in enumerate([(1, "ok"), (2, "ok")]):
        write_run(tmp_path / f"a{i}", batch=batch, outcome=outcome, depth=2)
    for i, (batch, outcome) in enumerate([(1, "ok"), (2, "oom")]):
        write_run(tmp_path / f"b{i}", batch=batch, outcome=outcome, depth=8)
    runs, _, _ = build_tables([tmp_path])
    lines = [line for line in format_frontier(frontier_table(runs)).splitlines() if line.startswith("batch")]
    assert len(lines) == 2
    assert any('workload_params={"depth": 2}' in line for line in lines)
    assert any('workload_params={"depth": 8}' in line for line in lines)
    for i, batch in enumerate((1, 2)):
        write_run(tmp_path / "one" / str(i), batch=batch, depth=2)
    runs, _, _ = build_tables([tmp_path / "one"])
    (line,) = [line for line in format_frontier(frontier_table(runs)).splitlines() if line.startswith("batch")]
    assert "workload_params" not in line


def test_stable_is_null_when_nothing_was_run_twice(tmp_path):
    """`stable` is a check of re-runs: with one run per value nothing was checked (null, and the
    report says so); a value that both ran and ran out of memory is unstable; two agreeing runs
    of a value are stable."""

    def row(sweep):
        runs, _, _ = build_tables([sweep])
        (r,) = [r for r in frontier_table(runs).to_pylist() if r["axis"] == "batch"]
        return r

    for i, (batch, outcome) in enumerate([(1, "ok"), (2, "ok"), (4, "oom")]):
        write_run(tmp_path / "once" / str(i), batch=batch, outcome=outcome)
    r = row(tmp_path / "once")
    assert (r["max_ok"], r["min_oom"], r["exact"], r["stable"]) == (2, 4, True, None)
    _, md = report_md([tmp_path / "once"])
    assert "stable: not checked" in md and "stable: yes" not in md
    for i, (batch, outcome) in enumerate([(1, "ok"), (2, "ok"), (2, "ok"), (4, "oom")]):
        write_run(tmp_path / "twice" / str(i), batch=batch, outcome=outcome)
    assert row(tmp_path / "twice")["stable"] is True
    for i, (batch, outcome) in enumerate([(1, "ok"), (2, "ok"), (2, "oom"), (4, "oom")]):
        write_run(tmp_path / "flip" / str(i), batch=batch, outcome=outcome)
    r = row(tmp_path / "flip")
    assert r["stable"] is False and r["exact"] is False


def test_a_sweep_directory_given_twice_is_read_once_and_checks_no_stability(tmp_path, monkeypatch, capsys):
    """`report c32 ./c32/` (or the same path twice): one sweep, read once with a note; its runs are
    not re-runs of themselves, so `stable` stays null and the runs are counted once."""
    from memsweep.analysis.report.cli import main as report_main

    for i, (batch, outcome) in enumerate([(1, "ok"), (2, "ok"), (4, "oom")]):
        write_run(tmp_path / "c32" / str(i), batch=batch, outcome=outcome)
    monkeypatch.chdir(tmp_path)
    runs, _, problems = build_tables([Path("c32"), Path("./c32/"), tmp_path / "c32"])
    assert runs.num_rows == 3 and sum("given twice" in p for p in problems) == 2
    (row,) = [r for r in frontier_table(runs).to_pylist() if r["axis"] == "batch"]
    assert (row["n_runs"], row["stable"], row["max_ok"], row["min_oom"]) == (3, None, 2, 4)
    # a run directory inside two of the directories given (the sweep and one of its runs) is one run
    runs, _, problems = build_tables([Path("c32"), Path("c32/0")])
    assert runs.num_rows == 3 and any("counted once" in p for p in problems)
    assert report_main(["c32", "./c32/", "--out", "r"]) == 0
    assert "given twice" in capsys.readouterr().err
    md = (tmp_path / "r" / "report.md").read_text()
    assert "from 3 measured runs in `c32`." in md and "stable: yes" not in md and "Read once" in md


def test_the_frontier_counts_a_run_directory_read_twice_once():
    """The frontier's own guard: two rows of one run directory are one observation, not a re-run."""
    from memsweep.analysis.tables import RUNS_SCHEMA, coerce_table

    rows = [
        {"sweep_dir": "s", "run_dir": f"s/{b}", "workload": "mlp", "mode": "inference", "device": "cpu"}
        | {"batch": b, "context": 16, "width": 32, "dtype": "float32", "outcome": "ok", "source": "measured"}
        for b in (1, 2)
    ]
    (row,) = [r for r in frontier_table(coerce_table(rows + rows, RUNS_SCHEMA)).to_pylist() if r["axis"] == "batch"]
    assert (row["n_runs"], row["n_ok"], row["stable"]) == (2, 2, None)


def test_a_dry_run_row_carries_its_verdict_beside_the_workers_ok(tmp_path):
    """runs.parquet: a dry run's `outcome` is the worker's ok (every phase predicted); its
    `predicted_outcome` is the verdict, oom when the predicted peak is above the capacity; null
    for a measured run and for a dry run without a capacity."""
    write_run(tmp_path / "0", batch=1, dry_run=True, peak=4 * MiB)
    write_run(tmp_path / "1", batch=64, dry_run=True, peak=10106360, capacity=4 * MiB)
    write_run(tmp_path / "2", batch=2, dry_run=True, capacity=None)
    write_run(tmp_path / "3", batch=2)
    rows = rows_by_id(build_tables([tmp_path])[0])
    assert {k: (r["outcome"], r["predicted_outcome"]) for k, r in rows.items()} == {
        "0": ("ok", "ok"),
        "1": ("ok", "oom"),
        "2": ("ok", None),
        "3": ("ok", None),
    }
    report, md = report_md([tmp_path])  # the report: the verdict, never a measured ok
    assert [r["run_id"] for r in report.runs] == ["3"]
    assert "| does not fit |" in md.split("# Predicted (dry runs)")[1]


def test_a_dtype_sweep_whose_runs_all_fit_is_reported_as_fitting(tmp_path):
    """Along dtype the frontier groups runs whatever their precision (it resolves with the dtype);
    the report finds the row's runs by the same fields: every value ran ok, so one is recommended
    and the per-value table has a row per dtype (a new user saw 'no value of dtype ran ok')."""
    for i, dtype in enumerate(("float32", "float16", "bfloat16")):
        write_run(tmp_path / str(i), batch=8)
        spec = json.loads((tmp_path / str(i) / "spec.json").read_text())
        (tmp_path / str(i) / "spec.json").write_text(json.dumps({**spec, "dtype": dtype, "precision": "pure"}))
    report, md = report_md([tmp_path])
    (axis,) = [a for a in report.axes if a.axis == "dtype"]
    assert axis.recommended is not None, axis.reason
    assert "none can be recommended" not in md and "none of the values ran ok" not in md
