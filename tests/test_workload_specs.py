"""Bad workloads and mode options are refused with a SpecError naming the field and the accepted
values, in the worker's contract (RunSpec) and when composing the Hydra config (no worker)."""

from pathlib import Path

import pytest

from memsweep.conf.contract import (
    GENERATE_PHASES,
    TRAIN_PHASES,
    RunSpec,
    SpecError,
    check_axis_read,
    hf_config_kind,
    validate_workload,
)

LM = {"name": "transformer", "layers": 2, "heads": 4, "vocab": 128}
USER = {"name": "user", "model": {"_target_": "a.model"}, "inputs": {"_target_": "a.inputs"}}
HF = {"name": "hf", "config": "LlamaConfig"}


def _spec(**kw):
    return RunSpec.from_dict({"batch": 2, "context": 16, "width": 32, "device": "cpu", **kw})


@pytest.mark.parametrize(
    "fields, field, accepted",
    [
        ({"workload": {**LM, "heads": 3}}, "workload.heads", "divisor of hidden=32"),
        ({"workload": {**LM, "heads": 4, "hidden": 30}}, "workload.heads", "divisor of hidden=30"),
        ({"workload": {**LM, "kv_heads": 3}}, "workload.kv_heads", "divisor of heads=4"),
        ({"workload": {**LM, "head_dim": 7}}, "workload.head_dim", "even"),
        ({"workload": {**LM, "heads": 32, "kv_heads": 32}}, "workload.heads", "even head_dim"),
        ({"workload": {**LM, "attention": "flash"}}, "workload.attention", "sdpa, eager"),
        ({"workload": {**LM, "norm": "batchnorm"}}, "workload.norm", "rmsnorm, layernorm"),
        ({"workload": {**LM, "ffn": "relu"}}, "workload.ffn", "gelu, swiglu"),
        ({"workload": {**LM, "layers": 0}}, "workload.layers", "integer"),
        ({"workload": {**LM, "tie_embeddings": "yes"}}, "workload.tie_embeddings", "true or false"),
        ({"workload": {**LM, "depth": 2}}, "workload.depth", "transformer settings"),
        ({"workload": {"name": "hf"}}, "workload.config", "config class name"),
        ({"workload": {"name": "hf", "config": "not a model"}}, "workload.config", "model type"),
        ({"workload": {"name": "hf", "config": "gpt2", "overrides": [1]}}, "workload.overrides", "mapping"),
        ({"workload": {"name": "hf", "config": "gpt2", "attention": "flash"}}, "workload.attention", "sdpa"),
        ({"workload": {"name": "user", "inputs": {"_target_": "a.b"}}}, "workload.model", "_target_"),
        (
            {"workload": {"name": "user", "model": {"_target_": "nodots"}, "inputs": {"_target_": "a.b"}}},
            "workload.model._target_",
            "dotted path",
        ),
        (
            {
                "workload": {
                    "name": "user",
                    "model": {"_target_": "a.b", "_partial_": True},
                    "inputs": {"_target_": "a.b"},
                }
            },
            "workload.model._partial_",
            "keyword arguments",
        ),
        (
            {"workload": {"name": "user", "model": {"_target_": "a.b"}, "inputs": {"_target_": "a.b"}, "path": "x"}},
            "workload.path",
            "list of directories",
        ),
        ({"mode": "generate"}, "mode", "generate needs a KV cache"),
        ({"mode": "serve"}, "mode", "inference, train, generate"),
        ({"precision": "autocast"}, "precision", "float16 or bfloat16"),
        ({"precision": "amp", "dtype": "bfloat16"}, "precision", "pure, autocast"),
        ({"optimizer": "lion", "mode": "train"}, "optimizer", "adamw, sgd, adafactor, adamw8bit"),
        ({"checkpointing": True}, "checkpointing", "mode=train"),
        ({"checkpointing": "yes", "mode": "train"}, "checkpointing", "true or false"),
        ({"micro_steps": 2}, "micro_steps", "mode=train"),
        ({"micro_steps": 0, "mode": "train"}, "micro_steps", "integer"),
        ({"eval_batch": 4}, "eval_batch", "mode=train"),
        ({"eval_batch": 0, "mode": "train"}, "eval_batch", "integer"),
        ({"export": 1}, "export", "true or false"),
        ({"new_tokens": 0, "mode": "generate", "workload": LM}, "new_tokens", "integer"),
        ({"kv_cache": "paged", "mode": "generate", "workload": LM}, "kv_cache", "dynamic, static"),
        ({"fault": {"phase": "cold_step.sideways", "kind": "oom"}}, "fault.phase", "cold_step.backward"),
        # a user optimizer factory replaces the spec's optimizer: another value would be ignored
        (
            {"mode": "train", "optimizer": "sgd", "workload": {**USER, "optimizer": {"_target_": "a.make"}}},
            "optimizer",
            "workload.optimizer=a.make",
        ),
    ],
)
def test_bad_workload_or_option_is_refused_naming_the_field(fields, field, accepted):
    with pytest.raises(SpecError) as err:
        _spec(**fields)
    assert err.value.field == field
    assert accepted in str(err.value)


