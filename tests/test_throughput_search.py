"""The throughput objective: the search for the fastest value inside the margin on synthetic
curves (sweeper.search.throughput), its stop rule, the record adapter, the setting's refusal, the
frontier sweeper's hook with a scripted launcher, and one tiny end-to-end sweep on the CPU."""

import io
import math
import random
import statistics
import subprocess
from pathlib import Path

import pytest

from memsweep.analysis.cli import analyze
from memsweep.conf.contract import RunSpec, SpecError, read_json, write_json_atomic
from memsweep.sweeper.frontier_settings import check_search_load
from memsweep.sweeper.frontier_throughput import search_timing, throughput_upper
from memsweep.sweeper.search import Lattice
from memsweep.sweeper.search.throughput import ThroughputSearch, parabola_peak, search_throughput
from tests.data.loads import MEMSWEEP, NO_REPORT, TINY_CPU, search_events
from tests.test_frontier_sweeper import edge_at, make


def lognormal(peak, drop_at_double=0.63):
    s2 = math.log(2) ** 2 / (2 * -math.log(drop_at_double))
    return lambda x: 1000.0 * math.exp(-((math.log(x) - math.log(peak)) ** 2) / (2 * s2))


CLIFF = lambda x: 1000.0 * x / (x + 16) / (1 + (x / 300) ** 4)  # noqa: E731 (a plateau, then a cliff)
CURVES = {
    "plateau": lambda x: 1000.0 * x / (x + 20),
    "rise-fall (vLLM-like, peak at 0.4 of the range)": lognormal(0.4 * 1024),
    "rise-fall, peak low": lognormal(37),
    "rise-cliff": CLIFF,
    "monotone": lambda x: 3.0 * x**0.7,
}


def noisy(curve, nu, rng, samples=10):
    """A run: the median of ``samples`` noisy samples and their MAD/median."""

    def run(x):
        got = [curve(x) * (1 + 1.4826 * nu * rng.gauss(0, 1)) for _ in range(samples)]
        med = statistics.median(got)
        return med, statistics.median(abs(g - med) for g in got) / med

    return run


@pytest.mark.parametrize("name", list(CURVES))
@pytest.mark.parametrize("nu", [0.005, 0.01, 0.03])
def test_the_answer_is_a_run_within_2_percent_of_the_best_in_few_runs(name, nu):
    curve, n = CURVES[name], 1024
    truth = max(curve(x) for x in range(1, n + 1))
    rng = random.Random(7)
    for _ in range(5):
        answer = search_throughput(Lattice(1, n, 1), n, noisy(curve, nu, rng))
        assert answer.best in {t.value for t in answer.timings if not t.known}  # a value that was run
        # within 2 % (at 3 % noise: within 2 % plus the noise the answer reports)
        slack = 0.02 if nu <= 0.01 else 0.02 + answer.noise_rel
        assert curve(answer.best) >= (1 - slack) * truth, answer.status
        assert answer.runs <= 10, answer.status
        assert answer.samples_per_s == max(t.samples_per_s for t in answer.timings)
        assert answer.noise_rel is not None and 0 < answer.noise_rel < 0.2


def test_the_search_stays_on_the_lattice_and_below_the_margin_edge():
    seen = []

    def measure(x):
        seen.append(x)
        return lognormal(300)(x), 0.01

    answer = search_throughput(Lattice(16, 4096, 16), 1200, measure)
    assert seen and all(16 <= x <= 1200 and x % 16 == 0 for x in seen) and len(set(seen)) == len(seen)
    assert answer.upper == 1200 and answer.best in seen


def test_the_stop_rule_honours_the_noise():
    """The same exact curve, reported with a large noise, stops sooner than with none; with none it
    goes on to the true best."""
    curve = CLIFF
    truth = max(curve(x) for x in range(1, 1025))
    runs = {}
    for noise in (0.0, 0.2):
        answer = search_throughput(Lattice(1, 1024, 1), 1024, lambda x, e=noise: (curve(x), e))
        runs[noise] = answer.runs
        assert f"noise {noise:.1%}" in answer.status or "every value between" in answer.status
        assert answer.noise_rel == noise
        if noise == 0.0:
            assert curve(answer.best) == truth
    assert runs[0.2] < runs[0.0]


