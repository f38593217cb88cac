"""The frontier sweeper's bookkeeping with a scripted launcher (no worker processes):
run directories keyed by spec, resume, confirmation, stops, decisions log, settings."""

import re

import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from memsweep.conf.contract import RunSpec, SpecError, predicted_outcome, run_peak, write_json_atomic
from memsweep.sweeper.errors import InputRefused
from memsweep.sweeper.frontier_runs import RunIndex, launcher_slots, oom_said, spec_key
from memsweep.sweeper.frontier_settings import check_sweep_choice
from memsweep.sweeper.frontier_sweeper import FrontierSweeperImpl
from memsweep.sweeper.search import ERRORS_IN_A_ROW
from tests.data.loads import search_events

CAP = 64 * 2**20
BASE = dict(batch=8, context=64, width=64, device="cpu", capacity_bytes=CAP, warmup=1, repeats=1, threads=1)


def spec_of(overrides):
    fields = dict(BASE)
    for o in overrides:
        key, value = o.split("=", 1)
        if key in ("batch", "context", "width"):
            fields[key] = int(value)
    return RunSpec(**fields)


class ScriptedLauncher:
    """Writes what a worker would leave (spec, record with one phase, result) from ``oracle``:
    (axis values dict) -> outcome; peak = 1000 * batch * context bytes."""

    def __init__(self, sweep_dir, oracle, source="measured", said=None):
        self.sweep_dir, self.oracle, self.calls, self.source, self.said = sweep_dir, oracle, [], source, said

    def launch(self, job_overrides, initial_job_idx):
        returns = []
        for overrides in job_overrides:
            self.calls.append(list(overrides))
            subdir = next(o.split("=", 1)[1] for o in overrides if o.startswith("hydra.sweep.subdir="))
            run_dir = self.sweep_dir / subdir
            run_dir.mkdir(parents=True, exist_ok=True)
            assert not (run_dir / "result.json").exists()  # a finished run is never run again
            spec = spec_of([o for o in overrides if not o.startswith("hydra.")])
            outcome = self.oracle(spec)
            peak = 1000 * spec.batch * spec.context
            phase = {"name": "cold_forward", "max_memory_allocated": peak if outcome == "ok" else None}
            if outcome == "oom" and self.said is not None:  # what the OOM said, as the worker records it
                phase.update(status="oom", **self.said(spec))
            write_json_atomic(run_dir / "spec.json", spec.to_dict())
            record = {
                "schema_version": 1,
                "complete": True,
                "outcome": outcome,
                "device_kind": "cpu",
                "capacity_bytes": CAP,
                "source": self.source,
                "phases": [phase],
            }
            write_json_atomic(run_dir / "record.json", record)
            envelope = {
                "schema_version": 1,
                "outcome": outcome,
                "failed_phase": None,
                "error_type": None,
                "error_message": None if outcome == "ok" else f"scripted {outcome}",
                # a dry run's verdict, as sweeper.process writes it
                "predicted_outcome": (
                    predicted_outcome(outcome, run_peak(record)[0], CAP) if self.source == "predicted" else None
                ),
            }
            write_json_atomic(run_dir / "result.json", envelope)
            r = JobReturn(overrides=overrides, status=JobStatus.COMPLETED)
            r.return_value = envelope
            returns.append(r)
        return returns


def make(tmp_path, oracle, launcher=None, said=None, **settings):
    impl = FrontierSweeperImpl(**settings)
    # isolation=spawn: the fork server started for the scripted launcher imports no torch (conf/config.yaml: forkserver)
    impl.config = OmegaConf.create(
        {"isolation": "spawn", "hydra": {"sweep": {"dir": str(tmp_path)}, "launcher": launcher or {}}}
    )
    impl.launcher = ScriptedLauncher(tmp_path, oracle, said=said)
    impl.fixed_overrides = lambda arguments: list(arguments)
    impl.compose = spec_of
    return impl


def edge_at(limit):
    return lambda spec: "ok" if spec.batch * spec.context <= limit else "oom"


