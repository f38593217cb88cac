"""The Python API (``import memsweep``): each function on tiny CPU loads, its results equal to what
the run directories' files hold and to what the command line prints; refusals typed; user
functions given by name or as importable functions; ``import memsweep`` stays light; the worked
example of docs/api.md runs."""

import dataclasses
import io
import json
import re
import subprocess
import sys
import textwrap
from contextlib import redirect_stdout
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import memsweep
from memsweep.conf.contract import RUN_EXIT, SWEEP_TOKEN_KEY, SpecError, read_json
from memsweep.sweeper import api
from memsweep.sweeper.process import RunDirError
from tests.conftest import ROOT, TINY
from tests.data.loads import NO_REPORT, search_events

LOAD = {**{k: v for k, v in TINY.items() if k not in ("workload", "timeout_s")}, "workload": {"depth": 2}}
"""tests/conftest.py's TINY load as the API's keyword settings (batch 2, mlp of depth 2, CPU)."""

USER_MODULE = """
import torch
from torch import nn


def build(load, hidden=7):
    return nn.Sequential(nn.Linear(load.width, hidden), nn.ReLU(), nn.Linear(hidden, 3))


def make_inputs(load):
    x = torch.randn(load.batch, load.width, generator=load.generator, device=load.device)
    return x, torch.randint(0, 3, (load.batch,), generator=load.generator, device=load.device)
"""
"""A user workload's module: an MLP of width -> 7 -> 3 (parameters: 16*7+7 + 7*3+3 = 143 at width 16)."""
USER_PARAMETERS = 16 * 7 + 7 + 7 * 3 + 3


def files_peak(run_dir: Path, counter: str) -> int | None:
    """The largest ``counter`` over the phases of run_dir/record.json, read here from the file."""
    values = [p[counter] for p in read_json(run_dir / "record.json", "record")["phases"] if p.get(counter) is not None]
    return max(values) if values else None


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return tmp_path_factory.mktemp("api_results")


@pytest.fixture(scope="module")
def one_run(results):
    return memsweep.run(run_dir=results / "one", results_dir=str(results), progress=False, **LOAD)


@pytest.fixture(scope="module")
def swept(results):
    return memsweep.sweep(sweep="none", sweep_dir=results / "sweep", progress=False, **{**LOAD, "batch": [1, 2]})


def test_api_names_are_the_modules():
    assert memsweep.__all__ == api.__all__
    for name in memsweep.__all__:
        assert getattr(memsweep, name) is getattr(api, name)
    assert set(memsweep.__all__) <= set(dir(memsweep))
    with pytest.raises(AttributeError):
        memsweep.no_such_name  # noqa: B018


