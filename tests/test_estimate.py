"""The estimator's formulas, against values computed by hand (in each test's docstring).

No torch here: estimator/ is standard library only.
"""

import json
import subprocess
import sys

import pytest

import memsweep.estimator as E
from memsweep.conf.contract import GB, GiB, RunSpec, SpecError
from memsweep.estimator.cli import main as estimate_main
from tests.data.loads import MEMSWEEP

LLAMA2_7B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
}
MISTRAL_7B = {
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, "vocab_size": 50257}


# ---------------------------------------------------------------- weights, the seed's case


def test_seed_7b_16bit_weights_and_reserve():
    """7e9 params x 16 bits / 8 = 14_000_000_000 B = 14.00 GB (/1e9) = 13.04 GiB (/2^30 = 13.0385).
    Reserve 4 GiB = 4 x 1_073_741_824 = 4_294_967_296 B. Total 18_294_967_296 B = 17.04 GiB
    (18294967296 / 1073741824 = 17.0385)."""
    w = E.weight_bytes(7_000_000_000, E.compact_format(16))
    assert w == 14_000_000_000
    b = E.Breakdown(weights=w, reserve=4 * GiB)
    assert b.peak == 14_000_000_000 and b.reserve == 4_294_967_296 and b.total == 18_294_967_296
    assert f"{w / GB:.2f}" == "14.00" and f"{w / GiB:.2f}" == "13.04" and f"{b.total / GiB:.2f}" == "17.04"
    assert set(b.not_included) == {"gradients", "optimizer_states", "activations", "kv_cache", "temporaries"}


def test_cli_seed_command(capsys):
    """`memsweep estimate --parameters 7000000000 --bits 16 --reserve-gib 4`, as seed 003 writes it:
    weight bytes 14000000000, 14.00 GB, 13.04 GiB; reserve 4294967296 B (4.00 GiB); total
    with reserve 17.04 GiB; and it says what is not included."""
    assert estimate_main(["--parameters", "7000000000", "--bits", "16", "--reserve-gib", "4"]) == 0
    out = capsys.readouterr().out
    weights = next(line for line in out.splitlines() if line.startswith("weights"))
    assert weights.split()[1:] == ["14000000000", "14.00", "13.04"]
    reserve = next(line for line in out.splitlines() if line.startswith("reserve"))
    assert reserve.split()[-3:] == ["4294967296", "4.29", "4.00"]
    total = next(line for line in out.splitlines() if line.startswith("total with reserve"))
    assert total.split()[-3:] == ["18294967296", "18.29", "17.04"]
    header = next(line for line in out.splitlines() if line.startswith("component"))
    assert header.split()[-2:] == ["GB", "GiB"]  # separate columns, never mixed
    not_included = next(line for line in out.splitlines() if line.startswith("Not included"))
    for part in ("gradients", "optimizer states", "activations", "KV cache"):
        assert part in not_included


