"""What a reader sees, checked where it can go wrong: the console frontier table's columns under
their headers, distinct colours per part of the split plot, x tick labels that never overlap, and
the report and compare pages in headless Chromium at 1280 px (nothing wider than the window)."""

import os
import re
from pathlib import Path

from memsweep.analysis.frontier import frontier_table
from memsweep.analysis.outputs import FRONTIER_HEADERS, format_frontier
from memsweep.analysis.tables import RUNS_SCHEMA, coerce_table

LONG_LOAD = dict(
    sweep_dir="s",
    workload="mlp",
    mode="train",
    device="cpu",
    capacity_bytes=128 << 20,
    context=4096,
    width=16384,
    dtype="bfloat16",
    parallel="fsdp",
    world_size=8,
    source="measured",
)


def _columns(header: str, names: list[str]) -> list[tuple[int, int]]:
    """(start, end) of each header name in the header line, in order."""
    spans, at = [], 0
    for name in names:
        start = header.index(name, at)
        spans.append((start, start + len(name)))
        at = start + len(name)
    return spans


def test_every_console_frontier_value_sits_under_its_header():
    """A fixed load longer than any fixed width (a load of many set fields) and wide values: each
    cell of a row ends where its header ends (numbers, right-aligned) or starts where it starts
    (the axis and the load, left-aligned), and the unit line's GiB sits under its column."""
    runs = [
        dict(LONG_LOAD, run_id=f"r{b}", batch=b, outcome=o, failed_phase=None if o == "ok" else "cold_step.forward")
        for b, o in ((13860, "ok"), (16384, "ok"), (65536, "oom"))
    ]
    text = format_frontier(frontier_table(coerce_table(runs, RUNS_SCHEMA)))
    header, units, *rows = text.splitlines()
    names = [h[0] for h in FRONTIER_HEADERS]
    spans = _columns(header, names)
    (row,) = [r for r in rows if r.startswith("batch")]
    cells = list(re.finditer(r"\S+", row))
    values = cells[-(len(names) - 2) :]  # the load's words are one column: the value columns are the last
    assert cells[0].start() == spans[0][0] and cells[1].start() == spans[1][0], (header, row)
    for cell, (_, end) in zip(values, spans[2:]):
        assert cell.end() == end, (header, row)
    assert [v.group() for v in values[:2]] == ["16384", "65536"]
    assert [m.end() for m in re.finditer("GiB", units)] == [end for _, end in spans[-3:]], (header, units)
    load_end = cells[len(cells) - len(values) - 1].end()
    assert load_end < spans[2][0], "the load ends before the next column begins"


def _figure_of(monkeypatch, draw):
    """The matplotlib figure a ``plots`` function saves (``draw()`` calls it), kept open for measuring."""
    from memsweep.analysis import plots

    figures, save = [], plots._png

    def keep(fig):
        figures.append(fig)
        return save(fig)

    monkeypatch.setattr(plots, "_png", keep)
    assert draw()[:8] == b"\x89PNG\r\n\x1a\n"
    (fig,) = figures
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)  # saving closed it: a canvas again, to draw it as it was saved
    fig.canvas.draw()
    return fig


def _pixel(fig, patch) -> tuple[int, int, int]:
    """The RGB colour drawn at the centre of ``patch`` (a legend's colour box) on the figure's canvas."""
    import numpy as np

    box = patch.get_window_extent(fig.canvas.get_renderer())
    rgba = np.asarray(fig.canvas.buffer_rgba())
    x, y = int((box.x0 + box.x1) / 2), int(rgba.shape[0] - (box.y0 + box.y1) / 2)
    return tuple(int(c) for c in rgba[y, x, :3])


