"""`make bench BENCH=ranks`: DDP and FSDP ranks (issue #17) against world size 1, 2 and 4, beside
the estimator, and what a 2-rank run costs in time against two 1-rank runs, side by side in one run.

The load: a small decoder (memsweep's transformer workload: 2 layers, width 128, vocab 2048,
AdamW, float32), batch 2 x context 32 per rank, one cold and one warm step, on the CPU (gloo;
each rank's counters are its tracked tensor bytes, so every figure but the times is the same on
any machine). Printed per run:

1. the fullest rank's peak (``max_memory_allocated``) beside the estimator's per-rank peak
   (runs.parquet ``est_peak_bytes``: the spec's estimate with its weights, gradients and
   optimizer states partitioned at ZeRO stage 0 for ddp, 3 for fsdp; activations per rank,
   unpartitioned), and the model states per rank, recorded (runs.parquet
   ``model_states_bytes``) and through the allocator's counters
   (``model_states_allocated_bytes``), each as a ratio to the estimator's ZeRO figure. Goal:
   FSDP's recorded model states within 1 % of the estimate. One more FSDP run at world size 4
   with vocab 2050 (not a multiple of 4) shows FSDP2's padding.
2. the wall time (sweeper's ``wall_s``, worker start to end; every worker is forked from the
   fork server, which imported torch once, before the timed runs) of one FSDP run of 2 ranks
   against two 1-rank runs of the same per-rank load one after the other, one thread per rank
   (``threads=1``) on both sides: the 2-rank run does the same work in one process group, its
   ranks side by side on two cores, plus forking its ranks, the process group's set-up and its
   collectives. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from memsweep.analysis.tables import build_tables  # noqa: E402
from memsweep.conf.contract import RunSpec  # noqa: E402
from memsweep.sweeper.process import execute  # noqa: E402
from memsweep.sweeper.spec import with_estimate  # noqa: E402

WORKLOAD = {"name": "transformer", "layers": 2, "vocab": 2048}
LOAD = {
    "batch": 2,
    "context": 32,
    "width": 128,
    "mode": "train",
    "device": "cpu",
    "warmup": 0,
    "repeats": 1,
    "workload": WORKLOAD,
}
WORLD_SIZES = (1, 2, 4)
GOAL = 0.01  # FSDP's recorded model states within 1 % of the ZeRO-3 estimate


def run(root: Path, name: str, **fields) -> dict:
    """One run through the sweeper's execute (a fresh worker forked from the fork server, its ranks
    forked from it); its runs.parquet row."""
    spec = with_estimate(RunSpec.from_dict({**LOAD, **fields}))
    result = execute(spec, root / name)  # the fork server (a sweep's default), started by the first run
    if result["outcome"] != "ok":
        raise RuntimeError(f"{name}: {result['outcome']}: {result.get('error_message')}")
    (row,) = build_tables([root / name])[0].to_pylist()
    return row


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.5f}"


def main() -> int:
    failed = []
    with tempfile.TemporaryDirectory(prefix="memsweep-bench-ranks-") as tmp:
        root = Path(tmp)
        header = (
            f"{'run':24} {'peak B':>10} {'est. peak B':>12} {'est. states B':>14} {'recorded B':>11} "
            f"{'rec/est':>8} {'allocator B':>12} {'alloc/est':>9}"
        )
        print("per-rank figures (bytes; estimates are calculated, the rest measured on the CPU, not a GPU):")
        print(header)
        rows = []
        for parallel in ("ddp", "fsdp"):
            for ws in WORLD_SIZES:
                rows.append(
                    (f"{parallel} world_size={ws}", run(root, f"{parallel}{ws}", parallel=parallel, world_size=ws))
                )
        padded = {**WORKLOAD, "vocab": 2050}
        rows.append(
            ("fsdp world_size=4 vocab=2050", run(root, "padded", parallel="fsdp", world_size=4, workload=padded))
        )
        for label, r in rows:
            print(
                f"{label:24} {r['max_memory_allocated']:>10} {r['est_peak_bytes'] or '-':>12} "
                f"{r['estimated_model_states_bytes'] or '-':>14} {r['model_states_bytes'] or '-':>11} "
                f"{ratio(r['model_states_ratio']):>8} {r['model_states_allocated_bytes'] or '-':>12} "
                f"{ratio(r['model_states_allocated_ratio']):>9}"
            )
            if r["parallel"] == "fsdp" and (r["model_states_ratio"] is None or abs(r["model_states_ratio"] - 1) > GOAL):
                failed.append(label)
        print(
            "est. peak: weights, gradients, optimizer states partitioned (ZeRO 0 for ddp, 3 for fsdp) + activations "
            "per rank (runs.parquet est_peak_bytes); est. states: the partitioned model states alone "
            "(estimated_model_states_bytes)."
        )
        print(
            f"FSDP model states within {GOAL:.0%} of the ZeRO-3 estimate: "
            + ("goal met" if not failed else f"GOAL NOT MET for {', '.join(failed)}")
        )

        # interleaved (1 rank, 2 ranks, 1 rank), so that a change in the machine's load between
        # them weighs on both sides; one thread per rank on both sides (a 1-rank run would otherwise
        # take every core's thread, and on a loaded machine run several times slower for it)
        ones = [run(root, "time_1rank_0", parallel="fsdp", world_size=1, threads=1)]
        two = run(root, "time_2ranks", parallel="fsdp", world_size=2, threads=1)
        ones.append(run(root, "time_1rank_1", parallel="fsdp", world_size=1, threads=1))
        both = sum(r["wall_s"] for r in ones)
        print(
            f"\nwall time, FSDP, same per-rank load, 1 thread per rank: one 2-rank run {two['wall_s']:.2f} s; "
            f"two 1-rank runs {ones[0]['wall_s']:.2f} s + {ones[1]['wall_s']:.2f} s = {both:.2f} s; "
            f"ratio {two['wall_s'] / both:.2f}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
