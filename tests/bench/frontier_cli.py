"""One real frontier sweep through the `memsweep` command, for the benches (not a bench itself)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.data.loads import MEMSWEEP, search_events


def frontier_sweep(args: list[str], sweep_dir: Path, cwd: Path, env: dict) -> dict:
    """Run ``memsweep sweep hydra/sweeper=frontier ARGS hydra.sweep.dir=SWEEP_DIR``.

    Returns {"error": None or the failure (exit status, end of stderr), "wall" (s), "events"
    (search.jsonl), "result" (its result event), "runs" (run directories with a result.json)}.
    """
    t0 = time.perf_counter()
    proc = subprocess.run(
        [MEMSWEEP, "sweep", "hydra/sweeper=frontier", *args, f"hydra.sweep.dir={sweep_dir}"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"error": f"memsweep failed ({proc.returncode}): {proc.stderr[-500:]}", "wall": wall}
    events = search_events(sweep_dir)
    (result,) = [e for e in events if e["event"] == "result"]
    return {
        "error": None,
        "wall": wall,
        "events": events,
        "result": result,
        "runs": len(list(Path(sweep_dir).glob("*/result.json"))),
    }