def test_search_writes_runs_keyed_by_spec_and_its_decisions(tmp_path):
    impl = make(tmp_path, edge_at(64 * 300), lower=1, upper=1024, confirm=0)
    impl.sweep([])
    (result,) = search_events(tmp_path, "result")
    assert (result["max_ok"], result["min_oom"], result["exact"]) == (300, 301, True)
    assert result["stable"] is None  # confirm=0: nothing re-run, not checked (the table's null)
    assert result["fixed"] == {
        "batch": None,
        "context": 64,
        "width": 64,
        "dtype": "float32",
        "eval_batch": None,  # an axis too (conf.contract.AXES): the analysis keys a row by every axis
        "world_size": 1,  # likewise (DDP/FSDP ranks; 1 = one process)
        "mode": "inference",
        "device": "cpu",
        "warmup": 1,
        "repeats": 1,
    }
    assert result["capacity_bytes"] == CAP and "max_memory_allocated" in result["peak_counter"]
    probes = search_events(tmp_path, "probe")
    assert len(probes) == result["runs_used"] and all(p["reason"] and p["outcome"] for p in probes)
    for p in probes:
        assert re.fullmatch(rf"batch_{p['value']}_{p['spec_key']}", p["run_dir"].rsplit("/", 1)[1])
        assert p["spec_key"] == spec_key(spec_of([f"batch={p['value']}"]))
        assert p["peak_counter"] == "max_memory_allocated"


def dry_runs(tmp_path, **settings):
    """A frontier sweeper whose probes are dry runs: the worker's outcome is always ok (fake
    tensors never run out of memory), the predicted peak 1000 * batch * context bytes."""
    impl = make(tmp_path, lambda spec: "ok", **settings)
    impl.launcher = ScriptedLauncher(tmp_path, lambda spec: "ok", source="predicted")
    return impl


def test_a_dry_run_search_reads_the_predicted_peak_against_the_capacity(tmp_path):
    edge = CAP // (1000 * BASE["context"])  # the largest batch whose predicted peak fits: 1048
    dry_runs(tmp_path, lower=1, upper=4096, confirm=0).sweep([])
    (result,) = search_events(tmp_path, "result")
    assert (result["max_ok"], result["min_oom"], result["exact"]) == (edge, edge + 1, True)
    assert not result["upper_reached"]
    probes = search_events(tmp_path, "probe")
    assert all((p["outcome"] == "ok") == (p["value"] <= edge) for p in probes)


def test_a_dry_run_search_with_every_value_predicted_above_the_capacity_finds_nothing_fits(tmp_path):
    dry_runs(tmp_path, lower=2000, upper=4096, confirm=0).sweep([])
    (result,) = search_events(tmp_path, "result")
    assert result["max_ok"] is None and result["min_oom"] == 2000 and not result["upper_reached"]
    assert result["status"].startswith("lower bound does not fit"), result["status"]
    assert all(p["outcome"] == "oom" for p in search_events(tmp_path, "probe"))


def test_a_dry_run_search_says_predicted_and_runs_no_confirmation(tmp_path, monkeypatch, caplog):
    """A dry run is deterministic: re-running the edge would repeat the same prediction, so
    ``confirm`` runs nothing; the console line and the result event say the edge is predicted."""

    measured = spec_of

    def spec_of_dry(overrides):
        return RunSpec(**{**vars(measured(overrides)), "dry_run": True})

    impl = dry_runs(tmp_path, lower=1, upper=4096, confirm=2)
    impl.compose = spec_of_dry
    monkeypatch.setattr(__import__(__name__), "spec_of", spec_of_dry)
    with caplog.at_level("INFO", logger="memsweep"):
        impl.sweep([])
    (result,) = search_events(tmp_path, "result")
    assert result["source"] == "predicted" and result["exact"]
    assert result["stable"] is None and result["confirm_outcomes"] == {}
    assert not search_events(tmp_path, "confirm") and len(impl.launcher.calls) == result["runs_used"]
    (line,) = [r.getMessage() for r in caplog.records if "confirmation run(s)" in r.getMessage()]
    assert "PREDICTED" in line and "and 0 more confirmation run(s)" in line
    assert line.endswith("stable: not checked (dry runs are deterministic: a re-run repeats the same prediction)")


