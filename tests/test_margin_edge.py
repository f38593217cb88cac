"""The margin's edge: after the capacity's edge, the frontier search measures the largest value
whose peak leaves the report's margin (``hydra.callbacks.analyze.margin``), so that the report's
recommendation is a measured run at most one lattice step below the true margin edge.

The real case: the mlp in inference (context=64 width=64 depth=2) on the CPU at capacity=64MiB,
whose tracked peak grows by 163,840 B per batch item; the capacity caps the tracked tensor bytes
(``capacity_mode=allocator``), so the peaks, and the edges, are the same on every machine.
"""

import math
import re
import subprocess

import pyarrow.parquet as pq
import pytest

from memsweep.analysis.report import parse_margin
from memsweep.analysis.report.build import build_report
from memsweep.sweeper.search import FrontierSearch, Lattice, run_search
from tests.data.loads import MEMSWEEP, TINY_CPU, search_events

CAPACITY = 64 * 2**20


def margin_bytes(fraction):
    return lambda capacity: math.ceil(fraction * capacity)


def affine(a, b, cap):
    return lambda x: ("ok", a + b * x, cap) if a + b * x <= cap else ("oom", None, cap)


@pytest.mark.parametrize("strategy", ["model", "bisect"])
@pytest.mark.parametrize("slots", [1, 3])
@pytest.mark.parametrize(
    "a, b, fraction, step",
    [(264_704, 163_840, 0.1, 1), (30_000_000, 9_000, 0.1, 1), (1_000, 50_000, 0.25, 8), (100_000, 1_500, 0.5, 1)],
)
def test_the_margin_edge_is_a_measured_run_next_to_the_true_one(strategy, slots, a, b, fraction, step):
    s = FrontierSearch("batch", Lattice.make(1, 65536, step), strategy, margin_of=margin_bytes(fraction))
    r = run_search(s, affine(a, b, CAPACITY), slots=slots)
    level = CAPACITY - math.ceil(fraction * CAPACITY)
    true_edge = (level - a) // b // step * step
    assert r.exact and r.margin_bytes == math.ceil(fraction * CAPACITY)
    assert r.margin_edge == true_edge
    peaks = {p.value: p.run_peak for p in s.probes if p.outcome == "ok"}
    assert peaks[r.margin_edge] <= level  # measured, within the margin
    above = r.margin_edge + step
    assert above == r.min_oom or peaks[above] > level  # the next value up: measured over it, or the capacity's edge


def test_no_margin_no_margin_search():
    plain = run_search(FrontierSearch("batch", Lattice.make(1, 65536)), affine(264_704, 163_840, CAPACITY))
    assert plain.margin_edge is None and plain.margin_bytes is None


def test_a_margin_no_value_leaves_ends_with_none():
    s = FrontierSearch("batch", Lattice.make(8, 65536), "model", margin_of=margin_bytes(0.5))
    r = run_search(s, affine(40_000_000, 10_000, CAPACITY))  # 8 already needs more than half the capacity
    assert r.exact and r.margin_edge is None and s.done


def sweep(sweep_dir, *args):
    return subprocess.run(
        [
            MEMSWEEP,
            "sweep",
            "hydra/sweeper=frontier",
            f"capacity={CAPACITY}B",
            *TINY_CPU,
            "hydra.sweeper.lower=1",
            "hydra.sweeper.upper=4096",
            "hydra.sweeper.confirm=0",
            *args,
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=sweep_dir.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("margin", [None, "20%"])
def test_the_report_recommends_the_measured_margin_edge(tmp_path, margin):
    sweep_dir = tmp_path / "sweep"
    proc = sweep(sweep_dir, *([f"hydra.callbacks.analyze.margin={margin}"] if margin else []))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = search_events(sweep_dir, "result")
    policy = parse_margin(margin)
    level = CAPACITY - policy.bytes_for(CAPACITY)
    assert result["exact"] and result["margin_bytes"] == policy.bytes_for(CAPACITY)
    tables = {name: pq.read_table(sweep_dir / f"{name}.parquet") for name in ("runs", "phases", "frontier")}
    report = build_report(tables["runs"], tables["phases"], tables["frontier"], policy, render_plots=False)
    (axis,) = [a for a in report.axes if a.axis == "batch"]
    rec = axis.stat(axis.recommended)
    assert axis.recommended == result["margin_edge"] and rec.all_ok and rec.used <= level
    above = axis.stat(axis.recommended + 1)
    assert above is not None  # the next lattice value up was measured:
    assert axis.recommended + 1 == axis.min_oom or (above.all_ok and above.used > level)  # over the margin, or OOM
    assert f"measured it as the margin's edge: the next value, batch={axis.recommended + 1}," in axis.reason
    (row,) = [r for r in tables["frontier"].to_pylist() if r["axis"] == "batch"]
    assert row["margin_edge"] == axis.recommended
    md = (sweep_dir / "report.md").read_text()
    assert re.search(rf"Recommended: \*\*batch={axis.recommended}\*\*", md), md[:1500]
