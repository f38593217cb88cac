"""``memsweep predict [OVERRIDES] capacity=80GB [--axis batch]``: the predicted edge of an axis.

A search of one axis (batch, context or width, everything else fixed) on dry runs only
(``dry_run=true``: the worker runs every phase on fake tensors, ``FakeTensorMode``, and
records the predicted live tensor bytes of each phase). Each dry run is a fresh worker
process started through ``sweeper.process.execute`` (the fork server by default), a second
or less for small models; nothing is allocated, so the load may be far larger than this
machine. With ``device=cuda`` (or cuda:N) the dry runs run fake CUDA tensors on this machine,
no GPU needed, and count each storage in the CUDA caching allocator's 512 B blocks
(worker.counters.CUDA_BLOCK_BYTES): the prediction is of torch.cuda.max_memory_allocated;
what it cannot see is listed in ``BLIND_SPOTS_CUDA``. The default device is cpu.

A load "fits" when the largest predicted phase peak (``max_memory_allocated`` of a dry run,
bytes) is at most ``capacity``. Search: the frontier sweeper's ``model`` strategy
(``sweeper.frontier.FrontierSearch``) with dry runs as its oracle, starting at the configured
value: predicted peaks fitted against the axis aim the next dry run, bisection when a guess is
wrong, down to neighbours (``Predictor.search``). At the edge it prints the predicted bytes of every phase
and the split of the largest phase peak into parameters, gradients, optimizer states and
activations/temporaries (the dry run's ``predicted_*_bytes``, conf.contract.PEAK_CATEGORIES).
The answer is a prediction of *tensor bytes*; what it cannot see is listed in
``BLIND_SPOTS`` and printed with every answer.
"""

from __future__ import annotations

import datetime as _dt
import sys
from pathlib import Path

from conf.contract import NUMERIC_AXES as AXES
from conf.contract import (PEAK_CATEGORIES, RECORD_FILE, RunSpec, SpecError, bytes_text, parse_size, run_peak, try_read,
                           write_json_atomic)

MAX_VALUE = 2**31
BLIND_SPOTS = (
    "the allocator's rounding (CUDA: 512 B blocks, 2 MiB segments) and its cache of freed blocks (reserved > allocated)",
    "fragmentation (free memory in pieces too small for the next request)",
    "library workspaces: cuBLAS, cuDNN, NCCL, flash/efficient-attention kernels' scratch",
    "the CUDA context and loaded kernels (hundreds of MB, outside PyTorch's counters)",
    "device-specific kernels that differ from the CPU ones (a dry run runs CPU fake kernels)",
)
# A dry run on a CUDA device (fake CUDA tensors): its peak is max_memory_allocated's, with each
# storage rounded up to the allocator's 512 B blocks (worker.counters.CUDA_BLOCK_BYTES).
BLIND_SPOTS_CUDA = (
    "the caching allocator's segments (2 MiB, 20 MiB, larger ones rounded to 2 MiB) and its cache of freed "
    "blocks: max_memory_reserved, what the GPU must hold, is larger than the predicted max_memory_allocated",
    "blocks the allocator hands out whole instead of splitting (a request above 1 MiB whose cached block "
    "leaves 1 MiB or less): allocated then exceeds the 512 B-rounded prediction; "
    "and PYTORCH_CUDA_ALLOC_CONF roundup_power2_divisions, which rounds further",
    "fragmentation (free memory in pieces too small for the next request)",
    "library workspaces: cuBLAS, cuDNN, NCCL, flash/efficient-attention kernels' scratch",
    "the CUDA context and loaded kernels (hundreds of MB, outside PyTorch's counters)",
    "kernels whose CUDA meta (fake) kernel's outputs differ from what the GPU kernel allocates "
    "(a dry run runs no GPU kernel)",
)


