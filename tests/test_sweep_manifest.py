"""A sweep knows its own runs (conf.contract.sweep): its manifest, the runs every analysis reads
(a missing one named, nothing foreign mixed in), the checks of its directory before anything
runs, its lock, and the tables published as one set or not at all."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from omegaconf import OmegaConf

from memsweep.analysis.cli import NotASweep, check_out, check_sweeps
from memsweep.analysis.outputs import OUTPUTS, PUBLISHING, publish_set, recover_set
from memsweep.analysis.tables import build_tables
from memsweep.conf.contract import (
    SWEEP_FILE,
    SWEEP_TOKEN_KEY,
    RecordError,
    SpecError,
    hold_sweep_lock,
    read_json,
    register_run,
    start_manifest,
    sweep_running,
    sweep_runs,
)
from memsweep.conf.contract.sweep import read_manifest
from memsweep.sweeper.cli import interrupted_by_signals
from memsweep.sweeper.sweep_dir import check_job_name, check_sweep_layout


def _run_dir(sweep: Path, name: str) -> Path:
    d = sweep / name
    d.mkdir(parents=True)
    (d / "spec.json").write_text(json.dumps({"schema_version": 1, "batch": 1}))
    return d


def test_a_sweep_reads_exactly_its_listed_runs_and_names_a_missing_one(tmp_path):
    sweep = tmp_path / "s"
    sweep.mkdir()
    start_manifest(sweep)
    for name in ("0", "1", "2"):
        register_run(sweep, _run_dir(sweep, name), [f"batch={name}"], "sess")
    _run_dir(sweep, "old/0")  # an older sweep's run below: not this sweep's
    _run_dir(sweep, "9")  # a run directory nobody launched in this sweep
    (sweep / "1" / "spec.json").unlink()  # deleted mid-sweep
    runs = sweep_runs(sweep)
    assert runs.listed and [p.name for p in runs.run_dirs] == ["0", "2"] and runs.missing == [sweep / "1"]
    tables = build_tables([sweep])
    assert sorted(tables.runs.column("run_id").to_pylist()) == ["0", "2"]
    assert any("1: a run of this sweep is missing" in p for p in tables.problems), tables.problems


def test_a_running_sweeps_ended_run_without_its_spec_and_a_linked_run_are_missing(tmp_path):
    """While the sweep runs (its lock held, as during its own end-of-sweep analysis), a run folder
    without spec.json is starting only while it has no result.json; one that ended without it was
    deleted mid-run and is named. A run folder replaced by a link to another sweep's run is not read."""
    sweep, other = tmp_path / "s", tmp_path / "other"
    sweep.mkdir()
    fd = hold_sweep_lock(sweep, "this sweep")
    try:
        for name in ("0", "1", "2", "3"):
            register_run(sweep, _run_dir(sweep, name), [f"batch={name}"], "sess")
        (sweep / "1" / "spec.json").unlink()  # starting: no spec.json yet, no result.json
        (sweep / "2" / "spec.json").unlink()  # deleted mid-run: the worker wrote its result after
        (sweep / "2" / "result.json").write_text("{}")
        (sweep / "3" / "spec.json").unlink()
        (sweep / "3").rmdir()
        (sweep / "3").symlink_to(_run_dir(other, "0"), target_is_directory=True)  # a foreign run put in place
        assert sweep_running(sweep)
        runs = sweep_runs(sweep)
        assert [p.name for p in runs.run_dirs] == ["0"]
        assert sorted(p.name for p in runs.missing) == ["2", "3"]
    finally:
        os.close(fd)


def _launched(sweep: Path, name: str, batch: int) -> Path:
    """A run as a job of the sweep leaves it: registered first, then its spec.json holding its token."""
    from tests.test_analysis_honesty import write_run

    token = register_run(sweep, sweep / name, [f"batch={batch}"], "sess")
    write_run(sweep / name, batch=batch)
    spec = json.loads((sweep / name / "spec.json").read_text())
    (sweep / name / "spec.json").write_text(json.dumps({**spec, SWEEP_TOKEN_KEY: token}))
    return sweep / name