def test_each_part_of_the_split_plot_has_its_own_colour(monkeypatch):
    """The four parts the report stacks (their names as the report writes them): the pixels drawn
    in the legend's colour boxes differ from part to part, and each is the colour of its bars."""
    from memsweep.analysis import plots
    from memsweep.analysis.report.split import PARTS

    phases = ["model_load", "forward", "backward", "optimizer_step"]
    parts = {p: [(i + 1) * 2**20 for _ in phases] for i, p in enumerate(PARTS)}
    fig = _figure_of(
        monkeypatch, lambda: plots.split_plot(phases, parts, [None] * 4, 64 * 2**20, None, "split", "observed")
    )
    (ax,) = fig.axes
    legend = ax.get_legend()
    boxes = {t.get_text(): h for t, h in zip(legend.get_texts(), legend.legend_handles)}
    colours = {name: _pixel(fig, boxes[f"{name} (calculated)"]) for name in PARTS}
    assert len(set(colours.values())) == len(PARTS), colours
    import matplotlib.colors as mcolors

    for bars, name in zip(ax.collections, PARTS):  # one collection per part, stacked in order
        bar = tuple(round(255 * c) for c in mcolors.to_rgb(bars.get_facecolor()[0]))
        assert bar == colours[name], (name, bar, colours[name])


def _visible_labels_apart(fig, ax) -> list[str]:
    """The visible x tick labels, after checking that no two of their boxes intersect."""
    renderer = fig.canvas.get_renderer()
    shown = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
    boxes = [t.get_window_extent(renderer) for t in shown]
    for i, a in enumerate(boxes):
        for j, b in enumerate(boxes[:i]):
            assert not a.overlaps(b), (shown[i].get_text(), shown[j].get_text())
    return [t.get_text() for t in shown]


def test_frontier_tick_labels_never_overlap_and_the_edges_are_named(monkeypatch):
    """A search's values crowd at the edge (198 beside 199) and at the top (13860 ... 65536 on a log2
    axis): the labels drawn never intersect (boxes measured by the figure's renderer), the edge that
    fits keeps its label, and labels were left out only where they would have overlapped."""
    from memsweep.analysis import plots

    values = [1, 2, 4, 8, 16, 32, 64, 128, 192, 196, 198, 199, 200, 256, 13860, 14000, 15000, 16384, 32768, 65536]
    points = [{"value": v, "outcome": "ok" if v <= 198 else "oom", "used": v * 2**20, "other": None} for v in values]
    fig = _figure_of(monkeypatch, lambda: plots.axis_plot("batch", points, 2**30, None, "a", "b", 198, 199))
    (ax,) = fig.axes
    shown = _visible_labels_apart(fig, ax)
    assert "198" in shown and "1" in shown and "65536" in shown
    assert len(shown) < len(values)
    assert len(shown) >= 8, shown  # the sparse ones all stay


def test_well_spaced_tick_labels_all_stay(monkeypatch):
    from memsweep.analysis import plots

    values = [1, 2, 4, 8, 16, 32]
    points = [{"value": v, "outcome": "ok", "used": v * 2**20, "other": None} for v in values]
    fig = _figure_of(monkeypatch, lambda: plots.axis_plot("batch", points, 2**30, None, "a", "b", 32, None))
    assert _visible_labels_apart(fig, fig.axes[0]) == [str(v) for v in values]


# ---- the pages, in headless Chromium at 1280 px ---------------------------------------------

import json  # noqa: E402
import shutil  # noqa: E402

import pytest  # noqa: E402

from tests.chromium import CHROMIUM, SKIP_REASON, page_widths, screenshot  # noqa: E402

LONG_DIR = "sweep-" + "x" * 60 + "-" + "y" * 60  # a long sweep directory name, one word
SEARCH_VALUES = (1, 2, 4, 8, 16, 32, 64, 128, 192, 196, 198, 199, 256)
HF_PARAMS = {"config": "llama", "overrides": {"num_hidden_layers": 2, "hidden_size": 32}, "pretrained": None}


def _sweep_rows(sweep_dir: str, grow: float = 1.0):
    """Runs and phases of a batch search crowding at its edge (198 fits, 199 does not) of an hf load."""
    from tests.test_report_unit import make

    points = [
        (v, "ok" if v <= 198 else "oom", int(grow * (4 * v + 64)) * 2**20, int(grow * (3 * v + 40)) * 2**20)
        for v in SEARCH_VALUES
    ]
    runs, phases = make(sweep_dir, points, capacity=1 << 30)
    for r in runs:
        r.update(workload="hf", workload_params=json.dumps(HF_PARAMS))
    return runs, phases


def _keep_screenshot(shot):
    keep = os.environ.get("MEMSWEEP_KEEP_SCREENSHOT_DIR")  # a directory, to look at the pages by eye
    if keep:
        shutil.copy(shot, keep)


