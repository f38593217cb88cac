"""Measured throughput from the warm phases' iteration times (conf.contract.throughput), in the
runs and frontier tables (analysis.throughput), the report's answer and section, and compare's
--fail-slower and --counter gates: unit tests on written records and rows (no timing of this machine)."""

from fractions import Fraction
from types import SimpleNamespace

import pytest

from memsweep.analysis.compare.match import GATE_COUNTERS
from memsweep.analysis.compare.speed import parse_slower, rate_changes, slowdowns, speed_lines
from memsweep.analysis.throughput import frontier_throughput, throughput_columns, value_rates
from memsweep.conf.contract import (
    THROUGHPUT_KEYS,
    SpecError,
    measured_throughput,
    rate_summary,
    throughput_words,
    timed_on,
)


def _record(mode="inference", phases=(), outcome="ok", source="measured", workload="mlp", **spec):
    spec = {"mode": mode, "batch": 8, "context": 16, "new_tokens": 4, "workload": {"name": workload}, **spec}
    return {"spec": spec, "outcome": outcome, "source": source, "phases": list(phases), "global_batch": None}


def _sub(parent, sub_phase, step, seconds):
    return {
        "name": f"{parent}.{sub_phase}",
        "parent": parent,
        "sub_phase": sub_phase,
        "step": step,
        "iteration_s": [seconds],
    }


def test_inference_rates_are_the_median_of_the_warm_forwards_and_their_spread():
    rec = _record(
        phases=[{"name": "warmup", "iteration_s": [9.0]}, {"name": "warm_forward", "iteration_s": [1.0, 2.0, 4.0]}]
    )
    t = measured_throughput(rec)
    assert set(t) == set(THROUGHPUT_KEYS)
    assert t["samples_per_s"] == 4.0  # 8/1, 8/2, 8/4: median 4 (the warmup is not timed)
    assert t["tokens_per_s"] == 4.0 * 16 and t["iterations"] == 3
    assert t["noise_rel"] == pytest.approx(2 / 4)  # |8-4|, |4-4|, |2-4| -> median 2
    assert t["prefill_tokens_per_s"] is None and t["decode_tokens_per_s"] is None


def test_a_training_step_is_its_sub_phases_summed_over_the_global_batch():
    phases = [_sub("cold_step", "forward", 0, 50.0)]
    for step, (f, b) in enumerate([(0.5, 1.5), (1.0, 3.0)]):
        phases += [_sub("warm_step", "forward", step, f), _sub("warm_step", "backward", step, b)]
    rec = _record("train", phases)
    rec["global_batch"] = 32
    t = measured_throughput(rec)
    assert t["iterations"] == 2 and t["samples_per_s"] == pytest.approx((32 / 2 + 32 / 4) / 2)


def test_generate_times_prefill_and_decode_apart():
    phases = [_sub("warm_generate", "prefill", 0, 0.5), _sub("warm_generate", "decode", 0, 2.0)]
    t = measured_throughput(_record("generate", phases))
    assert t["prefill_tokens_per_s"] == 8 * 16 / 0.5 and t["decode_tokens_per_s"] == 8 * 4 / 2.0
    assert t["samples_per_s"] == 8 / 2.5 and t["tokens_per_s"] == pytest.approx(8 / 2.5 * (16 + 4))
    assert t["noise_rel"] is None, "one generation has no spread"


@pytest.mark.parametrize(
    "changes",
    [
        {"outcome": "oom"},
        {"source": "predicted"},
        {"phases": []},
        {"phases": [{"name": "warm_forward", "iteration_s": [0.0]}]},
    ],
)
def test_nothing_measured_is_null_never_zero(changes):
    rec = {**_record(phases=[{"name": "warm_forward", "iteration_s": [1.0]}]), **changes}
    assert measured_throughput(rec) == dict.fromkeys(THROUGHPUT_KEYS)


def test_a_user_workload_has_samples_but_no_tokens():
    t = measured_throughput(_record(workload="user", phases=[{"name": "warm_forward", "iteration_s": [2.0]}]))
    assert t["samples_per_s"] == 4.0 and t["tokens_per_s"] is None


def test_rate_summary_is_median_and_mad_over_median():
    assert rate_summary([10.0]) == (10.0, None)
    assert rate_summary([9.0, 10.0, 12.0]) == (10.0, 1 / 10)