def test_a_run_folder_copied_in_from_another_sweep_is_named_and_not_read(tmp_path):
    """A real folder (spec, record, result) of another sweep copied into a run's place: its spec.json
    holds the other sweep's token, so it is left out with a line naming it; the sweep's own runs,
    re-registered by a resume, keep their token and are read; an older memsweep's run (no token in its
    manifest entry nor in its spec) is read as before."""
    import shutil

    this, other = tmp_path / "this", tmp_path / "other"
    for sweep in (this, other):
        sweep.mkdir()
        start_manifest(sweep)
        for name, batch in (("0", 1), ("1", 2)):
            _launched(sweep, name, batch * (1 if sweep is this else 16))
    assert register_run(this, this / "0", ["batch=1"], "resumed") is not None  # a resume keeps the token
    shutil.rmtree(this / "1")
    shutil.copytree(other / "1", this / "1")  # batch 32, of the other sweep
    tables = build_tables([this])
    assert tables.runs.column("run_id").to_pylist() == ["0"] and tables.runs.column("batch").to_pylist() == [1]
    foreign = [p for p in tables.problems if "not this sweep's run" in p]
    assert len(foreign) == 1 and foreign[0].startswith(f"{this / '1'}:"), tables.problems
    assert tables.runs.column("outcome").to_pylist() == ["ok"], "the token is no spec field: the spec is valid"

    spec = json.loads((this / "1" / "spec.json").read_text())  # a copy from an older sweep: no token
    (this / "1" / "spec.json").write_text(json.dumps({k: v for k, v in spec.items() if k != SWEEP_TOKEN_KEY}))
    assert any("not this sweep's run" in p for p in build_tables([this]).problems)

    data = json.loads((this / SWEEP_FILE).read_text())  # the manifest of an older memsweep: no tokens
    (this / SWEEP_FILE).write_text(json.dumps({**data, "runs": [{**r, "token": None} for r in data["runs"]]}))
    assert sorted(build_tables([this]).runs.column("run_id").to_pylist()) == ["0", "1"]


def test_a_run_registered_where_a_spec_already_is_gets_no_token(tmp_path):
    """A folder that holds a spec.json before its entry exists (a sweep of an older memsweep resumed,
    its manifest new) cannot carry a token: its entry has none, and it is read."""
    _run_dir(tmp_path, "0")
    assert register_run(tmp_path, tmp_path / "0", ["batch=1"], "sess") is None
    assert register_run(tmp_path, tmp_path / "1", ["batch=2"], "sess") is not None  # a new run: a token
    assert sweep_runs(tmp_path).tokens == {}  # (1 has no spec.json yet)


def test_a_manifest_of_very_many_missing_runs_names_a_few_and_counts_the_rest(tmp_path):
    from memsweep.analysis.tables import MISSING_SHOWN, sweep_run_dirs

    sweep = tmp_path / "s"
    sweep.mkdir()
    start_manifest(sweep)
    register_run(sweep, _run_dir(sweep, "0"), ["batch=1"], "sess")
    data = json.loads((sweep / SWEEP_FILE).read_text())
    data["runs"] += [{"run_id": str(i), "overrides": [], "session": "sess"} for i in range(1, 1001)]
    (sweep / SWEEP_FILE).write_text(json.dumps(data))
    problems: list[str] = []
    assert [p.name for p in sweep_run_dirs(sweep, problems)] == ["0"]
    assert len(problems) == MISSING_SHOWN + 1 and f"{1000 - MISSING_SHOWN} more runs" in problems[-1]


def test_without_a_manifest_every_run_below_is_read(tmp_path):
    _run_dir(tmp_path, "a")
    _run_dir(tmp_path, "b/c")
    runs = sweep_runs(tmp_path)
    assert not runs.listed and len(runs.run_dirs) == 2 and runs.missing == []


def test_the_manifest_is_written_atomically_and_keeps_a_resumed_sweeps_runs(tmp_path):
    start_manifest(tmp_path)
    register_run(tmp_path, tmp_path / "0", ["batch=1"], "one")
    start_manifest(tmp_path)  # a resume: the manifest stays
    register_run(tmp_path, tmp_path / "0", ["batch=1"], "two")
    data = read_json(tmp_path / SWEEP_FILE, "sweep")
    assert [r["run_id"] for r in data["runs"]] == ["0"] and data["runs"][0]["session"] == "two"
    assert not list(tmp_path.glob(".sweep.json.*.tmp"))


@pytest.mark.parametrize(
    "run_dir, field",
    [("../x0", "hydra.sweep.subdir"), (".", "hydra.sweep.subdir")],
)
def test_a_run_outside_its_sweep_is_refused(tmp_path, run_dir, field):
    sweep = tmp_path / "s"
    sweep.mkdir()
    with pytest.raises(SpecError) as info:
        register_run(sweep, sweep / run_dir, [], "sess")
    assert info.value.field == field