def test_known_runs_are_read_first_and_not_counted():
    curve, calls = CURVES["plateau"], []

    def measure(x):
        calls.append(x)
        return curve(x), 0.01

    known = {v: (curve(v), 0.01) for v in (256, 512, 1024, 2048)}
    answer = search_throughput(Lattice(1, 4096, 1), 1024, measure, known=known)
    assert answer.known == 3  # 2048 lies above the margin edge
    assert answer.runs == len(calls) and 2048 not in calls and not set(calls) & set(known)


def test_values_without_a_throughput_are_never_the_answer():
    answer = search_throughput(Lattice(1, 64, 1), 64, lambda x: (None, None) if x == 64 else (float(x), 0.01))
    assert answer.best is not None and answer.best < 64
    none = search_throughput(Lattice(1, 8, 1), 8, lambda x: (None, None))
    assert (
        none.best is None and none.samples_per_s is None and none.runs == 2 and "measured no throughput" in none.status
    )


@pytest.mark.parametrize("noise", [None, math.nan])
def test_an_answer_without_a_measured_noise_says_so(noise):
    """One warm iteration gives no spread: the answer says it was not measured (was 'noise nan%')."""
    answer = search_throughput(Lattice(1, 8, 1), 8, lambda x: (float(x), noise))
    assert answer.best is not None and "(noise not measured)" in answer.status and "nan" not in answer.status


def test_the_run_budget_bounds_the_search():
    rng = random.Random(3)
    answer = search_throughput(Lattice(1, 4096, 1), 4096, lambda x: (rng.uniform(1, 2), 0.0), max_runs=5)
    assert answer.runs == 5 and "budget" in answer.status


def test_parabola_peak():
    pts = [(0.0, 0.0), (1.0, 1.0), (2.0, 0.0)]
    assert parabola_peak(pts, 0, 2) == pytest.approx((1.0, 1.0))
    assert parabola_peak(pts, 0, 0.5)[0] == pytest.approx(0.5)  # the vertex outside: the higher end
    assert parabola_peak([(0.0, 0.0), (1.0, 1.0), (2.0, 2.0)], 0, 3) == pytest.approx((3.0, 3.0))


def test_the_first_probes_halve_down_from_the_top():
    search = ThroughputSearch(Lattice(1, 1000, 1), 1000)
    order = []
    for _ in range(3):
        v = search.propose()
        order.append(v)
        search.observe(v, float(v), 0.01)
    assert order == [1000, 500, 250]


@pytest.mark.parametrize(
    "record, expected",
    [
        ({"throughput": {"samples_per_s": 812.5, "noise_rel": 0.021}}, (812.5, 0.021)),
        ({"throughput": {"samples_per_s": None, "noise_rel": None}}, (None, None)),
        ({"throughput": {"samples_per_s": 0.0, "noise_rel": 0.1}}, (None, None)),  # no time measured
        ({"throughput": {"samples_per_s": 10, "noise_rel": -1}}, (10.0, None)),
        ({"throughput": {"samples_per_s": True, "noise_rel": 0.1}}, (None, None)),
        ({}, (None, None)),
        (None, (None, None)),
    ],
)
def test_the_adapter_reads_the_records_throughput(record, expected):
    assert search_timing({"record": record, "outcome": "ok"}) == expected
    assert search_timing({"record": record, "outcome": "oom"}) == (None, None)  # timed only when ok


def test_the_upper_end_is_the_margin_edge():
    assert throughput_upper({"margin_bytes": 10, "margin_edge": 96, "max_ok": 128})[0] == 96
    assert throughput_upper({"margin_bytes": 10, "margin_edge": None, "max_ok": 128})[0] is None
    assert throughput_upper({"margin_bytes": None, "margin_edge": None, "max_ok": 128})[0] == 128
    assert throughput_upper({"stopped_by": "crash", "max_ok": 128})[0] is None


def test_a_bad_objective_is_refused_naming_the_field_and_the_accepted_values(tmp_path):
    with pytest.raises(SpecError, match=r"hydra\.sweeper\.objective='fastest': expected one of edge, throughput"):
        make(tmp_path, edge_at(1), objective="fastest").lattices()


def test_a_throughput_search_of_dry_runs_is_refused():
    spec = RunSpec(batch=8, context=64, width=64, device="cpu", dry_run=True, capacity_bytes=2**30)
    check_search_load(spec)  # the memory edge of dry runs: fine
    with pytest.raises(SpecError, match=r"hydra\.sweeper\.objective='throughput'.*dry run measures no time"):
        check_search_load(spec, "throughput")


