"""A run's measured throughput: the rates of its warm phases (record.json's ``throughput``).

The worker times every iteration of a phase between two synchronizations of the device
(worker.protocol): the clock starts once the queued work has finished and stops once the
iteration's has. The rates come from the warm phases only (cold ones include allocation,
autotuning and compilation): inference, each iteration of ``warm_forward``; train, each
``warm_step`` (its sub-phases summed: one optimizer step of ``global_batch`` samples); generate,
each ``warm_generate`` (prefill and decode apart, and together). The figure is the median over
the iterations, the noise the median absolute deviation of the per-iteration samples per second
over that median. Nothing is measured on a dry run or a run that did not end ``ok``: every rate
is null then, never 0. A user workload's ``context`` need not count tokens: its token rates are null.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from .record import THROUGHPUT_FIELDS, field_names
from .rundir import record_phases

THROUGHPUT_KEYS = field_names(THROUGHPUT_FIELDS)
"""The keys of record.json's ``throughput``, in the schema's order."""

TOKEN_WORKLOADS = ("mlp", "transformer", "hf")
"""Built-in workloads whose ``context`` is a sequence length: one sample holds ``context`` tokens."""


def tokens_per_sample(workload: object, mode: object, context: object, new_tokens: object = None) -> int | None:
    """The tokens one sample holds, as ``tokens_per_s`` counts them (samples per second times it).

    Args:
        workload: the workload's name (``TOKEN_WORKLOADS`` count tokens; a user workload's
            ``context`` need not).
        mode: the spec's mode; in ``generate`` a sample is its prompt and its new tokens.
        context: the sequence length (tokens).
        new_tokens: the tokens generated per sample (``generate`` only).

    Returns:
        ``context`` (``context + new_tokens`` in generate), or None when the load counts no tokens
        (a user workload, no positive integer context, a generation without ``new_tokens``).
    """
    if workload not in TOKEN_WORKLOADS or isinstance(context, bool) or not isinstance(context, int) or context <= 0:
        return None
    if mode != "generate":
        return context
    return context + new_tokens if isinstance(new_tokens, int) and new_tokens > 0 else None


def empty_throughput() -> dict:
    """The ``throughput`` of a run that measured none: every key null."""
    return dict.fromkeys(THROUGHPUT_KEYS)


def _times(iteration_s: object) -> list[float] | None:
    """A phase's ``iteration_s`` as positive seconds, or None when missing or not all positive."""
    if not isinstance(iteration_s, list) or not iteration_s:
        return None
    if not all(isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0 for t in iteration_s):
        return None
    return [float(t) for t in iteration_s]


def _step_times(phases: Sequence[Mapping], parent: str, sub_phase: str | None = None) -> list[float] | None:
    """Seconds of each step of ``parent`` (``warm_step``, ``warm_generate``): the iterations of its
    sub-phases summed per step (only ``sub_phase`` when given), in step order; None when a
    sub-phase has no usable time."""
    by_step: dict[int, float] = {}
    for p in phases:
        if p.get("parent") != parent or (sub_phase is not None and p.get("sub_phase") != sub_phase):
            continue
        times, step = _times(p.get("iteration_s")), p.get("step")
        if times is None or not isinstance(step, int):
            return None
        by_step[step] = by_step.get(step, 0.0) + sum(times)
    return [by_step[s] for s in sorted(by_step)] or None


def rate_summary(rates: Sequence[float]) -> tuple[float, float | None]:
    """The median of per-iteration rates and their relative spread.

    Args:
        rates: one rate per timed iteration (per second), each > 0; at least one.

    Returns:
        ``(median, noise_rel)``: noise_rel is the median absolute deviation over the median
        (a robust spread, NIST/SEMATECH e-Handbook 1.3.5.6), None with fewer than 2 rates.
    """
    median = statistics.median(rates)
    if len(rates) < 2:
        return median, None
    return median, statistics.median(abs(r - median) for r in rates) / median


def _median_rate(amount: float | None, times: list[float] | None) -> float | None:
    """The median of ``amount / t`` over ``times``; None when either is missing."""
    if amount is None or not times:
        return None
    return rate_summary([amount / t for t in times])[0]