def blind_spots(device: str) -> tuple[str, ...]:
    """What a dry run on ``device`` (cpu or cuda:N) cannot see: BLIND_SPOTS_CUDA or BLIND_SPOTS."""
    return BLIND_SPOTS_CUDA if device.startswith("cuda") else BLIND_SPOTS

USAGE = """usage: memsweep predict [OVERRIDES] capacity=SIZE [--axis batch|context|width]

Predicts, without the device, the largest value of the axis whose tensor bytes fit in SIZE
(GB = 10^9 B, GiB = 2^30 B), by bisection on dry runs. OVERRIDES are those of `memsweep run`;
device=cpu (the default) or device=cuda[:N] (fake CUDA tensors: no GPU needed; CUDA's 512 B
allocator blocks counted)."""


class Predictor:
    """Dry runs of one load at different values of ``axis``, each in its own directory."""

    def __init__(self, base: RunSpec, axis: str, capacity_bytes: int, out_dir: Path, isolation: str,
                 upper: int = MAX_VALUE):
        """``base``: the load; its dry runs are on its device (cpu or cuda:N: fake CUDA tensors,
        no GPU needed), except a load on several devices (``devices`` > 1), predicted on the
        CPU as one device. ``capacity_bytes``: the capacity to fit in (bytes)."""
        self.base, self.axis, self.capacity, self.upper = base, axis, capacity_bytes, min(upper, MAX_VALUE)
        self.device = base.device if base.devices == 1 else "cpu"
        self.out_dir, self.isolation = Path(out_dir), isolation
        self.runs: dict[int, dict] = {}

    def run(self, value: int) -> dict:
        """The dry run at ``value``: {"value", "outcome", "peak" (bytes, max over phases), "fits",
        "record"}; a load the worker cannot predict has outcome error and fits None."""
        if value in self.runs:
            return self.runs[value]
        from .process import execute

        # one warmup iteration and one warm repeat: every later step repeats the first warm one
        data = {**self.base.to_dict(), self.axis: value, "dry_run": True, "device": self.device, "devices": 1,
                "capacity_bytes": None, "estimate": None, "repeats": 1, "warmup": min(self.base.warmup, 1)}
        spec = RunSpec.from_dict(data)
        run_dir = self.out_dir / f"{self.axis}={value}"
        result = execute(spec, run_dir, resume=True, isolation=self.isolation)
        record, _ = try_read(run_dir, RECORD_FILE)
        peak, _ = run_peak(record)  # a dry run's: max_memory_allocated, predicted
        ok = result["outcome"] == "ok" and peak is not None
        out = {"value": value, "outcome": result["outcome"], "error_type": result.get("error_type"),
               "error_message": result.get("error_message"), "peak": peak if ok else None,
               "fits": (peak <= self.capacity) if ok else None, "record": record}
        self.runs[value] = out
        return out

    def search(self, start: int, lattice=None) -> dict:
        """{"max_fit", "min_miss", "exact", "error"}: the edge of the axis (values, or None).

        Driven by memsweep's frontier search (``sweeper.frontier.FrontierSearch``, strategy
        ``model``) with dry runs as its oracle: a value "fits" when its predicted peak is at most
        the capacity, and the fit of predicted peaks against the axis aims the next dry run, so
        a load whose peak is affine in the axis needs about four dry runs instead of a doubling
        and a bisection. ``start``: the first value tried (the configured one); ``lattice``: the
        values allowed (``sweeper.frontier.Lattice``; default every integer in [1, upper]).
        ``error``: the dry run that could not predict (its outcome), which stops the search.
        """
        from .frontier import FrontierSearch, Lattice

        lattice = lattice or Lattice.make(1, self.upper)
        search = FrontierSearch(self.axis if self.axis in AXES else "batch", lattice, "model",
                                capacity=self.capacity, seed=start)
        error = None
        while not search.done:
            for probe in search.propose(1):
                r = self.run(probe.value)
                if r["fits"] is None:
                    error = r
                    search.observe(probe.value, "error", None, self.capacity, message=r.get("error_message"))
                else:
                    search.observe(probe.value, "ok" if r["fits"] else "oom", r["peak"], self.capacity)
        res = search.result()
        nothing_fits = res["max_ok"] is None and res["min_oom"] == lattice.lower
        return {"max_fit": res["max_ok"], "min_miss": res["min_oom"], "error": error,
                "exact": error is None and (res["exact"] or nothing_fits)}


