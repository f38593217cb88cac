"""The answer a user reads: a run's peaks, capacity and headroom named; sizes that carry a unit;
model inputs refused before any worker; no sweep, no analysis; progress per finished run."""

import json
import subprocess

import pytest

from memsweep.conf.contract import EXIT_ERROR, SpecError, parse_size
from memsweep.sweeper.answer import load_terms, run_answer
from tests.data.loads import MEMSWEEP, NO_REPORT, SMALLEST_CPU, TINY_LLAMA_OVERRIDES

MiB = 2**20


# -- sizes need a unit ---------------------------------------------------------------------------


@pytest.mark.parametrize("bare", ["256", 256, "10", 5])
def test_a_size_without_a_unit_is_refused_naming_the_field_and_the_forms(bare):
    with pytest.raises(SpecError) as err:
        parse_size(bare, "capacity")
    assert err.value.field == "capacity" and "256MiB" in err.value.accepted and "4096B" in err.value.accepted


def test_zero_is_a_size_only_where_zero_is_allowed():
    assert parse_size("0MiB", "--fail-above", zero=True) == 0 == parse_size("0B", "margin", zero=True)
    with pytest.raises(SpecError):
        parse_size("0MiB", "capacity")


@pytest.mark.parametrize("bare", ["10", "4096", "1"])
def test_a_margin_without_a_unit_or_percent_is_refused(bare):
    from memsweep.analysis.report import parse_margin

    with pytest.raises(SpecError) as err:
        parse_margin(bare)
    assert err.value.field == "margin" and "10%" in err.value.accepted and "0B" in err.value.accepted


def test_fail_above_zero_in_any_unit_and_no_bare_number():
    from memsweep.analysis.compare.gate import parse_threshold

    assert parse_threshold("0MiB").allowed(10**9) == 0 and parse_threshold("0").allowed(10**9) == 0
    assert parse_threshold("64MiB").bytes == 64 * MiB
    with pytest.raises(SpecError) as err:
        parse_threshold("5")
    assert err.value.field == "--fail-above" and "5%" in err.value.accepted


