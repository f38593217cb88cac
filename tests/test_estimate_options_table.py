"""Every option of ``memsweep estimate`` on every estimate (mlp, config, lora, parameters, layers):
applied (the figure changes), noted (named in the output, no memory of its own), output (the
form of the output only) or refused (exit 2, the option named). Parser-counted, no worker."""

from __future__ import annotations

import json

import pytest

from memsweep.estimator.applicable import PATHS
from memsweep.estimator.cli import build_parser
from memsweep.estimator.cli import main as estimate_main

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

VALUE = {
    "count_with": ["--count-with", "transformers"],
    "bits": ["--bits", "8"],
    "fmt": ["--format", "nf4"],
    "block_size": ["--block-size", "128"],
    "double_quant": ["--double-quant"],
    "keep": ["--keep", "bf16:1000"],
    "train": ["--train"],
    "optimizer": ["--optimizer", "sgd"],
    "mixed": ["--mixed-precision"],
    "precision": ["--precision", "bf16-true"],
    "grad_bytes": ["--grad-bytes", "2"],
    "state_bytes": ["--state-bytes", "2"],
    "zero_stage": ["--zero-stage", "3"],
    "devices": ["--devices", "4"],
    "lora_rank": ["--lora-rank", "8"],
    "lora_targets": ["--lora-targets", "q_proj,k_proj,v_proj"],
    "lora_alpha": ["--lora-alpha", "32"],
    "lora_dropout": ["--lora-dropout", "0.1"],
    "adapter_bytes": ["--adapter-bytes", "2"],
    "base_format": ["--base-format", "nf4"],
    "activations": ["--activations"],
    "batch": ["--batch", "3"],
    "seq_len": ["--seq-len", "16"],
    "recompute": ["--recompute", "full"],
    "fused_attention": ["--fused-attention"],
    "dropout": ["--no-dropout"],
    "no_head": ["--no-head"],
    "hidden_size": ["--hidden-size", "64"],
    "heads": ["--heads", "4"],
    "ffn_hidden": ["--ffn-hidden", "96"],
    "gated_mlp": ["--gated-mlp"],
    "act_bytes": ["--act-bytes", "4"],
    "kv_tokens": ["--kv-tokens", "32"],
    "sequences": ["--sequences", "3"],
    "layers": ["--layers", "2"],
    "kv_heads": ["--kv-heads", "1"],
    "head_dim": ["--head-dim", "8"],
    "kv_bytes": ["--kv-bytes", "1"],
    "sliding_window": ["--sliding-window", "8"],
    "static_cache": ["--static-cache", "64"],
    "kv_convention": ["--kv-convention", "full"],
    "context": ["--context", "16"],
    "width": ["--width", "32"],
    "depth": ["--depth", "3"],
    "hidden": ["--hidden", "48"],
    "activation": ["--activation", "relu"],
    "dtype": ["--dtype", "bfloat16"],
    "mode": ["--mode", "train"],
    "device": ["--device", "cuda"],
    "warmup": ["--warmup", "1"],
    "repeats": ["--repeats", "2"],
    "reserve_gib": ["--reserve-gib", "1"],
    "reserve_gb": ["--reserve-gb", "1"],
    "json": ["--json"],
    "decimals": ["--decimals", "4"],
}
"""One value per option (argparse destination) that the option's refusal is tried with."""

MODEL = ("parameters", "config", "workload")
"""The model choice: it decides the estimate, it is not an option of one."""

ACT = ["--activations", "--batch", "1", "--seq-len", "16"]
BARE_ACT = [*ACT, "--layers", "2", "--hidden-size", "64", "--heads", "4"]
BARE_KV = ["--kv-tokens", "32", "--layers", "2", "--kv-heads", "2", "--head-dim", "16"]
KV = ["--kv-tokens", "32"]

APPLIED = "applied"
NOTED = "noted"
OUTPUT = "output"
NOTED_AS = {"lora_alpha": "alpha=32,"}
"""How a noted option's ``VALUE`` reads in the notes."""


Row = tuple[str, list[str], list[str] | None]
"""(kind, the options it needs beside it, the option's argv when not ``VALUE``'s: a second value
of an option the estimate needs, compared with the first)."""