def test_import_memsweep_imports_no_torch_hydra_or_pandas():
    code = (
        "import sys, memsweep; memsweep.__all__; dir(memsweep); "
        "print(sorted(m for m in ('torch', 'hydra', 'omegaconf', 'pandas', 'pyarrow', 'tqdm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout


def test_run_result_is_what_its_files_hold(one_run, results):
    r = one_run
    result = read_json(r.run_dir / "result.json", "result")
    spec = read_json(r.run_dir / "spec.json", "spec")
    assert r.run_dir == results / "one" and r.outcome == result["outcome"] == "ok"
    assert r.exit_code == RUN_EXIT["ok"] == 0
    assert r.max_memory_allocated == files_peak(r.run_dir, "max_memory_allocated")
    assert r.max_memory_reserved == files_peak(r.run_dir, "max_memory_reserved")
    assert r.peak_counter == "max_memory_allocated" and r.peak == r.max_memory_allocated  # the CPU's
    assert isinstance(r.peak, int) and r.peak > 0
    assert r.capacity_bytes == spec["capacity_bytes"] is None and not r.dry_run and r.predicted_outcome is None
    assert (r.failed_phase, r.error_type, r.error_message) == (None, None, None)
    assert spec["batch"] == LOAD["batch"] and spec["workload"]["depth"] == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.outcome = "oom"  # type: ignore[misc]


def test_an_oom_is_a_result_with_the_commands_exit_status(results):
    r = memsweep.run(capacity="4KiB", results_dir=str(results), progress=False, **LOAD)
    assert r.outcome == "oom" and r.exit_code == RUN_EXIT["oom"] == 3
    assert r.capacity_bytes == 4096 and r.failed_phase is not None
    assert r.run_dir.parent == (results / "run").absolute()  # the command's default: <results_dir>/run/<time>


def test_sweep_result_holds_the_sweeps_tables(swept, results):
    assert swept.sweep_dir == (results / "sweep").absolute() and swept.tables.directory == swept.sweep_dir
    for name in ("runs", "phases", "frontier"):
        table = pq.read_table(swept.sweep_dir / f"{name}.parquet")
        frame = getattr(swept.tables, name)
        assert list(frame.columns) == table.column_names and len(frame) == table.num_rows
    rows = pq.read_table(swept.sweep_dir / "runs.parquet").to_pylist()
    assert sorted(r["batch"] for r in rows) == [1, 2]
    by_batch = {r.spec["batch"]: r for r in swept.runs}
    # spec.json's sweep bookkeeping is no setting of the run: not shown (the file keeps it)
    assert all(SWEEP_TOKEN_KEY in read_json(r.run_dir / "spec.json", "spec") for r in swept.runs)
    assert not any(SWEEP_TOKEN_KEY in r.spec for r in swept.runs)
    for row in rows:  # the runs ended here, the same numbers as the table's
        assert by_batch[row["batch"]].max_memory_allocated == row["max_memory_allocated"]
        assert list(swept.tables.runs.loc[swept.tables.runs["batch"] == row["batch"], "max_memory_allocated"]) == [
            row["max_memory_allocated"]
        ]
    assert str(swept.tables.runs["max_memory_allocated"].dtype) == "Int64"  # bytes stay integers
    assert swept.report is not None and swept.report.is_file()
    again = memsweep.load_tables(swept.sweep_dir)
    assert again.runs.equals(swept.tables.runs) and again.frontier.equals(swept.tables.frontier)


def test_frontier_is_the_searched_row(results):
    edge = memsweep.frontier(
        "batch",
        capacity="128KiB",
        upper=64,
        confirm=0,
        sweep_dir=results / "edge",
        progress=False,
        overrides=NO_REPORT,  # the search's row is read, not the report
        **LOAD,
    )
    (row,) = [r for r in pq.read_table(edge.sweep.sweep_dir / "frontier.parquet").to_pylist() if r["axis"] == "batch"]
    (logged,) = search_events(edge.sweep.sweep_dir, "result")
    assert (edge.max_ok, edge.min_oom, edge.exact) == (row["max_ok"], row["min_oom"], row["exact"])
    assert (edge.max_ok, edge.min_oom) == (logged["max_ok"], logged["min_oom"]) and edge.exact
    assert edge.min_oom == edge.max_ok + 1 and edge.runs_used == row["runs_used"]
    assert edge.capacity_bytes == 128 * 1024 and edge.max_ok_peak == row["max_ok_max_memory_allocated"]
    assert edge.max_ok_peak <= edge.capacity_bytes
    assert edge.margin_edge == row["margin_edge"] == logged.get("margin_edge") and edge.error_values == ()
    assert edge.margin_edge is not None and edge.margin_edge <= edge.max_ok, edge
    assert edge.load["context"] == LOAD["context"] and edge.load["device"] == "cpu" and "batch" not in edge.load


def test_predict_is_what_predict_json_holds(results):
    p = memsweep.predict("batch", capacity="128KiB", upper=64, results_dir=str(results), **LOAD)
    written = json.loads((p.out_dir / "predict.json").read_text())
    assert (p.max_fit, p.min_miss, p.exact) == (written["max_fit"], written["min_miss"], written["exact"])
    assert p.capacity_bytes == written["capacity_bytes"] == 128 * 1024 and p.exit_code == 0
    assert p.peak == next(r["peak"] for r in written["runs"] if r["value"] == p.max_fit) <= p.capacity_bytes
    assert p.device == "cpu" and p.blind_spots and p.error is None


def test_estimate_is_what_the_command_prints(capsys):
    from memsweep.sweeper.cli import main

    e = memsweep.estimate(parameters=7_000_000_000, bits=16, train=True, reserve_gib="2")
    assert main(["estimate", "--parameters", "7000000000", "--bits", "16", "--train", "--reserve-gib", "2"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == e.text
    as_json = memsweep.estimate(parameters=7_000_000_000, bits=16, train=True, reserve_gib="2", json=True)
    assert json.loads(as_json.text)["estimate"] == e.breakdown.to_dict()
    assert e.breakdown.weights == 14_000_000_000 and e.breakdown.reserve == 2 * 2**30
    mlp = memsweep.estimate(workload="mlp", batch=2, context=8, width=16, depth=2, mode="train")
    assert mlp.phases and mlp.breakdown.weights is not None
    layers = dict(layers=2, hidden_size=64, heads=4, activations=True, batch=1, seq_len=16)
    no_dropout = memsweep.estimate(**layers, dropout=False).breakdown.activations
    assert no_dropout < memsweep.estimate(**layers).breakdown.activations  # dropout=False is --no-dropout


def test_compare_is_what_the_command_prints(swept):
    from memsweep.sweeper.cli import main

    wider = memsweep.sweep(
        sweep="none",
        sweep_dir=swept.sweep_dir.parent / "wider",
        progress=False,
        overrides=NO_REPORT,  # compared by its tables
        **{**LOAD, "batch": [1, 2], "width": 512},
    )
    assert wider.report is None and not (wider.sweep_dir / "report.md").exists()  # the override reached the sweep
    c = memsweep.compare(swept.sweep_dir, wider.sweep_dir, fail_above="5%")
    printed = io.StringIO()
    with redirect_stdout(printed):
        code = main(["compare", str(swept.sweep_dir), str(wider.sweep_dir), "--fail-above", "5%"])
    assert printed.getvalue().rstrip("\n") == c.text and code == c.exit_code == 1
    assert c.comparable and c.regressions and c.markdown is None
    assert {r.value for r in c.regressions} <= {"batch=1", "batch=2"}


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: memsweep.run(batch=[1, 2], progress=False), "batch"),
        (lambda: memsweep.run(overrides="batch=2"), "overrides"),
        (lambda: memsweep.predict("batch", capacity="lots", **LOAD), "capacity"),
        (lambda: memsweep.predict("batch", capacity="1GiB", upper=0, **LOAD), "upper"),
        (lambda: memsweep.estimate(no_such_option=1), "option"),
        (lambda: memsweep.compare("a"), "others"),
    ],
)
def test_refused_before_anything_runs(call, field):
    with pytest.raises(SpecError) as info:
        call()
    assert info.value.field == field


