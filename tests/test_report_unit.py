"""The margin report on synthetic analysis tables (no worker processes): margin arithmetic,
choice of setting, context fit, estimator and frontier-search columns, several sweeps,
never overwriting. The real-sweep checks are in test_report.py."""

import math

import pyarrow as pa
import pytest

from memsweep.analysis.frontier import frontier_table
from memsweep.analysis.report import (
    ReportExists,
    build_report,
    crossing,
    decomposition,
    fit_context,
    parse_margin,
    peak_increments,
    write_report,
)
from memsweep.analysis.tables import PHASES_SCHEMA, RUNS_SCHEMA, coerce_table
from memsweep.conf.contract import GiB, SpecError
from memsweep.estimator import cards

MiB = 2**20


def make(sweep_dir, points, *, axis="batch", kind="cuda", capacity=GiB, base=None, device=None, torch="2.13.0"):
    """Runs and phases rows for one sweep: ``points`` = [(value, outcome, reserved, allocated)]."""
    base = dict(base or {"batch": 8, "context": 128, "width": 256, "dtype": "float32"})
    device = device or ("cpu" if kind == "cpu" else "cuda:0")
    runs, phases = [], []
    for i, (value, outcome, reserved, allocated) in enumerate(points):
        load = {**base, axis: value}
        run_id = str(i)
        failed = None if outcome == "ok" else "cold_forward"
        runs.append(
            {
                "sweep_dir": sweep_dir,
                "run_id": run_id,
                "run_dir": f"{sweep_dir}/{run_id}",
                "workload": "mlp",
                "mode": "inference",
                **load,
                "workload_params": '{"depth": 2}',
                "warmup": 1,
                "repeats": 1,
                "seed": 0,
                "device": device,
                "device_kind": kind,
                "device_name": "NVIDIA H200" if kind == "cuda" else "x86_64",
                "device_total_memory": 150 * GiB,
                "capacity_bytes": capacity,
                "capacity_method": "torch.cuda.set_per_process_memory_fraction",
                "outcome": outcome,
                "failed_phase": failed,
                "n_phases": 5 if outcome == "ok" else 3,
                "max_memory_allocated": allocated,
                "max_memory_reserved": reserved,
                "cold_max_memory_allocated": allocated,
                "cold_max_memory_reserved": reserved,
                "warm_max_memory_allocated": allocated if outcome == "ok" else None,
                "warm_max_memory_reserved": (reserved // 2 if outcome == "ok" else None),
                "source_allocated": f"{kind}: x",
                "source_reserved": f"{kind}: y",
                "torch": torch,
                "python": "3.11",
                "alloc_conf": '{"PYTORCH_CUDA_ALLOC_CONF": null}',
                "wall_s": 1.0,
            }
        )
        weights = 10 * MiB
        names = ["model_load", "inputs", "cold_forward"] + (["warmup", "warm_forward"] if outcome == "ok" else [])
        for j, name in enumerate(names):
            peak_a = {"model_load": weights, "inputs": weights + MiB}.get(name, allocated)
            peak_r = {"model_load": weights, "inputs": weights + MiB}.get(name, reserved // (1 if j == 2 else 2))
            phases.append(
                {
                    "sweep_dir": sweep_dir,
                    "run_id": run_id,
                    **load,
                    "mode": "inference",
                    "device": device,
                    "phase": name,
                    "phase_index": j,
                    "status": "oom" if failed == name else "ok",
                    "memory_allocated_start": 0 if j == 0 else weights + (MiB if j > 1 else 0),
                    "memory_reserved_start": 0 if j == 0 else weights,
                    "memory_allocated": weights + (MiB if j >= 1 else 0),
                    "memory_reserved": peak_r,
                    "max_memory_allocated": peak_a,
                    "max_memory_reserved": peak_r,
                }
            )
    return runs, phases


def tables(runs, phases, extra_columns=None):
    runs_t = coerce_table(runs, RUNS_SCHEMA)
    for name, (typ, values) in (extra_columns or {}).items():  # replaced where the schema has it already
        column = pa.array(values, type=typ)
        i = runs_t.schema.get_field_index(name)
        runs_t = runs_t.set_column(i, name, column) if i >= 0 else runs_t.append_column(name, column)
    return runs_t, coerce_table(phases, PHASES_SCHEMA), frontier_table(coerce_table(runs, RUNS_SCHEMA))


def report_of(runs, phases, margin=None, extra_columns=None, frontier_extra=None, plots=False):
    r, p, f = tables(runs, phases, extra_columns)
    if frontier_extra:
        for name, (typ, values) in frontier_extra.items():
            column = pa.array(values, type=typ)
            i = f.schema.get_field_index(name)
            f = f.set_column(i, name, column) if i >= 0 else f.append_column(name, column)
    return build_report(r, p, f, parse_margin(margin), render_plots=plots)


def markdown(report):
    from memsweep.analysis.doc import to_markdown

    return to_markdown(report.doc, "plots")


# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,fraction,fixed",
    [
        (None, 0.1, None),
        ("10%", 0.1, None),
        ("0.25", 0.25, None),
        ("0", 0.0, None),
        ("2GiB", None, 2 * GiB),
        ("1500MB", None, 1500 * 10**6),
        ("4096B", None, 4096),
        ("0B", None, 0),
    ],
)
def test_margin_policy_parses_fractions_and_sizes(text, fraction, fixed):
    policy = parse_margin(text)
    assert policy.default is (text is None)
    if fixed is None:
        assert float(policy.fraction) == fraction and policy.bytes_for(1000) == math.ceil(fraction * 1000)
    else:
        assert policy.fixed_bytes == fixed and policy.bytes_for(1000) == fixed


@pytest.mark.parametrize("bad", ["abc", "1.5", "100%", "-1GiB", "2 parsecs", "10", "4096", "1"])
def test_bad_margin_is_refused_with_a_message(bad):
    with pytest.raises(SpecError, match="margin"):
        parse_margin(bad)


def test_cuda_margin_is_capacity_minus_reserved_and_choice_respects_it():
    """Capacity 1 GiB, margin 10 % = 107374183 B (ceil). batch 32 leaves 1 GiB - 1000 MiB = 24 MiB
    < margin, so batch 16 (800 MiB reserved, 224 MiB left) is chosen though 32 ran."""
    runs, phases = make(
        "s",
        [
            (8, "ok", 400 * MiB, 300 * MiB),
            (16, "ok", 800 * MiB, 600 * MiB),
            (32, "ok", 1000 * MiB, 900 * MiB),
            (64, "oom", 1020 * MiB, 1000 * MiB),
        ],
    )
    rep = report_of(runs, phases)
    (axis,) = rep.axes
    assert (axis.max_ok, axis.min_oom) == (32, 64)
    assert axis.used_counter == "max_memory_reserved"
    assert axis.margin_at_edge == GiB - 1000 * MiB == 24 * MiB
    assert axis.margin_bytes == math.ceil(GiB / 10)
    assert axis.recommended == 16
    assert "batch=32 ran ok but its peak" in axis.reason and "batch=64 ran out of memory" in axis.reason
    md = markdown(rep)
    assert f"| {GiB} | 1.000 | {1000 * MiB} | 0.976562 | {24 * MiB} | 0.023438 | 2.3 % |" in md
    assert "No estimate available" in md and "**batch sweep (context=128 width=256 dtype=float32): batch=16**" in md


def test_fixed_byte_margin_and_no_value_fitting():
    runs, phases = make("s", [(8, "ok", 900 * MiB, 800 * MiB), (16, "oom", 1000 * MiB, 900 * MiB)])
    rep = report_of(runs, phases, margin="200MiB")
    (axis,) = rep.axes
    assert axis.margin_bytes == 200 * MiB and axis.recommended is None
    assert "no value leaves the margin" in axis.reason
    assert "no setting recommended" in markdown(rep)


def test_non_monotonic_results_only_allow_values_below_the_first_oom():
    runs, phases = make(
        "s", [(4, "ok", 100 * MiB, 90 * MiB), (8, "oom", 900 * MiB, 800 * MiB), (16, "ok", 300 * MiB, 200 * MiB)]
    )
    rep = report_of(runs, phases)
    (axis,) = rep.axes
    assert axis.frontier["monotonic"] is False
    assert axis.recommended == 4
    assert any("not monotonic" in n for n in axis.notes)


def test_errors_are_never_candidates_nor_ooms():
    runs, phases = make(
        "s", [(4, "ok", 100 * MiB, 90 * MiB), (8, "error", 150 * MiB, 100 * MiB), (16, "oom", 900 * MiB, 800 * MiB)]
    )
    (axis,) = report_of(runs, phases).axes
    assert axis.recommended == 4 and "batch=8 is not a candidate: error" in axis.reason


def test_context_sweep_gets_a_quadratic_fit_and_crossings():
    """peak = 50 MiB + 1000 B * c + 40 B * c^2: reaches 1 GiB at c = 5098.6 (positive root)."""

    def peak(c):
        return 50 * MiB + 1000 * c + 40 * c * c

    pts = [(c, "ok" if peak(c) < GiB else "oom", peak(c), peak(c) - MiB) for c in (512, 1024, 2048, 4096, 8192)]
    runs, phases = make("s", pts, axis="context")
    fit = fit_context([c for c, *_ in pts[:4]], [p for _, _, p, _ in pts[:4]])
    assert fit["degree"] == 2 and fit["coeffs"][0] == pytest.approx(40, rel=1e-6)
    x = crossing(fit["coeffs"], GiB)
    assert peak(x) == pytest.approx(GiB, rel=1e-6) and 4096 < x < 8192
    rep = report_of(runs, phases, plots=True)
    md = markdown(rep)
    assert "Fitted curve: peak vs context" in md and "fit0_context.png" in md
    assert any(img.name == "fit0_context.png" and img.png[:4] == b"\x89PNG" for img in rep.doc.images)


def test_estimator_columns_are_shown_beside_the_observed_peak():
    runs, phases = make("s", [(8, "ok", 400 * MiB, 300 * MiB), (16, "oom", 2 * GiB, GiB)])
    extra = {
        "est_weights_bytes": (pa.int64(), [10 * MiB, 10 * MiB]),
        "est_activations_bytes": (pa.int64(), [280 * MiB, 560 * MiB]),
        "est_peak_bytes": (pa.int64(), [315 * MiB, 600 * MiB]),
        "estimate_error": (pa.float64(), [0.05, None]),
    }
    md = markdown(report_of(runs, phases, extra_columns=extra))
    assert "No estimate available" not in md and "no estimate available" not in md
    assert "Largest estimated component: **activations**" in md
    assert f"| 8 | {315 * MiB} |" in md and "+5.0 %" in md
    assert f"weights estimate (calculated) | {10 * MiB} B" in md


def test_frontier_search_columns_are_read_when_present():
    runs, phases = make("s", [(8, "ok", 100 * MiB, 90 * MiB), (16, "ok", 200 * MiB, 180 * MiB)])
    md = markdown(
        report_of(
            runs,
            phases,
            frontier_extra={
                "upper_reached": (pa.bool_(), [True]),
                "strategy": (pa.string(), ["model"]),
                "runs_used": (pa.int64(), [2]),
                "stopped_by": (pa.string(), [None]),
            },
        )
    )
    assert "edge not found below the upper bound" in md and "strategy model, 2 runs" in md


def test_several_sweeps_line_up_the_same_load():
    a_runs, a_ph = make("sweepA", [(8, "ok", 400 * MiB, 300 * MiB), (16, "oom", 2 * GiB, GiB)])
    b_runs, b_ph = make(
        "sweepB", [(8, "ok", 500 * MiB, 300 * MiB), (16, "ok", 900 * MiB, 600 * MiB)], capacity=2 * GiB, torch="2.14.0"
    )
    md = markdown(report_of(a_runs + b_runs, a_ph + b_ph))
    assert "Comparable loads across sweeps" in md
    section = md.split("Comparable loads across sweeps")[1]
    assert "sweepA" in section and "sweepB" in section and "2.14.0" in section


def test_cold_peak_far_above_warm_is_called_out():
    runs, phases = make("s", [(8, "ok", 400 * MiB, 300 * MiB), (16, "ok", 600 * MiB, 500 * MiB)])
    md = markdown(report_of(runs, phases))  # make() sets warm reserved = cold / 2
    assert "the first (cold) pass peaks more than 1.2 x the warm one" in md


def test_peak_increments_stack_up_to_the_peak():
    phases = [{"phase": "a", "x": 10}, {"phase": "b", "x": 5}, {"phase": "c", "x": 30}]
    assert peak_increments(phases, ["a", "b", "c", "d"], "x") == [10, 0, 20, None]


def test_card_catalog_is_in_bytes_with_sources():
    by_name = {c.name: c for c in cards.CARDS}
    assert by_name["NVIDIA A100 80GB"].reported_bytes == 85899345920 == 80 * GiB
    assert by_name["NVIDIA T4"].reported_bytes == 15 * GiB  # 16 GiB less 6.25 % for ECC
    assert all(isinstance(c.reported_bytes, int) and c.source and c.vendor_unit for c in cards.CARDS)
    assert [c.reported_bytes for c in cards.CARDS] == sorted(c.reported_bytes for c in cards.CARDS)
    t4 = by_name["NVIDIA T4"]
    assert cards.holds(t4, 14 * GiB, GiB // 2) and not cards.holds(t4, 14 * GiB, GiB + 1)


def test_report_is_never_overwritten_and_the_sweep_end_picks_a_new_name(tmp_path, capsys):
    from memsweep.sweeper.callbacks import write_sweep_report

    runs, phases = make(str(tmp_path), [(8, "ok", 400 * MiB, 300 * MiB), (16, "oom", 2 * GiB, GiB)])
    r, p, f = tables(runs, phases)
    rep = build_report(r, p, f, render_plots=False)
    md, html = write_report(rep, tmp_path)
    before = md.read_bytes(), html.read_bytes()
    with pytest.raises(ReportExists, match="never overwrites"):
        write_report(rep, tmp_path)
    assert (md.read_bytes(), html.read_bytes()) == before
    other = write_sweep_report(tmp_path, tmp_path, {"runs.parquet": r, "phases.parquet": p, "frontier.parquet": f})
    assert other.name.startswith("report-") and other.exists() and other != html
    assert f"memsweep: report -> {other}" in capsys.readouterr().out


def test_dtype_axis_is_categorical_and_never_an_unqualified_choice():
    runs, phases = make(
        "s",
        [
            ("float32", "oom", 1100 * MiB, GiB),
            ("float16", "ok", 500 * MiB, 400 * MiB),
            ("bfloat16", "ok", 520 * MiB, 400 * MiB),
        ],
        axis="dtype",
    )
    rep = report_of(runs, phases, plots=True)
    (axis,) = rep.axes
    assert axis.min_oom == "float32" and axis.max_ok in ("float16", "bfloat16")
    assert axis.recommended in ("float16", "bfloat16")
    assert any("changes the numerics" in n for n in axis.notes)
    # the answer's plot, the axis and phases plots, the calculated split (the estimator's replay of
    # the mlp) and the card catalog as a picture
    names = [img.name for img in rep.doc.images]
    assert names == ["answer_dtype.png", "axis0_dtype.png", "phases0_dtype.png", "split0_dtype.png", "cards0_dtype.png"]


def test_empty_estimate_columns_mean_no_estimate():
    runs, phases = make("s", [(8, "ok", 400 * MiB, 300 * MiB), (16, "oom", 2 * GiB, GiB)])
    md = markdown(report_of(runs, phases, extra_columns={"est_peak_bytes": (pa.int64(), [None, None])}))
    assert "No estimate available" in md and "weights estimate (calculated) | no estimate available" in md


def test_training_sub_phases_are_stacked_and_decomposed():
    """The workloads' train mode records cold_step.forward ... warm_step.optimizer_step, each warm
    sub-phase once per step: states kept after the first step = end of the last cold sub-phase
    minus the start of the first one; a repeated sub-phase stacks with its largest peak."""
    w = 10 * MiB
    names = [
        ("model_load", 0, w, w),
        ("inputs", w, w + MiB, w + MiB),
        ("cold_step.forward", w + MiB, w + 5 * MiB, w + 9 * MiB),
        ("cold_step.loss", w + 5 * MiB, w + 5 * MiB, w + 5 * MiB),
        ("cold_step.backward", w + 5 * MiB, w + 11 * MiB, w + 15 * MiB),
        ("cold_step.optimizer_step", w + 11 * MiB, w + 31 * MiB, w + 32 * MiB),
        ("warm_step.forward", w + 31 * MiB, w + 31 * MiB, w + 38 * MiB),
        ("warm_step.forward", w + 31 * MiB, w + 31 * MiB, w + 40 * MiB),
    ]
    phases = [
        {
            "phase": n,
            "phase_index": i,
            "memory_allocated_start": a0,
            "memory_allocated": a1,
            "max_memory_allocated": peak,
        }
        for i, (n, a0, a1, peak) in enumerate(names)
    ]
    order = [
        "model_load",
        "inputs",
        "cold_step.forward",
        "cold_step.loss",
        "cold_step.backward",
        "cold_step.optimizer_step",
        "warm_step.forward",
    ]
    inc = peak_increments(phases, order, "max_memory_allocated")
    assert sum(inc) == w + 40 * MiB and inc[-1] == 8 * MiB
    parts = dict(decomposition(phases, w + 40 * MiB, "train"))
    assert parts["weights (left by model_load)"] == w
    assert parts["kept after the first pass/step (gradients, optimizer states, cuBLAS workspaces)"] == 30 * MiB
    transient = [v for k, v in parts.items() if k.startswith("transient")]
    assert transient == [9 * MiB]  # the peak (warm_step.forward, 2nd step) minus what was live at its start


def test_the_answer_comes_first_with_the_edge_the_recommended_value_and_its_headroom():
    runs, phases = make("s", [(8, "ok", 400 * MiB, 300 * MiB), (16, "ok", 700 * MiB, 600 * MiB), (32, "oom", GiB, GiB)])
    rep = report_of(runs, phases)
    assert rep.doc.blocks[0][0] == "answer"
    md = markdown(rep)
    assert md.index("## Answer") < md.index("## Summary card")
    answer = md.split("## Answer", 1)[1].split("##", 1)[0]
    assert "**batch=16 fits; batch=32 runs out of memory**" in answer
    # 10 % of 1 GiB kept free: 16 (700 MiB) leaves 324 MiB = 31.6 %
    headroom = GiB - 700 * MiB
    assert "Recommended: **batch=16**" in answer and f"headroom **{headroom} B (" in answer and "31.6 %" in answer
    assert "Fitted peak (calculated, not measured): the largest batch within the capacity is " in answer


def test_doubling_sweeps_get_a_log2_axis_and_close_values_do_not():
    from memsweep.analysis.plots import doubling

    assert doubling([4, 8, 16, 32]) and not doubling([80, 81, 82]) and not doubling(["float32", "bfloat16"])


def test_a_decreasing_axis_reads_its_edge_at_min_ok_in_every_section():
    """world_size under FSDP (more ranks, less memory each): the margin table, the summary, the
    answer, the estimate beside the measurement and the cards read the edge at min_ok (the smallest
    world size that ran), never "-" for a max_ok that a decreasing row does not have."""
    base = {"batch": 8, "context": 128, "width": 256, "dtype": "float32", "parallel": "fsdp"}
    reserved = {1: 1020 * MiB, 2: 700 * MiB, 4: 400 * MiB}
    points = [(n, "oom" if n == 1 else "ok", reserved[n], reserved[n] - MiB) for n in (1, 2, 4)]
    runs, phases = make("s", points, axis="world_size", base=base)
    est = {
        "est_weights_bytes": (pa.int64(), [5 * MiB, 3 * MiB, 2 * MiB]),
        "est_peak_bytes": (pa.int64(), [600 * MiB, 500 * MiB, 300 * MiB]),
    }
    rep = report_of(runs, phases, extra_columns=est)
    (axis,) = [a for a in rep.axes if a.axis == "world_size"]
    assert axis.frontier["direction"] == "decreasing" and axis.max_ok is None
    assert (axis.edge_names, axis.edge, axis.miss) == (("min_ok", "max_oom"), 2, 1)
    margin = GiB - reserved[2]  # capacity - the peak compared with it (reserved on CUDA) at min_ok
    assert axis.margin_at_edge == margin
    md = markdown(rep)
    # the margin table: the edge named, its value and the margin figure, not "-"
    table = md.split("Margin at max_ok (min_ok on a decreasing axis)")[1].split("\n#")[0]
    assert f"| min_ok | 2 | `max_memory_reserved` | {GiB} | 1.000 | {reserved[2]} |" in table
    assert f"| {margin} | {margin / GiB:.6f} |" in table
    # the summary and the answer
    assert f"margin at min_ok world_size (calculated) | {margin} B" in md
    assert "fits from world_size=2 (min_ok); 1 runs out of memory (max_oom)" in md
    assert f"At min_ok (world_size=2): peak {reserved[2]} B" in md and f"headroom {margin} B" in md
    # the estimate beside the measurement, at min_ok
    assert "at min_ok world_size=2 (estimate: calculated before the run" in md
    # the cards: the peak of the run needing the most memory (the smallest world size that ran)
    cards_md = md.split("Other cards")[1]
    assert f"measured at world_size=2 ({reserved[2]} B" in cards_md
    assert "which smallest measured world_size would (more ranks, less memory each)" in cards_md
    assert "| 2 (every measured value that ran; smaller ones were not measured) |" in cards_md


def train_sweep(points):
    """A synthetic train sweep: ``make``'s runs in mode train, each with the train sub-phases
    (cold_step.forward ... optimizer_step, then a warm step) and est_* columns for every model
    state; the peak is in warm_step.backward."""
    runs, _ = make("s", points)
    w, phases = 10 * MiB, []
    for run in runs:
        run["mode"] = "train"
        peak = run["max_memory_allocated"]
        rows = [
            ("model_load", 0, w, w),
            ("inputs", w, w + MiB, w + MiB),
            ("cold_step.forward", w + MiB, w + 5 * MiB, w + 9 * MiB),
            ("cold_step.backward", w + 5 * MiB, w + 11 * MiB, w + 15 * MiB),
            ("cold_step.optimizer_step", w + 11 * MiB, w + 31 * MiB, w + 32 * MiB),
            ("warm_step.forward", w + 31 * MiB, w + 35 * MiB, w + 38 * MiB),
            ("warm_step.backward", w + 35 * MiB, w + 31 * MiB, peak),
        ]
        for i, (name, a0, a1, top) in enumerate(rows[: None if run["outcome"] == "ok" else 3]):
            phases.append(
                {
                    "sweep_dir": "s",
                    "run_id": run["run_id"],
                    **{k: run[k] for k in ("batch", "context", "width", "dtype", "mode", "device")},
                    "phase": name,
                    "phase_index": i,
                    "status": "oom" if run["outcome"] != "ok" and i == 2 else "ok",
                    "memory_allocated_start": a0,
                    "memory_allocated": a1,
                    "max_memory_allocated": top,
                }
            )
    n = len(points)
    extra = {
        "est_weights_bytes": (pa.int64(), [w] * n),
        "est_gradients_bytes": (pa.int64(), [10 * MiB] * n),
        "est_optimizer_states_bytes": (pa.int64(), [20 * MiB] * n),
        "est_activations_bytes": (pa.int64(), [200 * MiB] * n),
        "est_peak_bytes": (pa.int64(), [w + 230 * MiB] * n),
    }
    return runs, phases, extra


def test_a_train_runs_estimate_is_set_beside_the_gradients_and_states_it_kept():
    """The estimate's gradients and optimizer states are compared with what the first step kept,
    named as the Observed section names it in train mode (gradients, optimizer states), never as
    an inference run's "no gradients nor optimizer states"."""
    runs, phases, extra = train_sweep([(8, "ok", 400 * MiB, 300 * MiB), (16, "oom", 2 * GiB, GiB)])
    md = markdown(report_of(runs, phases, extra_columns=extra))
    kept = "kept after the first pass/step (gradients, optimizer states, cuBLAS workspaces)"
    section = md.split("## Estimate beside the measurement")[1].split("\n## ")[0]
    for component in ("gradients", "optimizer_states"):
        row = next(line for line in section.splitlines() if line.startswith(f"| {component} |"))
        assert row.endswith(f"| {30 * MiB} B: {kept} |"), row  # end of cold_step minus its start
    assert "no gradients nor optimizer states" not in section
    assert kept in md.split("## Observed")[1]  # the same words as the Observed section's


def _card_row(md, label):
    """The value of the summary card's row ``label``."""
    card = md.split("# Summary card")[1]
    return next(line for line in card.splitlines() if line.startswith(f"| {label} |")).split(" | ", 1)[1]


def test_the_cards_weights_estimate_is_the_edge_runs_with_the_range_named():
    """The weights estimate differs along world_size (FSDP shards them) and width: the card shows
    the figure of its edge run (min_ok on a decreasing axis, max_ok otherwise) naming the value,
    and the range over the runs, each end named, never the first run's figure unqualified."""
    base = {"batch": 8, "context": 128, "width": 256, "dtype": "float32", "parallel": "fsdp"}
    runs, phases = make(
        "s",
        [(1, "oom", GiB, GiB), (2, "ok", 700 * MiB, 699 * MiB), (4, "ok", 400 * MiB, 399 * MiB)],
        axis="world_size",
        base=base,
    )
    sharded = [6 * MiB, 3 * MiB, 3 * MiB // 2]  # weights / world_size
    est = {
        "est_weights_bytes": (pa.int64(), sharded),
        "est_peak_bytes": (pa.int64(), [600 * MiB, 500 * MiB, 300 * MiB]),
    }
    row = _card_row(markdown(report_of(runs, phases, extra_columns=est)), "weights estimate (calculated)")
    text = lambda w: f"{w} B ({w / GiB:.6f} GiB)"  # noqa: E731
    assert row.startswith(f"{text(sharded[1])} at min_ok world_size=2; over the runs: ")
    assert f"{text(sharded[2])} at world_size=4 to {text(sharded[0])} at world_size=1" in row

    runs, phases = make(
        "s", [(64, "ok", 300 * MiB, 290 * MiB), (128, "ok", 500 * MiB, 490 * MiB), (256, "oom", GiB, GiB)], axis="width"
    )
    grows = [MiB, 4 * MiB, 16 * MiB]  # the weights grow with the width
    est = {"est_weights_bytes": (pa.int64(), grows), "est_peak_bytes": (pa.int64(), [300 * MiB, 500 * MiB, 900 * MiB])}
    row = _card_row(markdown(report_of(runs, phases, extra_columns=est)), "weights estimate (calculated)")
    assert row.startswith(f"{text(grows[1])} at max_ok width=128; over the runs: {text(grows[0])} at width=64 to ")
    assert row.endswith(f"{text(grows[2])} at width=256 |")


def test_first_crossing_refuses_a_non_positive_level_and_the_falling_side():
    """A peak reaches a capacity by rising: a fit that bends down far past its points (tiny negative
    square term) gives no crossing where it falls back through a level, and a level of 0 or less
    (a margin not below the capacity) is refused."""
    from memsweep.estimator.fit import Polynomial, first_crossing

    p = Polynomial(1e6, 1000.0, -1e-9)  # rises to its vertex at x = 5e11, then falls
    assert first_crossing(p, 2e6) == pytest.approx(1000.0, rel=1e-9)
    assert first_crossing(p, 5e5) is None  # above the level from x = 0: only the falling side crosses it
    for level in (0, -GiB):
        with pytest.raises(ValueError, match="positive"):
            first_crossing(p, level)


def test_a_margin_not_below_the_capacity_is_flagged_and_reaches_no_crossing():
    """--margin 2GiB on a 1 GiB capacity: no value is recommended and the report says why, in
    bytes and GiB, and computes no crossing of capacity - margin (a negative level)."""

    def peak(c):
        return 50 * MiB + 1000 * c + 40 * c * c

    pts = [(c, "ok", peak(c), peak(c) - MiB) for c in (512, 1024, 2048, 4096)]
    runs, phases = make("s", pts, axis="context")
    rep = report_of(runs, phases, margin="2GiB")
    (axis,) = rep.axes
    assert axis.recommended is None and "not below the capacity" in axis.reason
    md = markdown(rep)
    assert "the largest context within the capacity is " in md and "within the capacity - margin" not in md
    assert "never reaches the capacity - margin" not in md
    assert f"{2 * GiB} B (2.000 GiB)" in md and f"{2 * GiB} B ({2 * GiB} B)" not in md


def test_every_run_out_of_memory_in_model_load_is_said_in_the_answer():
    """Every run OOM in model_load (a phase that does not scale with batch): the answer names the
    phase as the console does (frontier row ``not_reached``), never "none ran out of memory"."""
    runs, phases = make("s", [(b, "oom", 2 * MiB, MiB) for b in (1, 2, 4)], capacity=1024)
    for r in runs:
        r["failed_phase"] = "model_load"
    rep = report_of(runs, phases)
    (axis,) = rep.axes
    answer = markdown(rep).split("# Answer")[1].split("\n# ")[0]
    assert axis.frontier["not_reached"] and axis.frontier["not_reached"] in answer
    assert "No value of batch ran ok" in answer and "model_load" in answer
    assert "none ran out of memory" not in answer and "no value of batch ran ok" in axis.reason


def test_a_dtype_axis_where_every_dtype_fits_names_the_largest_not_an_edge_above():
    runs, phases = make(
        "s", [("bfloat16", "ok", 300 * MiB, 200 * MiB), ("float32", "ok", 500 * MiB, 400 * MiB)], axis="dtype"
    )
    answer = markdown(report_of(runs, phases)).split("# Answer")[1].split("\n# ")[0]
    assert "**Every dtype run fits (largest: float32)**" in answer and "lies above" not in answer


def _linear_sweep(sweep_dir, values, oom_at):
    """A batch sweep whose peak is exactly 500000 + 80000 * batch bytes on a 4000000 B capacity
    (10 % margin: 400000 B kept free, 3600000 B usable); ``oom_at`` and above run out of memory."""

    def peak(b):
        return 500_000 + 80_000 * b

    points = [(b, "ok" if b < oom_at else "oom", peak(b), peak(b)) for b in values]
    return peak, make(sweep_dir, points, capacity=4_000_000)


def test_the_fits_limit_under_the_margin_is_floored_to_the_lattice_and_offered_unmeasured(tmp_path):
    """The recommendation stays a measured value (batch=6), and the fit's largest batch under the
    margin (3100000 / 80000 = 38.75: floored to 38, never rounded up to 39, which breaks it) is
    named beside it as not measured, with the command that measures it (the run's overrides)."""
    peak, (runs, phases) = _linear_sweep(str(tmp_path), (1, 6, 43, 44), oom_at=44)
    level = 4_000_000 - 400_000
    limit = max(b for b in range(1, 100) if peak(b) <= level)  # derived: 38
    whole = max(b for b in range(1, 100) if peak(b) <= 4_000_000)  # derived: 43
    assert peak(limit + 1) > level
    for r in runs:
        hydra = tmp_path / r["run_id"] / ".hydra"
        hydra.mkdir(parents=True)
        (hydra / "overrides.yaml").write_text(
            f"- device=cuda\n- sweep=none\n- capacity=4000000\n- batch={r['batch']}\n"
        )
    rep = report_of(runs, phases)
    (axis,) = rep.axes
    assert axis.recommended == 6 and axis.limits == {"capacity": whole, "capacity - margin": limit}
    md = markdown(rep)
    answer = md.split("## Answer", 1)[1].split("##", 1)[0]
    note = (
        f"the fit puts the largest value under the margin at batch={limit} (not measured; confirm with "
        f"`memsweep run device=cuda capacity=4000000 batch={limit}`)"
    )
    assert "Recommended: **batch=6**" in answer and note in answer
    assert f"the largest batch within the capacity - margin is {limit} (not run)" in answer
    assert "the largest batch within the capacity is 43 (run: ok)" in answer and "≈" not in answer
    card = md.split("## Summary card", 1)[1].split("\n#", 1)[0]
    assert f"| batch=6; {note} |" in card
    assert f"Calculated, not measured: {note}." in md.split("# Chosen setting", 1)[1]


def test_no_unmeasured_limit_is_offered_where_it_was_run_or_without_the_runs_overrides():
    """Where the fit's value under the margin was run (and so recommended), nothing is offered;
    without the runs' overrides the command leaves them to the reader."""
    _, (runs, phases) = _linear_sweep("s", (1, 38, 43, 44), oom_at=44)
    (axis,) = report_of(runs, phases).axes
    assert axis.recommended == 38 and axis.margin_limit_unmeasured is None
    assert "fit puts" not in markdown(report_of(runs, phases))
    _, (runs, phases) = _linear_sweep("s", (1, 6, 43, 44), oom_at=44)
    assert "(not measured; confirm with `memsweep run ... batch=38`)" in markdown(report_of(runs, phases))


def test_largest_under_floors_the_crossing_to_multiples_of_the_step():
    """peak = 500000 + 80000 x crosses 3600000 B at x = 38.75: 38 on the integers, 32 on the
    multiples of 8, 0 where even the first multiple is above the level, None where it is never reached."""
    from memsweep.analysis.report.fit import largest_under

    coeffs = [80_000.0, 500_000.0]
    assert largest_under(coeffs, 3_600_000) == 38
    assert largest_under(coeffs, 3_600_000, step=8) == 32
    assert largest_under(coeffs, 3_700_000) == 40  # a crossing on a lattice value is kept
    assert largest_under(coeffs, 600_000, step=8) == 0
    assert largest_under([0.0, 500_000.0], 3_600_000) is None


def test_a_run_whose_record_could_not_be_read_is_counted_and_named_apart_never_measured():
    """A newer memsweep's record (schema_version 2): the runs table holds its record_problem and no
    outcome. The report counts it apart from the outcomes, names it with its problem, never calls
    it unfinished nor counts it among the measured runs; a damaged record with an outcome (crash)
    stays a measured run."""
    from memsweep.analysis.report.stats import record_unread

    runs, phases = make("s", [(4, "ok", 100 * MiB, 90 * MiB), (8, "ok", 150 * MiB, 120 * MiB)])
    problem = "record s/1/record.json: schema_version 2 is newer than this memsweep reads (1); upgrade memsweep"
    unread = runs[1]
    for k in ("outcome", "failed_phase", "max_memory_allocated", "max_memory_reserved"):
        unread[k] = None
    unread["record_problem"] = problem
    phases = [p for p in phases if p["run_id"] != "1"]
    assert record_unread(unread) and not record_unread({"outcome": "crash", "record_problem": "record missing"})
    rep = report_of(runs, phases)
    assert [r["run_id"] for r in rep.unread] == ["1"] and [r["run_id"] for r in rep.runs] == ["0"]
    md = markdown(rep)
    assert "from 1 measured run (1 run whose record could not be read, not counted)" in md
    assert "| runs (observed) | 2: ok 1, record not readable 1 |" in md
    assert (
        f"| record not readable (not measured) | run `1` (batch=8 context=128 width=256 dtype=float32): {problem} |"
        in md
    )
    assert "unfinished" not in md and "every phase of every run succeeded" not in md


@pytest.mark.parametrize("protocol", [(1, 1), (3, 5)], ids=["same_protocol", "light_probe_rows"])
def test_a_frontier_search_floors_the_fits_limits_to_its_multiple_of(tmp_path, protocol):
    """The frontier sweeper's result line (search.jsonl) gives the lattice: multiple_of=8 floors the
    limit under the margin (38.75) to 32, and the capacity's (43.75) to 40. Rows of light probes
    (hydra.sweeper.light: warmup and repeats other than the result line's, logged for the full
    protocol) take their search's lattice too."""
    import json

    from memsweep.conf.contract import AXES, SEARCH_LOG

    _, (runs, phases) = _linear_sweep(str(tmp_path), (8, 16, 40, 48), oom_at=48)
    base = {"batch": None, "context": 128, "width": 256, "dtype": "float32"}
    event = {
        "event": "result",
        "axis": "batch",
        "strategy": "model",
        "multiple_of": 8,
        "workload": "mlp",
        "capacity_bytes": 4_000_000,
        "fixed": {**{a: base.get(a) for a in AXES}, "mode": "inference", "device": "cuda:0"},
    }
    event["fixed"]["warmup"], event["fixed"]["repeats"] = protocol
    (tmp_path / SEARCH_LOG).write_text(json.dumps(event) + "\n")
    (axis,) = report_of(runs, phases).axes
    assert axis.step == 8 and (axis.frontier.get("strategy") == "model" or protocol != (1, 1))
    assert axis.limits == {"capacity": 40, "capacity - margin": 32} and axis.margin_limit_unmeasured == 32


def _edge_sweep():
    """A batch sweep over 4 values, the last out of memory: plots of every kind the report draws."""
    return make("s", [(b, "ok" if b < 8 else "oom", b * 64 * MiB, b * 48 * MiB) for b in (1, 2, 4, 8)])


def test_figures_drawn_by_worker_processes_are_the_bytes_drawn_in_place(monkeypatch):
    """The report's figures handed to forked workers (``figures.FigurePool``) come back as the PNG
    bytes drawing them in this process gives, in the same places of the document."""
    from memsweep.analysis.report import figures

    monkeypatch.setattr(figures, "_workers", lambda: 1)
    here = report_of(*_edge_sweep(), plots=True)
    monkeypatch.setattr(figures, "_workers", lambda: 2)
    there = report_of(*_edge_sweep(), plots=True)
    assert len(here.doc.images) >= 3 and all(i.png.startswith(b"\x89PNG") for i in here.doc.images)
    assert [(i.name, i.png) for i in there.doc.images] == [(i.name, i.png) for i in here.doc.images]


def test_a_figure_failing_in_a_worker_fails_where_its_bytes_are_wanted(monkeypatch):
    from memsweep.analysis.doc import Doc, Image
    from memsweep.analysis.report import figures

    monkeypatch.setattr(figures, "_workers", lambda: 2)
    doc = Doc("t")
    with figures.figure_pool() as pool:
        assert isinstance(pool, figures.FigurePool)
        doc.image(Image("x.png", pool.no_such_figure(1), "x"))
        assert doc.images[0].png.startswith(figures.PLACEHOLDER)
        with pytest.raises(AttributeError, match="no_such_figure"):
            figures.fill_figures(pool, doc)


def test_figures_are_drawn_in_place_on_one_core_or_beside_another_thread(monkeypatch):
    """A fork copies the locks other threads hold: with one alive (or one core) nothing is forked."""
    import threading

    from memsweep.analysis.report import figures

    monkeypatch.setattr(figures, "usable_cores", lambda: 1)
    assert figures._workers() == 1
    monkeypatch.setattr(figures, "usable_cores", lambda: 64)
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    assert figures._workers() == figures.MAX_WORKERS
    monkeypatch.setattr(threading, "active_count", lambda: 2)
    assert figures._workers() == 1


def test_the_phase_rows_read_are_those_of_the_runs_asked_for_and_the_first_phase_starts_them():
    """Phase rows of two sweeps interleaved, a dry run's among them: a run's rows come back in the
    table's order, its start is that of its smallest phase_index, a dry run's rows never count."""
    from memsweep.analysis.report.rows import phase_starts, phases_of, split_rows

    def phase(d, run, index, start, source="measured"):
        return dict(
            sweep_dir=d, run_id=run, phase=f"p{index}", phase_index=index, memory_reserved_start=start, source=source
        )

    rows = [
        phase("a", "0", 1, 11),
        phase("b", "0", 0, 20),
        phase("a", "0", 0, 10),
        phase("a", "1", 0, 30),
        phase("a", "0", 2, 12),
        phase("a", "2", 0, 99, "predicted"),
        phase("a", "1", None, 5),
    ]
    table = coerce_table(rows, PHASES_SCHEMA)
    got = phases_of(table, [{"sweep_dir": "a", "run_id": "0"}, {"sweep_dir": "a", "run_id": "2"}])
    assert [(p["run_id"], p["phase_index"]) for p in got] == [("0", 1), ("0", 0), ("0", 2)]
    assert phase_starts(table) == {("a", "0"): 10, ("b", "0"): 20, ("a", "1"): 30}
    split = split_rows(coerce_table([], RUNS_SCHEMA), table)
    assert [(p["run_id"], p["memory_reserved_start"]) for p in split.predicted_phases] == [("2", 99)]
    assert split.phases == []


def test_a_figure_whose_worker_died_is_drawn_in_this_process(monkeypatch):
    """The pool broken (its worker killed, say out of memory): the figure is drawn here instead, and
    the figures asked for after it too."""
    import os

    from memsweep.analysis import plots
    from memsweep.analysis.doc import Doc, Image
    from memsweep.analysis.report import figures

    here = os.getpid()
    monkeypatch.setattr(plots, "axis_plot", lambda *a, **k: b"drawn here" if os.getpid() == here else os._exit(9))
    monkeypatch.setattr(figures, "_workers", lambda: 2)
    doc = Doc("t")
    with figures.figure_pool() as pool:
        doc.image(Image("a.png", pool.axis_plot(), "a"))
        figures.fill_figures(pool, doc)
        doc.image(Image("b.png", pool.axis_plot(), "b"))  # asked of the broken pool
        figures.fill_figures(pool, doc)
    assert [i.png for i in doc.images] == [b"drawn here", b"drawn here"]


def test_figures_are_drawn_in_place_where_no_process_can_be_forked(monkeypatch):
    import os

    from memsweep.analysis import plots
    from memsweep.analysis.report import figures

    fork, forked = os.fork, []

    def one_fork():  # the first worker forks, the second cannot
        if forked:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        forked.append(fork())
        return forked[-1]

    monkeypatch.setattr(figures, "_workers", lambda: 2)
    monkeypatch.setattr(os, "fork", one_fork)
    with figures.figure_pool() as pool:
        assert pool is plots
    assert _ends(forked[0]), "the worker forked first was left waiting"


def _ends(pid: int, within_s: float = 30.0) -> bool:
    """Whether child ``pid`` ends (or was reaped already) within ``within_s`` seconds."""
    import os
    import time

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:  # reaped by multiprocessing: it ended
            return True
        time.sleep(0.05)
    return False


def test_at_the_hosts_own_ram_the_fits_limit_is_an_extrapolation_never_a_run_to_confirm(tmp_path):
    """A CPU sweep without an emulated capacity (the host's whole RAM, ``device total_memory``): the
    fit's much larger value under the margin is named an extrapolation, and no ``memsweep run`` of it
    is offered (it could fill the host's RAM: swap, the OOM killer); a frontier search under an
    emulated capacity is offered instead, with the load's overrides."""
    peak, _ = _linear_sweep(str(tmp_path), (), oom_at=99)
    runs, phases = make(str(tmp_path), [(b, "ok", peak(b), peak(b)) for b in (1, 2, 4)], kind="cpu", capacity=4_000_000)
    for r in runs:
        r["capacity_method"] = "device total_memory"
        hydra = tmp_path / r["run_id"] / ".hydra"
        hydra.mkdir(parents=True)
        (hydra / "overrides.yaml").write_text(f"- device=cpu\n- sweep=batch\n- batch={r['batch']}\n")
    rep = report_of(runs, phases)
    (axis,) = rep.axes
    assert axis.recommended == 4 and axis.margin_limit_unmeasured == 38
    md = markdown(rep)
    assert "memsweep run" not in md and "confirm with" not in md
    note = (
        "the fit puts the largest value under the margin at batch=38 (an extrapolation of the fit, not a measurement;"
    )
    assert note in md.split("## Answer", 1)[1].split("##", 1)[0]
    assert "`memsweep sweep hydra/sweeper=frontier hydra.sweeper.axis=batch device=cpu capacity=1GiB`" in md
    runs[0]["capacity_method"] = "live tensor storage bytes <= capacity (worker tracker raises torch.OutOfMemoryError)"
    for r in runs[1:]:
        r["capacity_method"] = runs[0]["capacity_method"]
    assert "confirm with `memsweep run device=cpu batch=38`" in markdown(report_of(runs, phases))


def test_the_throughput_table_gives_a_failed_value_no_headroom(tmp_path):
    """A value that ran out of memory has a partial peak (up to the failure): its row in "Throughput
    beside memory" gives no headroom (a new user's report gave an oom row 9.6 %), the ok rows theirs."""
    points = [(1, "ok", 100_000, 100_000), (2, "ok", 200_000, 200_000), (4, "oom", 300_000, 300_000)]
    runs, phases = make(str(tmp_path), points, capacity=1_000_000)
    for r in runs:
        r["samples_per_s"] = 100.0 * r["batch"] if r["outcome"] == "ok" else None
    md = markdown(report_of(runs, phases))
    table = md.split("# Throughput beside memory", 1)[1]
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert "| 80.0 % |" in rows["2"] and "| 90.0 % |" in rows["1"], rows
    assert "%" not in rows["4"].split("|")[5] and rows["4"].split("|")[5].strip() == "-", rows["4"]


def test_a_margin_just_short_of_the_policy_is_never_printed_as_reaching_it(tmp_path):
    """104832 B free of 1048576 B is 9.9975 % of the capacity: 'leaves the margin' says no beside a
    10 % margin, so its share reads 9.9 %, not the 10.0 % rounding gave (a new user's report)."""
    capacity = 1_048_576
    runs, phases = make(str(tmp_path), [(1, "ok", 500_000, 500_000), (2, "ok", 943_744, 943_744)], capacity=capacity)
    md = markdown(report_of(runs, phases, margin="10%"))
    table = md.split("Margin at every value whose runs all ran ok:", 1)[1]
    (row,) = [line for line in table.splitlines() if line.startswith("| ") and "| 2 |" in line]
    assert "| 104832 |" in row and "| 9.9 % | no |" in row, row