def test_console_script_dispatches_estimate():
    """The installed `memsweep estimate` (a subprocess, as a user runs it) prints the same bytes."""
    proc = subprocess.run(
        [MEMSWEEP, "estimate", "--parameters", "7000000000", "--bits", "16", "--reserve-gib", "4", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    est = json.loads(proc.stdout)["estimate"]
    assert est["weights"] == 14_000_000_000 and est["reserve"] == 4 * 2**30 and est["gradients"] is None


def test_cli_bad_input_exits_2(capsys):
    assert estimate_main(["--parameters", "1000"]) == 2  # no storage given
    assert "--bits" in capsys.readouterr().err
    assert estimate_main(["--parameters", "1000", "--format", "adam"]) == 2
    assert estimate_main(["--parameters", "1000", "--bits", "4", "--train"]) == 2
    assert estimate_main(["--kv-tokens", "10"]) == 2  # no dimensions
    assert estimate_main(["--parameters", "1000", "--bits", "16", "--zero-stage", "3"]) == 2  # no --train


@pytest.mark.parametrize("device", ["banana", "tpu", "auto", "cuda:x"])
def test_cli_device_is_one_it_can_count_for(capsys, device):
    mlp = ["--workload", "mlp", "--batch", "2", "--context", "8", "--width", "16"]
    with pytest.raises(SystemExit) as info:  # argparse refuses the value itself: exit 2, nothing estimated
        estimate_main([*mlp, "--device", device])
    err = capsys.readouterr().err
    assert info.value.code == 2 and f"--device: invalid device {device!r}" in err and "cpu" in err and "cuda:N" in err
    assert estimate_main([*mlp, "--device", "cuda:1"]) == 0


def test_4bit_blockwise_scales_and_double_quant():
    """NF4, blocks of 64 with fp32 absmax (bitsandbytes): 7e9 -> 7e9/2 = 3_500_000_000 values +
    7e9/64 = 109_375_000 blocks x 4 B = 437_500_000 -> 3_937_500_000 B (4.5 bits/param).
    Double quantization (QLoRA): 109_375_000 one-byte scales + ceil(109_375_000/256) = 427_247
    fp32 second-level scales x 4 = 1_708_988 -> 3_611_083_988 B; the scales cost
    (109_375_000 + 1_708_988) x 8 / 7e9 = 0.127 bits/param, the paper's 8/64 + 32/(64*256)."""
    assert E.weight_bytes(7_000_000_000, "nf4") == 3_937_500_000
    dq = E.weight_bytes(7_000_000_000, E.storage_format("nf4", double_quant=True))
    assert dq == 3_611_083_988
    assert round((dq - 3_500_000_000) * 8 / 7e9, 3) == 0.127
    # block size is a parameter: 128-value blocks halve the scale overhead
    assert E.weight_bytes(7_000_000_000, E.storage_format("nf4", block_size=128)) == 3_500_000_000 + 218_750_000
    # compact 4 bits (the seed's theoretical division): no scales at all
    assert E.weight_bytes(7_000_000_000, E.compact_format(4)) == 3_500_000_000


def test_modules_kept_in_another_precision():
    """7e9 params, 262_144_000 kept in bf16 (embeddings + lm_head of a 32000 x 4096 model x 2):
    quantized int8 part 6_737_856_000 values + ceil(6_737_856_000/4096 = 1_644_984.375) = 1_644_985
    scales x 4 = 6_579_940 B; kept part 262_144_000 x 2 = 524_288_000 B. Total 7_268_723_940 B."""
    got = E.weight_bytes(7_000_000_000, "int8", kept={"bf16": 262_144_000})
    assert got == 6_737_856_000 + 6_579_940 + 524_288_000 == 7_268_723_940


def test_quantized_config_keeps_embeddings_and_head():
    """A config-described llama in nf4: only decoder Linear weights are quantized; embeddings,
    lm_head and norms stay bf16 (bitsandbytes replaces nn.Linear and skips lm_head)."""
    model = E.parse_hf_config(LLAMA2_7B)
    kept = [t for t in model.tensors() if not t.quantizable]
    quant = [t for t in model.tensors() if t.quantizable]
    expected = sum(t.numel * 2 for t in kept) + sum(E.FORMATS["nf4"].tensor_bytes(t.numel) for t in quant)
    assert E.weights_from_shapes(model.tensors(), "nf4") == expected
    assert sum(t.numel for t in kept) == 2 * 32000 * 4096 + 65 * 4096


# ---------------------------------------------------------------- training state


def test_mixed_precision_adamw_is_16_bytes_per_param():
    """ZeRO Sec. 3.1: fp16 weights 2 + fp16 gradients 2 + fp32 master 4 + fp32 m 4 + fp32 v 4 =
    16 bytes/param; for 1e9 params, 16e9 B (weights 2e9, gradients 2e9, optimizer 12e9)."""
    p = 1_000_000_000
    state = E.training_state(p, param_bytes=2, optimizer="adamw", mixed_precision=True)
    assert state.gradients == 2 * p and state.optimizer_states == 12 * p
    total = E.weight_bytes(p, "fp16") + state.gradients + state.optimizer_states
    assert total == 16 * p


def test_seed_002_full_finetune_examples():
    """Seed 002: 7B in fp32: weights 28 GB + gradients 28 GB + 2 states 56 GB = 112 GB.
    bf16 + fp32 states, no master copy: 14 + 14 + 56 = 84 GB."""
    p = 7_000_000_000
    fp32 = E.training_state(p, param_bytes=4, mixed_precision=False)
    assert E.weight_bytes(p, "fp32") + fp32.gradients + fp32.optimizer_states == 112 * GB
    bf16 = E.training_state(p, param_bytes=2, mixed_precision=False, state_bytes=4)
    assert E.weight_bytes(p, "bf16") + bf16.gradients + bf16.optimizer_states == 84 * GB


def test_zero3_over_8_devices():
    """7e9 params, mixed-precision AdamW (16 B/param = 112e9 B on one device). ZeRO-3 over 8
    devices partitions weights, gradients and optimizer states: 112e9 / 8 = 14e9 B per device
    (weights 1.75e9, gradients 1.75e9, optimizer 10.5e9). Stage 1: 14e9 + 14e9 + 84e9/8 =
    38.5e9; stage 2: 14e9 + (14e9 + 84e9)/8 = 26.25e9."""
    p = 7_000_000_000
    b = E.Breakdown(weights=2 * p) + E.training_state(p, param_bytes=2)
    assert b.peak == 112 * GB
    z3 = E.zero_partition(b, 3, 8)
    assert (z3.weights, z3.gradients, z3.optimizer_states) == (1_750_000_000, 1_750_000_000, 10_500_000_000)
    assert z3.peak == 14 * GB
    assert E.zero_partition(b, 1, 8).peak == 38_500_000_000
    assert E.zero_partition(b, 2, 8).peak == 26_250_000_000
    assert E.zero_partition(b, 0, 8) == b


def test_zero_paper_figure1():
    """Rajbhandari et al. 2020, Figure 1: Psi = 7.5e9, K = 12, N_d = 64: baseline 120 GB,
    P_os 31.4 GB, P_os+g 16.6 GB, P_os+g+p 1.9 GB."""
    p = 7_500_000_000
    b = E.Breakdown(weights=2 * p) + E.training_state(p, param_bytes=2)
    got = [round(E.zero_partition(b, s, 64).peak / GB, 1) for s in (0, 1, 2, 3)]
    assert got == [120.0, 31.4, 16.6, 1.9]


def test_optimizer_states_by_optimizer():
    """1e6 params, fp32 states: AdamW 2 x 4e6 = 8e6 B; SGD 0; SGD momentum 4e6;
    8-bit AdamW, blocks of 256 (current bitsandbytes): 2 x (1e6 + ceil(1e6/256) = 3907 blocks x 4)
    = 2_031_256 B; blocks of 2048 (before 0.44): 2 x (1e6 + 489 x 4) = 2_003_912 B.
    Adafactor on one 4096 x 11008 matrix: (4096 + 11008) x 4 = 60_416 B vs AdamW's
    2 x 45_088_768 x 4 = 360_710_144 B; a 1-D (4096,) tensor keeps its full 4096 x 4 B."""
    assert E.optimizer_state_bytes(1_000_000, "adamw") == 8_000_000
    assert E.optimizer_state_bytes(1_000_000, "sgd") == 0
    assert E.optimizer_state_bytes(1_000_000, "sgd-momentum") == 4_000_000
    current = E.BnbSettings(256, 4096, "test")
    assert E.optimizer_state_bytes(1_000_000, "adamw8bit", bnb=current) == 2_031_256
    assert E.optimizer_state_bytes(1_000_000, "adamw8bit", bnb=E.BnbSettings(2048, 4096, "test")) == 2_003_912
    assert E.optimizer_state_bytes(0, "adafactor", shapes=[(4096, 11008)]) == 60_416
    assert E.optimizer_state_bytes(0, "adamw", shapes=[(4096, 11008)]) == 360_710_144
    assert E.optimizer_state_bytes(0, "adafactor", shapes=[(4096,)]) == 16_384
    assert E.optimizer_state_bytes(0, "adafactor-momentum", shapes=[(4096,)]) == 32_768
    with pytest.raises(ValueError, match="shape"):
        E.optimizer_state_bytes(1_000_000, "adafactor")
    # bitsandbytes keeps small tensors (< 4096 values) in 32 bits: 2 x 100 x 4
    assert E.optimizer_state_bytes(0, "adamw8bit", shapes=[(100,)], bnb=current) == 800


def test_8bit_settings_follow_the_installed_bitsandbytes(monkeypatch):
    """Absent: the current defaults (256, 4096), and the note says so; an installed 0.43 has
    blocks of 2048."""
    import importlib.metadata

    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", absent)
    s = E.bnb_settings()
    assert (s.block, s.min_8bit_size) == (256, 4096) and "not installed" in s.source
    note = E.training_state(1_000_000, optimizer="adamw8bit").notes[0]
    assert "blocks of 256" in note and "not installed" in note
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.43.3")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    s = E.bnb_settings()
    assert (s.block, s.source) == (2048, "bitsandbytes 0.43.3 installed")


# ---------------------------------------------------------------- activations


def test_korthikanti_per_layer():
    """Korthikanti et al. 2022 Eq. (1), GPT-3 175B sizes, s=2048, b=1, h=12288, a=96:
    sbh(34 + 5as/h) = 2048 x 12288 x (34 + 5 x 96 x 2048 / 12288 = 80) = 25_165_824 x 114 =
    2_868_903_936 B. Selective recomputation: 34sbh = 855_638_016 B. Full: 2sbh = 50_331_648 B.
    Fused attention: 34sbh + 4 x b x a x s = 855_638_016 + 786_432 = 856_424_448 B."""
    s, b, h, a = 2048, 1, 12288, 96
    assert E.korthikanti_layer_bytes(s, b, h, a) == 2_868_903_936
    f = E.transformer_layer_activation_bytes
    assert f(s, b, h, a) == 2_868_903_936
    assert f(s, b, h, a, recompute="selective") == 855_638_016
    assert f(s, b, h, a, recompute="full") == 50_331_648
    assert f(s, b, h, a, fused_attention=True) == 856_424_448
    # without dropout: 32sbh + 2as^2b (no masks, no dropout output)
    assert f(s, b, h, a, dropout=False) == 32 * s * b * h + 2 * a * s * s * b


# ---------------------------------------------------------------- KV cache


def test_seed_kv_cache_1gib_and_4_sequences():
    """Seed 003: 2 (K and V) x 32 layers x 8 KV heads x 128 x 8192 tokens x 2 bytes x 1 sequence
    = 2 x 32 x 8 x 128 x 8192 x 2 = 1_073_741_824 B = 1 GiB; 4 sequences = 4 GiB."""
    kw = dict(layers=32, kv_heads=8, head_dim=128, tokens=8192, bytes_per_value=2)
    assert E.kv_cache_bytes(**kw, sequences=1) == 1_073_741_824 == GiB
    assert E.kv_cache_bytes(**kw, sequences=4) == 4 * GiB


def test_gqa_uses_kv_heads_not_query_heads():
    """Mistral-7B (GQA): 32 query heads share 8 KV heads. At 4096 tokens, 1 sequence, bf16:
    2 x 32 x 8 x 128 x 4096 x 2 = 536_870_912 B (0.5 GiB). Using the 32 query heads would give
    2 GiB, 4x too much."""
    model = E.parse_hf_config(MISTRAL_7B)
    assert (model.heads, model.kv_heads, model.head_dim) == (32, 8, 128)
    b = E.estimate_transformer(model, kv_tokens=4096, kv_sequences=1)
    assert b.kv_cache == 536_870_912
    wrong = E.kv_cache_bytes(layers=32, kv_heads=model.heads, head_dim=128, tokens=4096)
    assert wrong == 4 * b.kv_cache


def test_head_dim_precedence_sliding_window_static_cache():
    """Gemma-like: hidden 3072, 16 heads, explicit head_dim 256 (not 3072/16 = 192).
    Mistral's 4096-token window: 8192 tokens keep 4096 per layer -> 2 x 32 x 8 x 128 x 4096 x 2
    x 4 sequences = 2 GiB, not 4. A static cache of 16384 preallocates 16384 tokens whatever
    is used: 2 x 32 x 8 x 128 x 16384 x 2 = 2 GiB for 1 sequence of 10 tokens."""
    assert E.resolve_head_dim(3072, 16, 256) == 256
    assert E.resolve_head_dim(3072, 16) == 192
    gemma = E.parse_hf_config(
        {
            "model_type": "gemma",
            "hidden_size": 3072,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "head_dim": 256,
            "num_hidden_layers": 28,
            "intermediate_size": 24576,
            "vocab_size": 256000,
        }
    )
    assert gemma.head_dim == 256
    with pytest.raises(ValueError, match="head_dim"):
        E.resolve_head_dim(100, 3)
    mistral = E.parse_hf_config(MISTRAL_7B)
    assert E.estimate_transformer(mistral, kv_tokens=8192, kv_sequences=4).kv_cache == 2 * GiB
    llama = E.parse_hf_config({**LLAMA2_7B, "num_key_value_heads": 8})
    assert E.estimate_transformer(llama, kv_tokens=8192, kv_sequences=4).kv_cache == 4 * GiB
    assert E.estimate_transformer(llama, kv_tokens=10, kv_sequences=1, static_capacity=16384).kv_cache == 2 * GiB
    assert E.cached_tokens(100, sliding_window=4096, static_capacity=16384) == 4096
    with pytest.raises(ValueError):
        E.cached_tokens(20000, static_capacity=16384)
    # mixed layer types: only sliding layers are capped
    mixed = E.parse_hf_config(
        {**MISTRAL_7B, "num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"]}
    )
    assert mixed.kv_layer_tokens(8192) == [4096, 8192]


def test_cli_kv_cache(capsys):
    """The seed's KV case from the command line: 1 GiB, then 4 GiB with 4 sequences."""
    assert (
        estimate_main(
            [
                "--layers",
                "32",
                "--kv-heads",
                "8",
                "--head-dim",
                "128",
                "--kv-tokens",
                "8192",
                "--sequences",
                "4",
                "--json",
            ]
        )
        == 0
    )
    est = json.loads(capsys.readouterr().out)["estimate"]
    assert est["kv_cache"] == 4 * GiB and est["weights"] is None


# ---------------------------------------------------------------- model descriptions


def test_hf_config_parameter_counts(tmp_path):
    """Llama-2-7B: embeddings 32000 x 4096 = 131_072_000; per layer 4 x 4096^2 = 67_108_864
    (attention) + 3 x 4096 x 11008 = 135_266_304 (SwiGLU MLP) + 2 x 4096 (RMSNorms) =
    202_383_360, x 32 = 6_476_267_520; final norm 4096; lm_head 131_072_000 -> 6_738_415_616.
    GPT-2 small: wte 38_597_376 + wpe 786_432 + 12 x 7_087_872 + ln_f 1536 = 124_439_808."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA2_7B))
    assert E.load_hf_config(tmp_path).parameters == 6_738_415_616
    assert E.parse_hf_config(GPT2).parameters == 124_439_808
    with pytest.raises(ValueError, match="num_hidden_layers"):
        E.parse_hf_config({"hidden_size": 8})


def test_cli_config_train_zero(tmp_path, capsys):
    """--config with training and ZeRO-3 over 8 devices: per device (16 x 6_738_415_616) / 8 =
    13_476_831_232 B of model states (each component's ceil division is exact here)."""
    (tmp_path / "config.json").write_text(json.dumps(LLAMA2_7B))
    assert estimate_main(["--config", str(tmp_path), "--train", "--zero-stage", "3", "--devices", "8", "--json"]) == 0
    est = json.loads(capsys.readouterr().out)["estimate"]
    assert est["peak"] == 16 * 6_738_415_616 // 8 == 13_476_831_232
    assert (
        estimate_main(
            ["--config", str(tmp_path), "--train", "--activations", "--batch", "1", "--seq-len", "512", "--json"]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["estimate"]["activations"] > 0


# ---------------------------------------------------------------- breakdown, spec, columns


def test_breakdown_format_separates_gb_and_gib():
    b = E.Breakdown(weights=GiB, kv_cache=GB)
    lines = b.format().splitlines()
    assert lines[0].split() == ["component", "bytes", "(B)", "GB", "GiB"]
    assert lines[1].split() == ["weights", "1073741824", "1.07", "1.00"]
    assert lines[2].split() == ["KV", "cache", "1000000000", "1.00", "0.93"]
    assert b.to_dict()["peak"] == GiB + GB and b.to_dict()["gradients"] is None
    assert E.Breakdown.from_dict(b.to_dict()).peak == b.peak
    with pytest.raises(ValueError):
        E.Breakdown(weights=-1)


def test_runspec_estimate_field_validated(tiny):
    est = E.Breakdown(weights=10, activations=5).to_dict()
    spec = RunSpec.from_dict({**tiny, "estimate": est})
    assert RunSpec.from_dict(spec.to_dict()).estimate == est
    assert RunSpec.from_dict(tiny).estimate is None
    for bad in ({"weights": -1}, {"weights": 1.5}, {"bogus": 1}, [1, 2], {"peak": True}):
        with pytest.raises(SpecError, match="estimate"):
            RunSpec.from_dict({**tiny, "estimate": bad})


def test_estimate_columns():
    """est_peak 110 vs measured 100 -> estimate_error = (110 - 100) / 100 = 0.1; null unless ok."""
    est = E.Breakdown(weights=60, activations=50).to_dict()
    row = E.estimate_columns(est, 100, "ok")
    assert row["est_peak_bytes"] == 110 and row["est_weights_bytes"] == 60 and row["est_gradients_bytes"] is None
    assert row["estimate_error"] == pytest.approx(0.1)
    assert E.estimate_columns(est, 100, "oom")["estimate_error"] is None
    assert E.estimate_columns(est, None, "ok")["estimate_error"] is None
    predicted = E.estimate_columns(est, 110, "ok", "predicted")  # a dry run: nothing observed
    assert predicted["estimate_error"] is None and predicted["est_peak_bytes"] == 110
    assert E.estimate_columns(est, 110, "ok", "measured")["estimate_error"] == 0.0
    assert E.estimate_columns(None, 100, "ok") == {c: None for c in E.ESTIMATE_COLUMNS}
    for corrupt in ("x", [1], {"peak": "9"}, {"peak": -5}, {"peak": 2**70}, {"peak": True}):
        assert E.estimate_columns(corrupt, 100, "ok")["estimate_error"] is None


@pytest.mark.parametrize("dry_run, error", [(False, 0.0), (True, None)])
def test_a_dry_run_row_has_no_estimate_error(tmp_path, dry_run, error):
    """runs.parquet's estimate_error is checked against an observed peak: on a dry run's row
    (source predicted, its peak a prediction on fake tensors) it is null, never a verified 0.0."""
    from pathlib import Path

    from memsweep.analysis.tables import run_row
    from memsweep.conf.contract import Run

    spec = {"batch": 1, "device": "cpu", "dry_run": dry_run, "estimate": E.Breakdown(weights=1000).to_dict()}
    phase = {"name": "model_load", "status": "ok", "max_memory_allocated": 1000}
    record = {"complete": True, "outcome": "ok", "phases": [phase]}
    row = run_row(Run(Path(tmp_path) / "0", spec, record=record, result={"outcome": "ok"}), Path(tmp_path))
    assert row["source"] == ("predicted" if dry_run else "measured")
    assert row["est_peak_bytes"] == row["max_memory_allocated"] == 1000
    assert row["estimate_error"] == error


def test_estimator_and_sweeper_do_not_import_torch():
    code = (
        "import sys; import memsweep.estimator, memsweep.estimator.cli, memsweep.sweeper.spec, memsweep.sweeper.cli; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_adam_step_tensors_are_four_bytes_per_parameter_tensor_when_asked():
    shapes = [(8, 4), (8,), (3, 8)]
    n = 8 * 4 + 8 + 3 * 8
    base = E.training_state(n, param_bytes=4, mixed_precision=False, shapes=shapes)
    with_steps = E.training_state(n, param_bytes=4, mixed_precision=False, shapes=shapes, step_tensors=True)
    assert base.optimizer_states == 2 * 4 * n
    assert with_steps.optimizer_states - base.optimizer_states == 4 * len(shapes)
    sgd = E.training_state(n, param_bytes=4, optimizer="sgd", mixed_precision=False, shapes=shapes, step_tensors=True)
    assert sgd.optimizer_states == 0  # SGD keeps no step
    with pytest.raises(ValueError, match="shapes"):
        E.training_state(n, param_bytes=4, step_tensors=True)