def test_two_jobs_of_one_session_in_one_directory_collide(tmp_path):
    register_run(tmp_path, tmp_path / "x", ["batch=1"], "sess")
    register_run(tmp_path, tmp_path / "x", ["batch=1"], "sess")  # the same job again: fine
    with pytest.raises(SpecError, match="a folder of its own for each job") as info:
        register_run(tmp_path, tmp_path / "x", ["batch=2"], "sess")
    assert info.value.field == "hydra.sweep.subdir"


@pytest.mark.parametrize(
    "content",
    [
        "{",
        json.dumps({"kind": "sweep", "schema_version": 1, "runs": [{"run_id": "../../etc"}]}),
        json.dumps({"kind": "sweep", "schema_version": 1, "runs": [{"run_id": "0", "token": 5}]}),
        "[1]",
        "[" * 100000,
    ],
)
def test_a_bad_manifest_is_refused_in_words(tmp_path, content):
    (tmp_path / SWEEP_FILE).write_text(content)
    with pytest.raises(RecordError):
        read_manifest(tmp_path)
    with pytest.raises(NotASweep, match="sweep.json"):
        check_sweeps([tmp_path])


def _config(sweep_dir: str, subdir: str = "${hydra.job.num}", name: str = "memsweep"):
    return OmegaConf.create({"hydra": {"sweep": {"dir": sweep_dir, "subdir": subdir}, "job": {"name": name}}})