def _rows(kind: str, names: str, prereq: list[str]) -> dict[str, Row]:
    return {name: (kind, prereq, None) for name in names.split()}


F = ["--format", "bf16"]
TRAIN_ACT = ["--train", *ACT]

# per path: option -> Row; an option not listed is refused
TABLE: dict[str, dict[str, Row]] = {
    "mlp": {
        **_rows(APPLIED, "batch context width depth hidden dtype mode device warmup repeats", []),
        "activation": (APPLIED, ["--mode", "train"], None),
        **_rows(APPLIED, "reserve_gib reserve_gb", []),
        **_rows(OUTPUT, "json decimals", []),
    },
    "config": {
        **_rows(APPLIED, "bits fmt train lora_rank kv_tokens reserve_gib reserve_gb", []),
        **_rows(APPLIED, "block_size double_quant", ["--format", "nf4"]),
        **_rows(APPLIED, "optimizer mixed precision grad_bytes state_bytes", ["--train"]),
        "device": (APPLIED, ["--train"], ["--device", "cpu"]),
        "zero_stage": (APPLIED, ["--train"], ["--zero-stage", "3", "--devices", "4"]),
        "devices": (APPLIED, ["--train", "--zero-stage", "3", "--devices", "2"], None),
        "activations": (APPLIED, ["--train"], ACT),
        "batch": (APPLIED, TRAIN_ACT, ["--batch", "3"]),
        "seq_len": (APPLIED, TRAIN_ACT, ["--seq-len", "32"]),
        **_rows(APPLIED, "recompute fused_attention dropout no_head", TRAIN_ACT),
        **_rows(APPLIED, "sequences kv_bytes sliding_window static_cache", KV),
        "kv_convention": (APPLIED, [*KV, "--sliding-window", "8"], None),
        **_rows(OUTPUT, "count_with json decimals", []),
    },
    "lora": {
        **_rows(APPLIED, "fmt base_format lora_rank lora_targets adapter_bytes optimizer reserve_gib reserve_gb", []),
        **_rows(APPLIED, "block_size double_quant", ["--base-format", "nf4"]),
        "device": (APPLIED, [], ["--device", "cpu"]),
        "activations": (APPLIED, [], ACT),
        "batch": (APPLIED, ACT, ["--batch", "3"]),
        "seq_len": (APPLIED, ACT, ["--seq-len", "32"]),
        **_rows(APPLIED, "recompute fused_attention dropout no_head lora_dropout", ACT),
        "lora_alpha": (NOTED, [], None),
        **_rows(OUTPUT, "count_with json decimals", []),
    },
    "parameters": {
        "bits": (APPLIED, ["--bits", "16"], None),
        "fmt": (APPLIED, F, None),
        **_rows(APPLIED, "block_size double_quant keep", ["--format", "nf4"]),
        **_rows(APPLIED, "train reserve_gib reserve_gb", F),
        **_rows(APPLIED, "optimizer state_bytes", [*F, "--train"]),
        "precision": (APPLIED, ["--train", "--precision", "bf16-true"], ["--precision", "bf16-mixed"]),
        "mixed": (APPLIED, [*F, "--train"], ["--no-mixed-precision"]),
        "grad_bytes": (APPLIED, [*F, "--train"], ["--grad-bytes", "4"]),
        "zero_stage": (APPLIED, [*F, "--train"], ["--zero-stage", "3", "--devices", "4"]),
        "devices": (APPLIED, [*F, "--train", "--zero-stage", "3", "--devices", "2"], None),
        "activations": (APPLIED, F, BARE_ACT),
        "kv_tokens": (APPLIED, F, BARE_KV),
        **_rows(APPLIED, "sequences kv_bytes sliding_window static_cache", [*F, *BARE_KV]),
        "kv_convention": (APPLIED, [*F, *BARE_KV, "--sliding-window", "8"], None),
        **_rows(OUTPUT, "json decimals", F),
    },
    "layers": {
        "kv_tokens": (APPLIED, BARE_KV, ["--kv-tokens", "64"]),
        **_rows(APPLIED, "sequences kv_bytes sliding_window static_cache reserve_gib reserve_gb", BARE_KV),
        "kv_convention": (APPLIED, [*BARE_KV, "--sliding-window", "8"], None),
        **_rows(APPLIED, "activations recompute fused_attention dropout ffn_hidden gated_mlp act_bytes", BARE_ACT),
        **_rows(OUTPUT, "json decimals", BARE_KV),
    },
}
_DIMS = {
    "layers": (BARE_KV, ["--layers", "3"]),
    "kv_heads": (BARE_KV, ["--kv-heads", "1"]),
    "head_dim": (BARE_KV, ["--head-dim", "8"]),
    "hidden_size": (BARE_ACT, ["--hidden-size", "128"]),
    "heads": (BARE_ACT, ["--heads", "8"]),
    "batch": (BARE_ACT, ["--batch", "3"]),
    "seq_len": (BARE_ACT, ["--seq-len", "32"]),
}
for _path, _extra in (("parameters", F), ("layers", [])):
    for _name, (_prereq, _option) in _DIMS.items():
        TABLE[_path][_name] = (APPLIED, [*_extra, *_prereq], _option)