def test_resume_reuses_every_run_and_never_overwrites(tmp_path):
    make(tmp_path, edge_at(64 * 300), lower=1, upper=1024, confirm=0).sweep([])
    before = sorted(p.name for p in tmp_path.iterdir())
    again = make(tmp_path, lambda spec: pytest.fail("a run was launched again"), lower=1, upper=1024, confirm=0)
    again.sweep([])
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    first, second = search_events(tmp_path, "result")
    assert second["runs_reused"] == second["runs_used"] == first["runs_used"]
    assert (second["max_ok"], second["min_oom"]) == (first["max_ok"], first["min_oom"])


def test_resume_after_an_interrupted_run_runs_it_in_its_directory(tmp_path):
    impl = make(tmp_path, edge_at(64 * 300), strategy="bisect", lower=1, upper=1024, confirm=0)
    key = spec_key(spec_of(["batch=1"]))
    (tmp_path / f"batch_1_{key}").mkdir()
    write_json_atomic(tmp_path / f"batch_1_{key}" / "spec.json", spec_of(["batch=1"]).to_dict())  # no result
    other = spec_key(spec_of(["batch=2"]))
    (tmp_path / f"batch_2_{other}").mkdir()  # a directory of that name holding another condition
    write_json_atomic(tmp_path / f"batch_2_{other}" / "spec.json", spec_of(["batch=3"]).to_dict())
    impl.sweep([])
    assert (tmp_path / f"batch_1_{key}" / "result.json").exists()  # resumed in place
    assert not (tmp_path / f"batch_1_{key}_2").exists()
    assert (tmp_path / f"batch_2_{other}_2" / "result.json").exists()  # bisect grows 1, 2, 4...


def test_confirmation_flip_marks_the_edge_unstable(tmp_path):
    seen = {}

    def flaky(spec):  # 300 fits the first time, then runs out of memory
        seen[spec.batch] = seen.get(spec.batch, 0) + 1
        if spec.batch == 300 and seen[300] > 1:
            return "oom"
        return edge_at(64 * 300)(spec)

    impl = make(tmp_path, flaky, lower=1, upper=1024, confirm=2)
    impl.sweep([])
    (result,) = search_events(tmp_path, "result")
    assert result["stable"] is False and "UNSTABLE" in result["status"]
    assert result["exact"] is False  # a flip: no single edge, whatever the search found first
    assert result["confirm_outcomes"] == {"300": ["oom", "oom"], "301": ["oom", "oom"]}
    assert len(search_events(tmp_path, "confirm")) == 4
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("batch_300_")]) == 3


def test_confirmation_agrees(tmp_path):
    make(tmp_path, edge_at(64 * 300), lower=1, upper=1024, confirm=1).sweep([])
    (result,) = search_events(tmp_path, "result")
    assert result["stable"] is True and result["confirm_outcomes"] == {"300": ["ok"], "301": ["oom"]}
    assert result["source"] == "measured"


@pytest.mark.parametrize("failure", ["error", "crash", "timeout"])
def test_failure_stops_the_axis_and_the_next_axis_still_runs(tmp_path, failure):
    oracle = lambda spec: failure if spec.batch >= 100 and spec.context == 64 else edge_at(8 * 2000)(spec)  # noqa
    impl = make(tmp_path, oracle, axes=["batch", "context"], lower=1, upper=4096, confirm=1)
    impl.sweep([])
    batch, context = search_events(tmp_path, "result")
    assert batch["stopped_by"] == failure and batch["min_oom"] is None and batch["stop_value"] >= 100
    assert batch["status"].startswith(f"stopped by {failure}") and not batch["exact"]
    assert not any(c["axis"] == "batch" for c in search_events(tmp_path, "confirm"))  # no confirmation after a stop
    assert context["axis"] == "context" and context["exact"] and context["max_ok"] == 2000
    assert context["fixed"]["batch"] == 8  # the other axes at the baseline