def timed(launcher, curve):
    """Wrap a scripted launcher: each ok run's record gets ``throughput`` from ``curve(batch)``."""
    launch = launcher.launch

    def with_throughput(job_overrides, initial_job_idx):
        returns = launch(job_overrides, initial_job_idx)
        for overrides in job_overrides:
            subdir = next(o.split("=", 1)[1] for o in overrides if o.startswith("hydra.sweep.subdir="))
            path = launcher.sweep_dir / subdir / "record.json"
            record = read_json(path, "record")
            batch = int(next(o.split("=", 1)[1] for o in overrides if o.startswith("batch=")))
            ok = record["outcome"] == "ok"
            record["throughput"] = {"samples_per_s": curve(batch) if ok else None, "noise_rel": 0.01 if ok else None}
            write_json_atomic(path, record)
        return returns

    launcher.launch = with_throughput


def test_the_frontier_sweeper_answers_the_fastest_value_inside_the_margin(tmp_path):
    curve = lognormal(90)
    impl = make(tmp_path, edge_at(64 * 300), lower=1, upper=1024, confirm=0, objective="throughput")
    timed(impl.launcher, curve)
    impl.sweep([])
    (result,) = search_events(tmp_path, "result")
    tput, edge = result["throughput"], result["margin_edge"]
    assert edge is not None and tput["upper"] == edge
    assert tput["best"] <= edge and curve(tput["best"]) >= 0.98 * max(curve(x) for x in range(1, edge + 1))
    probes = search_events(tmp_path, "throughput_probe")
    assert tput["runs"] == sum(not p["known"] for p in probes) and tput["known"] == sum(p["known"] for p in probes)
    best = next(p for p in probes if p["value"] == tput["best"])
    assert best["samples_per_s"] == tput["samples_per_s"] and best["outcome"] == "ok" and best["run_dir"]
    assert all(p["reason"] for p in probes)
    assert search_events(tmp_path, "start")[0]["objective"] == "throughput"
    tables = analyze([tmp_path], out_dir=tmp_path / "out", stream=io.StringIO())
    (row,) = [r for r in tables["frontier.parquet"].to_pylist() if r["search_status"]]
    assert (row["fastest"], row["fastest_samples_per_s"]) == (tput["best"], tput["samples_per_s"])
    assert (row["fastest_noise_rel"], row["fastest_runs"]) == (tput["noise_rel"], tput["runs"])


def test_the_default_objective_runs_no_throughput_search(tmp_path):
    impl = make(tmp_path, edge_at(64 * 300), lower=1, upper=1024, confirm=0)
    impl.sweep([])
    (result,) = search_events(tmp_path, "result")
    assert "throughput" not in result and not search_events(tmp_path, "throughput_probe")


def test_a_tiny_cpu_sweep_answers_a_measured_run(tmp_path):
    """End to end: the mlp on the CPU, batch 1..8 at 64 MiB (every value fits: the top is the edge)."""
    sweep_dir = tmp_path / "tput"
    proc = subprocess.run(
        [MEMSWEEP, "sweep", "hydra/sweeper=frontier", "capacity=64MiB", *TINY_CPU, "hydra.sweeper.lower=1"]
        + ["hydra.sweeper.upper=8", "hydra.sweeper.confirm=0", "hydra.sweeper.objective=throughput"]
        + [f"hydra.sweep.dir={sweep_dir}", *NO_REPORT],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    probes = search_events(sweep_dir, "throughput_probe")
    assert any(p["samples_per_s"] is not None for p in probes), probes  # the worker timed its runs
    (result,) = search_events(sweep_dir, "result")
    tput = result["throughput"]
    best = next(p for p in probes if p["value"] == tput["best"])
    assert best["samples_per_s"] == tput["samples_per_s"] and best["outcome"] == "ok"
    assert (
        read_json(Path(best["run_dir"]) / "record.json", "record")["throughput"]["samples_per_s"]
        == tput["samples_per_s"]
    )
    assert "fastest measured" in tput["status"] and tput["runs"] == sum(not p["known"] for p in probes)


def test_the_report_states_the_fastest_value_with_its_noise():
    from types import SimpleNamespace

    from memsweep.analysis.report.sections_observed import _fastest_fact

    frontier = {"fastest": 96, "fastest_samples_per_s": 812.5, "fastest_noise_rel": 0.021, "fastest_runs": 4}
    (fact,) = _fastest_fact(SimpleNamespace(axis="batch", frontier=frontier))
    assert "batch=96 at 812.5 samples/s (noise 2.1%" in fact and "after 4 throughput runs" in fact
    assert _fastest_fact(SimpleNamespace(axis="batch", frontier={"fastest": None})) == []