def test_transformer_defaults_and_explicit_head_dim():
    spec = _spec(workload={**LM, "heads": 3, "head_dim": 16})  # 3 does not divide 32, head_dim given
    assert spec.workload["kv_heads"] is None and spec.workload["attention"] == "sdpa"
    assert validate_workload({"name": "transformer"})["vocab"] == 32000


@pytest.mark.parametrize(
    "config, kind",
    [
        ("LlamaConfig", "class"),
        ("gpt2", "model_type"),
        ("./model/config.json", "path"),
        ("/m", "path"),
        ("cfg.json", "path"),
    ],
)
def test_hf_config_kinds(config, kind):
    assert hf_config_kind(config) == kind


def test_phases_of_each_mode_with_eval_and_export():
    assert _spec(mode="train", eval_batch=4, export=True).phases == TRAIN_PHASES + ("eval", "export")
    assert TRAIN_PHASES[2:6] == (
        "cold_step.forward",
        "cold_step.loss",
        "cold_step.backward",
        "cold_step.optimizer_step",
    )
    assert _spec(mode="generate", workload=LM).phases == GENERATE_PHASES
    assert GENERATE_PHASES[2:4] == ("cold_generate.prefill", "cold_generate.decode")
    assert _spec(export=True).phases[-1] == "export"
    for phase in ("cold_step", "warm_step.optimizer_step", "eval", "export", "warm_generate.decode"):
        _spec(fault={"phase": phase, "kind": "oom"})


# ----- through Hydra's composition (the sweeper side, no worker process) ---------------------


@pytest.fixture
def compose():
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    def _compose(*overrides):
        with initialize_config_module(config_module="memsweep.conf", version_base="1.3"):
            return hydra_compose(config_name="config", overrides=["device=cpu", *overrides])

    return _compose


def test_config_groups_compose_into_valid_specs(compose, monkeypatch, tmp_path):
    from memsweep.sweeper.spec import spec_from_config

    spec = spec_from_config(compose("workload=transformer", "mode=generate", "new_tokens=8", "kv_cache=static"))
    assert spec.workload["name"] == "transformer" and spec.workload["hidden"] is None
    assert (spec.mode, spec.new_tokens, spec.kv_cache) == ("generate", 8, "static")
    spec = spec_from_config(
        compose(
            "mode=train",
            "optimizer=sgd",
            "micro_steps=2",
            "eval_batch=4",
            "export=true",
            "checkpointing=true",
            "dtype=bfloat16",
            "precision=autocast",
        )
    )
    assert (spec.optimizer, spec.micro_steps, spec.eval_batch, spec.export, spec.checkpointing, spec.precision) == (
        "sgd",
        2,
        4,
        True,
        True,
        "autocast",
    )
    monkeypatch.chdir(tmp_path)
    spec = spec_from_config(compose("workload=user_convnet"))
    assert spec.workload["model"]["_target_"] == "memsweep.conf.examples.convnet.build_model"
    assert spec.workload["path"] == [str(tmp_path)]  # the worker imports from where memsweep runs
    spec = spec_from_config(
        compose("workload=hf", "workload.config=LlamaConfig", "+workload.overrides.num_hidden_layers=2")
    )
    assert spec.workload["overrides"] == {"num_hidden_layers": 2}