def test_runs_columns_read_the_record_and_older_records_from_their_phases():
    rec = _record(phases=[{"name": "warm_forward", "iteration_s": [1.0, 1.0]}])
    older = throughput_columns(rec, "ok")  # no "throughput" key: computed from the phases
    assert older["samples_per_s"] == 8.0 and older["throughput_iterations"] == 2 and older["throughput_noise_rel"] == 0
    rec["throughput"] = {**dict.fromkeys(THROUGHPUT_KEYS), "samples_per_s": 3.0, "iterations": 7}
    assert throughput_columns(rec, "ok")["samples_per_s"] == 3.0
    assert set(throughput_columns(rec, "timeout").values()) == {None}, "a run that did not end ok has no rate"


def _row(batch, rate, outcome="ok", noise=0.01):
    return {"batch": batch, "outcome": outcome, "samples_per_s": rate, "throughput_noise_rel": noise}


def test_frontier_throughput_at_the_edges_and_the_fastest_value():
    rows = [_row(4, 10.0), _row(8, 30.0), _row(8, 20.0), _row(16, 24.0), _row(32, None, "oom")]
    assert value_rates(rows, "batch")[8] == (25.0, 0.01)
    out = frontier_throughput(rows, "batch", "max_ok", 16, 8)
    assert out["max_ok_samples_per_s"] == 24.0 and out["margin_edge_samples_per_s"] == 25.0
    assert out["fastest_label"] == "8" and out["fastest_samples_per_s"] == 25.0 and out["min_ok_samples_per_s"] is None
    assert frontier_throughput([_row(4, None)], "batch", "max_ok", 4, None)["fastest_label"] is None


def _ctx(context, samples, workload="mlp", tokens=True):
    """A context-sweep run row: ``samples`` samples/s, each sample ``context`` tokens (none: a user
    workload's context counts no tokens)."""
    return {
        "context": context, "outcome": "ok", "workload": workload, "samples_per_s": samples,
        "tokens_per_s": samples * context if tokens else None, "throughput_noise_rel": 0.01,
    }  # fmt: skip


def test_along_context_the_fastest_is_the_most_tokens_per_second():
    rows = [_ctx(8, 7000.0), _ctx(16, 5600.0), _ctx(32, 6000.0)]  # samples/s fall, tokens/s rise
    out = frontier_throughput(rows, "context", "max_ok", 32, None)
    assert out["fastest_label"] == "32" and out["fastest_samples_per_s"] == 6000.0  # the column: samples/s
    user = [_ctx(v, r, "user", tokens=False) for v, r in ((8, 7000.0), (16, 5600.0), (32, 6000.0))]
    assert frontier_throughput(user, "context", "max_ok", 32, None)["fastest_label"] == "8"  # no tokens: samples
    batch = [{**_ctx(8, r), "batch": b} for b, r in ((2, 7000.0), (4, 6000.0))]
    assert frontier_throughput(batch, "batch", "max_ok", 4, None)["fastest_label"] == "2"


def test_the_console_and_the_report_give_tokens_per_second_along_context():
    from memsweep.analysis.outputs import _answer_notes
    from memsweep.analysis.report.throughput import throughput_answer

    row = {
        "axis": "context", "device": "cpu", "workload": "mlp", "mode": "inference", "margin_edge": None,
        "fastest_label": "32", "fastest_samples_per_s": 6000.0,
    }  # fmt: skip
    (fast,) = _answer_notes(row)
    assert fast.startswith("fastest among the ok runs (by tokens/s): context=32, 1.92e+05 tokens/s = 6000 samples/s")
    (gen,) = _answer_notes({**row, "mode": "generate", "new_tokens": 8})
    assert "context=32, 2.4e+05 tokens/s = 6000 samples/s x 40 tokens" in gen
    (searched,) = _answer_notes({**row, "fastest": 32})
    assert "(by samples/s, the throughput search's measure): context=32, 1.92e+05 tokens/s" in searched
    (user,) = _answer_notes({**row, "workload": "user"})
    assert user.startswith("fastest among the ok runs: context=32, 6000 samples/s (measured")
    runs = [_ctx(8, 7000.0), _ctx(16, 5600.0), _ctx(32, 6000.0)]
    axis = SimpleNamespace(
        runs=runs, axis="context", kind="cpu", capacity=None, recommended=16, stat=lambda value: None,
        frontier={"fastest_label": "32", "fastest_samples_per_s": 6000.0},
    )  # fmt: skip
    (sentence,) = throughput_answer(axis)
    assert "**context=32 is 2.14x faster than context=16**" in sentence and "1.92e+05 vs 8.96e+04 tokens/s" in sentence