def test_refusals_from_inside_hydra_are_spec_errors(tmp_path):
    results = tmp_path / "results"
    with pytest.raises(SpecError) as info:  # the task's refusal (InputRefused inside Hydra)
        memsweep.run(results_dir=str(results), progress=False, **{**LOAD, "batch": 0})
    assert info.value.field == "batch"
    with pytest.raises(SpecError) as info:  # a user workload without its functions
        memsweep.run(results_dir=str(results), progress=False, workload="user")
    assert info.value.field == "workload.model"
    with pytest.raises(SpecError) as info:  # a misspelt key, refused before Hydra composes
        memsweep.run(results_dir=str(results), progress=False, bacth=2)
    assert info.value.field == "bacth" and "did you mean 'batch'?" in str(info.value)
    with pytest.raises(SpecError) as info:  # an override Hydra cannot apply
        memsweep.run(results_dir=str(results), progress=False, overrides=["workload=no_such_workload"])
    assert info.value.field == "overrides" and "no_such_workload" in str(info.value)
    with pytest.raises(SpecError) as info:  # the frontier sweeper's refusal
        memsweep.frontier("dtype", sweep_dir=results / "refused", progress=False, **LOAD)
    assert "dtype" in str(info.value)
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert left == [], left  # refused before any run directory was written


def test_a_run_directory_is_never_reused(one_run):
    with pytest.raises(RunDirError):
        memsweep.run(run_dir=one_run.run_dir, progress=False, **LOAD)


@pytest.mark.parametrize(
    "options, field, accepted",
    [
        ({"parameters": 10, "bits": "many"}, "bits", "an integer"),  # argparse's refusal raised, not an exit
        ({"parameters": 10, "bits": 16, "optimizer": "adam9"}, "optimizer", "one of adamw, adam,"),
        ({"workload": "nope"}, "workload", "one of mlp"),
        ({"parameters": 10, "bits": 16, "train": "yes"}, "train", "True or False"),
        ({"parameters": 10, "bits": 16, "device": "tpu0"}, "device", "cpu (the worker's tracker), cuda or cuda:N"),
        ({"parameters": -5, "bits": 16}, "parameters", "integer >= 0"),  # the estimator's own refusal
        ({"parameters": 10, "fmt": "xml"}, "fmt", "one of bf16, fp16"),
        ({"parameters": 10, "bits": 16, "zero_stage": 2}, "zero_stage", "add --train"),
        ({"bits": 16}, "options", "nothing to estimate"),  # no option alone is at fault
    ],
)
def test_estimate_refusals_are_spec_errors(options, field, accepted):
    with pytest.raises(SpecError) as info:
        memsweep.estimate(**options)
    assert info.value.field == field and accepted in info.value.accepted, info.value
    assert info.value.value == (options if field == "options" else options[field])
    assert str(info.value).startswith(f"invalid {field}=") and "\n" not in str(info.value)


