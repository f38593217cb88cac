"""The training precision recipe: ``precision=auto`` (the default) is what "16-bit training" means
(float32 master weights and optimizer states, 16-bit compute: Lightning's ``bf16-mixed``), with
pure 16-bit (``bf16-true``) by name; the spec stores it resolved, and the estimate, the dry run,
the measured run and every verdict line agree on it and name it."""

import json
import re
from pathlib import Path

import pytest

from memsweep.conf.contract import RunSpec, SpecError, parse_size
from memsweep.conf.contract.spec import resolve_precision
from memsweep.estimator.labels import load_words, recipe_word, size_word, verdict_words

SMALL = dict(batch=2, context=8, width=16, device="cpu")
TINY_LLAMA_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 64,
}


@pytest.mark.parametrize(
    "precision, mode, dtype, workload, resolved",
    [
        ("auto", "train", "bfloat16", None, "autocast"),
        ("auto", "train", "float16", None, "autocast"),
        ("auto", "train", "float32", None, "pure"),
        ("auto", "inference", "bfloat16", None, "pure"),
        ("auto", "generate", "float16", None, "pure"),
        ("auto", "train", "bfloat16", {"lora_rank": 8}, "pure"),
        ("auto", "train", "bfloat16", {"lora_rank": 8, "quantization": "nf4"}, "pure"),
        ("auto", "train", "bfloat16", {"train_step": {"_target_": "m.step"}}, "pure"),
        ("mixed", "inference", "bfloat16", None, "autocast"),
        ("pure", "train", "bfloat16", None, "pure"),
        ("autocast", "inference", "float16", None, "autocast"),
    ],
)
def test_auto_resolves_to_mixed_for_16_bit_training_of_the_models_own_weights(
    precision, mode, dtype, workload, resolved
):
    assert resolve_precision(precision, mode, dtype, workload) == resolved


def test_a_spec_stores_the_resolved_precision_and_reads_it_back_unchanged():
    assert RunSpec(**SMALL).precision == "pure"
    spec = RunSpec(**SMALL, mode="train", dtype="bfloat16")
    assert spec.precision == "autocast" and spec.to_dict()["precision"] == "autocast"
    assert RunSpec.from_dict(spec.to_dict()) == spec
    assert RunSpec(**SMALL, mode="train", dtype="bfloat16", precision="pure").precision == "pure"
    assert RunSpec(**SMALL, mode="train", dtype="float16", precision="mixed").precision == "autocast"
    with pytest.raises(SpecError, match="pure with dtype=float32"):  # explicit autocast stays refused there
        RunSpec(**SMALL, mode="train", precision="autocast")


def test_the_defaults_are_auto_and_a_lightning_name_gets_the_settings_that_say_it():
    from omegaconf import OmegaConf

    config = OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "config.yaml")
    assert config.precision == "auto"
    assert {f: RunSpec.__dataclass_fields__[f].default for f in ("precision",)} == {"precision": "auto"}
    with pytest.raises(SpecError, match=r"bf16-mixed is dtype=bfloat16 precision=autocast"):
        RunSpec(**SMALL, precision="bf16-mixed")
    with pytest.raises(SpecError, match=r"16-true is dtype=float16 precision=pure"):
        RunSpec(**SMALL, precision="16-true")
    with pytest.raises(SpecError, match=r"one of auto, pure, autocast, mixed$"):
        RunSpec(**SMALL, precision="amp")


