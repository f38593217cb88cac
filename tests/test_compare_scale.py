"""memsweep compare of many series: the pairs shown in full, lists named up to a bound and counted,
what differs shown in a bounded line, the columns read, the plot's crowded axis. Sweeps made of rows
(no worker runs); nothing here is timed (speed: make bench BENCH=scale)."""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memsweep.analysis.compare import load, match, plot, render, scale, speed
from memsweep.analysis.compare.gate import parse_threshold, regressions
from memsweep.analysis.compare.load import Sweep

VALUES = list(range(1, 11))


def _sweep(label: str, loads: int, grow=lambda load, v: 1.0, rate=lambda load, v: 1.0) -> Sweep:
    """``loads`` batch sweeps (context 64, 65, ... each with its own capacity: no context sweep) over
    VALUES, every run ok, two phases each;
    peaks scaled by ``grow(load, value)``, samples per second by ``rate(load, value)``."""
    runs, phases = [], []
    for i in range(loads):
        for v in VALUES:
            peak = int(1000 * v * grow(i, v))
            run = dict(
                sweep_dir=label, run_id=f"{i}-{v}", workload="mlp", mode="train", batch=v, context=64 + i,
                width=64, dtype="float32", capacity_bytes=10**6 + i, device="cpu", device_kind="cpu", outcome="ok",
                max_memory_allocated=peak, max_memory_reserved=2 * peak, samples_per_s=100.0 * rate(i, v),
            )  # fmt: skip
            runs.append(run)
            for k, name in enumerate(("inputs", "step")):
                counters = dict.fromkeys(match.COUNTERS, peak // (2 - k))
                phases.append(dict(sweep_dir=label, run_id=f"{i}-{v}", phase=name, phase_index=k, **counters))
    return Sweep(label, Path(label), "test", runs, phases)


def _compared(a: Sweep, b: Sweep) -> list[match.Comparison]:
    others = match.series_of(b)
    return [match.compare_series(s, others, "max_memory_allocated") for s in match.series_of(a)]


class _NoPlots:
    def counters_plot(self, *args):
        return b""


def _in_full(doc) -> list[str]:
    return [b[2] for b in doc.blocks if b[0] == "h" and " -> " in b[2]]


def test_past_detail_pairs_the_two_whose_peak_grew_most_are_shown_in_full():
    a = _sweep("A", 8)
    b = _sweep("B", 8, grow=lambda load, v: {2: 1.05, 5: 1.10}.get(load, 1.0))
    comparisons = _compared(a, b)
    doc = render.document([a, b], [], comparisons, None, [], _NoPlots())
    assert len(_in_full(doc)) == scale.IN_FULL == 2
    assert all("context=66" in t or "context=69" in t for t in _in_full(doc)), _in_full(doc)
    summary = next(b for b in doc.blocks if b[0] == "table" and "largest growth at" in b[1])
    assert len(summary[2]) == 8
    text = render.text([a, b], [], comparisons, None, [])
    assert text.count("largest growth of the run peak") == 6  # one line for each pair not in full
    few = _compared(_sweep("A", scale.DETAIL_PAIRS), _sweep("B", scale.DETAIL_PAIRS))
    assert len(_in_full(render.document([a, b], [], few, None, [], _NoPlots()))) == scale.DETAIL_PAIRS


def test_rates_and_peaks_past_named_are_summarised_naming_those_that_fell_or_grew_most():
    n = 8 * len(VALUES)
    assert n > scale.NAMED
    fall = {(i, v): (i * len(VALUES) + v) / (2 * n) for i in range(8) for v in VALUES}  # 0.6 % .. 50 %
    a, b = _sweep("A", 8), _sweep("B", 8, grow=lambda i, v: 1 + fall[i, v], rate=lambda i, v: 1 - fall[i, v])
    comparisons = _compared(a, b)
    rates = speed.rate_changes(comparisons)
    assert len(rates) == n
    failed = speed.slowdowns(comparisons, speed.parse_slower("0%"))
    lines = speed.speed_lines(rates, "0%", failed)
    named = [line for line in lines[2:] if "samples/s (" in line][: scale.NAMED]
    assert f"{n} values with a measured rate in both sweeps" in lines[1]
    assert len(lines) == 2 + scale.NAMED + 1 + scale.NAMED + 1 and lines[-1] == f"  ... and {n - scale.NAMED} more"
    assert f"FAILED, {n} value(s) slower beyond it" in lines[2 + scale.NAMED]
    shown = sorted(rates, key=lambda s: s.change)[: scale.NAMED]
    assert named == [f"  {s.text()}" for s in shown]  # the largest falls, largest first
    grown = regressions(comparisons, parse_threshold("0%"))
    verdict = render.verdict(comparisons, parse_threshold("0%"), grown).splitlines()
    assert len(grown) == n and len(verdict) == 1 + scale.NAMED + 1 and f"{n - scale.NAMED} more" in verdict[-1]
    assert f"batch={VALUES[-1]}:" in verdict[1] and "context=71" in verdict[1]  # the largest growth first


def test_what_differs_shows_a_bounded_line_of_values_and_tells_types_apart():
    a = _sweep("A", 1)
    b = _sweep("B", 2)
    for i, r in enumerate(b.runs):
        r["capacity_bytes"] = 1000 + i  # one value per run
    assert len(b.runs) > match.SHOWN_VALUES
    (diff,) = [d for d in match.differences([a, b], ["batch"]) if d.field == "capacity_bytes"]
    assert diff.values[0] == str(10**6) and diff.values[1].endswith(f", ... ({len(b.runs)} values)")
    assert diff.values[1].count(",") == match.SHOWN_VALUES
    mixed = Sweep("M", Path("m"), "test", [{"x": v} for v in (1, 1.0, True, None, 1)], [])
    assert match._values(mixed, "x") == sorted(["1", "1.0", "true", "null"])
    lists = Sweep("L", Path("l"), "test", [{"x": [1]}, {"x": [1]}, {"x": [2]}], [])
    assert match._values(lists, "x") == ["[1]", "[2]"]


def test_a_sweep_is_read_with_the_columns_asked_and_the_columns_absent_are_named(tmp_path):
    runs = pa.table(
        {"sweep_dir": ["s", "s"], "run_id": ["0", "1"], "batch": [1, None], "n": [[1, 2], None], "extra": ["x", "y"]}
    )
    phases = pa.table({"sweep_dir": ["s"], "run_id": ["0"], "phase": ["inputs"], "memory_allocated": [5]})
    pq.write_table(runs, tmp_path / "runs.parquet")
    pq.write_table(phases, tmp_path / "phases.parquet")
    whole = load.load_sweep(tmp_path, "A")
    assert whole.runs == runs.to_pylist() and whole.phases == phases.to_pylist()
    some = load.load_sweep(tmp_path, "A", ["sweep_dir", "run_id", "batch", "outcome"], ["sweep_dir", "run_id", "phase"])
    assert some.runs == [
        {"sweep_dir": "s", "run_id": "0", "batch": 1},
        {"sweep_dir": "s", "run_id": "1", "batch": None},
    ]
    assert some.phases == [{"sweep_dir": "s", "run_id": "0", "phase": "inputs"}]
    assert "outcome" in some.missing_columns and "batch" not in some.missing_columns
    assert some.missing_columns == whole.missing_columns  # what the file lacks, whatever was read


def test_the_counters_plot_thins_the_labels_of_a_crowded_axis(monkeypatch):
    """The plot is saved by analysis.plots.png_bytes, which hides the x tick labels that would
    overlap (thin_xticklabels), on an axis crowded enough that some are."""
    from memsweep.analysis import plots

    monkeypatch.setattr(plots, "thin_xticklabels", _counting(plots.thin_xticklabels))
    a = _sweep("A", 1, grow=lambda i, v: 1 + v / 100)
    b = _sweep("B", 1, grow=lambda i, v: 1 + v / 50)
    crowded = {v: a.runs[0:1] for v in range(1, 21)}
    series = [match.series_of(s)[0] for s in (a, b)]
    for s in series:
        s.by_value = {v: [dict(r, batch=v) for r in rs] for v, rs in crowded.items()}
    png = plot.counters_plot(series, "t")
    assert png.startswith(b"\x89PNG")
    assert plots.thin_xticklabels.hidden, "the crowded axis's overlapping labels are hidden"  # type: ignore[attr-defined]


def _counting(thin):
    """``thin_xticklabels`` noting how many labels it hid."""

    def wrapped(ax, first=()):
        before = len(ax.get_xticklabels())
        thin(ax, first)
        wrapped.hidden += max(0, before - len(ax.get_xticklabels()))  # type: ignore[attr-defined]

    wrapped.hidden = 0  # type: ignore[attr-defined]
    return wrapped


@pytest.mark.parametrize("n", [0, 3])
def test_rows_of_is_to_pylist(n):
    t = pa.table({"a": list(range(n)), "b": [[i] for i in range(n)], "c": [None] * n})
    assert load.rows_of(t) == t.to_pylist()
    assert load.rows_of(t.select([])) == [{} for _ in range(n)]


def test_a_regression_from_a_zero_byte_peak_reads_without_a_percentage():
    from memsweep.analysis.compare.gate import Regression

    assert "(from 0 B), 0 B -> 512 B" in Regression("batch sweep", 8, "max_memory_allocated", 0, 512).text()
    assert "(+50.0 %)" in Regression("batch sweep", 8, "max_memory_allocated", 1024, 1536).text()
