"""Bad input, table-driven: each case fails with a message naming the field (and what is
accepted), a non-zero exit, and nothing written or overwritten. Parsers fuzzed with hypothesis.

The tables' commands are each a process of their own forked from one server that imported the
command line once (the ``forked_memsweep`` fixture, tests/forked_cli.py); the console script itself
runs the other commands here and the refusals of tests/test_cli.py."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsweep.analysis.tables import phase_rows, run_row
from memsweep.conf.contract import RecordError, Run, RunSpec, SpecError, read_json
from tests.data.loads import MEMSWEEP

TINY = ["context=8", "width=16", "warmup=1", "repeats=1", "device=cpu"]

# (command-line arguments after `memsweep sweep`, text the error must contain)
CASES = [
    (["batch=0"], "invalid batch=0"),
    (["batch=-1"], "invalid batch=-1"),
    (["batch=1.5"], "invalid batch=1.5"),
    (["batch=10000000000000"], "invalid batch="),
    (["context=0"], "invalid context=0"),
    (["context=abc"], "invalid context='abc'"),
    (["width=-64"], "invalid width=-64"),
    (["width=2.5"], "invalid width=2.5"),
    (["dtype=float8"], "float32, float16, bfloat16"),
    (["dtype=int8"], "invalid dtype='int8'"),
    (["mode=serve"], "inference, train"),
    (["device=tpu"], "auto, cpu, cuda, cuda:N"),
    (["device=gpu"], "invalid device='gpu'"),
    (["device=cuda:0"], "visible device"),
    (["device=cuda:7"], "invalid device='cuda:7'"),
    (["batch=0", "sweep=batch"], "invalid batch=0"),
    (["workload=resnet"], "workload/resnet"),
    (["+workload.heads=4"], "invalid workload.heads=4"),
    (["workload.depth=0"], "invalid workload.depth=0"),
    (["workload.activation=swish"], "gelu, relu, silu, tanh"),
    (["workload.hidden=-1"], "invalid workload.hidden=-1"),
    (["capacity=lots"], "invalid capacity='lots'"),
    (["capacity=12XB"], "KiB, MiB, GiB"),
    (["capacity=-1GB"], "invalid capacity='-1GB'"),
    (["capacity=0"], "invalid capacity=0"),
    (["capacity=256"], "invalid capacity=256: expected a positive size with its unit, such as 256MiB"),
    (["capacity=256"], "4096B"),
    (["capacity=1.3B"], "whole number of bytes"),
    (["warmup=-1"], "invalid warmup=-1"),
    (["repeats=0"], "invalid repeats=0"),
    (["timeout_s=0"], "invalid timeout_s=0"),
    (["timeout_s=-5"], "invalid timeout_s=-5"),
    (["seed=-1"], "invalid seed=-1"),
    (["threads=0"], "invalid threads=0"),
    (["devices=0"], "invalid devices=0: expected an integer from 1 to"),
    (["devices=2"], "several devices per run need a CUDA device"),
    (["fault={phase:nowhere,kind:raise}"], "invalid fault.phase='nowhere'"),
    (["fault={phase:inputs,kind:explode}"], "invalid fault.kind='explode'"),
    (["sweep=nope"], "sweep/nope"),
    (["batch=1,0"], "invalid batch=0"),
    (["bach=4"], "invalid bach='4': expected a key memsweep reads (nothing reads this one; a misspelling; did you"),
    (["workload.dpeth=2"], "did you mean 'workload.depth'?"),
    (["workload=transformer", "workload.depth=2"], "invalid workload.depth='2'"),
    (["snapshot_on_oom=true"], "invalid snapshot_on_oom=True"),
    (["snapshot_on_oom=maybe"], "true or false"),
    (["context=8,-8"], "invalid context=-8"),
    (["dtype=float32,float64"], "invalid dtype='float64'"),
    (["device=cpu", "capacity=99999999TiB"], "at most this machine's memory"),
    (["pool=cores", "cores_per_run=4096"], "invalid cores_per_run=4096"),
    # issue 21: options that cannot apply are refused, naming the key
    (["kv_cache=static"], "invalid kv_cache='static'"),
    (["new_tokens=4"], "invalid new_tokens=4"),
    (["optimizer=sgd"], "invalid optimizer='sgd'"),
    (["mode=generate", "workload=transformer", "optimizer=sgd"], "invalid optimizer='sgd'"),
    (["+bacth=16"], "invalid bacth=16"),
    (["+bacth=16", "batch=1,2"], "invalid bacth=16"),
    # checked before anything runs: paths, targets, the report's margin, the launcher
    (["workload=hf", "workload.config=./no/such/config.json"], "invalid workload.config="),
    (["workload=user_convnet", "workload.model._target_=no_such_module.build"], "invalid workload.model._target_="),
    (
        ["workload=user_convnet", "workload.model._target_=torch.nn.Linear"],
        "expected a factory fn(load, **kwargs) returning an nn.Module",
    ),
    (["workload=user_convnet", "+workload.inputs.colours=3"], "invalid workload.inputs._target_="),
    (["workload=hf", "workload.config=LLamaConfig"], "invalid workload.config='LLamaConfig'"),
    (["workload=hf", "workload.config=gpt2", "context=2048"], "invalid context=2048: expected at most the model's"),
    (["batch=1,2", "hydra.callbacks.analyze.margin=10"], "invalid hydra.callbacks.analyze.margin=10"),
    (["batch=1,2", "hydra.callbacks.analyze.margin=lots"], "invalid hydra.callbacks.analyze.margin='lots'"),
    (  # a margin that keeps the whole emulated capacity free: nothing could fit under it
        ["batch=1,2", "capacity=8MiB", "hydra.callbacks.analyze.margin=1GiB"],
        "invalid hydra.callbacks.analyze.margin='1GiB': expected a margin below the capacity 8388608 B",
    ),
    (["batch=1,2", "results_dir=/dev/null/results"], "invalid results_dir='/dev/null/results'"),
    (["batch=1,2", "hydra.sweep.dir=/dev/null/sweep"], "invalid hydra.sweep.dir='/dev/null/sweep'"),
    (["batch=1,2", "hydra/launcher=submitit_slurm"], "invalid hydra/launcher='submitit_slurm'"),
    # sweeps that would run nothing, or mix with another sweep
    (["batch=16"], "invalid sweep='custom'"),
    (["hydra/sweeper=frontier", "dry_run=true"], "invalid capacity=None"),
    (["hydra/sweeper=frontier", "capacity=1MiB", "hydra.sweep.dir=/dev/null/x"], "invalid hydra.sweep.dir="),
    # an axis the load ignores (the fixed width of a transformer, the hf workload's: test_workload_specs)
    (["workload=transformer", "workload.hidden=32", "width=16,32"], "invalid width='32': expected an axis this"),
    (
        [
            "hydra/sweeper=frontier",
            "hydra.sweeper.axis=width",
            "capacity=1MiB",
            "workload=transformer",
            "workload.hidden=32",
        ],
        "invalid hydra.sweeper.axis='width'",
    ),
    # the setting as typed (axis, not axes), with the way out
    (["hydra/sweeper=frontier", "hydra.sweeper.axis=world_size", "capacity=1MiB"], "sweep its values instead"),
    (["hydra/sweeper=frontier", "hydra.sweeper.axis=world_size", "capacity=1MiB"], "invalid hydra.sweeper.axis="),
    # a frontier search on the CPU needs a capacity; conflicting or misspelt frontier settings
    (["hydra/sweeper=frontier"], "invalid capacity=None: expected a size on the CPU"),
    (
        ["hydra/sweeper=frontier", "capacity=1MiB", "+hydra.sweeper.bounds.contxt.multiple_of=64"],
        "invalid hydra.sweeper.bounds.contxt=",
    ),
    (
        ["hydra/sweeper=frontier", "capacity=1MiB", "hydra.sweeper.axis=batch", "hydra.sweeper.axes=[context]"],
        "invalid hydra.sweeper.axes=['context']",
    ),
    # Hydra's basic sweeper: every job checked before the first one runs; the launcher's settings
    (["hydra/sweeper=basic", "capacity=64MiB", "batch=1,-2"], "invalid batch=-2"),
    (["batch=1,2", "hydra/launcher=joblib", "hydra.launcher.n_jobs=0"], "invalid hydra.launcher.n_jobs=0"),
    (["batch=1,2", "capacity_mode=process"], "invalid capacity_mode='process'"),
    # a sweep directory that cannot hold one clean sweep: refused before anything runs, naming the field
    (["batch=1,2", "hydra.sweep.dir="], "invalid hydra.sweep.dir=''"),
    (
        ["batch=1,2", "hydra.sweep.subdir=../../x${hydra.job.num}"],
        "invalid hydra.sweep.subdir='../../x${hydra.job.num}'",
    ),
    (["batch=1,2", "hydra.sweep.subdir=same"], "invalid hydra.sweep.subdir='same'"),
    (["batch=1,2", "hydra.job.name=../../x"], "invalid hydra.job.name='../../x'"),
    (["batch=1,2", "hydra.job.name=/tmp/memsweep-job"], "invalid hydra.job.name='/tmp/memsweep-job'"),
    (["batch=${context}", "context=${batch}"], "invalid batch="),
    (["batch=1,2", "results_dir=/tmp/memsweep-no-such-dir/../../proc/memsweep"], "invalid results_dir="),
    # a sweep's size, counted from the range's bounds before any value is listed
    (
        ["batch=range(1,100000000)"],
        "invalid batch='range(1,100000000) (99999999 conditions)': expected at most 4096 conditions",
    ),
    (
        ["hydra/sweeper=basic", "batch=range(1,100)", "context=range(1,100)"],
        "invalid batch context='range(1,100) range(1,100) (9801 conditions)'",
    ),
    (
        ["hydra/sweeper=frontier", "capacity=1MiB", "batch=range(1,100000000)"],
        "invalid batch='range(1,100000000) (99999999 conditions)'",
    ),
]


def case_id(case):
    args = case.values[0] if hasattr(case, "values") else case[0]
    return " ".join(args)


@pytest.mark.parametrize("args, message", CASES, ids=[case_id(c) for c in CASES])
def test_bad_sweep_input(tmp_path, forked_memsweep, args, message):
    results = tmp_path / "res"
    sentinel = results / "keep.txt"
    sentinel.parent.mkdir()
    sentinel.write_text("earlier results")
    # sweep=none and tiny sizes: were a case wrongly accepted, it would cost one small run, not a sweep.
    proc = forked_memsweep.run(
        ["sweep", "sweep=none", f"results_dir={results}", *TINY, *args], cwd=tmp_path, timeout=300
    )
    assert proc.returncode in (1, 2), proc.returncode  # documented: 2 refused, 1 Hydra could not compose
    assert message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert len(proc.stderr.strip().splitlines()) <= 20, (
        proc.stderr
    )  # a message (Hydra lists a group's options), not a dump
    for name in ("spec.json", "record.json", "stdout.log", "result.json"):  # no run, no worker process
        assert not list(tmp_path.rglob(name)), f"no worker may start on bad input ({name})"
    assert sorted(p.relative_to(results).as_posix() for p in results.rglob("*")) == ["keep.txt"]
    assert sentinel.read_text() == "earlier results"


def _refused_sweep(tmp_path, *args):
    """Run ``memsweep sweep`` on bad input: refused (exit 2) in one line, no worker started."""
    proc = subprocess.run(
        [MEMSWEEP, "sweep", "sweep=none", f"hydra.sweep.dir={tmp_path / 's'}", *TINY, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.startswith("memsweep: error:")]
    assert len(errors) == 1, proc.stderr[-2000:]
    assert not (tmp_path / "s").exists() or not list((tmp_path / "s").rglob("spec.json")), "no worker may start"
    return errors[0]


HF_BASE = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "not valid JSON"),  # /etc/passwd as the config
        (json.dumps({**HF_BASE, "hidden_size": "abc"}), "expected a config transformers builds"),
    ],
    ids=["etc-passwd", "wrong-type"],
)
def test_an_hf_config_is_read_before_any_worker(tmp_path, content, message):
    """A workload.config that is no config.json (or one transformers cannot build) is refused up front,
    as `memsweep estimate --config` refuses it: exit 2, one line naming the field."""
    path = "/etc/passwd"
    if content is not None:
        path = str(tmp_path / "config.json")
        (tmp_path / "config.json").write_text(content)
    line = _refused_sweep(tmp_path, "workload=hf", f"workload.config={path}", "batch=1,2")
    assert "invalid workload.config=" in line and message in line, line


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"a":' + "[" * 100000 + "]" * 100000 + "}", "nested too deep"),
        (bytes(range(256)) * 4, "expected a Hugging Face config.json"),
        ("[1, 2]", "holds a JSON list"),
    ],
    ids=["deep", "bytes", "list"],
)
def test_config_json_contents_are_checked(tmp_path, content, message):
    from memsweep.sweeper.inputs import check_config_json

    file = tmp_path / "config.json"
    file.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(SpecError, match=message) as err:
        check_config_json(str(file), file)
    assert err.value.field == "workload.config"


def test_a_fifo_as_the_hf_config_is_named_a_fifo_not_missing(tmp_path):
    """A FIFO given as workload.config is refused without being read, called what it is (a FIFO, not
    a regular file), not said not to exist; a missing one still does not exist."""
    from memsweep.sweeper.inputs import check_workload_sources

    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    with pytest.raises(SpecError) as err:
        check_workload_sources({"name": "hf", "config": str(fifo)})
    assert err.value.field == "workload.config" and "a regular file" in err.value.accepted
    assert f"{fifo} is a FIFO" in err.value.accepted and "does not exist" not in err.value.accepted, err.value
    with pytest.raises(SpecError, match="does not exist"):
        check_workload_sources({"name": "hf", "config": str(tmp_path / "none.json")})


@pytest.mark.parametrize(
    "argv",
    [
        ["analyze", "{fifo}"],
        ["analyze", "{fifo}", "--out", "o"],
        ["report", "{fifo}", "--out", "o"],
        ["compare", "{fifo}", "{fifo}"],
    ],
)
def test_a_fifo_given_as_a_sweep_directory_is_named_a_fifo(tmp_path, forked_memsweep, argv):
    fifo = tmp_path / "s"
    os.mkfifo(fifo)
    proc = forked_memsweep.run([a.format(fifo=fifo) for a in argv], cwd=tmp_path)
    line = [x for x in proc.stderr.splitlines() if x.startswith("memsweep")]
    assert proc.returncode == 2 and "is not a directory (a FIFO)" in line[-1], proc.stderr
    assert "does not exist" not in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"], "nothing written"


def test_a_python_tag_in_a_config_file_is_refused_in_one_line(tmp_path):
    """A YAML tag that would run code (!!python/object/apply) is never constructed: exit 2, one line."""
    (tmp_path / "conf" / "workload").mkdir(parents=True)
    marker = tmp_path / "ran"
    evil = f'name: mlp\nwidth: !!python/object/apply:os.system ["touch {marker}"]\n'
    (tmp_path / "conf" / "workload" / "evil.yaml").write_text(evil)
    line = _refused_sweep(tmp_path, f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "workload=evil", "batch=1,2")
    assert "not plain YAML" in line and "evil.yaml" in line, line
    assert not marker.exists()


def test_compare_refuses_a_runs_parquet_of_random_bytes(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for table in ("runs.parquet", "phases.parquet"):
            (tmp_path / name / table).write_bytes(bytes(range(256)) * 16)
    proc = subprocess.run([MEMSWEEP, "compare", "a", "b"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "runs.parquet is not a Parquet table" in proc.stderr


def test_what_stops_hydra_is_said_in_one_line():
    import errno

    import yaml

    from memsweep.conf.contract import EXIT_BAD_INPUT, EXIT_STOPPED
    from memsweep.sweeper.hydra_errors import stopped

    full = stopped(OSError(errno.ENOSPC, "No space left on device", "/s/0/record.json"))
    assert full.code == EXIT_STOPPED and "No space left on device: /s/0/record.json" in str(full)
    assert "resumes" in str(full) and "\n" not in str(full)
    try:
        try:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/s/3/.result.json.x.tmp")
        except OSError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as wrapped:
        gone = stopped(wrapped)
    assert gone.code == EXIT_STOPPED and "/s/3/" in str(gone)
    tag = stopped(yaml.constructor.ConstructorError(None, None, "could not determine a constructor", None))
    assert tag.code == EXIT_BAD_INPUT and "not plain YAML" in str(tag)
    assert stopped(KeyError("a fault of memsweep itself")) is None


@pytest.mark.parametrize("refusal", ["spec", "run_dir"])
def test_a_refusal_inside_hydras_app_is_raised_as_it_is_not_as_a_fault(monkeypatch, capsys, refusal):
    """The command line prints a SpecError (exit 2) or RunDirError in one line itself: raised_errors
    passes them on, with no traceback and no "fault of memsweep"."""
    from memsweep.conf.contract import SpecError
    from memsweep.sweeper.hydra_errors import raised_errors
    from memsweep.sweeper.process import RunDirError

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    error = SpecError("batch", 0, "a positive integer") if refusal == "spec" else RunDirError("holds a run")
    with pytest.raises(type(error)):
        with raised_errors():
            raise error
    assert "Traceback" not in capsys.readouterr().err


def test_the_up_front_count_is_bounded_by_timeout_s(tmp_path, monkeypatch, tiny):
    """The count of an hf model before the first run gets the run's timeout_s (not its own 600 s);
    a count past it refuses the config, naming timeout_s."""
    import os

    from memsweep.sweeper import spec as spec_module

    asked = {}

    def past_its_time(flag, *args, timeout):
        asked["timeout"] = timeout
        raise subprocess.TimeoutExpired(flag, timeout)

    monkeypatch.setattr(spec_module, "ask_worker", past_its_time)
    (tmp_path / "config.json").write_text(json.dumps({**HF_BASE, "num_hidden_layers": 10**11}))
    workload = {"name": "hf", "config": str(tmp_path / "config.json")}
    spec = RunSpec.from_dict({**tiny, "timeout_s": 5, "workload": workload})
    before = set(os.environ)
    try:
        with pytest.raises(SpecError) as err:
            spec_module.with_estimate(spec)
    finally:
        for key in set(os.environ) - before:  # the count's answer, cached for this process
            monkeypatch.delenv(key)
    assert asked["timeout"] == 5
    assert err.value.field == "workload.config" and "timeout_s=5" in err.value.accepted, err.value


def test_at_least_thirty_cases():
    assert len(CASES) >= 30


@pytest.mark.parametrize(
    "argv, code, message",
    [
        (["frobnicate"], 2, "unknown command 'frobnicate'"),
        (["analyze", "/nonexistent/sweep"], 2, "does not exist"),
        (["report", "/nonexistent/sweep", "--out", "r"], 2, "does not exist"),
        (["analyze"], 2, "SWEEP_DIR"),
    ],
)
def test_bad_command_lines(tmp_path, forked_memsweep, argv, code, message):
    proc = forked_memsweep.run(argv, cwd=tmp_path)
    assert proc.returncode == code and message in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["bacth=4"], "invalid bacth='4'"),
        (["+bacth=4"], "invalid bacth=4"),
        (["workload=nope"], "invalid workload='nope'"),
        (["batch=1,2"], "invalid batch='1,2'"),
        (["kv_cache=static"], "invalid kv_cache='static'"),
        (["--axis", "depth"], "invalid --axis='depth'"),
        (["results_dir=/dev/null/results"], "invalid results_dir='/dev/null/results'"),
        (["--axis", "eval_batch"], "invalid --axis='eval_batch': expected an axis this load reads, not eval_batch"),
        (["workload=transformer", "workload.hidden=32", "--axis", "width"], "invalid --axis='width'"),
        (["--cards="], "invalid --cards=''"),
        (["hydra.run.dir=/etc"], "invalid hydra.run.dir='/etc': expected a new or empty directory"),
    ],
)
def test_predict_refuses_in_one_line_before_any_dry_run(tmp_path, forked_memsweep, args, message):
    proc = forked_memsweep.run(["predict", "capacity=1GiB", "context=8", "width=16", *args], cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.rglob("*")), "nothing written"


@pytest.mark.parametrize(
    "args, message",
    [
        # Hydra's run mode starts no launcher: +cluster=slurm would have run here
        (["+cluster=slurm"], "invalid hydra/launcher='submitit_slurm'"),
        (
            ["+cluster=slurm", "mode=train", "parallel=fsdp", "world_size=4", "nodes=2", "tasks_per_node=2"],
            "memsweep sweep",
        ),
        # ranks as SLURM tasks outside a SLURM job: refused as the worker would, world_size 1 too
        (["mode=train", "parallel=ddp", "world_size=1", "tasks_per_node=1"], "invalid tasks_per_node=1"),
        (["mode=train", "nodes=2"], "invalid nodes=2: expected 1 with parallel=none world_size=1"),
        (["hydra.run.dir="], "invalid hydra.run.dir='': expected a directory of its own"),
        (
            ["mode=train", "parallel=ddp", "world_size=2", "reshard_after_forward=false"],
            "invalid reshard_after_forward",
        ),
        (
            [
                "workload=user_convnet",
                "mode=train",
                "optimizer=sgd",
                "+workload.optimizer._target_=memsweep.conf.examples.convnet.make_optimizers",
            ],
            "invalid optimizer='sgd'",
        ),
    ],
)
def test_run_refuses_before_any_worker_and_leaves_nothing(tmp_path, forked_memsweep, args, message):
    proc = forked_memsweep.run(["run", f"hydra.run.dir={tmp_path / 'run'}", *TINY, *args], cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.rglob("*")), "nothing written"


def test_predict_writes_where_hydra_run_dir_says(tmp_path):
    proc = subprocess.run(
        [
            MEMSWEEP,
            "predict",
            "capacity=1GiB",
            "context=8",
            "width=16",
            "--upper",
            "2",
            f"hydra.run.dir={tmp_path / 'p'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "p" / "predict.json").is_file()
    assert not (tmp_path / "results").exists(), "nothing in the default results_dir"


def test_a_refused_run_in_the_default_folders_leaves_no_empty_folder(tmp_path):
    """Without hydra.run.dir the run's folder is results_dir/run/<time>: all three go when the
    run is refused, a results_dir that already held something stays."""
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "other.txt").write_text("x")
    for results, left in ((tmp_path / "res", []), (tmp_path / "kept", ["kept/other.txt"])):
        proc = subprocess.run(
            [MEMSWEEP, "run", f"results_dir={results}", *TINY, "batch=0"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2 and "invalid batch=0" in proc.stderr, proc.stderr[-2000:]
        found = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
        assert found == ["kept/other.txt"] and not (results / "run").exists(), found
        assert results.exists() == bool(left)


def test_predict_cards_add_up_and_an_empty_list_is_refused():
    from memsweep.sweeper.cli import card_names

    assert card_names(["--cards=T4", "--cards=H100, T4"]) == ["T4", "H100"]
    assert card_names(["--cards"]) is None and card_names(["--cards", "--cards=T4"]) == ["T4"]
    for empty in ("--cards=", "--cards=,"):
        with pytest.raises(SpecError) as err:
            card_names([empty])
        assert err.value.field == "--cards"


def test_predict_exits_3_when_nothing_fits(tmp_path, capsys):
    from memsweep.conf.contract import PREDICT_EXIT
    from memsweep.sweeper.cli import predict_command

    code = predict_command(["capacity=1KiB", "context=8", "width=16", f"results_dir={tmp_path}"])
    assert code == PREDICT_EXIT["nothing_fits"] == 3, capsys.readouterr().err
    assert "PREDICTED: nothing fits" in capsys.readouterr().out


def test_report_margin_is_checked_before_the_tables(tmp_path):
    proc = subprocess.run(
        [MEMSWEEP, "report", str(tmp_path / "no_sweep"), "--margin", "lots"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "invalid margin='lots'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "cannot be read"),
        ("{not json", "corrupt or truncated"),
        ('{"schema_version": 99, "batch": 1}', "newer"),
        ('{"schema_version": 1, "batch": 0, "context": 1, "width": 1}', "invalid batch=0"),
        ("[]", "JSON object"),
    ],
)
def test_worker_refuses_bad_spec_files(tmp_path, content, message):
    spec = tmp_path / "spec.json"
    if content is not None:
        spec.write_text(content)
    proc = subprocess.run(
        [sys.executable, "-m", "memsweep.worker", str(spec)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 5 and message in proc.stderr


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["float32", "bfloat16", "cpu", "cuda:0", "train", "2GiB"]),
)
# every RunSpec field (schema_version included) and one it does not have
KEYS = st.sampled_from([*(f.name for f in dataclasses.fields(RunSpec)), "bogus"])
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS, VALUES, max_size=10))
def test_spec_parser_fuzz(data):
    """Any JSON object either becomes a valid RunSpec or raises SpecError naming a field."""
    try:
        spec = RunSpec.from_dict(data)
    except SpecError as exc:
        assert exc.field and "expected" in str(exc)
    else:
        assert RunSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_record_reader_fuzz(tmp_path_factory, blob):
    """Arbitrary bytes in a record file: a dict or RecordError, never another exception."""
    path = tmp_path_factory.mktemp("fuzz") / "record.json"
    path.write_bytes(blob)
    try:
        assert isinstance(read_json(path, "record"), dict)
    except RecordError:
        pass


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "schema_version",
                "phases",
                "complete",
                "outcome",
                "environment",
                "counter_sources",
                "capacity",
                "pid",
                "device_total_memory",
            ]
        ),
        VALUES,
        max_size=9,
    )
)
def test_analysis_survives_any_record_content(tmp_path_factory, record):
    """A readable but nonsensical record still yields one row, with wrong-typed values as null."""
    root = tmp_path_factory.mktemp("an")
    run = Run(root / "0", {"schema_version": 1, "batch": 1, "context": 1, "width": 1}, record=record)
    row = run_row(run, root)
    assert row["run_id"] == "0"
    phase_rows(run, "0", root)


def test_a_record_nested_too_deeply_is_an_unreadable_record_not_a_traceback(tmp_path):
    from memsweep.conf.contract import read_run

    (tmp_path / "spec.json").write_text(json.dumps({"schema_version": 1}))
    (tmp_path / "record.json").write_text("[" * 100000 + "]" * 100000)
    run = read_run(tmp_path)
    assert run.record is None and run.record_damage == "corrupt"
    assert any("nested too deeply" in p for p in run.problems), run.problems


@pytest.mark.parametrize("command", ["analyze", "report"])
def test_an_empty_directory_and_a_whole_file_system_are_no_sweep(tmp_path, forked_memsweep, command):
    for target in (tmp_path, "/"):
        proc = forked_memsweep.run([command, str(target)], cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("counter", ["parser", "auto"])
def test_estimate_refuses_a_fifo_and_a_device_as_its_config_without_reading_them(tmp_path, counter):
    from memsweep.estimator.counted import describe_config

    fifo, zero = tmp_path / "fifo.json", tmp_path / "zero.json"
    os.mkfifo(fifo)
    zero.symlink_to("/dev/zero")
    for path in (fifo, zero):
        with pytest.raises(ValueError, match="not a regular file"):
            describe_config(path, counter)
