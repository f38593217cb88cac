"""`make bench BENCH=scale`: analyze, report and compare of synthesized sweeps of 1,000, 4,000 and
10,000 runs (copies of a real tiny sweep's runs, tests/bench/synth.py): CPU and wall seconds,
output sizes, the report again once the sweep's own tables are in it, and the growth from 1,000 to
10,000 (goals: analyze and report at most 10 s and the report's HTML at most 2 MB at 10,000 runs,
growth at most 10x). Prints; asserts nothing.
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.bench.synth import synthesize
from tests.data.loads import MEMSWEEP, TINY_CPU

SIZES = (1000, 4000, 10000)


def _timed(args: list[str]) -> tuple[float, float]:
    """(wall s, CPU s of the command and its children) of one memsweep command."""
    before = os.times()
    t = time.perf_counter()
    subprocess.run([MEMSWEEP, *args], check=True, capture_output=True)
    after = os.times()
    return time.perf_counter() - t, (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="memsweep-bench-scale-"))
    real = root / "real"
    subprocess.run(
        [
            MEMSWEEP,
            "sweep",
            "sweep=none",
            "batch=2,4,8,16,32,64",
            "capacity=8MiB",
            "mode=train",
            *TINY_CPU,
            f"hydra.sweep.dir={real}",
        ],
        check=True,
        capture_output=True,
    )
    print(
        f"{'runs':>6} {'analyze s':>10} {'cpu':>6} {'report s':>9} {'cpu':>6} {'html MB':>8} {'plots':>6} "
        f"{'compare s':>10} {'cpu':>6} {'compare html MB':>15} {'report, tables s':>16} {'cpu':>6}"
    )
    seen = {}
    for n in SIZES:
        sweep = synthesize(real, root / f"s{n}", n)
        a = _timed(["analyze", str(sweep), "--out", str(root / f"a{n}")])
        r = _timed(["report", str(sweep), "--out", str(root / f"r{n}")])
        c = _timed(["compare", str(root / f"a{n}"), str(root / f"a{n}"), "--out", str(root / f"c{n}")])
        html = (root / f"r{n}" / "report.html").stat().st_size / 1e6
        plots = len(list((root / f"r{n}" / "report_plots").iterdir()))
        chtml = (root / f"c{n}" / "compare.html").stat().st_size / 1e6
        # the sweep's own tables written into it (as a sweep's end does), then the report reads them
        _timed(["analyze", str(sweep)])
        t = _timed(["report", str(sweep), "--out", str(root / f"t{n}")])
        seen[n] = (a[0], r[0], c[0], t[0])
        print(
            f"{n:>6} {a[0]:>10.1f} {a[1]:>6.1f} {r[0]:>9.1f} {r[1]:>6.1f} {html:>8.2f} {plots:>6} "
            f"{c[0]:>10.1f} {c[1]:>6.1f} {chtml:>15.2f} {t[0]:>16.1f} {t[1]:>6.1f}",
            flush=True,
        )
    lo, hi = seen[SIZES[0]], seen[SIZES[-1]]
    names = ("analyze", "report", "compare", "report from tables")
    print("growth 1,000 -> 10,000 (wall): " + ", ".join(f"{name} {b / a:.1f}x" for name, a, b in zip(names, lo, hi)))
    print("goals at 10,000 runs: analyze <= 10 s, report <= 10 s and <= 2 MB of HTML, growth <= 10x")
    print(
        "report: of the run directories (no tables in the sweep); report, tables: of the same sweep once "
        "its own current tables are in it (analysis/current.py)"
    )
    print(f"(sweeps left in {root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
