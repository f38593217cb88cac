"""The CUDA allocator snapshot of an OOM run (spec ``snapshot_on_oom``), taken so that it never
costs the measurement.

* The history is recorded with Python stacks only (``_record_memory_history(enabled="all",
  context="all", stacks="python", max_entries=SNAPSHOT_MAX_ENTRIES)``, torch/cuda/memory.py);
  C++ stacks can raise or hang (pytorch#123408).
* Enabling it is guarded on its own (``enable_history``): a failure is noted in the record's
  ``oom_snapshot`` and the run goes on.
* At an OOM the record is saved before any dump (``save_oom_then_dump``), marked ``pending``.
* The snapshot is bounded under SNAPSHOT_MAX_BYTES before any file is written, atomically.

No torch import at the top: callers pass ``torch.cuda.memory`` (tests pass a fake).
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

SNAPSHOT_FILE = "oom_snapshot.pickle"
SNAPSHOT_MAX_ENTRIES = 100_000  # allocator events the recorder keeps (its ring buffer)
SNAPSHOT_MAX_BYTES = 256 * 2**20  # the file's limit


def enable_history(memory: Any, max_entries: int = SNAPSHOT_MAX_ENTRIES) -> dict | None:
    """Start recording the caching allocator's history, with Python stacks only, in its own guard.

    Args:
        memory: ``torch.cuda.memory`` (or a fake with ``_record_memory_history``).
        max_entries: allocation/free events kept (the recorder's ring buffer).

    Returns:
        None when recording started; else the record's ``oom_snapshot`` describing the failure
        (``file`` None, ``problem``), which is also printed on stderr. Never raises.
    """
    try:
        memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=max_entries)
    except Exception as exc:  # noqa: BLE001 - a snapshot must never cost the measurement
        problem = f"history not recorded, the run went on without it: {type(exc).__name__}: {exc}"
        print(f"memsweep worker: warning: snapshot_on_oom: {problem}", file=sys.stderr)
        return {"file": None, "bytes": None, "problem": problem, "pending": False}
    return None


def bounded_pickle(snapshot: dict, max_bytes: int = SNAPSHOT_MAX_BYTES) -> tuple[bytes | None, int]:
    """Pickle a snapshot, keeping the most recent trace entries so that it fits in ``max_bytes``.

    The snapshot's ``device_traces`` (one list of events per device, oldest first:
    torch.cuda.memory._snapshot) are cut to their last entries; ``segments`` (the allocator's
    current state) are kept whole. Each pass keeps at most half the entries, fewer when the
    size says so (a pickle's size is about linear in its entries), until the pickle fits; the
    file is built from the bounded dict only.

    Args:
        snapshot: torch.cuda.memory._snapshot()'s dict (modified: its traces are cut).
        max_bytes: the file's limit, bytes.

    Returns:
        (the pickle, or None when even the segments alone exceed ``max_bytes``; the number of
        trace entries dropped).
    """
    traces = snapshot.get("device_traces") or []
    entries = sum(len(t) for t in traces)
    data = pickle.dumps(snapshot)
    keep = entries
    while len(data) > max_bytes and keep > 0:
        keep = min(keep // 2, int(keep * 0.9 * max_bytes / len(data)))  # the size is about linear in entries
        share = keep / entries
        snapshot["device_traces"] = [t[len(t) - int(len(t) * share) :] for t in traces]
        data = pickle.dumps(snapshot)
    if len(data) > max_bytes:
        return None, entries
    return data, entries - sum(len(t) for t in snapshot.get("device_traces") or [])


def dump_snapshot(run_dir: Path, memory: Any, max_bytes: int = SNAPSHOT_MAX_BYTES) -> dict:
    """Write the CUDA allocator snapshot of an OOM run to run_dir/oom_snapshot.pickle.

    PyTorch's own format (what torch.cuda.memory._dump_snapshot pickles: _snapshot()'s dict),
    for pytorch.org/memory_viz; bounded before it is written (``bounded_pickle``). Recording
    stops first (``_record_memory_history(enabled=None)``), so the dump adds no events.

    Args:
        run_dir: the run directory.
        memory: ``torch.cuda.memory`` (or a fake with ``_snapshot`` and ``_record_memory_history``).
        max_bytes: the file's limit, bytes.

    Returns:
        The record's ``oom_snapshot``: ``file`` (name, or None), ``bytes`` (its size),
        ``dropped_entries`` (oldest trace events left out to fit), ``max_entries``, ``problem``
        (why there is no file, or None) and ``pending`` False. Never raises.
    """
    try:
        snap = memory._snapshot()
        try:
            memory._record_memory_history(enabled=None)
        except Exception:  # noqa: BLE001 - the snapshot is taken already
            pass
        data, dropped = bounded_pickle(snap, max_bytes)
        if data is None:
            problem = f"larger than {max_bytes} B without its traces: not written"
            return {"file": None, "bytes": None, "problem": problem, "pending": False}
        fd, tmp = tempfile.mkstemp(prefix=f".{SNAPSHOT_FILE}.", dir=run_dir)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, run_dir / SNAPSHOT_FILE)
    except Exception as exc:  # noqa: BLE001 - a failed snapshot must not hide the OOM
        return {"file": None, "bytes": None, "problem": f"{type(exc).__name__}: {exc}", "pending": False}
    return {
        "file": SNAPSHOT_FILE,
        "bytes": len(data),
        "dropped_entries": dropped,
        "max_entries": SNAPSHOT_MAX_ENTRIES,
        "problem": None,
        "pending": False,
    }


def save_oom_then_dump(rec: Any, finish: Callable[[], int], run_dir: Path, memory: Any) -> int:
    """At an OOM: save the finished record first, then dump the snapshot and save again.

    Args:
        rec: the run's ``Recorder`` (``data``, ``save()``).
        finish: completes and saves the record with the OOM (``Recorder.finish``'s call) and
            returns the exit code.
        run_dir: the run directory.
        memory: ``torch.cuda.memory``.

    Returns:
        ``finish``'s exit code.
    """
    rec.data["oom_snapshot"] = {
        "file": None,
        "bytes": None,
        "problem": "the dump did not finish (the worker died or hung while dumping)",
        "pending": True,
    }
    code = finish()  # the OOM is on disk before anything of the snapshot runs
    rec.data["oom_snapshot"] = dump_snapshot(run_dir, memory)
    rec.save()
    return code