def test_estimate_and_compare_refusals(tmp_path):
    with pytest.raises(SpecError):
        memsweep.compare(tmp_path, tmp_path, fail_above="lots")
    from memsweep.analysis.compare import SweepNotFound

    with pytest.raises(SweepNotFound):
        memsweep.compare(tmp_path / "no", tmp_path / "such")


def test_a_missing_sweep_directory_raises_what_the_api_page_and_the_docstrings_name(tmp_path):
    """A sweep directory that is missing, or holds no tables or no measured run, raises the exception
    docs/api.md and the function's Raises section name (not SpecError, which the page gives for bad
    settings), by its public dotted name."""
    from memsweep.analysis.compare import EmptySweep, SweepNotFound

    page = " ".join((ROOT / "docs" / "api.md").read_text().split())
    (tmp_path / "empty").mkdir()
    cases = [
        (lambda: memsweep.load_tables(tmp_path / "no"), memsweep.load_tables, FileNotFoundError, "FileNotFoundError"),
        (
            lambda: memsweep.load_tables(tmp_path / "empty"),
            memsweep.load_tables,
            FileNotFoundError,
            "FileNotFoundError",
        ),
        (
            lambda: memsweep.compare(tmp_path / "no", tmp_path / "empty"),
            memsweep.compare,
            SweepNotFound,
            "memsweep.analysis.compare.SweepNotFound",
        ),
        (
            lambda: memsweep.compare(tmp_path / "empty", tmp_path / "empty"),
            memsweep.compare,
            EmptySweep,
            "memsweep.analysis.compare.EmptySweep",
        ),
    ]
    for call, function, raised, name in cases:
        with pytest.raises(Exception) as info:
            call()
        assert type(info.value) is raised and not isinstance(info.value, SpecError), (name, info.value)
        assert f"`{function.__name__}`" in page and f"`{name}`" in page, name
        raises = (function.__doc__ or "").split("Raises:", 1)[1]
        assert name.removeprefix("memsweep.") + ":" in raises, (function.__name__, name)
    assert "`memsweep.sweeper.process.RunDirError`" in page


def _nested():
    def build(load):
        return load

    return build


def _from_main(load):
    return load


_from_main.__module__ = "__main__"


@pytest.mark.parametrize(
    "function, words",
    [
        (lambda load: load, "a lambda"),
        (_nested(), "a nested function"),
        (_from_main, "__main__"),
        ("no_colon.build", "'pkg.module:function'"),
        ("pkg.mod:not an identifier", "'pkg.module:function'"),
        (42, "not a function"),
    ],
)
def test_functions_that_cannot_be_imported_by_name_are_refused(function, words):
    with pytest.raises(memsweep.SpecError, match=re.escape(words)) as info:  # the API's one refusal
        memsweep.run(model=function, inputs="x:y", progress=False)
    assert "top level of a .py module" in str(info.value) or "pkg.module:function" in str(info.value)