def test_a_cpu_timing_says_so():
    assert timed_on("cpu", "x86_64") == "timed on CPU"
    assert timed_on("cuda", "NVIDIA H100") == "timed on NVIDIA H100 (cuda)"
    line = throughput_words({"samples_per_s": 812.3, "iterations": 1, "noise_rel": None}, timed_on("cpu", None))
    assert (
        line == "throughput (measured, timed on CPU): 812.3 samples/s; median of 1 warm iterations, "
        "no spread (one iteration)"
    )
    assert throughput_words(dict.fromkeys(THROUGHPUT_KEYS), "timed on CPU") is None


def _comparison(base_rates, other_rates, comparable=True):
    sweep_a, sweep_b = SimpleNamespace(label="A"), SimpleNamespace(label="B")
    base = SimpleNamespace(sweep=sweep_a, axis="batch", by_value={b: [_row(b, r)] for b, r in base_rates.items()})
    other = SimpleNamespace(sweep=sweep_b, axis="batch", by_value={b: [_row(b, r)] for b, r in other_rates.items()})
    rows = [SimpleNamespace(value=v) for v in base_rates]
    return SimpleNamespace(base=base, other=other, comparable=comparable, rows=rows, title="batch sweep")


def test_fail_slower_flags_a_fall_beyond_the_percentage_only():
    c = _comparison({4: 100.0, 8: 100.0, 16: 100.0}, {4: 96.0, 8: 94.0, 16: None})
    assert [s.value for s in rate_changes([c])] == ["batch=4", "batch=8"], "a value without a rate is not gated"
    (slow,) = slowdowns([c], parse_slower("5%"))
    assert slow.value == "batch=8" and slow.change == pytest.approx(-0.06)
    assert slowdowns([c], Fraction(0)) and not slowdowns([_comparison({4: 1.0}, {4: 1.0})], Fraction(0))
    assert "FAILED, 1 value(s)" in speed_lines(rate_changes([c]), "5%", [slow])[-2]
    assert not rate_changes([_comparison({4: 1.0}, {4: 2.0}, comparable=False)]), "another device: no rate compared"


@pytest.mark.parametrize("text", ["5", "fast", "-5%", "64MiB"])
def test_fail_slower_refuses_anything_but_a_percentage(text):
    with pytest.raises(SpecError, match="--fail-slower"):
        parse_slower(text)


def test_the_memory_gate_reads_the_allocated_peak_unless_told():
    import inspect

    from memsweep.analysis.compare.compare import compare

    assert GATE_COUNTERS[inspect.signature(compare).parameters["counter"].default] == "max_memory_allocated"
    assert GATE_COUNTERS["reserved"] == "max_memory_reserved"


def test_each_iteration_is_timed_between_two_synchronizations(monkeypatch, tmp_path):
    """worker.protocol: the device is synchronized before the clock starts and before it stops
    (kernels run asynchronously: a clock read without waiting times the launch, not the work)."""
    from memsweep.worker import protocol

    calls = []

    class Counters:
        def synchronize(self):
            calls.append("sync")

        def reset_peak_memory_stats(self):
            calls.append("reset")

        def __getattr__(self, name):
            return lambda: None

    clock = iter(range(100))
    monkeypatch.setattr(protocol.time, "perf_counter", lambda: calls.append("clock") or float(next(clock)))
    result = protocol.run_phase(Counters(), "warm_forward", lambda: calls.append("body"), 2, None, tmp_path / "r.json")
    assert result.error is None and result.record["iteration_s"] == [1.0, 1.0]
    timed = calls[calls.index("reset") :]
    assert timed[:8] == ["reset", "clock", "clock", "body", "sync", "clock", "clock", "body"]
    assert timed[8:10] == ["sync", "clock"], "the clock stops after the device finished the iteration"
    assert calls.index("sync") < calls.index("reset"), "the queued work is waited for before the phase starts"


def test_compare_refuses_a_bad_fail_slower_before_reading_anything(tmp_path, capsys):
    from memsweep.analysis.compare import EXIT_BAD_INPUT, main

    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--fail-slower", "5"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "--fail-slower" in err and "5%" in err and len(err.strip().splitlines()) == 1


def _timed_rows(sweep_dir, grow=1.0):
    """tests/test_visual.py's crowded hf batch search, each ok run with measured rates."""
    from tests.test_visual import _sweep_rows

    runs, phases = _sweep_rows(sweep_dir, grow)
    for r in runs:
        ok = r["outcome"] == "ok"
        rate = min(r["batch"], 64) * 100.0 / grow if ok else None
        r.update(samples_per_s=rate, tokens_per_s=rate * 512 if ok else None, throughput_noise_rel=0.02 if ok else None)
        r.update(throughput_iterations=5 if ok else None)
    return runs, phases