def _assert_fits_the_window(url: str, tmp_path, name: str) -> None:
    """The page is no wider than a 1280 px window (its own load handler measured it), and a
    screenshot of it is taken."""
    found = page_widths(url, tmp_path)
    assert found["plots-total"] == found["plots-rendered"] and int(found["plots-total"]) >= 1, found
    assert found["errors"] == "0", found
    assert int(found["scroll-width"]) <= int(found["client-width"]) <= 1280, found
    shot = screenshot(url, tmp_path / f"{name}.png", tmp_path)
    assert shot.stat().st_size > 20_000
    _keep_screenshot(shot)


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_the_report_page_fits_1280_px_and_names_the_load_in_words(tmp_path):
    from memsweep.analysis.report import build_report, parse_margin, write_report
    from tests.test_report_unit import tables

    runs, phases = _sweep_rows(f"/tmp/{LONG_DIR}")
    report = build_report(*tables(runs, phases), parse_margin(None))
    _, html_path = write_report(report, tmp_path / "out")
    html = html_path.read_text()
    load = re.search(r"<td>load \(observed\)</td><td>(.*?)</td>", html)
    assert load, html[:2000]
    assert "{" not in load.group(1) and "overrides.num_hidden_layers=2" in load.group(1), load.group(1)
    _assert_fits_the_window(html_path.as_uri(), tmp_path, "report")


def parquet_sweeps(tmp_path: Path, rows) -> list[Path]:
    """Two analysed sweeps under long names (a/LONG_DIR, b/LONG_DIR), their tables written from
    ``rows(sweep_dir, grow)`` -> (runs, phases) rows, the second's peaks grown by 1.2."""
    import pyarrow.parquet as pq

    from tests.test_report_unit import tables

    dirs = []
    for name, grow in (("a", 1.0), ("b", 1.2)):
        d = tmp_path / name / LONG_DIR
        d.mkdir(parents=True)
        runs_t, phases_t, _ = tables(*rows(str(d), grow))
        pq.write_table(runs_t, d / "runs.parquet")
        pq.write_table(phases_t, d / "phases.parquet")
        dirs.append(d)
    return dirs


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_the_compare_page_fits_1280_px_and_lists_what_failed_the_gate(tmp_path):

    from memsweep.analysis.compare import plot
    from memsweep.analysis.compare.compare import compare, write_doc
    from memsweep.analysis.compare.gate import parse_threshold
    from memsweep.analysis.compare.render import document

    dirs = parquet_sweeps(tmp_path, _sweep_rows)
    threshold = parse_threshold("5%")
    result = compare(dirs, threshold)
    assert result.regressions
    doc = document(result.sweeps, result.differences, result.comparisons, threshold, result.regressions, plot)
    (counters,) = doc.images
    width = int.from_bytes(counters.png[16:20], "big")  # the PNG header's width, in pixels
    # 10 inches at 100 dpi and its labels: a long sweep name in the legend would widen it, and the
    # page would shrink the whole figure to fit
    assert width <= 1200, width
    _, html_path = write_doc(doc, tmp_path / "out")
    html = html_path.read_text()
    gate = re.search(r"<p>gate --fail-above 5%: FAILED, (\d+) peak\(s\) grew beyond it:</p>\n<ul>(.*?)</ul>", html)
    assert gate, html[:3000]
    items = re.findall(r"<li>(.*?)</li>", gate.group(2))
    assert len(items) == int(gate.group(1)) == len(result.regressions) and all(" grew " in i for i in items)
    _assert_fits_the_window(html_path.as_uri(), tmp_path, "compare")


def test_the_split_plot_keeps_every_phase_name(monkeypatch):
    """Its phase names are rotated, set apart by their angle: none is left out."""
    from memsweep.analysis import plots

    phases = [f"cold_step.phase_{i}_optimizer_step" for i in range(12)]
    parts = {"parameters": [2**20] * 12}
    fig = _figure_of(monkeypatch, lambda: plots.split_plot(phases, parts, [None] * 12, None, None, "split"))
    assert [t.get_text() for t in fig.axes[0].get_xticklabels() if t.get_visible()] == phases