def test_axes_share_runs_of_the_same_condition(tmp_path):
    impl = make(tmp_path, edge_at(10**9), axes=["batch", "context"], lower=8, upper=64, multiple_of=8, confirm=0)
    impl.sweep([])
    batch, context = search_events(tmp_path, "result")
    assert batch["upper_reached"] and context["upper_reached"]
    assert batch["status"].startswith("edge not found below the upper bound")
    # batch=8 context=64 is the baseline: searched on both axes, run once
    reused = [p for p in search_events(tmp_path, "probe") if p["reused"]]
    assert [(p["axis"], p["value"]) for p in reused] == [("context", 64)]


def test_parallel_slots_come_from_the_launcher_or_the_setting(tmp_path, monkeypatch):
    monkeypatch.setattr("memsweep.sweeper.frontier_runs.usable_cores", lambda: 8)  # not this machine's count
    assert launcher_slots(OmegaConf.create({"hydra": {"launcher": {"n_jobs": 3}}}), None) == 3
    assert launcher_slots(OmegaConf.create({"hydra": {"launcher": {"n_jobs": 100000}}}), None) == 8
    assert launcher_slots(OmegaConf.create({"hydra": {"launcher": {"n_jobs": 3}}}), 2) == 2
    assert launcher_slots(OmegaConf.create({"hydra": {"launcher": {"timeout_min": 60}}}), None) == 1
    assert launcher_slots(OmegaConf.create({"hydra": {"launcher": {"n_jobs": -1}}}), None) >= 1
    impl = make(
        tmp_path, edge_at(64 * 3000), launcher={"n_jobs": 3}, strategy="bisect", lower=1, upper=65536, confirm=0
    )
    impl.sweep([])
    rounds = {}
    for p in search_events(tmp_path, "probe"):
        rounds.setdefault(p["round"], []).append(p["value"])
    assert max(len(v) for v in rounds.values()) == 3 and search_events(tmp_path, "start")[0]["slots"] == 3


@pytest.mark.parametrize(
    "settings, field",
    [
        ({"strategy": "random"}, "strategy"),
        ({"axes": ["dtype"]}, "axes"),
        ({"confirm": -1}, "confirm"),
        ({"lower": 100, "upper": 10}, "upper"),
        ({"multiple_of": 0}, "multiple_of"),
        ({"parallel": 0}, "parallel"),
        ({"suspect": "ignore"}, "suspect"),
        ({"bounds": {"context": {"step": 3}}}, "bounds"),
        ({"bounds": {"contxt": {"multiple_of": 64}}}, r"bounds\.contxt=.*searches: batch"),
        ({"axes": ["batch"], "bounds": {"context": {"lower": 16}}}, r"bounds\.context=.*searches: batch"),
        ({"axis": "batch", "axes": ["context"]}, r"invalid hydra\.sweeper\.axes=.*without hydra\.sweeper\.axis"),
        ({"axes": []}, r"invalid hydra\.sweeper\.axes=\[\].*a non-empty list of axes to search, of batch"),
        # a per-axis bound is named as given, not as the global key it overrides
        ({"bounds": {"batch": {"upper": -1}}}, r"invalid hydra\.sweeper\.bounds\.batch\.upper=-1"),
        ({"bounds": {"batch": {"lower": 0}}}, r"invalid hydra\.sweeper\.bounds\.batch\.lower=0"),
        ({"bounds": {"batch": {"multiple_of": 0}}}, r"invalid hydra\.sweeper\.bounds\.batch\.multiple_of=0"),
        ({"bounds": {"batch": {"upper": 10}}, "lower": 20}, r"invalid hydra\.sweeper\.bounds\.batch\.upper=10"),
        ({"light": 2}, r"invalid hydra\.sweeper\.light=2: expected true or false"),
        ({"seed_from_dry_run": 2}, r"invalid hydra\.sweeper\.seed_from_dry_run=2: expected true or false"),
    ],
)
def test_bad_settings_name_the_field(tmp_path, settings, field):
    with pytest.raises(SpecError, match=field):
        make(tmp_path, edge_at(1), **settings).lattices()


def test_an_unknown_setting_is_refused_naming_the_key_and_the_accepted_ones(tmp_path):
    from memsweep.sweeper.errors import InputRefused

    with pytest.raises(InputRefused) as info:  # sweeper.cli: exit 2, not Hydra's TypeError and exit 1
        make(tmp_path, edge_at(1), bogus=1)
    assert info.value.field == "hydra.sweeper.bogus" and info.value.value == 1
    assert "seed_from_dry_run" in info.value.accepted and "multiple_of" in info.value.accepted


