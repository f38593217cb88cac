"""The margin report of a real CPU sweep (worker processes, emulated capacity), checked for its
numbers against the Parquet tables, and its HTML rendered in headless Chromium."""

import os
import re
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from memsweep.analysis.report import gib, pct
from tests.data.loads import MEMSWEEP, TINY_CPU

# Tiny loads: at 8 MiB, batch 16 fits and batch 32 runs out of memory (measured: ~5 s a run).
TINY_ARGS = [*TINY_CPU, "isolation=forkserver"]
CAPACITY = 8 * 2**20


def run(cmd, cwd, **kw):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, **kw)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """One 4-run batch sweep; the sweep's end writes the tables and the report."""
    root = tmp_path_factory.mktemp("report")
    env = {k: v for k, v in os.environ.items() if k != "MEMSWEEP_PROGRESS"}  # stdout a pipe: the lines
    proc = run(
        [MEMSWEEP, "sweep", "sweep=none", "batch=4,16,32,64", "capacity=8MiB", *TINY_ARGS, f"hydra.sweep.dir={root}/s"],
        cwd=root,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, root / "s"


def test_sweep_ends_with_the_report_path_and_shows_progress(sweep):
    proc, sweep_dir = sweep
    assert f"memsweep: report -> {sweep_dir}/report.html" in proc.stdout
    assert (sweep_dir / "report.md").is_file() and (sweep_dir / "report_plots").is_dir()
    # the ovat sweeper launches the largest condition first (sweeper.ovat.launch_order)
    assert "running job" not in proc.stdout, "one line per finished job, none per start"
    eta = r", about \d+:\d\d:\d\d left"
    assert re.search(
        r"\[1/4 done, 3 left" + eta + r"\] job 0: batch=64 .* -> oom in \w+ · elapsed \d+:\d\d:\d\d", proc.stdout
    )
    assert re.search(r"\[4/4 done, 0 left" + eta + r"\] job 3: batch=4 .* -> ok · elapsed \d+:\d\d:\d\d", proc.stdout)


def test_progress_is_a_bar_on_a_terminal_and_lines_elsewhere(monkeypatch):
    from memsweep.sweeper.callbacks import Progress

    monkeypatch.delenv("MEMSWEEP_PROGRESS", raising=False)
    assert Progress.mode() == ("bar" if sys.stdout.isatty() else "lines")
    for forced, mode in (("0", "off"), ("1", "lines"), ("bar", "bar")):
        monkeypatch.setenv("MEMSWEEP_PROGRESS", forced)
        assert Progress.mode() == mode


def _peak_at(runs, batch):
    return max(r["max_memory_allocated"] for r in runs if r["batch"] == batch and r["outcome"] == "ok")


def test_margin_is_capacity_minus_the_measured_peak_from_parquet(sweep):
    _, sweep_dir = sweep
    runs = pq.read_table(sweep_dir / "runs.parquet").to_pylist()
    (row,) = [r for r in pq.read_table(sweep_dir / "frontier.parquet").to_pylist() if r["axis"] == "batch"]
    assert row["capacity_bytes"] == CAPACITY and row["exact"]
    max_ok = row["max_ok"]
    peak = _peak_at(runs, max_ok)  # on the CPU the compared counter is max_memory_allocated
    assert peak == row["max_ok_max_memory_allocated"]
    margin = CAPACITY - peak
    md = (sweep_dir / "report.md").read_text()
    expected = (
        f"| {max_ok} | `max_memory_allocated` | {CAPACITY} | {gib(CAPACITY)} | {peak} | {gib(peak)} | "
        f"{margin} | {gib(margin)} | {pct(margin, CAPACITY)} |"
    )
    assert expected in md, [line for line in md.splitlines() if "max_memory_allocated` |" in line]
    assert f"margin at max_ok batch (calculated) | {margin} B" in md
    # the four counters of the max_ok run, in bytes
    ok_run = next(r for r in runs if r["batch"] == max_ok and r["outcome"] == "ok")
    assert f"| max_memory_reserved | {ok_run['max_memory_reserved']} |" in md


def test_chosen_value_ran_ok_and_respects_the_margin(sweep):
    _, sweep_dir = sweep
    runs = pq.read_table(sweep_dir / "runs.parquet").to_pylist()
    md = (sweep_dir / "report.md").read_text()
    m = re.search(r"\*\*batch sweep \([^)]*\): batch=(\d+)\*\*", md)
    assert m, md.split("## Chosen setting")[1][:800]
    chosen = int(m.group(1))
    at = [r for r in runs if r["batch"] == chosen]
    assert at and all(r["outcome"] == "ok" for r in at)
    assert CAPACITY - _peak_at(runs, chosen) >= -(-CAPACITY // 10)  # default margin: 10 % of capacity, rounded up
    smallest_oom = min(r["batch"] for r in runs if r["outcome"] == "oom")
    assert chosen < smallest_oom
    assert "10 % of the capacity (memsweep's default" in md


def test_report_refuses_to_overwrite_and_writes_elsewhere_with_another_margin(sweep, tmp_path):
    _, sweep_dir = sweep
    before = (sweep_dir / "report.md").read_bytes()
    proc = run([MEMSWEEP, "report", str(sweep_dir)], cwd=tmp_path)
    assert proc.returncode == 1 and "already exists" in proc.stderr and "never overwrites" in proc.stderr
    assert (sweep_dir / "report.md").read_bytes() == before
    proc = run([MEMSWEEP, "report", str(sweep_dir), "--out", str(tmp_path / "r"), "--margin", "6MiB"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"memsweep: report -> {tmp_path / 'r' / 'report.html'}" in proc.stdout
    md = (tmp_path / "r" / "report.md").read_text()
    runs = pq.read_table(sweep_dir / "runs.parquet").to_pylist()
    chosen = re.search(r"\*\*batch sweep \([^)]*\): batch=(\d+)\*\*", md)
    # with 6 MiB kept free only values whose peak is under 2 MiB may be chosen
    if chosen:
        assert CAPACITY - _peak_at(runs, int(chosen.group(1))) >= 6 * 2**20
    else:
        assert "no setting recommended" in md
    proc = run([MEMSWEEP, "report", str(sweep_dir), "--out", str(tmp_path / "x"), "--margin", "lots"], cwd=tmp_path)
    assert proc.returncode == 2 and "invalid margin='lots'" in proc.stderr
    # a margin of at least the capacity: refused (no load could fit under it), naming it and the capacity
    proc = run([MEMSWEEP, "report", str(sweep_dir), "--out", str(tmp_path / "y"), "--margin", "1GiB"], cwd=tmp_path)
    assert proc.returncode == 2 and not (tmp_path / "y").exists() and len(proc.stderr.strip().splitlines()) == 1
    assert f"invalid margin='1GiB': expected a margin below the capacity {CAPACITY} B" in proc.stderr


def test_html_is_self_contained(sweep):
    _, sweep_dir = sweep
    html = (sweep_dir / "report.html").read_text()
    assert not re.search(r"""(src|href)=["'](?!data:|#)""", html), "every resource is embedded"
    assert html.count('<img src="data:image/png;base64,') == len(list((sweep_dir / "report_plots").glob("*.png"))) >= 2
    for section in ("Summary card", "Observed", "Calculated", "Assumed", "Chosen setting", "Raw results"):
        assert f">{section}</h2>" in html


CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
CHROME_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--virtual-time-budget=5000",
]


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (Debian: apt-get install chromium); "
    "the HTML rendering check needs a headless browser",
)
def test_html_renders_in_headless_chromium_with_its_plots(sweep, tmp_path):
    _, sweep_dir = sweep
    url = (sweep_dir / "report.html").as_uri()
    dom = run(
        [
            CHROMIUM,
            *CHROME_FLAGS,
            f"--user-data-dir={tmp_path / 'profile1'}",
            "--enable-logging=stderr",
            "--dump-dom",
            url,
        ],
        cwd=tmp_path,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    total = re.search(r'data-plots-total="(\d+)"', dom.stdout)
    rendered = re.search(r'data-plots-rendered="(\d+)"', dom.stdout)
    assert total and rendered, "the page's load handler did not run: " + dom.stdout[:500]
    assert int(total.group(1)) >= 2 and rendered.group(1) == total.group(1), "every plot decoded"
    assert 'data-errors="0"' in dom.stdout
    assert "Uncaught" not in dom.stderr, dom.stderr[-2000:]
    shot = tmp_path / "report.png"
    proc = run(
        [
            CHROMIUM,
            *CHROME_FLAGS,
            f"--user-data-dir={tmp_path / 'profile2'}",
            "--window-size=1280,2400",
            f"--screenshot={shot}",
            url,
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0 and shot.stat().st_size > 20_000, proc.stderr[-2000:]
    keep = os.environ.get("MEMSWEEP_KEEP_SCREENSHOT")  # a path, to look at the page by eye
    if keep:
        shutil.copy(shot, keep)


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (Debian: apt-get install chromium); "
    "the first-screen check needs a headless browser",
)
def test_answer_and_main_plot_are_on_the_first_screen(sweep, tmp_path):
    """At 1280 x 1000 CSS pixels the answer's words and numbers and the main plot end within the
    first 1,000 pixels of the page (positions written into the page by its own load handler)."""
    _, sweep_dir = sweep
    (row,) = [r for r in pq.read_table(sweep_dir / "frontier.parquet").to_pylist() if r["axis"] == "batch"]
    dom = run(
        [
            CHROMIUM,
            *CHROME_FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1280,1000",
            "--dump-dom",
            (sweep_dir / "report.html").as_uri(),
        ],
        cwd=tmp_path,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    answer_bottom = re.search(r'data-answer-bottom="(\d+)"', dom.stdout)
    plot_bottom = re.search(r'data-main-plot-bottom="(\d+)"', dom.stdout)
    assert answer_bottom and plot_bottom, "the answer block or its plot is missing: " + dom.stdout[:800]
    assert int(answer_bottom.group(1)) <= 1000 and int(plot_bottom.group(1)) <= 1000
    answer = dom.stdout.split('id="answer"', 1)[1].split("</section>", 1)[0]
    assert f"batch={row['max_ok']} fits; batch={row['min_oom']} runs out of memory" in re.sub(r"<[^>]+>", "", answer)
    assert 'id="main-plot"><img src="data:image/png;base64,' in answer
    runs = pq.read_table(sweep_dir / "runs.parquet").to_pylist()
    m = re.search(r"Recommended: <strong>batch=(\d+)</strong>", answer)
    assert m, answer[:1500]
    peak = _peak_at(runs, int(m.group(1)))
    headroom = CAPACITY - peak
    assert f"headroom <strong>{headroom} B ({gib(headroom)} GiB), {pct(headroom, CAPACITY)}</strong>" in answer