CATEGORY_LABELS = {"parameter": "parameters", "gradient": "gradients", "optimizer_state": "optimizer states",
                   "activation": "activations and temporaries"}


def breakdown(record: dict) -> list[dict]:
    """Per phase of a dry run's record: predicted peak and final live bytes, the peak's split
    by category (``predicted_*_bytes``, conf.contract.PEAK_CATEGORIES; null when the record
    has none) and the sizes by construction the worker adds (gradients, optimizer states, KV
    cache, at the phase's end)."""
    rows = []
    for p in record.get("phases", []):
        rows.append({"phase": p["name"], "peak_bytes": p.get("max_memory_allocated"),
                     "live_bytes": p.get("memory_allocated"),
                     **{field: p.get(field) for _, field in PEAK_CATEGORIES},
                     **{k: p[k] for k in ("gradient_bytes", "optimizer_state_bytes", "kv_cache_bytes")
                        if p.get(k) is not None}})
    return rows


def peak_split_at(record: dict) -> dict | None:
    """{"phase", "peak_bytes", and each ``predicted_*_bytes`` field}: the split of the phase
    with the largest predicted peak of ``record`` (the first such phase), or None when that
    phase has no split (a record written before it existed)."""
    phases = [p for p in record.get("phases", []) if p.get("max_memory_allocated") is not None]
    if not phases:
        return None
    top = max(phases, key=lambda p: p["max_memory_allocated"])
    split = {field: top.get(field) for _, field in PEAK_CATEGORIES}
    if any(v is None for v in split.values()):
        return None
    return {"phase": top["name"], "peak_bytes": top["max_memory_allocated"], **split}


def _parse(argv: list[str]) -> tuple[list[str], str, str | None]:
    axis, overrides, capacity = "batch", [], None
    it = iter(argv)
    for arg in it:
        if arg == "--axis":
            axis = next(it, None)
        elif arg.startswith("--axis="):
            axis = arg.split("=", 1)[1]
        elif arg.startswith("capacity="):
            capacity = arg.split("=", 1)[1]
        else:
            overrides.append(arg)
    if axis not in AXES:
        raise SpecError("--axis", axis, "one of " + ", ".join(AXES))
    return overrides, axis, capacity


