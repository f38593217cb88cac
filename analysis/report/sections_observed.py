"""The observed section: environment, runs and outcomes, each swept axis and its phases.

Only the counters of the runs appear here; sizes are printed as raw bytes beside GiB.
"""

from __future__ import annotations

from collections import OrderedDict

from memsweep.conf.contract import AXES, gib
from memsweep.estimator.margin import basis

from ..doc import Doc, Image
from ..frontier import direction_words
from ..schemas import ENV_COLUMNS
from .fmt import axis_label, nbytes, pct
from .phases import COLD_WARM_FLAG, decomposition, peak_increments, phase_order
from .sections_answer import axis_image
from .sections_summary import alloc_text
from .stats import AxisResult


def _cut(text: str, n: int) -> str:
    """``text`` in at most about ``n`` characters, cut at a word and marked with an ellipsis."""
    return text if len(text) <= n else text[:n].rsplit(" ", 1)[0] + " …"


_ENV_KEY = (
    "sweep_dir",
    "device",
    *(
        c
        for c in ENV_COLUMNS
        if c not in ("device_kind", "allocator_backend", "alloc_conf", "torch_dynamo_imported", "schema_version")
    ),
)
"""What tells one environment row from another: the sweep, the spec's device and the environment
columns the table shows (the others are compared by ``memsweep compare``)."""


def _env_rows(runs: list[dict]) -> list[list]:
    """One row per distinct environment (sweep, device, versions, host) of ``runs``."""
    seen: OrderedDict[tuple, dict] = OrderedDict()
    for r in runs:
        key = tuple(r.get(k) for k in _ENV_KEY)
        seen.setdefault(key, r)
    rows = []
    for r in seen.values():
        rows.append(
            [
                r.get("sweep_dir"),
                r.get("device"),
                r.get("device_name"),
                nbytes(r.get("device_total_memory")),
                gib(r.get("device_total_memory")),
                r.get("torch"),
                r.get("cuda") or r.get("hip") or "-",
                r.get("driver"),
                r.get("python"),
                r.get("host"),
            ]
        )
    return rows


def observed_section(doc: Doc, runs: list[dict], phases: list[dict], axes: list[AxisResult], plots) -> None:
    """Append the "Observed" section: environment, runs and outcomes, then per axis its values,
    frontier facts, plot and phases.

    Args:
        doc: the document appended to.
        runs: the measured run rows, enriched by ``stats.enrich_runs``.
        phases: the measured phase rows (their order of phases is shown).
        axes: the axis results (``stats.analyse_axis``); figures are numbered by their index.
        plots: ``analysis.plots``, or a stand-in whose every figure is empty bytes (no plots).
    """
    doc.h(1, "Observed")
    doc.h(2, "Environment")
    doc.table(
        ["sweep", "device", "name", "total memory B", "total GiB", "torch", "CUDA/HIP", "driver", "python", "host"],
        _env_rows(runs),
    )
    doc.p("Allocator settings: " + "; ".join(sorted({alloc_text(r) for r in runs})) + ".")
    _runs_table(doc, runs)
    order = phase_order(phases)
    if not axes:
        doc.p("No frontier: no variable was swept over two or more values.")
    for i, a in enumerate(axes):
        doc.h(2, f"{a.title}")
        _values_table(doc, a)
        _frontier_facts(doc, a)
        doc.image(axis_image(a, plots, f"axis{i}_{a.axis}.png"))
        _phases_section(doc, a, order, plots, i)


def _runs_table(doc: Doc, runs: list[dict]) -> None:
    """The "Runs and outcomes" table: one row per run, its axes, outcome, failed phase and error."""
    doc.h(2, "Runs and outcomes")
    several = len({r["sweep_dir"] for r in runs}) > 1
    doc.table(
        (["sweep"] if several else []) + ["run", *AXES, "mode", "outcome", "failed phase", "error", "wall s"],
        [
            ([r["sweep_dir"]] if several else [])
            + [
                r["run_id"],
                *(r.get(a) for a in AXES),
                r.get("mode"),
                r.get("outcome") or "unfinished",
                r.get("failed_phase"),
                (r.get("error_type") or "") + (": " + _cut(r["error_message"], 80) if r.get("error_message") else ""),
                f"{r['wall_s']:.1f}" if r.get("wall_s") is not None else None,
            ]
            for r in sorted(runs, key=lambda r: (r["sweep_dir"], len(r["run_id"]), r["run_id"]))
        ],
        note="Only `oom` means 'does not fit'; an error, crash or timeout is neither a success nor an OOM."
        + ("" if several else f" Run directories are under `{runs[0]['sweep_dir']}`."),
    )


