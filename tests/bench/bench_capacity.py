"""`make bench BENCH=capacity`: the edge of the `make run` load under five process states, in
each capacity mode.

The load: `make run`'s (the mlp in inference, context 128, width 256, the baseline of
conf/config.yaml) at an emulated 256 MiB on the CPU; its batch edge searched to the item
(`hydra/sweeper=frontier`, lower 64, upper 1024, no confirmation). Five sweeps per mode, each a
different process state: other malloc settings (mallopt(3) environment variables), 2 threads
instead of 1, a worker holding 32 or 64 MiB of non-tensor ballast (MEMSWEEP_BALLAST_BYTES),
spawned workers (the malloc settings reach a new interpreter only). Printed: the answer of each
sweep side by side; the allocator mode must give one answer, the process mode's spread is what
the RLIMIT_DATA emulation charges besides the tensors.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.frontier_cli import frontier_sweep  # noqa: E402

LOAD = [
    "device=cpu",
    "capacity=256MiB",
    "warmup=1",
    "repeats=1",
    "isolation=spawn",
    "hydra.sweeper.lower=64",
    "hydra.sweeper.upper=1024",
    "hydra.sweeper.confirm=0",
]
MIB = 2**20
STATES = [  # (label, environment additions, overrides)
    ("default malloc, 1 thread", {}, ["threads=1"]),
    ("MALLOC_MMAP_THRESHOLD_=128KiB", {"MALLOC_MMAP_THRESHOLD_": "131072"}, ["threads=1"]),
    (
        "MALLOC_ARENA_MAX=1, TOP_PAD=16MiB, 2 threads",
        {"MALLOC_ARENA_MAX": "1", "MALLOC_TOP_PAD_": str(16 * MIB)},
        ["threads=2"],
    ),
    ("32 MiB ballast", {"MEMSWEEP_BALLAST_BYTES": str(32 * MIB)}, ["threads=1"]),
    (
        "64 MiB ballast, MMAP_THRESHOLD_=32MiB",
        {"MEMSWEEP_BALLAST_BYTES": str(64 * MIB), "MALLOC_MMAP_THRESHOLD_": str(32 * MIB)},
        ["threads=1"],
    ),
]


def main() -> int:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "MEMSWEEP_BALLAST_BYTES"}
    answers: dict[str, list] = {"allocator": [], "process": []}
    with tempfile.TemporaryDirectory(prefix="memsweep-bench-capacity-") as tmp:
        root = Path(tmp)
        print(f"{'process state':45} {'allocator (max_ok/min_oom)':>27} {'process (max_ok/min_oom)':>25}")
        for i, (label, extra_env, overrides) in enumerate(STATES):
            cells = []
            for mode in answers:
                s = frontier_sweep(
                    [*LOAD, *overrides, f"capacity_mode={mode}"], root / f"{mode}{i}", root, {**base, **extra_env}
                )
                if s["error"]:
                    print(f"{label}: {mode} sweep failed: {s['error']}")
                    return 1
                answer = (s["result"]["max_ok"], s["result"]["min_oom"])
                answers[mode].append(answer)
                cells.append(f"{answer[0]}/{answer[1]} ({s['runs']} runs)")
            print(f"{label:45} {cells[0]:>27} {cells[1]:>25}")
    allocator = set(answers["allocator"])
    process = [a[0] for a in answers["process"] if a[0] is not None]
    print(
        f"\nallocator mode: {len(allocator)} distinct answer(s) over {len(STATES)} states"
        f" ({'goal met: one answer' if len(allocator) == 1 else 'GOAL NOT MET'})"
    )
    if process:
        print(
            f"process mode: max_ok from {min(process)} to {max(process)} (spread {max(process) - min(process)} "
            f"batch items): RLIMIT_DATA charges malloc's arenas, threads and the ballast as well"
        )
    return 0 if len(allocator) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