for _path, _extra in (("parameters", F), ("layers", [])):
    TABLE[_path]["activations"] = (APPLIED, _extra, BARE_ACT)
"""Per estimate, the options it applies (and what each needs beside it)."""


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    (d / "config.json").write_text(json.dumps(TINY))
    config = ["--config", str(d), "--count-with", "parser"]
    return {
        "mlp": ["--workload", "mlp", "--batch", "2", "--context", "8", "--width", "16"],
        "config": config,
        "lora": [*config, "--lora-rank", "4"],
        "parameters": ["--parameters", "1000000"],
        "layers": [],
    }


def _estimate(argv, capsys):
    code = estimate_main([*argv, "--json"] if "--json" not in argv else argv)
    captured = capsys.readouterr()
    assert code == 0, (argv, captured.err)
    answer = json.loads(captured.out)
    return answer, (answer["estimate"], answer.get("phases"))


def test_the_table_covers_every_option():
    dests = {a.dest for a in build_parser()._actions if a.option_strings and a.dest != "help"}
    assert dests == set(VALUE) | set(MODEL)
    assert set(TABLE) == set(PATHS)
    for path, rows in TABLE.items():
        assert set(rows) <= set(VALUE), path


CELLS = [(path, name) for path in PATHS for name in VALUE]


@pytest.mark.parametrize(("path", "name"), CELLS, ids=[f"{p}-{n}" for p, n in CELLS])
def test_an_option_is_applied_or_refused(bases, capsys, path, name):
    kind, prereq, option = TABLE[path].get(name, ("refused", [], None))
    option = option or VALUE[name]
    base = bases[path]
    if kind == "refused":
        argv = [*base, *option]
        if path == "layers":  # something to estimate, so that the option is what is refused
            argv += BARE_KV
        assert estimate_main(argv) == 2, argv
        assert option[0] in capsys.readouterr().err, argv
        return
    with_option, figures = _estimate([*base, *prereq, *option], capsys)
    without = _estimate([*base, *prereq], capsys)[1] if base or prereq else None
    if kind == APPLIED:
        assert figures != without, (path, name)
    elif kind == NOTED:  # the value is named in the output, and the figures do not move
        assert figures == without, (path, name)
        assert NOTED_AS[name] in " ".join(with_option["notes"]), with_option["notes"]
    else:  # OUTPUT: how the answer is shown, never what it is
        assert kind == OUTPUT and figures == without, (path, name)


@pytest.mark.parametrize("optimizer", ["adamw8bit", "sgd"])
def test_the_mlp_replay_refuses_an_optimizer_it_does_not_model(capsys, optimizer):
    argv = ["--workload", "mlp", "--batch", "8", "--context", "128", "--width", "256", "--mode", "train"]
    assert estimate_main([*argv, "--optimizer", optimizer]) == 2
    err = capsys.readouterr().err
    assert "--optimizer does not apply to the mlp estimate" in err and "AdamW" in err