def test_missing_optional_packages_are_named_before_any_worker(compose, monkeypatch):
    import importlib.util

    from memsweep.sweeper.spec import spec_from_config

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("transformers", "bitsandbytes") else real(name, *a),
    )
    with pytest.raises(SpecError, match=r"pip install 'memsweep\[hf\]'"):
        spec_from_config(compose("workload=hf"))
    with pytest.raises(SpecError, match="pip install bitsandbytes"):
        spec_from_config(compose("mode=train", "optimizer=adamw8bit"))
    with pytest.raises(SpecError, match="workload.kv_heads"):
        spec_from_config(compose("workload=transformer", "workload.kv_heads=3"))


@pytest.mark.parametrize(
    "fields, axis, reads",
    [
        ({}, "width", True),  # mlp
        ({"workload": LM}, "width", True),  # hidden = width
        ({"workload": {**LM, "hidden": 64}}, "width", False),  # hidden fixed
        ({"workload": USER}, "width", True),  # passed to the user's functions
        ({"workload": HF}, "width", False),  # the config's hidden_size, not width
        ({"workload": {**HF, "pretrained": None}}, "batch", True),
        ({"workload": HF}, "context", True),
        ({}, "eval_batch", False),  # mode=inference
        ({"mode": "train"}, "eval_batch", True),
    ],
)
def test_varying_an_axis_the_load_ignores_is_refused_naming_the_field(fields, axis, reads):
    spec = _spec(**fields)
    if reads:
        check_axis_read(spec, axis, "--axis")
        return
    with pytest.raises(SpecError) as err:
        check_axis_read(spec, axis, "--axis")
    assert err.value.field == "--axis" and err.value.value == axis and f"not {axis}" in str(err.value)
    with pytest.raises(SpecError) as err:  # a sweep's value, named by its axis
        check_axis_read(spec, axis, axis, 16)
    assert err.value.field == axis and err.value.value == 16


def test_the_runs_table_names_the_optimizer_that_ran():
    """A user factory's target, not the spec's unused default optimizer (adamw)."""
    from memsweep.analysis.tables import run_row
    from memsweep.conf.contract import Run, run_optimizer

    factory = _spec(mode="train", workload={**USER, "optimizer": {"_target_": "a.make"}}).to_dict()
    plain = _spec(mode="train", optimizer="sgd").to_dict()
    assert factory["optimizer"] == "adamw" and run_optimizer(factory) == "a.make"
    assert run_optimizer(plain) == "sgd" and run_optimizer({"workload": "junk"}) is None
    for spec, name in ((factory, "a.make"), (plain, "sgd")):
        assert run_row(Run(Path("/nonexistent/0"), spec, record={}), Path("/nonexistent"))["optimizer"] == name


def test_the_console_line_leaves_out_a_width_the_load_ignores(tmp_path):
    from memsweep.sweeper.job import outcome_line

    result = {"outcome": "ok", "failed_phase": None, "wall_s": 1.0}
    assert " width=32 " in outcome_line(_spec(), tmp_path, result)
    assert "width=" not in outcome_line(_spec(workload=HF), tmp_path, result)


@pytest.mark.parametrize(
    "workload, named",
    [(None, True), (HF, False), ({**LM, "hidden": 64}, False), (LM, True), (USER, True)],
)
def test_a_table_row_names_the_width_only_where_the_load_reads_it(tmp_path, workload, named):
    """The frontier's fixed load and the report's title (``load_words`` on a runs-table row, whose
    workload is a name and its params JSON text) follow ``axis_ignored``, like the console line."""
    from memsweep.analysis.tables import run_row
    from memsweep.conf.contract import Run, axis_ignored
    from memsweep.estimator.labels import load_words
    from memsweep.sweeper.job import outcome_line

    spec = _spec() if workload is None else _spec(workload=workload)
    row = run_row(Run(tmp_path / "0", spec.to_dict(), record={}), tmp_path)
    assert isinstance(row["workload"], str) and isinstance(row["workload_params"], str)
    assert (axis_ignored(spec, "width") is None) is named
    assert ("width=32" in load_words(row)) is named
    assert ("width=32" in load_words(spec.to_dict())) is named
    result = {"outcome": "ok", "failed_phase": None, "wall_s": 1.0}
    assert (" width=32 " in outcome_line(spec, tmp_path, result)) is named
    assert "width=32" in load_words(row, also=("width",))  # asked for by name: always named
