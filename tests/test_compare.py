"""memsweep compare: a float32 and a bfloat16 batch sweep of a tiny CPU load (real worker
processes), the --fail-above gate in both orders, Parquet of an older memsweep (fewer
columns), and what is not comparable."""

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from memsweep.analysis.compare import EXIT_BAD_INPUT, EXIT_NOTHING_COMPARABLE, EXIT_OK, EXIT_REGRESSION, main
from memsweep.sweeper.cli import main as memsweep
from tests.data.loads import NO_REPORT, TINY_CPU

TINY = ["sweep=none", "batch=4,8,16", "capacity=64MiB", *TINY_CPU, *NO_REPORT]


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """(float32 sweep dir, bfloat16 sweep dir): three batch values each, all fit."""
    root = tmp_path_factory.mktemp("compare")
    out = {}
    for dtype in ("float32", "bfloat16"):
        d = root / dtype
        rc = memsweep(["sweep", *TINY, f"dtype={dtype}", f"hydra.sweep.dir={d}"])
        assert rc == 0
        out[dtype] = d
    sys.argv = sys.argv[:1]
    return out["float32"], out["bfloat16"]


def test_bfloat16_peak_is_half_the_float32_one_where_activations_dominate(sweeps, capsys):
    from memsweep.analysis.compare import compare

    f32, bf16 = sweeps
    result = compare([f32, bf16])
    (cmp,) = result.comparisons
    assert cmp.comparable and cmp.gate_counter == "max_memory_allocated"
    assert [d[1] for d in result.differences] == ["dtype"]
    runs = {r["batch"]: r for r in pq.read_table(f32 / "runs.parquet").to_pylist()}
    peaks = [row for row in cmp.rows if row.phase == "run peak"]
    assert [row.value for row in peaks] == [4, 8, 16]
    for row in peaks:
        r = runs[row.value]
        assert r["est_activations_bytes"] > r["est_weights_bytes"]  # activations dominate (calculated)
        assert row.ratio("max_memory_allocated") == pytest.approx(0.5, abs=0.03)
    phases = {row.phase for row in cmp.rows}
    assert {"model_load", "inputs", "cold_forward", "warm_forward"} <= phases
    assert not cmp.not_comparable


def test_fail_above_exits_1_when_float32_comes_after_bfloat16_and_0_the_other_way(sweeps, capsys):
    f32, bf16 = sweeps
    assert main([str(bf16), str(f32), "--fail-above", "5%"]) == EXIT_REGRESSION
    out = capsys.readouterr().out
    assert "gate --fail-above 5%: FAILED, 3 peak(s) grew beyond it" in out and "(+100.0 %)" in out
    assert main([str(f32), str(bf16), "--fail-above", "5%"]) == EXIT_OK
    assert "gate --fail-above 5%: passed (3 value(s) compared" in capsys.readouterr().out
    # in bytes: float32 adds about 0.4, 0.8 and 1.4 MiB at batch 4, 8 and 16
    assert main([str(bf16), str(f32), "--fail-above", "1MiB"]) == EXIT_REGRESSION
    assert "1 peak(s) grew beyond it" in capsys.readouterr().out
    assert main([str(bf16), str(f32), "--fail-above", "64MiB"]) == EXIT_OK


def test_compare_writes_a_page_with_the_counters_plot_and_never_overwrites(sweeps, tmp_path, capsys):
    f32, bf16 = sweeps
    assert main([str(f32), str(bf16), "--out", str(tmp_path)]) == EXIT_OK
    html = (tmp_path / "compare.html").read_text()
    assert html.count('<img src="data:image/png;base64,') == 1
    assert "What differs between the sweeps" in html and "bfloat16" in html
    assert (tmp_path / "compare_plots" / "counters0_batch.png").stat().st_size > 10_000
    assert main([str(f32), str(bf16), "--out", str(tmp_path)]) == EXIT_BAD_INPUT
    assert "already exists" in capsys.readouterr().err


def _older(src: Path, dst: Path, drop: set[str]) -> Path:
    """A copy of a sweep's Parquet tables without the columns ``drop`` (as an older memsweep wrote)."""
    dst.mkdir()
    for name in ("runs.parquet", "phases.parquet"):
        t = pq.read_table(src / name)
        pq.write_table(t.drop([c for c in t.column_names if c in drop]), dst / name)
    return dst