@pytest.mark.parametrize(
    "load, word",
    [
        (dict(mode="train", dtype="bfloat16", precision="autocast"), "bf16-mixed"),
        (dict(mode="train", dtype="bfloat16", precision="pure"), "bf16-true"),
        (dict(mode="train", dtype="float16", precision="autocast"), "16-mixed"),
        (dict(mode="train", dtype="float16", precision="pure"), "16-true"),
        (dict(mode="train", dtype="float32", precision="pure"), "32-true"),
        (dict(mode="inference", dtype="bfloat16", precision="autocast"), "bf16-mixed"),
        (dict(mode="inference", dtype="bfloat16", precision="pure"), None),
        (dict(mode="generate", dtype="float16", precision="pure"), None),
        (dict(mode="train", dtype=None, precision="autocast"), "autocast"),  # a dtype sweep's frontier row
        (dict(mode="train", dtype="bfloat16", precision="auto"), "bf16-mixed"),  # a composed config
        (dict(mode=None, dtype="bfloat16", precision="auto"), None),
        (dict(mode="train", dtype="bfloat16"), None),
    ],
)
def test_the_label_names_the_recipe_in_lightnings_words(load, word):
    assert recipe_word(load) == word
    assert (f"precision={word}" in load_words(load)) is (word is not None)


def test_a_verdict_names_mode_recipe_optimizer_checkpointing_and_capacity():
    spec = RunSpec(**SMALL, mode="train", dtype="bfloat16", checkpointing=True, micro_steps=2)
    assert verdict_words(spec.to_dict(), 80 * 10**9, skip=("batch",)) == [
        "mode=train",
        "context=8",
        "width=16",
        "dtype=bfloat16",
        "precision=bf16-mixed",
        "optimizer=adamw",
        "checkpointing=true",
        "micro_steps=2",
        "capacity=80GB",
    ]
    inference = RunSpec(**SMALL, dtype="bfloat16").to_dict()
    assert verdict_words(inference, None) == [
        "mode=inference",
        "batch=2",
        "context=8",
        "width=16",
        "dtype=bfloat16",
        "capacity=device",
    ]


@pytest.mark.parametrize(
    "value, word",
    [
        (80 * 10**9, "80GB"),
        (2 * 2**30, "2GiB"),
        (256 * 2**20, "256MiB"),
        (1500 * 10**6, "1500MB"),
        (123, "123B"),
    ],
)
def test_a_verdicts_capacity_reads_back_exactly(value, word):
    assert size_word(value) == word and parse_size(word) == value


def test_the_estimate_follows_the_resolved_recipe():
    """16 B/param of model states for the default (float32 weights, gradients, AdamW's two
    states), 8 B/param for pure bfloat16; the estimator's figures as the worker stores them."""
    from memsweep.estimator.hf_config import parse_hf_config
    from memsweep.estimator.hf_load import estimate_hf_load

    model = parse_hf_config(TINY_LLAMA_CONFIG)
    load = dict(SMALL, mode="train", dtype="bfloat16", device="cuda:0")  # CUDA: AdamW's step on the host
    workload = {"name": "hf", "config": "LlamaConfig"}
    per_param = {}
    for precision in ("auto", "pure"):
        spec = RunSpec(**load, precision=precision, workload=workload)
        b = estimate_hf_load(model, spec)
        per_param[spec.precision] = (b.weights + b.gradients + b.optimizer_states) / model.parameters
    assert per_param == {"autocast": 16, "pure": 8}


def test_the_dry_run_and_the_measured_run_use_the_same_recipe(tmp_path):
    """A bfloat16 mlp training run at the default: float32 weights and optimizer states in the
    measured run and in its dry run alike, computed in bfloat16."""
    from memsweep.sweeper.process import execute

    base = dict(
        SMALL, mode="train", dtype="bfloat16", warmup=1, repeats=1, threads=1, workload={"name": "mlp", "depth": 2}
    )
    records = {}
    for kind in ("measured", "predicted"):
        spec = RunSpec.from_dict(dict(base, dry_run=kind == "predicted"))
        execute(spec, tmp_path / kind)
        records[kind] = json.loads((tmp_path / kind / "record.json").read_text())
    for record in records.values():
        assert record["outcome"] == "ok", record.get("error_message")
        assert record["spec"]["precision"] == "autocast"
        assert (record["model"]["param_dtype"], record["model"]["compute_dtype"]) == ("float32", "bfloat16")
    states = {
        kind: [p.get("optimizer_state_bytes") for p in r["phases"] if p["name"].endswith("optimizer_step")]
        for kind, r in records.items()
    }
    parameters = records["measured"]["model"]["parameters"]
    assert states["measured"] == states["predicted"] and states["measured"][0] >= 8 * parameters