def _values_table(doc: Doc, a: AxisResult) -> None:
    """One row per value of axis ``a``: runs, outcome, failed phases and both peaks (bytes, GiB)."""
    used_c, other_c = basis(a.kind)
    cpu = a.kind == "cpu"
    headers = [a.axis, "runs", "outcome", "failed phase", f"peak {used_c} B", "GiB", f"peak {other_c} B", "GiB"]
    if cpu:
        headers += ["reserved above start B", "GiB"]
    rows = []
    for s in a.values:
        row = [
            s.value,
            len(s.runs),
            s.status,
            ", ".join(s.failed_phases) or None,
            nbytes(s.used),
            gib(s.used),
            nbytes(s.other),
            gib(s.other),
        ]
        if cpu:
            row += [nbytes(s.above_start), gib(s.above_start)]
        rows.append(row)
    doc.table(
        headers,
        rows,
        note="A run that did not complete shows its partial peak, before the failure: "
        "not the memory the full run would need.",
    )


def _stable_words(stable: bool | None) -> str:
    """A frontier row's ``stable`` in words."""
    if stable is None:
        return "not checked (no value was run twice; the frontier sweeper's confirm re-runs the edge)"
    return "yes" if stable else "NO"


def _facts(a: AxisResult) -> list[str]:
    """The frontier of ``a`` in words: max_ok/min_oom, exact, monotonic, stable, the run counts
    and what the frontier sweeper's search says about it."""
    f = a.frontier
    facts = [
        f"`max_ok` = {a.max_ok if a.max_ok is not None else 'none'} (largest value that ran), "
        f"`min_oom` = {a.min_oom if a.min_oom is not None else 'none'} (smallest that ran out of memory)",
        f"exact: {'yes' if f.get('exact') else 'no'} (neighbours among the values run"
        + (", on the search's lattice" if f.get("strategy") else "")
        + ")",
        f"monotonic: {'yes' if f.get('monotonic') else 'NO'}; stable: " + _stable_words(f.get("stable")),
        f"runs: {f.get('n_runs')} (ok {f.get('n_ok')}, oom {f.get('n_oom')}, other {f.get('n_other')})",
    ]
    words = direction_words(f)
    if words:  # world_size: the edge is not read "larger is harder"
        facts[0] = words if f.get("direction") == "decreasing" else f"{facts[0]}; {words}"
    if f.get("n_oom_elsewhere"):
        facts.append(
            f"{f['n_oom_elsewhere']} run(s) ran out of memory in a phase whose size does not follow {a.axis} "
            f"({f.get('oom_elsewhere_phases')}, set by {f.get('oom_elsewhere_variables')}): not points of "
            f"this frontier; a run whose every phase that scales with {a.axis} ran ok before it counts for `max_ok`"
        )
    if f.get("n_memory_suspect"):
        facts.append(
            f"{f['n_memory_suspect']} run(s) failed with an error that probably means memory but does not say "
            "so (`failure_class` memory_suspect: a library that could not get its workspace); counted neither "
            "as ok nor as out of memory (the frontier sweeper's `hydra.sweeper.suspect=oom` reads them as OOMs)"
        )
    return facts + _search_facts(a)


def _search_facts(a: AxisResult) -> list[str]:
    """What the frontier sweeper's search of ``a`` says: its strategy, an upper bound reached, a stop."""
    f, facts = a.frontier, []
    if f.get("strategy"):
        facts.append(
            f"searched by the frontier sweeper: strategy {f['strategy']}, {f.get('runs_used')} runs"
            + (f", status {f['search_status']}" if f.get("search_status") else "")
        )
    if f.get("upper_reached"):
        facts.append(f"edge not found below the upper bound: every value up to {a.max_ok} fit; the edge lies above it")
    if f.get("stopped_by"):
        facts.append(
            f"the search stopped on a run that ended with `{f['stopped_by']}`"
            + (f" at {a.axis}={f['stop_value']}" if f.get("stop_value") is not None else "")
            + ": not an OOM, the edge is unknown above it"
        )
    if f.get("error_values"):
        facts.append(
            f"{a.axis}={f['error_values']} raised an error that is not memory (the value's shape: other values ran); "
            "the search stepped past it, counting it neither as ok nor as out of memory"
        )
    if f.get("margin_edge") is not None:
        facts.append(f"margin edge found by the search (a measured run): {a.axis}={f['margin_edge']}")
    return facts + _fastest_fact(a)


