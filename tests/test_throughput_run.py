"""Throughput end to end: a tiny real CPU batch sweep (worker processes, emulated capacity) whose
records carry the warm phases' rates, read into runs.parquet and frontier.parquet, named in the
report's answer beside the memory answer and drawn beside the memory curve, and gated by compare.
Nothing here asserts a rate's size: only where each figure comes from (no timed test)."""

import statistics

import pyarrow.parquet as pq
import pytest

from memsweep.conf.contract import THROUGHPUT_KEYS, document_problems, read_json
from tests.data.loads import MEMSWEEP, TINY_CPU
from tests.test_report import CHROME_FLAGS, CHROMIUM, run

BATCHES = (2, 8, 64)  # at 8 MiB, 2 and 8 fit and 64 runs out of memory (the peak grows about linearly)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("throughput")
    args = [a for a in TINY_CPU if not a.startswith("repeats=")] + ["repeats=3", "isolation=forkserver"]
    batches = ",".join(map(str, BATCHES))
    proc = run(
        [MEMSWEEP, "sweep", "sweep=none", f"batch={batches}", "capacity=8MiB", *args, f"hydra.sweep.dir={root}/s"],
        cwd=root,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root / "s"


def test_each_ok_run_records_its_rates_from_its_warm_iterations(sweep):
    runs = pq.read_table(sweep / "runs.parquet").to_pylist()
    ok = [r for r in runs if r["outcome"] == "ok"]
    assert ok and any(r["outcome"] == "oom" for r in runs)
    for r in runs:
        record = read_json(f"{r['run_dir']}/record.json", "record")
        assert not document_problems(record, "record")
        assert set(record["throughput"]) == set(THROUGHPUT_KEYS)
        if r["outcome"] != "ok":
            assert set(record["throughput"].values()) == {None} and r["samples_per_s"] is None
            continue
        (warm,) = [p for p in record["phases"] if p["name"] == "warm_forward"]
        expected = statistics.median(r["batch"] / t for t in warm["iteration_s"])
        assert r["samples_per_s"] == pytest.approx(expected) and r["throughput_iterations"] == 3
        assert r["tokens_per_s"] == pytest.approx(expected * r["context"]) and r["throughput_noise_rel"] is not None
        assert r["prefill_tokens_per_s"] is None and r["decode_tokens_per_s"] is None


def test_the_frontier_names_the_fastest_measured_value(sweep):
    runs = pq.read_table(sweep / "runs.parquet").to_pylist()
    (row,) = [r for r in pq.read_table(sweep / "frontier.parquet").to_pylist() if r["axis"] == "batch"]
    rates = {r["batch"]: r["samples_per_s"] for r in runs if r["outcome"] == "ok"}
    assert row["fastest_label"] == str(max(rates, key=rates.__getitem__))
    assert row["fastest_samples_per_s"] == max(rates.values())
    assert row["max_ok_samples_per_s"] == rates[row["max_ok"]]


def test_the_report_names_both_answers_and_draws_both_curves(sweep):
    md = (sweep / "report.md").read_text()
    answer = md.split("## Answer", 1)[1].split("\n## ", 1)[0] if "## Answer" in md else md
    assert "Throughput (measured, timed on CPU)" in answer
    assert (
        "## Throughput beside memory" in md
        and "timed on CPU" in md
        and "GPU" not in answer.split("Throughput")[1].split("\n")[0]
    )
    assert (sweep / "report_plots" / "throughput_0_batch.png").stat().st_size > 5_000


def test_compare_gates_the_rates_of_a_sweep_with_itself(sweep):
    from memsweep import compare

    result = compare(sweep, sweep, fail_above="0%", fail_slower="0%", counter="reserved")
    assert result.exit_code == 0 and not result.slowdowns and result.details.rates
    assert "gate --fail-slower 0%: passed" in result.text and "gate counter max_memory_reserved" in result.text


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)")
def test_the_throughput_plot_renders_in_headless_chromium(sweep, tmp_path):
    html = (sweep / "report.html").read_text()
    assert "Throughput beside memory" in html
    dom = run(
        [CHROMIUM, *CHROME_FLAGS, f"--user-data-dir={tmp_path / 'p'}", "--dump-dom", (sweep / "report.html").as_uri()],
        cwd=tmp_path,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-errors="0"' in dom.stdout
    total = int(dom.stdout.split('data-plots-total="', 1)[1].split('"', 1)[0])
    rendered = int(dom.stdout.split('data-plots-rendered="', 1)[1].split('"', 1)[0])
    assert total >= 3 and rendered == total, "every plot decoded, the throughput figure among them"
