"""``memsweep predict [OVERRIDES] capacity=80GB [--axis batch]``: the predicted edge of an axis.

A search of one axis (everything else fixed) on dry runs only (``dry_run=true``: every phase
on fake tensors, the predicted live tensor bytes recorded), each a fresh worker process
(``sweeper.process.execute``). With ``device=cuda`` the dry runs count each storage in the CUDA
caching allocator's 512 B blocks, no GPU needed. A load fits when its largest predicted phase
peak (bytes) is at most ``capacity``; the search is the frontier sweeper's ``model`` strategy
with dry runs as its oracle (``Predictor.search``). The answer is a prediction of tensor bytes:
what it cannot see is ``BLIND_SPOTS`` (``BLIND_SPOTS_CUDA``), printed with every answer.

This module is the library (``Predictor``, ``predict_edge``, which writes predict.json); the
command and what it prints are ``sweeper.cli.predict_command``.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path

from hydra import compose, initialize_config_module
from omegaconf import DictConfig

from memsweep.conf.contract import (
    RECORD_FILE,
    RunSpec,
    SpecError,
    check_axis_read,
    parse_size,
    predicted_outcome,
    run_peak,
    try_read,
    write_json_atomic,
)

from .callbacks import report_dry_run
from .frontier_settings import FrontierSweeperConf
from .inputs import check_writable
from .predict_parts import breakdown, estimator_figures, peak_split_at
from .process import execute
from .search import FrontierSearch, Lattice, Reading, check_search_axis
from .spec import launch_settings, spec_from_config

MAX_VALUE = 2**31
BLIND_SPOTS = (
    "the allocator's rounding (CUDA: 512 B blocks, 2 MiB segments) and its cache of freed blocks "
    "(reserved > allocated)",
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


@dataclass
class PredictedEdge:
    """The edge of an axis that dry runs predict (``Predictor.search``).

    Attributes:
        max_fit: the largest value predicted to fit, or None.
        min_miss: the smallest value predicted not to fit, or None.
        exact: neighbours on the lattice (or nothing fits), and no dry run failed.
        upper: the largest value searched.
        upper_reached: ``upper`` fits: the edge lies above it.
        error: the ``Predictor.run`` dict of the dry run that could not predict (it stops the
            search), or None.
    """

    max_fit: int | None
    min_miss: int | None
    exact: bool
    upper: int
    upper_reached: bool
    error: dict | None = None


class Predictor:
    """Dry runs of one load at different values of ``axis``, each in its own directory.

    Args:
        base: the load; its dry runs are on its device (cpu or cuda:N: fake CUDA tensors, no
            GPU needed), except a load on several devices (``devices`` > 1), predicted on the
            CPU as one device.
        axis: batch, context or width.
        capacity_bytes: the capacity to fit in (bytes).
        out_dir: the directory of the dry runs (one ``<axis>=<value>`` directory each).
        isolation: how each worker process starts (``sweeper.process.execute``).
        upper: the largest value searched (at most ``MAX_VALUE``); None: the frontier
            sweeper's (``FrontierSweeperConf.upper``, 65536).
        finished: value -> (result envelope, record.json or None) of the dry runs made, shared
            between predictors of the same load and ``out_dir`` at other capacities
            (``predict_cards``): a value one of them ran is not executed again; default its own.

    Attributes:
        device: the device the dry runs are on.
        runs: value -> ``run``'s dict, for every dry run made.
    """

    def __init__(
        self,
        base: RunSpec,
        axis: str,
        capacity_bytes: int,
        out_dir: Path,
        isolation: str,
        upper: int | None = None,
        finished: dict[int, tuple[dict, dict | None]] | None = None,
    ):
        self.base, self.axis, self.capacity, self.upper = (
            base,
            axis,
            capacity_bytes,
            min(upper or FrontierSweeperConf.upper, MAX_VALUE),
        )
        self.device = base.device if base.devices == 1 else "cpu"
        self.out_dir, self.isolation = Path(out_dir), isolation
        self.runs: dict[int, dict] = {}
        self.finished = {} if finished is None else finished

    def run(self, value: int) -> dict:
        """The dry run at ``value`` (made once; later calls return the same dict).

        Args:
            value: the value of the axis.

        Returns:
            {"value", "outcome", "error_type", "error_message", "peak" (bytes: the largest
            phase peak of ``max_memory_allocated``, or None), "fits" (peak <= capacity, or
            None when the worker could not predict: outcome error), "record" (record.json,
            or None)}.

        Raises:
            SpecError: a load the dry run refuses (e.g. a workload it cannot fake).
        """
        if value in self.runs:
            return self.runs[value]
        fresh = value not in self.finished
        if fresh:
            self.finished[value] = self._dry_run(value)
        result, record = self.finished[value]
        peak, _ = run_peak(record)  # a dry run's: max_memory_allocated, predicted
        verdict = predicted_outcome(result["outcome"], peak, self.capacity)
        if fresh:
            report_dry_run(len(self.finished), f"{self.axis}={value}", result, peak, verdict, self.capacity)
        ok = verdict in ("ok", "oom")
        out = {
            "value": value,
            "outcome": result["outcome"],
            "error_type": result.get("error_type"),
            "error_message": result.get("error_message"),
            "peak": peak if ok else None,
            "fits": (verdict == "ok") if ok else None,
            "record": record,
        }
        self.runs[value] = out
        return out

    def _dry_run(self, value: int) -> tuple[dict, dict | None]:
        """Execute (or resume) the dry run at ``value``: its result envelope and record.json."""
        # one warmup iteration and one warm repeat: every later step repeats the first warm one
        data = {
            **self.base.to_dict(),
            self.axis: value,
            "dry_run": True,
            "device": self.device,
            "devices": 1,
            "capacity_bytes": None,
            "estimate": None,
            "repeats": 1,
            "warmup": min(self.base.warmup, 1),
        }
        spec = RunSpec.from_dict(data)
        run_dir = self.out_dir / f"{self.axis}={value}"
        result = execute(spec, run_dir, resume=True, isolation=self.isolation)
        return result, try_read(run_dir, RECORD_FILE)[0]

    def search(self, start: int, lattice: Lattice | None = None) -> PredictedEdge:
        """The predicted edge of the axis.

        Driven by memsweep's frontier search (``sweeper.search.FrontierSearch``, strategy
        ``model``) with dry runs as its oracle: a value "fits" when its predicted peak is at most
        the capacity, and the fit of predicted peaks against the axis aims the next dry run, so
        a load whose peak is affine in the axis needs about four dry runs instead of a doubling
        and a bisection.

        Args:
            start: the first value tried (the configured one).
            lattice: the values allowed (default the frontier sweeper's: multiples of its
                ``multiple_of`` in [its ``lower``, ``upper``], ``FrontierSweeperConf``).

        Returns:
            The ``PredictedEdge``; the search stops once the edge is exact.

        Raises:
            SpecError: a load the dry run refuses.
        """
        conf = FrontierSweeperConf
        lattice = lattice or Lattice.make(conf.lower, self.upper, conf.multiple_of, self.axis)
        search = FrontierSearch(self.axis, lattice, "model", capacity=self.capacity, seed=start)
        error = None
        while not search.done:
            for probe in search.propose(1):
                r = self.run(probe.value)
                if r["fits"] is None:
                    error = r
                    search.observe(probe.value, Reading("error", None, self.capacity, r.get("error_message")))
                else:
                    search.observe(probe.value, Reading("ok" if r["fits"] else "oom", r["peak"], self.capacity))
        res = search.result()
        nothing_fits = res.max_ok is None and res.min_oom == lattice.lower
        return PredictedEdge(
            max_fit=res.max_ok,
            min_miss=res.min_oom,
            exact=error is None and (res.exact or nothing_fits),
            upper=lattice.upper,
            upper_reached=error is None and res.upper_reached,
            error=error,
        )


@dataclass
class Prediction:
    """What ``predict_edge`` found.

    Attributes:
        axis: the axis predicted.
        capacity_bytes: the capacity (bytes).
        out_dir: the directory of the dry runs and of predict.json.
        predictor: the dry runs (``Predictor.runs``, ``Predictor.device``).
        edge: ``Predictor.search``'s answer.
        summary: what predict.json holds: axis, capacity_bytes, source ("predicted"),
            max_fit, min_miss, exact, upper (the largest value searched), upper_reached,
            dry_runs, runs (value, outcome, peak, fits, error_type), breakdown at max_fit (or
            None), peak_split at split_value (max_fit, or min_miss when nothing fits; or None),
            estimator (``estimator_figures`` there), blind_spots, device, prediction_rounding.
    """

    axis: str
    capacity_bytes: int
    out_dir: Path
    predictor: Predictor
    edge: PredictedEdge
    summary: dict


def compose_config(overrides: list[str], fixed: tuple[str, ...] = ()) -> DictConfig:
    """memsweep's config with ``overrides`` (Hydra's syntax), one value each, then ``fixed``.

    Args:
        overrides: the load's overrides, as the user gave them.
        fixed: overrides the caller adds after them (``memsweep predict``'s ``dry_run=true``...),
            never named in an error about the user's.

    Returns:
        The composed config.

    Raises:
        SpecError: a key memsweep does not read (``sweeper.override_keys``), a list or range
            (``batch=1,2``: the search picks the values), or an
            override Hydra cannot parse or apply (an unknown key or config group, a malformed
            value), naming that override alone and Hydra's reason in one line.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from .override_keys import check_override_keys

    parser = OverridesParser.create()
    for text in overrides:  # one at a time: the error names the one that cannot be parsed
        try:
            parser.parse_overrides([text])
        except HydraException as exc:
            raise SpecError("override", text, f"key=value in Hydra's override syntax ({first_line(exc)})") from None
    check_override_keys(overrides)
    parsed = parser.parse_overrides(overrides)
    for override in parsed:
        if override.is_sweep_override():
            raise SpecError(
                override.get_key_element(),
                str(override.input_line).split("=", 1)[-1],
                "a single value: memsweep predict searches the --axis itself",
            )
    try:
        with initialize_config_module(config_module="memsweep.conf", version_base="1.3"):
            return compose(config_name="config", overrides=overrides + list(fixed))
    except (HydraException, OmegaConfBaseException) as exc:
        field = next((o.get_key_element() for o in parsed if o.get_key_element() in str(exc)), "overrides")
        value = next(
            (str(o.input_line).split("=", 1)[-1] for o in parsed if o.get_key_element() == field), " ".join(overrides)
        )
        raise SpecError(field, value, f"an override of memsweep's config ({first_line(exc)})") from None


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (Hydra's run over several)."""
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


def compose_load(overrides: list[str], axis: str, axis_field: str = "axis") -> tuple[RunSpec, str, Path]:
    """The load of ``memsweep predict``: memsweep's config with ``overrides`` (Hydra's syntax;
    ``device=cpu`` unless they set a device: a CUDA dry run needs no GPU), as a dry run, checked to
    read ``axis`` (``conf.contract.check_axis_read``).

    Args:
        overrides: the load's overrides (those of ``memsweep run``).
        axis: the axis to predict along.
        axis_field: how the user named the axis (``--axis``), named when the load ignores it.

    Returns:
        (the spec, the worker isolation, the new output directory: ``hydra.run.dir`` when given,
        else ``<results_dir>/predict/<timestamp>``; not created).

    Raises:
        SpecError: bad input in the load (``compose_config``), a ``dry_run`` other than true (every
            run here is a dry run), an unwritable ``results_dir``, a ``hydra.run.dir`` that cannot be
            written or holds files already, or a load the dry run refuses.
    """
    for o in overrides:
        key, _, value = o.partition("=")
        if key.lstrip("+~") == "dry_run" and value.strip().lower() != "true":
            raise SpecError(
                "dry_run",
                value,
                "true or left out: memsweep predict runs dry runs only (fake tensors); to measure the load, "
                "memsweep run / memsweep sweep",
            )
    device = () if any(o.startswith("device=") for o in overrides) else ("device=cpu",)
    cfg = compose_config(overrides, (*device, "capacity=null", "export=false", "dry_run=true"))
    settings = launch_settings(cfg)
    base = spec_from_config(cfg)
    check_axis_read(base, axis, axis_field)
    given = next((o.split("=", 1)[1] for o in overrides if o.startswith("hydra.run.dir=")), None)
    if given is not None:  # the dry runs and predict.json go where the user said
        check_writable("hydra.run.dir", given)
        if Path(given).exists() and (not Path(given).is_dir() or any(Path(given).iterdir())):
            raise SpecError("hydra.run.dir", given, "a new or empty directory: memsweep never overwrites a prediction")
        return base, settings["isolation"], Path(given)
    check_writable("results_dir", cfg.get("results_dir", "results"))
    stamp = _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S-%f")
    return base, settings["isolation"], Path(cfg.get("results_dir", "results")) / "predict" / stamp


def check_upper(value: object, field: str = "upper") -> int:
    """The search's upper bound as an int: an integer (or its digits, as typed) from 1 to ``MAX_VALUE``.

    Raises:
        SpecError: anything else (field ``field``: ``upper``, ``--upper``).
    """
    number = int(value) if isinstance(value, str) and value.isdigit() else value
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= MAX_VALUE:
        raise SpecError(field, value, f"an integer from 1 to {MAX_VALUE}: the largest value searched")
    return number


def predict_edge(
    overrides: list[str], axis: str, capacity: str | None, axis_field: str = "axis", upper: int | None = None
) -> Prediction:
    """Predict the edge of ``axis`` on dry runs and write predict.json.

    The load is memsweep's config with ``overrides`` (Hydra's syntax; ``device=cpu`` unless
    they set a device: a CUDA dry run needs no GPU); the dry runs go to
    ``<results_dir>/predict/<timestamp>``.

    Args:
        overrides: the load's overrides (those of ``memsweep run``).
        axis: batch, context or width.
        capacity: the capacity to fit in, as text (``80GB``, ``2GiB``, a byte count).
        axis_field: how the user named the axis (``--axis``), named when it is refused.
        upper: the largest value searched (``--upper``); None: the frontier sweeper's default
            (``FrontierSweeperConf.upper``).

    Returns:
        The ``Prediction``.

    Raises:
        SpecError: an unknown axis or one the load ignores (field ``axis_field``), no capacity
            (field ``capacity``), a capacity that is not a size, bad input in the load, or a load
            the dry run refuses.
    """
    check_search_axis(axis, axis_field)
    if capacity in (None, "null"):
        raise SpecError("capacity", capacity, "a size to predict against, e.g. capacity=80GB")
    capacity_bytes = parse_size(capacity, "capacity")
    base, isolation, out_dir = compose_load(overrides, axis, axis_field)
    predictor = Predictor(base, axis, capacity_bytes, out_dir, isolation, upper=upper)
    edge = predictor.search(getattr(base, axis))
    summary = predict_summary(base, axis, capacity_bytes, predictor, edge)
    write_json_atomic(out_dir / "predict.json", summary)
    return Prediction(axis, capacity_bytes, out_dir, predictor, edge, summary)


def predict_summary(base: RunSpec, axis: str, capacity_bytes: int, predictor: Predictor, edge: PredictedEdge) -> dict:
    """What predict.json holds: the predicted edge, the dry runs, the breakdown at the edge.

    Args:
        base: the load.
        axis: batch, context or width.
        capacity_bytes: the capacity predicted against (bytes).
        predictor: the dry runs made.
        edge: ``Predictor.search``'s answer.

    Returns:
        The summary (JSON-ready; bytes as integers).
    """
    at = predictor.runs.get(edge.max_fit) if edge.max_fit is not None else None
    # nothing fits: the split of the smallest value, to show what does not fit
    split_value = edge.max_fit if at is not None else edge.min_miss
    split_run = at or (predictor.runs.get(split_value) if split_value is not None else None)
    rounding = next(
        (
            r["record"].get("prediction_rounding")
            for r in predictor.runs.values()
            if r["record"] and r["record"].get("prediction_rounding")
        ),
        None,
    )
    summary = {
        "axis": axis,
        "capacity_bytes": capacity_bytes,
        "source": "predicted",
        "max_fit": edge.max_fit,
        "min_miss": edge.min_miss,
        "exact": edge.exact,
        "upper": edge.upper,
        "upper_reached": edge.upper_reached,
        "dry_runs": len(predictor.runs),
        "runs": [
            {k: r[k] for k in ("value", "outcome", "peak", "fits", "error_type")}
            for r in sorted(predictor.runs.values(), key=lambda r: r["value"])
        ],
        "breakdown": breakdown(at["record"]) if at else None,
        "peak_split": peak_split_at(split_run["record"]) if split_run and split_run["record"] else None,
        "split_value": split_value if split_run else None,
        "estimator": estimator_figures(base, split_run["record"] if split_run else None),
        "blind_spots": list(blind_spots(predictor.device)),
        "device": predictor.device,
        "prediction_rounding": rounding,
    }
    return summary