def _fastest_fact(a: AxisResult) -> list[str]:
    """The fastest value inside the margin the frontier sweeper measured
    (``hydra.sweeper.objective=throughput``), in words; empty without one."""
    f = a.frontier
    if f.get("fastest") is None:
        return []
    noise = f.get("fastest_noise_rel")
    noise_words = "not measured" if noise is None else f"{noise:.1%}"
    return [
        f"fastest inside the margin (a measured run, after {f.get('fastest_runs')} throughput runs): "
        f"{a.axis}={f['fastest']} at {f['fastest_samples_per_s']:.4g} samples/s (noise {noise_words}, the "
        "MAD/median of its samples; measured on the runs' device)"
    ]


def _frontier_facts(doc: Doc, a: AxisResult) -> None:
    """The frontier facts of ``a`` as a list, then its warnings (not reached, nothing ran ok, not
    monotonic or not stable)."""
    f = a.frontier
    doc.ul(_facts(a))
    if f.get("not_reached"):
        doc.note("warning", f"{f['not_reached']}.")
    if a.edge is None:
        doc.note(
            "warning",
            f"no value of {a.axis} ran ok: the {a.light_end} value tried already needs too much, or "
            "the runs failed for another reason (see outcomes).",
        )
    if not f.get("monotonic", True) or f.get("stable") is False:
        doc.note("warning", "results are not monotonic or not stable here; they are shown as measured, not smoothed.")


def _phases_section(doc: Doc, a: AxisResult, order: list[str], plots, i: int) -> None:
    """The phases of axis ``a`` (the ``i``-th): status, cold against warm peaks, the stacked
    phases plot and what the peak at the edge (max_ok; min_ok on a decreasing axis) consists of."""
    used_c = basis(a.kind)[0]
    doc.h(3, f"Phases ({a.axis} sweep)")
    run_of = {}
    for s in a.values:
        ok = [r for r in s.runs if r.get("outcome") == "ok"]
        run_of[s.value] = (ok or s.runs)[0]
    present = [n for n in order if any(p["phase"] == n for r in run_of.values() for p in r["_phases"])]
    rows = []
    for s in a.values:
        r = run_of[s.value]
        status = {p["phase"]: p.get("status") for p in r["_phases"]}
        rows.append([s.value] + [status.get(n, "not run") for n in present])
    doc.table([a.axis] + present, rows, note="Status of each phase (one run per value: an ok one where there is one).")
    _cold_warm(doc, a, run_of, used_c)
    _outside_allocator(doc, a, run_of)
    values = [s.value for s in a.values]
    increments = [peak_increments(run_of[v]["_phases"], present, used_c) for v in values]
    outcomes = [run_of[v].get("outcome") or "unfinished" for v in values]
    doc.image(
        Image(
            f"phases{i}_{a.axis}.png",
            plots.phases_plot(a.axis, values, present, increments, outcomes, a.capacity, used_c),
            f"Stacked phases: each segment is how much that phase raised the run's peak `{used_c}` above "
            "every phase before it; the bar's height is the run's peak (observed).",
        )
    )
    if a.stat(a.edge) is not None:
        _edge_parts(doc, a, run_of[a.edge])