def test_per_axis_bounds(tmp_path):
    impl = make(
        tmp_path,
        edge_at(1),
        axes=["batch", "context"],
        lower=1,
        upper=100,
        bounds={"context": {"lower": 16, "upper": 8192, "multiple_of": 16}},
    )
    lat = impl.lattices()
    assert (lat["batch"].lower, lat["batch"].upper, lat["batch"].step) == (1, 100, 1)
    assert (lat["context"].lower, lat["context"].upper, lat["context"].step) == (16, 8192, 16)


def test_run_peak_reads_the_counter_of_the_device():
    phases = [
        {"max_memory_allocated": 10, "max_memory_reserved": 40},
        {"max_memory_allocated": 30, "max_memory_reserved": None},
    ]
    assert run_peak({"device_kind": "cpu", "phases": phases}) == (30, "max_memory_allocated")
    assert run_peak({"device_kind": "cuda", "phases": phases}) == (40, "max_memory_reserved")
    assert run_peak(None) == (None, "max_memory_allocated")


def test_run_index_skips_hidden_and_unfinished_runs(tmp_path):
    spec = spec_of(["batch=4"])
    for name, files in (
        ("a", ("spec.json", "result.json")),
        (".submitit/x", ("spec.json", "result.json")),
        ("b", ("spec.json",)),
    ):
        (tmp_path / name).mkdir(parents=True)
        for f in files:
            write_json_atomic(tmp_path / name / f, spec.to_dict() if f == "spec.json" else {"schema_version": 1})
    index = RunIndex(tmp_path)
    assert index.get(spec_key(spec)) == tmp_path / "a" and index.get(spec_key(spec), 1) is None
    assert index.count() == 1


def test_frontier_table_carries_the_search_columns(tmp_path):
    import io

    from memsweep.analysis.cli import analyze

    # batch: exact edge; context: the lower bound already fails (one value run, still a row)
    oracle = lambda spec: "error" if spec.context >= 128 else edge_at(64 * 300)(spec)  # noqa: E731
    impl = make(
        tmp_path, oracle, axes=["batch", "context"], lower=1, upper=1024, confirm=1, bounds={"context": {"lower": 128}}
    )
    impl.sweep([])
    tables = analyze([tmp_path], out_dir=tmp_path / "out", stream=io.StringIO())
    rows = {r["axis"]: r for r in tables["frontier.parquet"].to_pylist() if r["search_status"]}
    assert set(rows) == {"batch", "context"}
    b, c = rows["batch"], rows["context"]
    assert (b["max_ok"], b["min_oom"], b["exact"], b["stable"], b["strategy"]) == (300, 301, True, True, "model")
    assert b["runs_used"] == search_events(tmp_path, "result")[0]["runs_used"] and b["upper_reached"] is False
    assert b["n_runs"] == b["runs_used"] + 2  # the confirmations are runs of the same group
    # every context errors: the search steps past ERRORS_IN_A_ROW - 1 of them, then stops, naming them
    assert c["stopped_by"] == "error" and c["max_ok"] is None and c["min_oom"] is None
    assert c["n_other"] == ERRORS_IN_A_ROW and c["error_values"] == "128,129,130"
    assert c["search_status"].startswith("stopped by error at context=128: 3 values in a row raised errors")
    assert b["error_values"] is None and b["margin_edge"] == 300  # its peak leaves the default 10 % margin


def light_aware(limit_light, limit_full):
    """Edge by protocol: runs with repeats=1 (light) fit up to limit_light, full ones up to limit_full."""

    def oracle(spec):
        limit = limit_light if spec.repeats == 1 and spec.warmup == 0 else limit_full
        return "ok" if spec.batch * spec.context <= limit else "oom"

    return oracle


def spec_of_with_policy(overrides):
    fields = dict(BASE, warmup=3, repeats=5)
    for o in overrides:
        key, value = o.split("=", 1)
        if key in ("batch", "context", "width", "warmup", "repeats"):
            fields[key] = int(value)
    return RunSpec(**fields)