def predict(argv: list[str], out=sys.stdout) -> int:
    """The ``memsweep predict`` command; returns the exit status (0 edge found, 1 no edge
    (an error or nothing fits), 2 bad input)."""
    from hydra import compose, initialize_config_module

    from .spec import launch_settings, spec_from_config

    if any(a in ("-h", "--help") for a in argv):
        print(USAGE, file=out)
        return 0
    try:
        overrides, axis, capacity = _parse(argv)
        if capacity in (None, "null"):
            raise SpecError("capacity", capacity, "a size to predict against, e.g. capacity=80GB")
        capacity_bytes = parse_size(capacity, "capacity")
        # the device is the user's (cpu or cuda[:N]: a CUDA dry run needs no GPU), cpu by default
        device = [] if any(o.startswith("device=") for o in overrides) else ["device=cpu"]
        with initialize_config_module(config_module="conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides + device + [
                "capacity=null", "export=false", "dry_run=true"])
        settings = launch_settings(cfg)
        base = spec_from_config(cfg)
    except SpecError as exc:
        print(f"memsweep predict: error: {exc}", file=sys.stderr)
        return 2
    stamp = _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S-%f")
    out_dir = Path(cfg.get("results_dir", "results")) / "predict" / stamp
    predictor = Predictor(base, axis, capacity_bytes, out_dir, settings["isolation"])
    try:
        edge = predictor.search(getattr(base, axis))
    except SpecError as exc:  # a load the dry run refuses (e.g. a workload it cannot fake)
        print(f"memsweep predict: error: {exc}", file=sys.stderr)
        return 2
    at = predictor.runs.get(edge["max_fit"]) if edge["max_fit"] is not None else None
    cuda = predictor.device.startswith("cuda")
    rounding = next((r["record"].get("prediction_rounding") for r in predictor.runs.values()
                     if r["record"] and r["record"].get("prediction_rounding")), None)
    summary = {"axis": axis, "capacity_bytes": capacity_bytes, "source": "predicted", **{
        k: edge[k] for k in ("max_fit", "min_miss", "exact")}, "dry_runs": len(predictor.runs),
        "runs": [{k: r[k] for k in ("value", "outcome", "peak", "fits", "error_type")}
                 for r in sorted(predictor.runs.values(), key=lambda r: r["value"])],
        "breakdown": breakdown(at["record"]) if at else None,
        "peak_split": peak_split_at(at["record"]) if at else None, "blind_spots": list(blind_spots(predictor.device)),
        "device": predictor.device, "prediction_rounding": rounding}
    write_json_atomic(out_dir / "predict.json", summary)

    print(f"memsweep predict: {axis} at capacity {bytes_text(capacity_bytes)}, {len(predictor.runs)} dry runs "
          f"(fake tensors, no device), in {out_dir}", file=out)
    if cuda:
        print(f"  a PREDICTION for a CUDA device ({predictor.device}) made on this machine with fake CUDA tensors "
              f"(no GPU used); tensor bytes counted as the CUDA caching allocator counts them, each storage "
              f"rounded up to 512 B blocks: the predicted peak is torch.cuda.max_memory_allocated's, not "
              f"max_memory_reserved's", file=out)
    if edge["error"] is not None:
        err = edge["error"]
        print(f"  dry run at {axis}={err['value']} failed: {err['error_type']}: {err['error_message']}", file=out)
        print("  (a real run measures such a load: memsweep run / sweep)", file=out)
    if edge["max_fit"] is None and edge["min_miss"] == 1:
        print(f"  PREDICTED: nothing fits; {axis}=1 already needs {bytes_text(predictor.runs[1]['peak'])}", file=out)
    if edge["max_fit"] is not None:
        exact = "exact" if edge["exact"] else "not exact"
        print(f"  PREDICTED edge: max fit {axis}={edge['max_fit']}, min miss {axis}={edge['min_miss']} ({exact})",
              file=out)
        print(f"  predicted tensor bytes at {axis}={edge['max_fit']}, per phase (peak / live at its end):", file=out)
        for row in summary["breakdown"]:
            extra = "".join(f", {k} {v}" for k, v in row.items() if k.endswith("_bytes") and v is not None and
                            k not in ("peak_bytes", "live_bytes") and not k.startswith("predicted_"))
            print(f"    {row['phase']:<28} {row['peak_bytes']:>16} B {row['live_bytes']:>16} B{extra}", file=out)
        print(f"  largest phase peak: {bytes_text(at['peak'])}", file=out)
        split = summary["peak_split"]
        if split is not None:
            print(f"  at that peak ({split['phase']}), live tensor bytes by category "
                  f"(torch.distributed._tools.mem_tracker's categories):", file=out)
            for name, field in PEAK_CATEGORIES:
                print(f"    {CATEGORY_LABELS[name]:<28} {bytes_text(split[field])}", file=out)
    print("  This is a prediction of live tensor bytes, not a measurement. It cannot see:", file=out)
    for item in blind_spots(predictor.device):
        print(f"    - {item}", file=out)
    print("  Keep a margin for these, or measure the edge: memsweep sweep ... capacity=SIZE", file=out)
    return 0 if edge["max_fit"] is not None and edge["error"] is None else 1