def _cold_warm(doc: Doc, a: AxisResult, run_of: dict, used_c: str) -> None:
    """The cold peak beside the warm one per value of ``a`` (counter ``used_c``), flagging a cold
    peak above ``COLD_WARM_FLAG`` times the warm one; ``run_of``: value -> the run shown."""
    cw_rows, flagged = [], []
    cold_key, warm_key = f"cold_{used_c}", f"warm_{used_c}"
    for s in a.values:
        r = run_of[s.value]
        cold, warm = r.get(cold_key), r.get(warm_key)
        ratio = f"{cold / warm:.2f}" if cold is not None and warm else None
        cw_rows.append([s.value, nbytes(cold), gib(cold), nbytes(warm), gib(warm), ratio])
        if cold is not None and warm and cold > COLD_WARM_FLAG * warm:
            flagged.append(
                f"{axis_label(a.axis, s.value)}: cold {gib(cold)} GiB vs warm {gib(warm)} GiB (x{cold / warm:.2f})"
            )
    doc.table(
        [a.axis, f"cold peak {used_c} B", "GiB", f"warm peak {used_c} B", "GiB", "cold / warm"],
        cw_rows,
        note="cold = the first pass, step or generation (cold_forward, cold_step, cold_generate and their "
        "sub-phases), warm = the measured repeats after warmup (warm_*); '-' where the phase did not run.",
    )
    if flagged:
        doc.note(
            "warning",
            f"the first (cold) pass peaks more than {COLD_WARM_FLAG:g} x the warm one: "
            + "; ".join(flagged)
            + ". Size for the cold peak: it happens on every fresh process "
            "(allocator warm-up, cuBLAS workspaces and autotuning, optimizer states created on the first step).",
        )
    else:
        doc.p(f"No cold peak above {COLD_WARM_FLAG:g} x its warm peak.")


def _edge_parts(doc: Doc, a: AxisResult, r: dict) -> None:
    """What the peak of run ``r`` at the edge of ``a`` (max_ok; min_ok on a decreasing axis) consists of."""
    parts = decomposition(r["_phases"], r.get("max_memory_allocated"), r.get("mode"))
    if not parts:
        return
    peak = r.get("max_memory_allocated")
    doc.p(
        f"What the peak `max_memory_allocated` of the {a.edge_names[0]} {axis_label(a.axis, a.edge)} run "
        "consists of "
        "(observed: differences of the counters between phases):"
    )
    doc.table(
        ["part", "bytes", "GiB", "share of peak"],
        [[n, nbytes(v), gib(v), pct(v, peak)] for n, v in parts]
        + [["peak max_memory_allocated", nbytes(peak), gib(peak), pct(peak, peak)]],
    )


def _outside_allocator(doc: Doc, a: AxisResult, run_of: dict) -> None:
    """CUDA: what the cold phase keeps in cuBLAS workspaces (CUBLAS_WORKSPACE_CONFIG), and the
    memory outside the caching allocator per value (measured per phase: total - free - reserved),
    with the emulated capacity's fractions and the runs' flags. Nothing on the CPU."""
    runs = [run_of[s.value] for s in a.values]
    if not any(r.get("device_kind") == "cuda" for r in runs):
        return
    configs = sorted({str(r.get("cublas_workspace_config") or "unset (cuBLAS's default)") for r in runs})
    doc.p(
        "cuBLAS workspaces are allocated by the caching allocator at the first matrix product and kept: "
        "part of what the cold phase keeps (in inference too), never gradients. CUBLAS_WORKSPACE_CONFIG: "
        + ", ".join(configs)
        + "."
    )
    rows = []
    for s, r in zip(a.values, runs):
        peak, start = r.get("max_outside_allocator_bytes"), r.get("outside_allocator_start_bytes")
        fraction, nominal = r.get("memory_fraction"), r.get("memory_fraction_nominal")
        rows.append(
            [
                s.value,
                nbytes(start),
                gib(start),
                nbytes(peak),
                gib(peak),
                f"{fraction:.6f}" if fraction is not None else None,
                f"{nominal:.6f}" if nominal is not None else None,
            ]
        )
    doc.table(
        [a.axis, "outside allocator at start B", "GiB", "largest per phase B", "GiB", "fraction", "capacity / total"],
        rows,
        note="Memory outside the caching allocator (observed: total - free - memory_reserved; the CUDA context, "
        "library handles, lazily loaded kernels, other processes). An emulated capacity gives the allocator "
        "capacity minus the footprint at the start (`fraction`), so it means a card of that size.",
    )
    flags = sorted({f for r in runs for f in (r.get("device_not_free"), r.get("allocator_backend_warning")) if f})
    for flag in flags:
        doc.note("warning", flag)