@pytest.mark.parametrize("full_edge", [300, 280, 320])
def test_light_probes_then_the_full_protocol_at_the_edge(tmp_path, monkeypatch, caplog, full_edge):
    monkeypatch.setattr(__import__(__name__), "spec_of", spec_of_with_policy)
    impl = make(tmp_path, light_aware(64 * 300, 64 * full_edge), lower=1, upper=1024, confirm=1, light=True)
    impl.compose = spec_of_with_policy
    with caplog.at_level("INFO", logger="memsweep"):
        impl.sweep([])
    (result,) = search_events(tmp_path, "result")
    # the full-protocol runs at the edge are in runs_used; confirm=1 re-runs each edge value once more
    (line,) = [r.getMessage() for r in caplog.records if "confirmation run(s)" in r.getMessage()]
    assert f"after {result['runs_used']} search run(s)" in line and "and 2 more confirmation run(s)" in line
    assert (result["max_ok"], result["min_oom"], result["exact"]) == (full_edge, full_edge + 1, True)
    assert result["light"] is True and result["stable"] is True
    light = search_events(tmp_path, "light_probe")
    assert light and all(p["overrides"] == ["warmup=0", "repeats=1"] for p in light)
    assert all("_light_" in p["run_dir"] for p in light)
    verify = search_events(tmp_path, "verify")
    assert [v["value"] for v in verify] == [300, 301]
    if full_edge == 300:
        assert "verified with the full protocol" in result["status"] and not search_events(tmp_path, "probe")
        # confirm=1: one fresh re-run of each edge value after the verification
        assert result["confirm_outcomes"] == {"300": ["ok"], "301": ["oom"]}
        assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == len(light) + 2 + 2
    else:  # searched again with the full protocol, reusing its run at the light edge
        assert "after light probes it disagreed" in result["status"] and search_events(tmp_path, "probe")
    assert result["runs_used"] == len(light) + len(verify) + len(search_events(tmp_path, "probe"))
    # the answer's runs are full-protocol runs
    full_dirs = {p.name for p in tmp_path.iterdir() if p.is_dir() and "_light_" not in p.name}
    assert any(d.startswith(f"batch_{full_edge}_") for d in full_dirs)
    assert any(d.startswith(f"batch_{full_edge + 1}_") for d in full_dirs)


def test_frontier_table_marks_the_full_protocol_row_of_a_light_search(tmp_path, monkeypatch):
    import io

    from memsweep.analysis.cli import analyze

    monkeypatch.setattr(__import__(__name__), "spec_of", spec_of_with_policy)
    impl = make(tmp_path, light_aware(64 * 300, 64 * 280), lower=1, upper=1024, confirm=0, light=True)
    impl.compose = spec_of_with_policy
    impl.sweep([])
    printed = io.StringIO()
    tables = analyze([tmp_path], out_dir=tmp_path / "out", stream=printed)
    rows = [r for r in tables["frontier.parquet"].to_pylist() if r["axis"] == "batch"]
    searched = [r for r in rows if r["search_status"]]
    assert len(rows) == 2 and len(searched) == 1  # light probes' own row, and the answer's
    assert (searched[0]["max_ok"], searched[0]["min_oom"], searched[0]["exact"]) == (280, 281, True)
    # the two rows carry their protocol, and the printed table names it (else they look alike)
    assert sorted((r["warmup"], r["repeats"]) for r in rows) == [(0, 1), (3, 5)]
    text = printed.getvalue()
    assert "warmup=0 repeats=1" in text and "warmup=3 repeats=5" in text