@pytest.mark.skipif(__import__("tests.chromium").chromium.CHROMIUM is None, reason="chromium is not installed")
def test_the_throughput_section_and_compare_table_fit_1280_px(tmp_path):

    from memsweep.analysis.compare import compare, compare_document, parse_slower, plot, write_doc
    from memsweep.analysis.report import build_report, parse_margin, write_report
    from tests.test_report_unit import tables
    from tests.test_visual import LONG_DIR, _assert_fits_the_window, parquet_sweeps

    report = build_report(*tables(*_timed_rows(f"/tmp/{LONG_DIR}")), parse_margin(None))
    _, html_path = write_report(report, tmp_path / "report")
    html = html_path.read_text()
    assert "Throughput beside memory" in html and "Throughput (measured, timed on NVIDIA H200 (cuda))" in html
    _assert_fits_the_window(html_path.as_uri(), tmp_path, "report")
    dirs = parquet_sweeps(tmp_path, _timed_rows)
    result = compare(dirs, fail_slower=parse_slower("5%"))
    assert result.slowdowns and len(result.slowdowns) == len(result.rates)  # every rate fell 1/6
    _, cmp_html = write_doc(compare_document(result, None, "5%", plot), tmp_path / "cmp")
    assert "gate --fail-slower 5%: FAILED" in cmp_html.read_text()
    _assert_fits_the_window(cmp_html.as_uri(), tmp_path, "compare")


def _axis(rates: dict, noise: float | None, recommended: int):
    """An AxisResult stand-in of a batch axis timed on the CPU: ``rates`` value -> samples/s."""
    from types import SimpleNamespace

    runs = [
        {"batch": v, "outcome": "ok", "samples_per_s": r, "throughput_noise_rel": noise, "device_name": None}
        for v, r in rates.items()
    ]
    best = max(rates, key=rates.__getitem__)
    return SimpleNamespace(
        runs=runs,
        axis="batch",
        kind="cpu",
        capacity=None,
        recommended=recommended,
        frontier={"fastest_label": str(best), "fastest_samples_per_s": rates[best]},
        stat=lambda value: None,
    )


@pytest.mark.parametrize(
    "rates, noise, same",
    [
        ({11: 788.5, 14: 788.5}, None, True),  # a tie, noise not measured
        ({11: 800.0, 14: 790.0}, 0.02, True),  # 1.3 % faster, within a 2 % noise
        ({11: 900.0, 14: 790.0}, 0.02, False),  # 14 % faster: beyond the noise
    ],
)
def test_the_answer_says_as_fast_when_the_fastest_is_within_the_noise(rates, noise, same):
    from memsweep.analysis.report.throughput import throughput_answer

    (sentence,) = throughput_answer(_axis(rates, noise, recommended=14))
    assert ("is as fast as the fastest measured" in sentence) is same
    assert ("x faster than" in sentence) is not same


def test_the_answer_never_calls_a_slower_value_the_fastest():
    """A report of another margin recommends a value the sweep's row did not weigh: measured faster
    than the row's fastest, it is said to be faster (a new user read 'batch=181 is as fast as the
    fastest measured, batch=180 (1.404e+05 vs 1.194e+05 samples/s: a difference within the noise,
    - and -)'), and the fastest of a searched margin is named as the fastest inside it."""
    from memsweep.analysis.report.throughput import throughput_answer

    axis = _axis({180: 1.194e5, 181: 1.404e5}, None, recommended=181)
    axis.frontier["fastest_label"], axis.frontier["fastest_samples_per_s"] = "180", 1.194e5
    (sentence,) = throughput_answer(axis)
    assert "**batch=181** is faster than the fastest the sweep measured among the ok runs, batch=180" in sentence
    assert "1.404e+05 vs 1.194e+05 samples/s" in sentence and "as fast as" not in sentence and "noise" not in sentence
    axis.recommended, axis.frontier["margin_edge"] = 180, 180
    (same,) = throughput_answer(axis)
    assert "the recommended **batch=180** is also the fastest measured inside the margin, 1.194e+05" in same
    tie = _axis({11: 788.5, 14: 788.5}, None, recommended=14)
    (sentence,) = throughput_answer(tie)
    assert "a difference under 0.5 %, the noise not measured" in sentence and "- and -" not in sentence