def _verdict(printed: str) -> str:
    (line,) = [line for line in printed.splitlines() if line.strip().startswith("PREDICTED")]
    return line


def test_predict_says_which_recipe_it_answered_for(tmp_path, capsys):
    """``memsweep predict`` of a bfloat16 training load: the default is mixed and says so; pure
    bfloat16 by name fits a larger batch (half the bytes per parameter) and is labelled
    bf16-true."""
    from memsweep.sweeper.cli import main

    load = ["mode=train", "dtype=bfloat16", "context=8", "width=64", "workload.depth=2", "threads=1", "device=cpu"]
    load += ["capacity=2MiB", f"results_dir={tmp_path}"]
    edges = {}
    for extra, recipe in (([], "bf16-mixed"), (["precision=pure"], "bf16-true")):
        assert main(["predict", *load, *extra]) == 0
        line = _verdict(capsys.readouterr().out)
        assert line.endswith(
            f"for mode=train context=8 width=64 dtype=bfloat16 precision={recipe} optimizer=adamw "
            "checkpointing=false capacity=2MiB"
        ), line
        edges[recipe] = int(re.search(r"max fit batch=(\d+)", line).group(1))
    assert edges["bf16-true"] > edges["bf16-mixed"]


@pytest.mark.parametrize(
    "recipe, per_param", [("bf16-mixed", 16), ("16-mixed", 16), ("bf16-true", 8), ("16-true", 8), ("32-true", 16)]
)
def test_memsweep_estimate_takes_the_recipe_in_lightnings_words(recipe, per_param, capsys):
    """``memsweep estimate --precision``: AdamW's model states per parameter (weights, gradients,
    two states, mixed precision's fp32 master copy); the 16-bit default is the mixed recipe."""
    from memsweep.estimator.cli import main as estimate_main

    assert estimate_main(["--parameters", "1000", "--train", "--precision", recipe, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["estimate"]["peak"] == 1000 * per_param
    if recipe == "bf16-mixed":
        assert estimate_main(["--parameters", "1000", "--train", "--format", "bf16", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["estimate"]["peak"] == 1000 * per_param


@pytest.mark.parametrize(
    "args",
    [
        ["--parameters", "1000", "--train", "--format", "bf16"],
        ["--parameters", "1000", "--train", "--no-mixed-precision"],
        ["--parameters", "1000"],  # no --train
        ["--workload", "mlp", "--mode", "train", "--batch", "2", "--context", "8", "--width", "16"],
    ],
)
def test_memsweep_estimate_refuses_a_recipe_it_cannot_apply(args, capsys):
    from memsweep.estimator.cli import main as estimate_main

    assert estimate_main([*args, "--precision", "bf16-true"]) == 2
    assert "--precision" in capsys.readouterr().err


def test_a_training_dtype_sweep_is_one_frontier_row_though_auto_differs_by_dtype():
    """precision=auto makes float32 pure and bfloat16 autocast in one training sweep of the dtype
    axis: still one load along that axis, every dtype in its row."""
    from memsweep.analysis.frontier import frontier_table
    from memsweep.analysis.tables import RUNS_SCHEMA, coerce_table

    base = dict(sweep_dir="s", workload="mlp", mode="train", device="cpu", batch=2, context=8, width=64)
    runs = [
        dict(base, run_id=d, run_dir=f"s/{d}", dtype=d, precision=p, outcome="ok", max_memory_allocated=m)
        for d, p, m in (("float32", "pure", 400), ("bfloat16", "autocast", 300))
    ]
    rows = [r for r in frontier_table(coerce_table(runs, RUNS_SCHEMA)).to_pylist() if r["axis"] == "dtype"]
    assert [(r["values"], r["n_runs"]) for r in rows] == [("bfloat16,float32", 2)]