@pytest.mark.parametrize("confirm", [0, 1, 2])
def test_light_confirmations_are_fresh_runs_and_every_output_agrees(tmp_path, monkeypatch, caplog, confirm):
    """After light probes, ``confirm`` re-runs each edge value in new processes beyond the
    verification (none with confirm=0): the console, search.jsonl and frontier.parquet say the
    same about stability."""
    from memsweep.analysis.cli import analyze

    monkeypatch.setattr(__import__(__name__), "spec_of", spec_of_with_policy)
    impl = make(tmp_path, light_aware(64 * 300, 64 * 300), lower=1, upper=1024, confirm=confirm, light=True)
    impl.compose = spec_of_with_policy
    with caplog.at_level("INFO", logger="memsweep"):
        impl.sweep([])
    (result,) = search_events(tmp_path, "result")
    verify, confirms = search_events(tmp_path, "verify"), search_events(tmp_path, "confirm")
    assert len(verify) == 2 and len(confirms) == 2 * confirm
    assert not {c["run_dir"] for c in confirms} & {v["run_dir"] for v in verify}
    assert not any(c["reused"] for c in confirms)
    (line,) = [r.getMessage() for r in caplog.records if "confirmation run(s)" in r.getMessage()]
    assert f"and {2 * confirm} more confirmation run(s)" in line
    (row,) = [
        r
        for r in analyze([tmp_path], out_dir=tmp_path / "out").get("frontier.parquet").to_pylist()
        if r["search_status"]
    ]
    expected = None if confirm == 0 else True  # None: nothing re-run, not checked
    assert result["stable"] is expected and row["stable"] is expected
    assert line.endswith("stable: not checked (nothing re-run)" if confirm == 0 else "stable: yes")


def test_a_run_finished_by_another_orchestrator_after_the_scan_is_reused(tmp_path):
    """Two orchestrators on one directory: a probe the other one finished after this one
    scanned the directory is read, not run a second time."""
    impl = make(tmp_path, edge_at(64 * 300), lower=1, upper=1024, confirm=0, strategy="bisect")
    other = ScriptedLauncher(tmp_path, edge_at(64 * 300))
    name = f"batch_256_{spec_key(spec_of(['batch=256']))}"
    launch = impl.launcher.launch

    def launch_then_the_other_finishes_256(job_overrides, initial_job_idx):
        if not (tmp_path / name).exists():
            other.launch([["batch=256", f"hydra.sweep.subdir={name}"]], 0)
        return launch(job_overrides, initial_job_idx)

    impl.launcher.launch = launch_then_the_other_finishes_256
    impl.sweep([])
    (result,) = search_events(tmp_path, "result")
    assert (result["max_ok"], result["min_oom"], result["exact"]) == (300, 301, True)
    assert not any("batch=256" in call for call in impl.launcher.calls)  # read, not run again
    assert [p for p in search_events(tmp_path, "probe") if p["value"] == 256][0]["reused"] is True
    assert not (tmp_path / f"{name}_2").exists()


def test_oom_said_in_the_units_of_the_peak_counter():
    def run(outcome="oom", **fields):
        return {
            "outcome": outcome,
            "record": {"phases": [{"name": "inputs", "status": "ok"}, {"status": outcome, **fields}]},
        }

    cpu = run(oom_allocated_bytes=700, oom_request_bytes=90)
    assert oom_said(cpu, "max_memory_allocated") == (700, 90)
    # CUDA: the search reads max_memory_reserved, so what was held is allocated + reserved-unallocated
    cuda = run(oom_allocated_bytes=700, oom_request_bytes=90, oom_reserved_unallocated_bytes=50)
    assert oom_said(cuda, "max_memory_reserved") == (750, 90)
    assert oom_said(cpu, "max_memory_reserved") == (None, None)  # reserved not said: nothing
    assert oom_said(run(oom_request_bytes=90), "max_memory_allocated") == (None, None)  # "you tried to allocate"
    assert oom_said(run("error", oom_allocated_bytes=700, oom_request_bytes=90), "max_memory_allocated") == (None, None)
    assert oom_said({"outcome": "oom", "record": None}, "max_memory_allocated") == (None, None)