@pytest.mark.parametrize(
    "sweep_dir, subdir, name, field",
    [
        ("", "${hydra.job.num}", "memsweep", "hydra.sweep.dir"),
        (".", "${hydra.job.num}", "memsweep", "hydra.sweep.dir"),
        ("..", "${hydra.job.num}", "memsweep", "hydra.sweep.dir"),
        ("s", "../../x${hydra.job.num}", "memsweep", "hydra.sweep.subdir"),
        ("s", "/abs/${hydra.job.num}", "memsweep", "hydra.sweep.subdir"),
        ("s", "same", "memsweep", "hydra.sweep.subdir"),
        ("s", "${oc.env:HOME}/x${hydra.job.num}", "memsweep", "hydra.sweep.subdir"),  # absolute once resolved
        ("s", "${oc.env:MEMSWEEP_TEST_UP}${hydra.job.num}", "memsweep", "hydra.sweep.subdir"),  # '..' once resolved
        ("s", "${oc.env:MEMSWEEP_TEST_UNSET}${hydra.job.num}", "memsweep", "hydra.sweep.subdir"),  # unresolvable
        ("s", "${hydra.job.num}", "../../x", "hydra.job.name"),
        ("s", "${hydra.job.num}", "/abs/log", "hydra.job.name"),
        ("s", "${hydra.job.num}", "", "hydra.job.name"),
    ],
)
def test_a_sweep_directory_that_cannot_hold_one_clean_sweep_is_refused(
    tmp_path, monkeypatch, sweep_dir, subdir, name, field
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMSWEEP_TEST_UP", "../../evil")
    monkeypatch.delenv("MEMSWEEP_TEST_UNSET", raising=False)
    with pytest.raises(SpecError) as info:
        check_sweep_layout(_config(sweep_dir, subdir, name), per_job_subdir=True)
    assert info.value.field == field


@pytest.mark.parametrize(
    "subdir",
    [
        "${oc.env:MEMSWEEP_TEST_PREFIX}${hydra.job.num}",  # an environment variable
        "b${batch}_${hydra.job.num}",  # a setting of the sweep's config
        "${hydra.job.id}_${hydra.job.num}",  # another field of the job, known once it runs
    ],
)
def test_a_subdir_whose_interpolations_stay_inside_is_accepted(tmp_path, monkeypatch, subdir):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMSWEEP_TEST_PREFIX", "run_")
    config = _config("s", subdir)
    config.batch = 4
    config.hydra.job.id = "???"  # as in a multirun's config before any job
    assert check_sweep_layout(config, per_job_subdir=True) == tmp_path / "s"


def test_a_sweep_directory_holding_another_sweep_below_its_first_level_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _run_dir(tmp_path / "s", "0")  # its own first level: a resume
    assert check_sweep_layout(_config("s"), per_job_subdir=True) == tmp_path / "s"
    _run_dir(tmp_path / "s", "older/2026-01-01/0")
    with pytest.raises(SpecError, match="a run of another sweep below it") as info:
        check_sweep_layout(_config("s"), per_job_subdir=True)
    assert info.value.field == "hydra.sweep.dir"


def test_job_names_are_file_names():
    check_job_name(_config("s"))
    with pytest.raises(SpecError):
        check_job_name(_config("s", name=".."))


HOLD = textwrap.dedent(
    """
    import sys, time
    from memsweep.conf.contract import hold_sweep_lock
    hold_sweep_lock(sys.argv[1])
    print("held", flush=True)
    time.sleep(600)  # killed by the test; long enough for a slow machine
    """
)


def test_a_running_sweep_is_refused_by_a_second_sweep_and_by_an_analysis_into_it(tmp_path):
    sweep = tmp_path / "s"
    _run_dir(sweep, "0")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(sweep)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        register_run(sweep, sweep / "0", ["batch=1"], None)
        assert sweep_running(sweep)
        with pytest.raises(RuntimeError, match="in use by another sweep"):
            hold_sweep_lock(sweep, "another sweep")
        os.close(hold_sweep_lock(sweep))  # the same sweep: orchestrators share its directory
        with pytest.raises(NotASweep, match="still running"):
            check_sweeps([sweep], sweep)
        check_sweeps([sweep], tmp_path / "elsewhere")  # --out elsewhere: allowed
    finally:
        holder.kill()
        holder.wait()
    assert not sweep_running(sweep)
    check_sweeps([sweep], sweep)


def test_a_root_of_a_file_system_and_an_unwritable_out_are_refused():
    with pytest.raises(NotASweep, match="whole file system"):
        check_sweeps([Path("/")])
    with pytest.raises(NotASweep, match="--out"):
        check_out(Path("/proc/memsweep-out"))


def _tables():
    return {name: pa.table({"x": [1, 2]}) for name in OUTPUTS}


def test_tables_are_published_as_one_set_and_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    publish_set(_tables(), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(OUTPUTS)
    out = tmp_path / "full"
    out.mkdir()
    import pyarrow.parquet as pq

    calls = []
    real = pq.write_table

    def full_disk(table, where, *a, **k):
        calls.append(where)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(table, where, *a, **k)

    monkeypatch.setattr(pq, "write_table", full_disk)
    with pytest.raises(OSError):
        publish_set(_tables(), out)
    assert list(out.iterdir()) == []


def test_a_set_left_partial_by_a_killed_writer_is_undone_and_stale_temps_removed(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no live process
    pid = gone.pid
    (tmp_path / OUTPUTS[0]).write_bytes(b"renamed before the kill")
    (tmp_path / f".{OUTPUTS[1]}.{pid}.tmp").write_bytes(b"")
    (tmp_path / f".{OUTPUTS[2]}.{pid}.tmp").write_bytes(b"")
    (tmp_path / PUBLISHING.format(pid=pid)).write_text(json.dumps(list(OUTPUTS)))
    recover_set(tmp_path)
    assert list(tmp_path.iterdir()) == []
    complete = tmp_path / "complete"
    complete.mkdir()
    publish_set(_tables(), complete)
    (complete / PUBLISHING.format(pid=pid)).write_text(json.dumps(list(OUTPUTS)))  # killed after its renames
    (complete / f".frontier.parquet.{pid + 1}.tmp").write_bytes(b"")  # another dead writer's temporary
    recover_set(complete)
    assert sorted(p.name for p in complete.iterdir()) == sorted(OUTPUTS)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_interrupt_as_ctrl_c_does(signum):
    before = signal.getsignal(signum)
    with pytest.raises(KeyboardInterrupt):
        with interrupted_by_signals():
            os.kill(os.getpid(), signum)
            for _ in range(100):
                pass
    assert signal.getsignal(signum) == before


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_an_analysis_ended_by_a_signal_says_so_in_one_line_and_exits_130(tmp_path, monkeypatch, capsys, signum):
    """``memsweep analyze DIR`` sent SIGTERM (or SIGHUP) while it reads: one line naming the signal,
    exit 130 as a sweep's, nothing published (not a silent 143)."""
    import time

    from memsweep.analysis import cli as analysis_cli
    from memsweep.conf.contract import EXIT_INTERRUPTED
    from memsweep.sweeper.cli import main

    sweep = tmp_path / "s"
    sweep.mkdir()
    start_manifest(sweep)
    _launched(sweep, "0", 1)

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signum)
        time.sleep(5)  # (interrupted at once: the handler raises in this thread)
        raise AssertionError("not interrupted")

    monkeypatch.setattr(analysis_cli, "analyze", signalled)
    before = signal.getsignal(signum)
    assert main(["analyze", str(sweep)]) == EXIT_INTERRUPTED
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"memsweep analyze: interrupted ({signum.name})"), lines
    assert "Traceback" not in lines[0] and not (sweep / "runs.parquet").exists()
    assert signal.getsignal(signum) == before


def _report(pages: int = 0):
    """A small report with two plots (and ``pages`` load pages), built without tables."""
    from memsweep.analysis.doc import Doc, Image
    from memsweep.analysis.report.build import Report

    doc = Doc("memsweep report")
    doc.p("a paragraph")
    for i in range(2):
        doc.image(Image(f"plot{i}.png", b"\x89PNG" + bytes([i]) * 64, f"plot {i}"))
    load_pages = {f"load{i}.html": Doc(f"load {i}") for i in range(pages)}
    return Report(doc=doc, axes=[], policy=None, runs=[], has_estimate=False, pages=load_pages)


def _entries(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name != ".analyze.lock")


def test_a_report_fails_whole_mid_write_and_the_previous_one_is_kept(tmp_path, monkeypatch):
    """A failure injected mid-report (the HTML cannot be written, after the plots and the markdown)
    publishes nothing of it and leaves no temporary file; the report already there is untouched."""
    import memsweep.analysis.report.write as write

    md, html = write.write_report(_report(pages=2), tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert _entries(tmp_path) == ["report.html", "report.md", "report_loads", "report_plots"]

    def full_disk(doc, footer):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(write, "to_html", full_disk)
    with pytest.raises(OSError, match="No space"):
        write.write_report(_report(pages=2), tmp_path, "report-2")
    assert _entries(tmp_path) == ["report.html", "report.md", "report_loads", "report_plots"]
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    with pytest.raises(write.ReportExists, match="never overwrites"):
        write.write_report(_report(), tmp_path)  # refused before anything is staged


KILLED_REPORT = """
import os, signal, sys
from pathlib import Path
import memsweep.analysis.report.write as write
from tests.test_sweep_manifest import _report

real = Path.write_bytes
def killed_after_first_plot(self, data):
    real(self, data)
    os.kill(os.getpid(), signal.SIGKILL)
Path.write_bytes = killed_after_first_plot
write.write_report(_report(), Path(sys.argv[1]))
"""


def test_a_report_writer_killed_mid_write_leaves_nothing_the_next_writer_keeps(tmp_path):
    """A report writer SIGKILLed while it writes leaves its staging directory only (no report file);
    the next report into that directory removes it and is written whole."""
    from memsweep.analysis.report.write import recover_sweep_outputs, write_report

    root = Path(__file__).resolve().parents[1]
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_REPORT, str(tmp_path)],
        cwd=root.parent,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert killed.returncode == -signal.SIGKILL
    left = _entries(tmp_path)
    assert len(left) == 1 and left[0].startswith(".report.") and left[0].endswith(".tmp"), left
    assert recover_sweep_outputs(tmp_path), "a resume removes it"
    assert _entries(tmp_path) == []
    (tmp_path / left[0]).mkdir()  # killed again: the next write removes it as well
    write_report(_report(), tmp_path)
    assert _entries(tmp_path) == ["report.html", "report.md", "report_plots"]


def test_a_report_left_half_renamed_by_a_killed_writer_is_undone(tmp_path):
    """A writer killed between the renames of its report (its marker left, some entries still in
    its staging directory): the next writer removes the entries it had renamed; a marker whose
    set is complete is only removed. Another report beside it is never touched."""
    from memsweep.analysis.publish import MARKER, STAGING
    from memsweep.analysis.report.write import write_report

    gone = subprocess.Popen(["true"])
    gone.wait()
    write_report(_report(), tmp_path, "older")
    staging = tmp_path / STAGING.format(kind="report", pid=gone.pid)
    staging.mkdir()
    (tmp_path / "report_plots").mkdir()  # renamed before the kill
    (staging / "report.md").write_text("not renamed yet")
    (staging / "report.html").write_text("not renamed yet")
    names = ["report_plots", "report_loads", "report.md", "report.html"]
    (tmp_path / MARKER.format(kind="report", pid=gone.pid)).write_text(json.dumps(names))
    write_report(_report(), tmp_path)
    assert _entries(tmp_path) == ["older.html", "older.md", "older_plots", "report.html", "report.md", "report_plots"]
    assert (tmp_path / "report.md").read_text() != "not renamed yet"
    complete = tmp_path / "complete"
    complete.mkdir()
    write_report(_report(), complete)
    (complete / MARKER.format(kind="report", pid=gone.pid)).write_text(json.dumps(names))  # killed after its renames
    write_report(_report(), complete, "second")
    assert _entries(complete) == [
        "report.html",
        "report.md",
        "report_plots",
        "second.html",
        "second.md",
        "second_plots",
    ]
