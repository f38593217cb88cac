"""``memsweep estimate``: an option the estimate asked for would ignore is refused; the LoRA
options need --lora-rank; --adapter-bytes is 2 or 4; --device decides AdamW's step tensors of a
--config training estimate by the run estimate's rule. Parser-counted, no worker: fast."""

from __future__ import annotations

import json

import pytest

from memsweep.conf.contract import SpecError, lora_settings_without_rank
from memsweep.conf.contract.finetune import HF_FINETUNE_DEFAULTS, check_hf_finetune
from memsweep.estimator.activations import NO_ACTIVATIONS
from memsweep.estimator.cli import main as estimate_main
from memsweep.estimator.finetune import estimate_lora_run
from memsweep.estimator.hf_config import parse_hf_config
from memsweep.estimator.lora import LoraSettings
from memsweep.estimator.training import ADAM_STEP_NOTE

TINY = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "torch_dtype": "float32",
}


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    return ["--config", str(tmp_path), "--count-with", "parser"]


def _json(argv, capsys):
    assert estimate_main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("extra", "option", "words"),
    [
        (["--mode", "train"], "--mode", "--train"),
        (["--dtype", "bfloat16"], "--dtype", "--format"),
        (["--width", "999"], "--width", "--workload mlp"),
        (["--depth", "2"], "--depth", "--workload mlp"),
        (["--device", "cuda"], "--device", "--train or --lora-rank"),
        (["--lora-alpha", "16"], "--lora-alpha", "needs --lora-rank"),
        (["--lora-targets", "q_proj"], "--lora-targets", "needs --lora-rank"),
        (["--lora-dropout", "0.1"], "--lora-dropout", "needs --lora-rank"),
        (["--adapter-bytes", "4"], "--adapter-bytes", "needs --lora-rank"),
    ],
)
def test_an_option_that_does_not_apply_is_refused(tiny, capsys, extra, option, words):
    assert estimate_main([*tiny, *extra]) == 2
    err = capsys.readouterr().err
    assert option in err and words in err


def test_mlp_options_are_refused_for_parameters_and_device_without_shapes(capsys):
    assert estimate_main(["--parameters", "1000", "--bits", "16", "--train", "--device", "cpu"]) == 2
    assert "--device applies to" in capsys.readouterr().err
    assert estimate_main(["--parameters", "1000", "--bits", "16", "--mode", "train"]) == 2
    assert "--mode applies to --workload mlp" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["1", "3", "8"])
def test_adapter_bytes_other_than_2_or_4_are_refused(tiny, capsys, value):
    with pytest.raises(SystemExit) as info:
        estimate_main([*tiny, "--lora-rank", "8", "--adapter-bytes", value])
    assert info.value.code == 2 and "--adapter-bytes" in capsys.readouterr().err
    with pytest.raises(ValueError, match="adapter bytes must be 2 or 4"):
        LoraSettings(rank=8, adapter_bytes=int(value))


def test_lora_rule_is_the_workload_settings_rule():
    assert lora_settings_without_rank({"lora_rank": None, "lora_alpha": 16, "lora_dropout": 0.0}) == ["lora_alpha"]
    assert lora_settings_without_rank({"lora_rank": 8, "lora_alpha": 16, "lora_dropout": 0.5}) == []
    with pytest.raises(SpecError) as info:
        check_hf_finetune({**HF_FINETUNE_DEFAULTS, "lora_dropout": 0.1})
    assert info.value.field == "workload.lora_dropout" and "without workload.lora_rank" in info.value.accepted


def test_lora_step_tensors_on_cpu_equal_the_run_estimate(tiny, capsys):
    """--device cpu: the CLI's LoRA figures equal an hf CPU run's estimate (est_*), AdamW's
    4-byte step per adapter tensor included; cuda: 4 B x adapter tensors fewer, and said."""
    run = estimate_lora_run(
        parse_hf_config(TINY),
        {"dtype": "float32", "device": "cpu", "mode": "train", "optimizer": "adamw", "workload": {"lora_rank": 8}},
        NO_ACTIVATIONS,
    )
    cpu = _json([*tiny, "--lora-rank", "8", "--device", "cpu"], capsys)
    for name in ("weights", "gradients", "optimizer_states"):
        assert cpu["estimate"][name] == getattr(run, name)
    cuda = _json([*tiny, "--lora-rank", "8", "--device", "cuda"], capsys)
    # peft's default targets of llama: q_proj and v_proj, lora_A and lora_B each, per layer
    adapter_tensors = TINY["num_hidden_layers"] * 2 * 2
    assert cuda["estimate"]["optimizer_states"] == run.optimizer_states - 4 * adapter_tensors
    assert ADAM_STEP_NOTE in cuda["notes"]
    unset = _json([*tiny, "--lora-rank", "8"], capsys)
    assert unset["estimate"]["optimizer_states"] == cuda["estimate"]["optimizer_states"]
    assert any("no --device given" in n for n in unset["notes"])


def test_full_training_step_tensors_follow_device(tiny, capsys):
    cpu = _json([*tiny, "--train", "--device", "cpu"], capsys)["estimate"]["optimizer_states"]
    cuda = _json([*tiny, "--train", "--device", "cuda:0"], capsys)["estimate"]["optimizer_states"]
    # one step tensor per parameter tensor (untied llama: embed, lm_head, final norm, 9 per layer)
    tensors = 3 + 9 * TINY["num_hidden_layers"]
    assert cpu - cuda == 4 * tensors