def test_the_search_reads_what_an_oom_said(tmp_path):
    # fits up to batch 300 although the capacity (64 MiB) would hold ~1048 at 64,000 B a batch
    # element: memory the counter does not see. Each OOM says what it held and asked (the growth
    # in 16 requests); the search learns the usable capacity and needs fewer runs than without.
    usable = 1000 * 64 * 300

    def said(spec):
        piece = 1000 * spec.batch * spec.context // 16
        return {"oom_allocated_bytes": usable // piece * piece, "oom_request_bytes": piece}

    read = make(tmp_path / "read", edge_at(64 * 300), said=said, lower=1, upper=4096, confirm=0)
    read.sweep([])
    silent = make(tmp_path / "silent", edge_at(64 * 300), lower=1, upper=4096, confirm=0)
    silent.sweep([])
    (result,) = search_events(tmp_path / "read", "result")
    assert (result["max_ok"], result["min_oom"], result["exact"]) == (300, 301, True)
    probes = search_events(tmp_path / "read", "probe")
    ooms = [p for p in probes if p["outcome"] == "oom"]
    assert ooms and all(p["oom_held_bytes"] <= usable < p["oom_held_bytes"] + p["oom_request_bytes"] for p in ooms)
    assert any(p.get("usable_bytes") and p["usable_bytes"][1] <= CAP for p in probes)
    assert len(probes) < len(search_events(tmp_path / "silent", "probe"))


def test_a_search_on_the_cpu_without_a_capacity_is_refused(tmp_path):
    impl = make(tmp_path, edge_at(64 * 300), lower=1, upper=1024, confirm=0)
    impl.compose = lambda overrides: RunSpec(**{**BASE, "capacity_bytes": None})
    with pytest.raises(InputRefused, match=r"invalid capacity=None: expected a size on the CPU") as info:
        impl.sweep([])
    assert info.value.field == "capacity" and not list(tmp_path.iterdir())  # refused before anything is written


def test_a_preset_sweep_of_other_axes_is_refused_with_the_frontier_sweeper():
    ovat = OmegaConf.create(
        {"name": "ovat", "axes": {"batch": [1], "context": [8], "width": [8], "dtype": ["float32"]}}
    )
    with pytest.raises(SpecError, match=r"invalid sweep='ovat'.*searches batch") as info:
        check_sweep_choice(["capacity=1GiB", "sweep=ovat"], ovat, ["batch"])
    assert info.value.field == "sweep"
    batch = OmegaConf.create({"name": "batch", "axes": {"batch": [1, 2]}})
    check_sweep_choice(["sweep=batch"], batch, ["batch", "context"])  # the same axis: nothing dropped
    check_sweep_choice(["sweep=none"], OmegaConf.create({"name": "custom", "axes": {}}), ["batch"])
    check_sweep_choice([], ovat, ["batch"])  # the default preset, not given: the frontier names its own axes


@pytest.mark.parametrize(
    "refused, field",
    [
        ({"export": True}, "export"),
        ({"compile": "default"}, "compile"),
        ({"fault": {"phase": "cold_forward", "kind": "raise"}}, "fault"),
    ],
)
def test_a_load_the_dry_run_refuses_leaves_the_search_to_real_probes(tmp_path, caplog, refused, field):
    """seed_from_dry_run=true on a load a dry run refuses (SpecError, before any dry-run worker):
    one line says why there is no seed, search.jsonl records it, the real search finds the edge."""
    impl = make(tmp_path, edge_at(64 * 300), lower=1, upper=1024, confirm=0, seed_from_dry_run=True)
    impl.compose = lambda overrides: RunSpec(**{**vars(spec_of(overrides)), **refused})
    with pytest.raises(SpecError, match=field):  # what the dry run refuses (else this test proves nothing)
        RunSpec(**{**vars(spec_of([])), **refused, "dry_run": True})
    with caplog.at_level("WARNING", logger="memsweep"):
        impl.sweep([])
    (dry,) = search_events(tmp_path, "dry_run")
    assert dry["predicted_max_ok"] is None and dry["dry_runs"] == 0
    assert dry["error"].startswith("SpecError: ") and field in dry["error"]
    (line,) = [r.getMessage() for r in caplog.records if "seed_from_dry_run" in r.getMessage()]
    assert "refuses" in line and field in line and "real probes only" in line
    (result,) = search_events(tmp_path, "result")
    assert (result["max_ok"], result["min_oom"], result["exact"]) == (300, 301, True)
    assert not list((tmp_path / ".dry_run").rglob("spec.json"))  # no dry run started