def test_reads_parquet_of_an_older_version_with_fewer_columns(sweeps, tmp_path, capsys):
    f32, bf16 = sweeps
    old = _older(
        f32, tmp_path / "old", {"source", "device_kind", "isolation", "capacity_mode", "predicted_parameter_bytes"}
    )
    assert main([str(old), str(bf16), "--fail-above", "5%"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "written by an older memsweep: 6 columns absent, read as unknown" in out
    assert "capacity_mode" in out and "not recorded (older Parquet)" in out
    assert "passed (3 value(s) compared" in out


def test_says_what_is_not_comparable_and_why(sweeps, tmp_path, capsys):
    f32, bf16 = sweeps
    # the same runs, said to be measured on CUDA: the counters mean other things there
    cuda = tmp_path / "cuda"
    cuda.mkdir()
    for name in ("runs.parquet", "phases.parquet"):
        t = pq.read_table(bf16 / name)
        if name == "runs.parquet":
            i = t.schema.get_field_index("device_kind")
            t = t.set_column(i, "device_kind", pa.array(["cuda"] * t.num_rows))
        pq.write_table(t, cuda / name)
    assert main([str(f32), str(cuda), "--fail-above", "5%"]) == EXIT_NOTHING_COMPARABLE
    out = capsys.readouterr().out
    assert "measured on cpu in A and on cuda in B: the counters measure different things" in out
    assert "NOTHING COMPARABLE, nothing was checked" in out
    # a value run in one sweep only
    one = _older(f32, tmp_path / "one", set())
    t = pq.read_table(one / "runs.parquet")
    pq.write_table(t.filter(pc.not_equal(t["batch"], 4)), one / "runs.parquet")
    assert main([str(one), str(bf16)]) == EXIT_OK
    assert "batch=4: not run in A" in capsys.readouterr().out


def test_bad_input_is_refused_naming_the_field(sweeps, tmp_path, capsys):
    f32, bf16 = sweeps
    assert main([str(f32), str(bf16), "--fail-above", "lots"]) == EXIT_BAD_INPUT
    assert "--fail-above" in capsys.readouterr().err
    assert main([str(f32), str(tmp_path / "missing")]) == EXIT_BAD_INPUT
    assert "does not exist" in capsys.readouterr().err
    assert main([str(f32)]) == EXIT_BAD_INPUT


def test_fail_above_zero_is_accepted_as_zero_percent():
    from memsweep.analysis.compare.gate import parse_threshold

    for text in ("0", "0B", "0MiB", "0%"):
        t = parse_threshold(text)
        assert t.allowed(1000) == 0, text
    assert parse_threshold("0").bytes == 0 and parse_threshold("0%").fraction == 0


def test_a_directory_without_runs_is_bad_input_naming_it(sweeps, tmp_path, capsys):
    f32, _ = sweeps
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(f32), str(empty)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert str(empty) in err and "no measured run" in err


def test_the_pair_heading_names_both_loads_when_they_differ(sweeps, capsys):
    f32, bf16 = sweeps
    assert main([str(f32), str(bf16)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "dtype=float32) in A; dtype=bfloat16 in B: A -> B" in out
    assert main([str(f32), str(f32)]) == EXIT_OK  # the same load: one heading
    out = capsys.readouterr().out
    assert "dtype=float32): A -> B" in out and " in A;" not in out


def test_a_sweep_given_twice_is_noted_as_compared_with_itself(sweeps, capsys):
    """As ``memsweep report`` notes a directory given twice, so does compare (``./X/`` is X too)."""
    f32, bf16 = sweeps
    again = f32 / ".." / f32.name
    assert main([str(f32), str(again)]) == EXIT_OK
    err = capsys.readouterr().err
    assert f"note: {f32.resolve()} was given twice ({f32}, {again}): it is compared with itself" in err
    assert main([str(f32), str(bf16)]) == EXIT_OK
    assert "given twice" not in capsys.readouterr().err


def test_a_ddp_and_an_fsdp_load_of_the_same_sizes_are_two_series():
    """DDP and FSDP runs of one size are two loads (parallel and world_size group them), never
    one series whose values mix the two."""
    from memsweep.analysis.compare.load import Sweep
    from memsweep.analysis.compare.match import series_of

    base = dict(workload="mlp", mode="train", context=8, width=64, dtype="float32", device="cpu", world_size=2)
    runs = [dict(base, batch=b, parallel=p, run_id=f"{p}{b}") for p in ("ddp", "fsdp") for b in (1, 2)]
    series = series_of(Sweep("A", Path("s"), "test", runs, []))
    batch = [s for s in series if s.axis == "batch"]
    assert sorted(s.load["parallel"] for s in batch) == ["ddp", "fsdp"]
    assert all(sorted(s.by_value) == [1, 2] and len(s.by_value[1]) == 1 for s in batch)
