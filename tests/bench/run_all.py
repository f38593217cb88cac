"""`make bench`: runs every tests/bench/bench_*.py in turn, each printing its side-by-side ratios.

Benchmarks are not tests: they measure (speed, memory, runs needed) and print; pytest does
not collect them. Optional peers (lightning, accelerate) are bench dependencies only:
`pip install -e '.[bench]'`; a bench whose peer is missing says so and skips that column.
"""

import runpy
import sys
from pathlib import Path


def main() -> int:
    only = sys.argv[1:]
    for path in sorted(Path(__file__).parent.glob("bench_*.py")):
        if only and not any(o in path.stem for o in only):
            continue
        print(f"\n=== {path.stem} ===", flush=True)
        runpy.run_path(str(path), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