@pytest.mark.parametrize(
    "argv, message",
    [
        (["report", "/nonexistent/s", "--margin", "10"], "invalid margin='10'"),
        (["compare", "/nonexistent/a", "/nonexistent/b", "--fail-above", "5"], "invalid --fail-above='5'"),
    ],
)
def test_bare_numbers_are_refused_on_the_command_line(tmp_path, argv, message):
    proc = subprocess.run([MEMSWEEP, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]


# -- a run's answer ------------------------------------------------------------------------------


def _record(kind, alloc, resv, capacity):
    phases = [{"name": "cold_forward", "max_memory_allocated": alloc, "max_memory_reserved": resv}]
    return {
        "device_kind": kind,
        "device": "cpu" if kind == "cpu" else "cuda:0",
        "capacity_bytes": capacity,
        "phases": phases,
        "outcome": "ok",
    }


def test_cpu_answer_is_labelled_cpu_and_its_headroom_is_on_the_allocated_peak():
    spec = {"mode": "train", "dtype": "float32", "precision": "pure", "optimizer": "adamw", "capacity_bytes": 256 * MiB}
    lines = run_answer(spec, _record("cpu", 100 * MiB, 300 * MiB, 256 * MiB))
    text = "\n".join(lines)
    assert "the CPU" in text and "GPU figure" in text and "on cuda" not in text
    assert f"max_memory_allocated {100 * MiB} B (0.098 GiB)" in text
    assert f"max_memory_reserved {300 * MiB} B (0.293 GiB)" in text
    assert f"headroom = capacity - max_memory_allocated = {156 * MiB} B (0.152 GiB)" in text
    # one name for the recipe, the field's (Lightning's 32-true), as on every verdict line
    assert "precision=32-true optimizer=adamw checkpointing=false capacity=256MiB" in text
    assert text.count("precision=") == 1 and "precision=pure" not in text


def test_cuda_headroom_is_on_the_reserved_peak_and_can_be_negative():
    spec = {"mode": "inference", "dtype": "bfloat16", "capacity_bytes": None}
    text = "\n".join(run_answer(spec, _record("cuda", 100 * MiB, 300 * MiB, 256 * MiB)))
    assert "peak on cuda" in text and "CPU" not in text
    assert f"headroom = capacity - max_memory_reserved = {-44 * MiB} B" in text and "above the capacity" in text
    assert load_terms(spec) == "mode=inference dtype=bfloat16 capacity=device"


@pytest.mark.parametrize(
    "outcome, phase, why",
    [
        ("error", "cold_forward", "headroom: none (ended error in cold_forward: its peaks are partial"),
        ("oom", "inputs", "headroom: none (ran out of memory in inputs: the load does not fit)"),
        ("crash", None, "headroom: none (ended crash: its peaks are partial"),
        (None, None, "headroom: none (did not complete: its peaks are partial"),
    ],
)
def test_a_run_that_did_not_end_ok_gives_no_headroom_its_peaks_partial(outcome, phase, why):
    """capacity - a peak that stopped at the failure is no headroom: the answer says why there is none."""
    record = {**_record("cpu", 100 * MiB, 300 * MiB, 256 * MiB), "outcome": outcome, "failed_phase": phase}
    lines = run_answer({"mode": "inference", "dtype": "float32", "capacity_bytes": 256 * MiB}, record)
    assert "up to the failure: max_memory_allocated" in lines[0] and f"{100 * MiB} B" in lines[0]
    assert lines[1].startswith(f"  capacity {256 * MiB} B (0.250 GiB); ") and why in lines[1]
    assert "headroom =" not in "\n".join(lines) and f"{156 * MiB} B" not in "\n".join(lines)


def test_a_run_without_a_record_says_so_never_zero():
    lines = run_answer({"mode": "inference", "dtype": "float32", "capacity_bytes": MiB}, None)
    assert "not recorded" in lines[0] and " 0 B" not in "\n".join(lines)


def test_memsweep_run_prints_peaks_capacity_headroom_and_load(tmp_path):
    proc = subprocess.run(
        [MEMSWEEP, "run", "batch=4", "capacity=256MiB", *SMALLEST_CPU, f"hydra.run.dir={tmp_path / 'r'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    record = json.loads((tmp_path / "r" / "record.json").read_text())
    alloc = max(p["max_memory_allocated"] for p in record["phases"])
    assert f"max_memory_allocated {alloc} B (" in out and "not a GPU figure" in out
    assert (
        f"capacity {256 * MiB} B (0.250 GiB); headroom = capacity - max_memory_allocated = {256 * MiB - alloc} B" in out
    )
    answered = next(line for line in out.splitlines() if "answered for: " in line)
    assert "mode=inference batch=4 " in answered and "capacity=256MiB" in answered, answered


def test_the_api_run_result_gives_the_same_answer(tmp_path):
    import memsweep

    load = dict(context=8, width=16, workload={"depth": 2}, warmup=1, repeats=1, threads=1, device="cpu")
    one = memsweep.run(batch=2, capacity="256MiB", results_dir=str(tmp_path), progress=False, **load)
    text = one.answer()  # printable as it is, in a notebook too
    assert isinstance(text, str) and not text.endswith("\n")
    lines = text.splitlines()
    assert len(lines) > 2 and lines[-1].lstrip().startswith("answered for: "), lines
    assert f"max_memory_allocated {one.max_memory_allocated} B (" in lines[0] and "the CPU" in lines[0]
    assert f"= {256 * MiB - one.peak} B (" in lines[1] and one.peak_counter == "max_memory_allocated"
    with pytest.raises(SpecError, match="capacity"):
        memsweep.run(batch=2, capacity=256, results_dir=str(tmp_path), progress=False, **load)


# -- model inputs before any worker --------------------------------------------------------------


BARE_CPU = ["width=16", "warmup=1", "repeats=1", "device=cpu"]


def _refused_run(tmp_path, *args):
    proc = subprocess.run(
        [MEMSWEEP, "run", "batch=2", "capacity=1GiB", *BARE_CPU, f"hydra.run.dir={tmp_path / 'r'}", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and not (tmp_path / "r").exists(), "refused before any worker"
    return proc.stderr


def test_a_class_where_a_model_factory_is_expected_is_named(tmp_path):
    err = _refused_run(tmp_path, "context=16", "workload=user_convnet", "workload.model._target_=torch.nn.Linear")
    assert "invalid workload.model._target_='torch.nn.Linear'" in err
    assert "expected a factory fn(load, **kwargs) returning an nn.Module" in err


def test_check_user_targets_binds_each_factory():
    from memsweep.worker.workloads.user import check_user_targets

    convnet = "memsweep.conf.examples.convnet"
    good = {"model": {"_target_": f"{convnet}.build_model"}, "inputs": {"_target_": f"{convnet}.make_inputs"}}
    assert check_user_targets(good) == {"ok": True}
    wrong_kw = {**good, "inputs": {"_target_": f"{convnet}.make_inputs", "colours": 3}}
    answer = check_user_targets(wrong_kw)
    assert answer["field"] == "workload.inputs._target_" and "colours" in answer["accepted"]
    loss_class = {**good, "loss": {"_target_": "torch.nn.CrossEntropyLoss"}}
    answer = check_user_targets(loss_class)
    assert answer["field"] == "workload.loss._target_" and "fn(output, target, **kwargs)" in answer["accepted"]
    optimizer_class = {**good, "optimizer": {"_target_": "torch.optim.SGD", "lr": 0.1}}
    assert check_user_targets(optimizer_class) == {"ok": True}, "an optimizer class is its own factory"


def test_hf_model_checks_from_the_count(monkeypatch):
    from types import SimpleNamespace

    from memsweep.sweeper.inputs import check_hf_model

    spec = SimpleNamespace(workload={"config": "LLamaConfig"}, context=128, mode="inference", new_tokens=16)
    with pytest.raises(SpecError) as err:
        check_hf_model(spec, {"error": "ValueError: workload.config='LLamaConfig': transformers 5 has no such class"})
    assert err.value.field == "workload.config" and "has no such class" in err.value.accepted
    with pytest.raises(SpecError) as err:
        check_hf_model(spec, {"config": {"max_position_embeddings": 64}})
    assert err.value.field == "context" and "max_position_embeddings = 64" in err.value.accepted
    generate = SimpleNamespace(**{**vars(spec), "context": 60, "mode": "generate"})
    with pytest.raises(SpecError, match="new_tokens"):
        check_hf_model(generate, {"config": {"n_positions": 64}})
    check_hf_model(spec, {"config": {"max_position_embeddings": 128}})  # fits: no error
    check_hf_model(spec, {"error": "ModuleNotFoundError: No module named 'transformers'"})  # not the config's fault


def test_hf_context_above_the_local_configs_positions_is_refused(tmp_path):
    pytest.importorskip("transformers")
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", **TINY_LLAMA_OVERRIDES}))
    err = _refused_run(tmp_path, "workload=hf", f"workload.config={model}", "context=128")
    assert "invalid context=128: expected at most the model's max_position_embeddings = 64" in err


# -- a sweep that answered nothing, a directory that is no sweep ---------------------------------


def _run_dir(root, name, outcome):
    d = root / name
    d.mkdir(parents=True)
    (d / "spec.json").write_text("{}")
    (d / "result.json").write_text(json.dumps({"schema_version": 1, "outcome": outcome}))


def test_a_sweep_without_an_ok_or_oom_run_exits_4(tmp_path, capsys):
    from memsweep.sweeper.callbacks import sweep_exit_code

    _run_dir(tmp_path / "s", "0", "error")
    _run_dir(tmp_path / "s", "1", "crash")
    assert sweep_exit_code([tmp_path / "s"]) == EXIT_ERROR == 4
    assert "none of the 2 run(s) of this sweep ended ok or oom (crash, error)" in capsys.readouterr().err
    _run_dir(tmp_path / "s", "2", "oom")
    assert sweep_exit_code([tmp_path / "s"]) == 0, "an OOM answers: the sweep ran"
    assert sweep_exit_code([]) == 0


@pytest.mark.parametrize(
    "launcher", [[], ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]], ids=["basic", "joblib"]
)
def test_a_sweep_whose_every_run_fails_in_setup_exits_non_zero(tmp_path, launcher):
    proc = subprocess.run(
        [
            MEMSWEEP,
            "sweep",
            "sweep=none",
            *launcher,
            "batch=1,2",
            "capacity=256MiB",
            *SMALLEST_CPU,
            "fault={phase:model_load,kind:raise}",
            f"hydra.sweep.dir={tmp_path / 's'}",
            *NO_REPORT,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == EXIT_ERROR, proc.stderr[-3000:]
    assert "none of the 2 run(s) of this sweep ended ok or oom" in proc.stderr


@pytest.mark.parametrize("command", ["analyze", "report"])
def test_a_directory_holding_no_sweep_is_refused_and_nothing_written(tmp_path, command, capsys):
    from memsweep.analysis.cli import main as analyze_main
    from memsweep.analysis.report.cli import main as report_main

    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    before = sorted(p.name for p in package.iterdir())
    main = analyze_main if command == "analyze" else report_main
    assert main([str(package)]) == 2
    assert "holds no sweep" in capsys.readouterr().err
    assert sorted(p.name for p in package.iterdir()) == before


# -- progress ------------------------------------------------------------------------------------


def test_progress_words_give_done_left_and_time_left():
    from memsweep.sweeper.progress import counts_text, time_left_s

    assert time_left_s(30.0, 3, 9) == 60.0 and time_left_s(30.0, 0, 9) is None and time_left_s(1.0, 2, None) is None
    assert counts_text(3, 9, 30.0) == "3/9 done, 6 left, about 0:01:00 left"
    assert counts_text(3, None, 30.0).startswith("3 done, time left not known")


@pytest.mark.parametrize("mode", ["RUN", "MULTIRUN"])
def test_a_job_end_line_is_a_sweeps_not_a_single_runs(tmp_path, monkeypatch, capsys, mode):
    """``memsweep sweep`` prints one line per finished job; ``memsweep run`` (one job, no multirun)
    none: its answer says how it ended (a new user saw ``[1 done, time left not known (the search
    picks...)] job ?: ... elapsed -`` after every run)."""
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from memsweep.sweeper.callbacks import Progress

    monkeypatch.setenv("MEMSWEEP_PROGRESS", "1")
    hydra = {"mode": getattr(RunMode, mode), "sweep": {"dir": str(tmp_path)}, "job": {"num": 0}}
    config = OmegaConf.create({"hydra": hydra, "batch": 2, "mode": "inference", "device": "cpu"})
    Progress().on_job_end(config)
    out = capsys.readouterr().out
    assert ("job 0: batch=2" in out) == (mode == "MULTIRUN"), out


def test_each_dry_run_is_reported_as_it_ends(capsys):
    from memsweep.sweeper.callbacks import report_dry_run

    report_dry_run(2, "batch=64", {"outcome": "ok", "wall_s": 1.25}, 3 * MiB, "oom", 2 * MiB)
    line = capsys.readouterr().err.strip()
    assert line.startswith("memsweep: dry run 2: batch=64 -> predicted max_memory_allocated 3145728 B")
    assert "does not fit in 2097152 B" in line and "nothing measured" in line
    report_dry_run(3, "batch=128", {"outcome": "error", "failed_phase": "inputs"}, None, "error", 2 * MiB)
    assert "error in inputs: nothing predicted" in capsys.readouterr().err
