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
    failed: list[str] = []
    for path in sorted(Path(__file__).parent.glob("bench_*.py")):
        if only and not any(o in path.stem for o in only):
            continue
        print(f"\n=== {path.stem} ===", flush=True)
        try:
            runpy.run_path(str(path), run_name="__main__")
        except SystemExit as exc:  # a bench's own `sys.exit(main())` ends that bench, not the run
            if exc.code not in (None, 0):
                failed.append(path.stem)
    if failed:
        print(f"\nbenches that exited non-zero: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