def measured_throughput(record: Mapping) -> dict:
    """The throughput of a finished run, from its record's warm phases.

    Args:
        record: the worker's record (its ``spec``, ``outcome``, ``source``, ``global_batch``
            and ``phases`` with their ``iteration_s`` in seconds).

    Returns:
        THROUGHPUT_KEYS -> value: ``samples_per_s``, ``tokens_per_s``,
        ``prefill_tokens_per_s``, ``decode_tokens_per_s`` (per second, medians),
        ``noise_rel`` (of samples per second) and ``iterations``; all null for a dry run, a run
        not ``ok``, or a record whose warm phases carry no usable times.
    """
    spec = record.get("spec")
    if record.get("source") != "measured" or record.get("outcome") != "ok" or not isinstance(spec, Mapping):
        return empty_throughput()
    phases, mode, batch = record_phases(record), spec.get("mode"), spec.get("batch")
    workload = spec.get("workload")
    name = workload.get("name") if isinstance(workload, Mapping) else None
    context = spec.get("context") if name in TOKEN_WORKLOADS else None
    tokens = tokens_per_sample(name, mode, spec.get("context"), spec.get("new_tokens"))
    out = empty_throughput()
    if mode == "train":
        times = _step_times(phases, "warm_step")
        samples = record.get("global_batch") or batch
    elif mode == "generate":
        times = _step_times(phases, "warm_generate")
        samples = batch
        new = spec.get("new_tokens")
        out["prefill_tokens_per_s"] = _median_rate(
            batch * context if context else None, _step_times(phases, "warm_generate", "prefill")
        )
        out["decode_tokens_per_s"] = _median_rate(
            batch * new if context and new else None, _step_times(phases, "warm_generate", "decode")
        )
    else:
        warm = [p for p in phases if p.get("name") == "warm_forward"]
        times = _times(warm[-1].get("iteration_s")) if warm else None
        samples = batch
    if not times or not isinstance(samples, int) or samples <= 0:
        return empty_throughput()
    out["samples_per_s"], out["noise_rel"] = rate_summary([samples / t for t in times])
    out["tokens_per_s"] = out["samples_per_s"] * tokens if tokens else None
    out["iterations"] = len(times)
    return out


def run_throughput(record: Mapping | None, outcome: str | None) -> dict:
    """A run's throughput as its files hold it: the record's ``throughput`` (worked out from its
    phases for a record written before the field), every key null unless ``outcome`` is ``ok``.

    Args:
        record: the worker's record, or None when it wrote none.
        outcome: the run's outcome (result.json's).

    Returns:
        THROUGHPUT_KEYS -> value (per second; null when not measured, never 0).
    """
    if outcome != "ok" or not isinstance(record, Mapping):
        return empty_throughput()
    measured = record.get("throughput")
    if not isinstance(measured, Mapping):
        return measured_throughput(record)
    return {key: measured.get(key) for key in THROUGHPUT_KEYS}


def timed_on(device_kind: str | None, device_name: str | None) -> str:
    """Where a rate was timed, for a label: ``"timed on CPU"``, ``"timed on NVIDIA H100 (cuda)"``.

    Args:
        device_kind: the record's ``device_kind`` (cpu, cuda), or None.
        device_name: the device's name, or None.

    Returns:
        The words; a CPU timing is never called a GPU figure.
    """
    if device_kind == "cpu":
        return "timed on CPU"
    if device_name:
        return f"timed on {device_name} ({device_kind or 'unknown device'})"
    return f"timed on {device_kind or 'an unknown device'}"


def throughput_words(throughput: Mapping, where: str) -> str | None:
    """A run's throughput in one console line, or None when nothing was measured.

    Args:
        throughput: its THROUGHPUT_KEYS (``run_throughput``).
        where: where it was timed (``timed_on``).

    Returns:
        ``"throughput (measured, timed on CPU): 812.3 samples/s, 103974 tokens/s; median of 5
        warm iterations, noise 2.1 %"``; the prefill and decode rates of a generation too.
    """
    rate = throughput.get("samples_per_s")
    if rate is None:
        return None
    parts = [f"{rate:.4g} samples/s"]
    for key, name in (
        ("tokens_per_s", "tokens/s"),
        ("prefill_tokens_per_s", "prefill tokens/s"),
        ("decode_tokens_per_s", "decode tokens/s"),
    ):
        if throughput.get(key) is not None:
            parts.append(f"{throughput[key]:.4g} {name}")
    noise = throughput.get("noise_rel")
    spread = "no spread (one iteration)" if noise is None else f"noise {100 * noise:.1f} %"
    n = throughput.get("iterations")
    return f"throughput (measured, {where}): {', '.join(parts)}; median of {n} warm iterations, {spread}"