def test_a_notebooks_function_is_refused_in_its_own_words(tmp_path):
    code = textwrap.dedent(
        """
        import memsweep
        def build(load):
            return None
        try:
            memsweep.run(model=build, inputs=build)
        except ValueError as exc:
            print(exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert "build is defined in __main__" in out.stdout and "define it at the top level" in out.stdout, out


def test_model_without_inputs_is_refused():
    with pytest.raises(memsweep.SpecError, match="needs model= and inputs="):
        memsweep.run(model="m:build", progress=False)


def test_user_functions_by_name_and_as_objects(tmp_path, monkeypatch):
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "tiny_user.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path / "here")
    load = {k: v for k, v in LOAD.items() if k != "workload"}
    by_name = memsweep.run(
        model="tiny_user:build", inputs="tiny_user:make_inputs", results_dir=str(tmp_path), progress=False, **load
    )
    assert by_name.outcome == "ok" and by_name.record["model"]["parameters"] == USER_PARAMETERS
    assert by_name.spec["workload"]["model"] == {"_target_": "tiny_user.build"}
    # a function object of a package elsewhere: the worker gets its package's root on sys.path
    package = tmp_path / "elsewhere" / "userpkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))
    from userpkg import models  # type: ignore[import-not-found]

    as_object = memsweep.run(
        model=models.build,
        inputs=models.make_inputs,
        workload={"model": {"hidden": 4}},  # the model function's keyword arguments
        results_dir=str(tmp_path),
        progress=False,
        **load,
    )
    assert as_object.outcome == "ok" and as_object.record["model"]["parameters"] == 16 * 4 + 4 + 4 * 3 + 3
    assert as_object.spec["workload"]["model"] == {"_target_": "userpkg.models.build", "hidden": 4}
    assert str(tmp_path / "elsewhere") in as_object.spec["workload"]["path"]


def test_overrides_of_keyword_settings():
    assert api.settings_overrides({"batch": 2, "capacity": "256MiB", "compile": False, "eval_batch": None}, False) == [
        "batch=2",
        "capacity=256MiB",
        "compile=false",
        "eval_batch=null",
    ]
    assert api.settings_overrides({"workload": {"depth": 2}, "hydra": {"sweeper": {"axis": "batch"}}}, False) == [
        "workload.depth=2",
        "hydra.sweeper.axis=batch",
    ]
    assert api.settings_overrides({"batch": [1, 2, 4]}, True) == ["batch=1,2,4"]
    assert api.override_value("a b's") == "'a b\\'s'"
    assert api.target_path("pkg.module:build") == ("pkg.module.build", None)


def test_progress_bar_shown_or_not(results, capsys):
    memsweep.run(results_dir=str(results), progress=True, **LOAD)
    shown = capsys.readouterr().err
    assert re.search(r"memsweep: 100%.*1/1", shown), shown
    memsweep.run(results_dir=str(results), progress=False, **LOAD)
    assert "1/1" not in capsys.readouterr().err


def test_progress_false_is_quiet_but_for_errors(tmp_path, capfd):
    """No Hydra line (``[HYDRA] Launching jobs``, ``#0 : ...``), no per-run INFO line, no summary or
    report path on the console; the job's log file keeps its lines; an error is still shown."""
    swept = memsweep.sweep(sweep="none", sweep_dir=tmp_path / "s", progress=False, **{**LOAD, "batch": [1, 2]})
    failed = memsweep.run(
        run_dir=tmp_path / "r", progress=False, overrides=["fault={phase:cold_forward,kind:raise}"], **LOAD
    )
    out = capfd.readouterr()
    shown = out.out + out.err
    assert failed.outcome == "error" and swept.report is not None
    for noise in ("HYDRA", "Launching", "#0 :", "[INFO]", "memsweep: report", "runs (ok: 2)", "max_ok"):
        assert noise not in shown, shown
    assert "[ERROR]" in shown and "injected fault in phase cold_forward" in shown, shown
    assert "-> ok" in (tmp_path / "s" / "0" / "memsweep.log").read_text()


def test_quiet_overrides_leave_the_callers_own_choices():
    from omegaconf import OmegaConf

    from memsweep.sweeper.callbacks import Progress
    from memsweep.sweeper.progress import QUIET_OVERRIDES, quiet_overrides

    assert quiet_overrides(["batch=2"]) == list(QUIET_OVERRIDES.values())
    assert quiet_overrides(["hydra/job_logging=disabled", "batch=2"]) == [
        QUIET_OVERRIDES["hydra/hydra_logging"],
        QUIET_OVERRIDES["hydra.job.env_set.MEMSWEEP_PROGRESS"],
    ]
    # a job a launcher runs in another process (joblib) prints no progress line when its config says so
    job = OmegaConf.create({"hydra": {"job": {"env_set": {"MEMSWEEP_PROGRESS": "0"}}}})
    assert Progress.mode(job) == "off" and not Progress.enabled(job)


def api_examples() -> list[tuple[str, str]]:
    """(file, code) of every python block of README.md and docs/*.md that imports memsweep."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for code in re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S):
            if "import memsweep" in code:
                found.append((doc.relative_to(ROOT).as_posix(), textwrap.dedent(code)))
    return found


def test_the_worked_example_is_found():
    assert "docs/api.md" in {name for name, _ in api_examples()}


@pytest.mark.parametrize("name, code", api_examples(), ids=lambda v: v if v.endswith(".md") else "")
def test_docs_examples_run(name, code, tmp_path):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, f"{name}: " + out.stderr[-3000:]
    if name == "docs/api.md":
        assert "max_ok=" in out.stdout and "predicted: max_fit=" in out.stdout
