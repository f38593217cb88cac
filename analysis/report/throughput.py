"""The report's throughput beside memory: the answer's sentence that names the largest value
inside the margin and the fastest measured one with their ratio, and the section "Throughput
beside memory" (a table per axis and a figure: peak memory and samples per second against the
swept value; tokens per second along context, where a sample grows with the value).

The rates are runs.parquet's ``samples_per_s`` ... (analysis.throughput): medians over the warm
iterations, timed on the device the runs ran on, which every sentence and caption names (a CPU
timing is no GPU figure). Nothing is shown for an axis without a measured rate.
"""

from __future__ import annotations

import statistics
from typing import NamedTuple

from memsweep.conf.contract import gib, timed_on

from ..doc import Doc, Image
from ..throughput import RATE_UNITS, RATE_WORDS, rate_column, value_rates
from .fmt import axis_label, nbytes, pct
from .stats import AxisResult


def _device_words(a: AxisResult) -> str:
    """Where the axis' runs were timed (``analysis.throughput.timed_on``)."""
    named = next((r for r in a.runs if r.get("device_name")), a.runs[0] if a.runs else {})
    return timed_on(a.kind, named.get("device_name"))


def _noise(noise: float | None) -> str:
    return "-" if noise is None else f"{100 * noise:.1f} %"


class Rates(NamedTuple):
    """The rates of one axis's values, in the unit that says which is fastest (``axis_rates``)."""

    column: str  # analysis.throughput.rate_column's: tokens_per_s along context, else samples_per_s
    unit: str  # its unit (RATE_UNITS)
    of: dict  # value -> (rate, noise): analysis.throughput.value_rates of that column


def axis_rates(a: AxisResult) -> Rates:
    """The measured rates of the values of ``a`` (``rate_column``, ``value_rates``), worked out once."""
    column = rate_column(a.runs, a.axis)
    return Rates(column, RATE_UNITS[column], value_rates(a.runs, a.axis, column))


def fastest(a: AxisResult, rates: Rates) -> tuple[object, float] | None:
    """The frontier row's fastest value (``fastest_label``: the fastest measured inside the margin,
    or the throughput search's answer) and its rate in ``rates``' unit (tokens per second along
    context); None when no run of it was timed."""
    label, rate = a.frontier.get("fastest_label"), a.frontier.get("fastest_samples_per_s")
    value = next((v for v in rates.of if str(v) == label), None)
    if value is None or not isinstance(rate, (int, float)):
        return None
    return value, float(rate) if rates.column == "samples_per_s" else rates.of[value][0]


def throughput_answer(a: AxisResult) -> list[str]:
    """The answer's throughput sentence for one axis (inline markup), or none.

    Args:
        a: the axis result (its runs carry runs.parquet's throughput columns).

    Returns:
        One sentence naming the recommended value (the largest inside the margin) and the
        fastest measured one (inside the sweep's margin when it searched one, else among the ok
        runs), their ratio of samples per second (tokens per second along context, said so; or,
        when the fastest is faster by less than 0.5 % or than either value's measured
        ``throughput_noise_rel``, that the two are as fast; or, when the recommended value of this
        report's margin is the faster, that it is) and the fastest one's headroom; empty when no
        run of the axis was timed.
    """
    measured = axis_rates(a)
    best = fastest(a, measured)
    if best is None:
        return []
    value, rate = best
    rates, unit = measured.of, measured.unit
    where, ax, cap = _device_words(a), a.axis, a.capacity
    st = a.stat(value)
    room = f", {pct(st.margin, cap)} headroom" if st is not None and st.margin is not None and cap else ""
    rec, scope = (
        a.recommended,
        "inside the margin" if a.frontier.get("margin_edge") is not None else "among the ok runs",
    )
    if rec is None or rec not in rates:
        return [f"Throughput (measured, {where}): fastest **{axis_label(ax, value)}**, {rate:.4g} {unit}{room}."]
    if rec == value:
        return [
            f"Throughput (measured, {where}): the recommended **{axis_label(ax, rec)}** is also the fastest "
            f"measured {scope}, {rate:.4g} {unit}{room}."
        ]
    ratio, noises = rate / rates[rec][0], [n for n in (rates[value][1], rates[rec][1]) if n is not None]
    if ratio < 1:  # the row's fastest was chosen under the sweep's own margin; this report's is another
        return [
            f"Throughput (measured, {where}): the recommended **{axis_label(ax, rec)}** is faster than the "
            f"fastest the sweep measured {scope}, {axis_label(ax, value)} ({rates[rec][0]:.4g} vs {rate:.4g} "
            f"{unit}){room}."
        ]
    if ratio - 1 < 0.005 or (noises and ratio - 1 <= max(noises)):  # no faster than the noise says
        within = (
            f"within the noise, {_noise(rates[value][1])} and {_noise(rates[rec][1])}"
            if noises
            else "under 0.5 %, the noise not measured"
        )
        return [
            f"Throughput (measured, {where}): the recommended **{axis_label(ax, rec)}** is as fast as the "
            f"fastest measured, {axis_label(ax, value)} ({rates[rec][0]:.4g} vs {rate:.4g} {unit}: a "
            f"difference {within}){room}."
        ]
    return [
        f"Throughput (measured, {where}): **{axis_label(ax, value)} is {ratio:.2f}x faster than "
        f"{axis_label(ax, rec)}** (the largest inside the margin; {rate:.4g} vs {rates[rec][0]:.4g} "
        f"{unit}, noise {_noise(rates[value][1])} and {_noise(rates[rec][1])}){room}."
    ]


def _row(a: AxisResult, value: object, rates: dict, runs: list[dict]) -> list:
    """The section table's row of one value: outcome, peak, headroom and the rates."""
    st = a.stat(value)
    used = st.used if st is not None else None
    rate, noise = rates.get(value, (None, None))
    return [
        value,
        st.status if st is not None else "-",
        nbytes(used),
        gib(used),
        pct(st.margin if st is not None else None, a.capacity),  # (an ok value's only: a failure's peak is partial)
        None if rate is None else f"{rate:.4g}",
        *(None if (m := _median_of(runs, c)) is None else f"{m:.4g}" for c in _TOKEN_COLUMNS),
        _noise(noise),
        _median_of(runs, "throughput_iterations"),
    ]


_TOKEN_COLUMNS = ("tokens_per_s", "prefill_tokens_per_s", "decode_tokens_per_s")


def _median_of(runs: list[dict], column: str) -> float | None:
    """The median of ``column`` over the ok runs that have it; None when none has."""
    found = [r[column] for r in runs if r.get("outcome") == "ok" and r.get(column) is not None]
    return statistics.median(found) if found else None


def throughput_image(a: AxisResult, plots, name: str) -> Image:
    """The figure of one axis: peak memory (ok runs) and samples per second (tokens per second along
    context, ``rate_column``) against the value."""
    measured = axis_rates(a)
    rates, unit = measured.of, measured.unit
    values = [s.value for s in a.values]
    best = fastest(a, measured)
    png = plots.throughput_plot(
        a.axis,
        values,
        [s.used if s.outcomes.get("ok") else None for s in a.values],
        [rates.get(v, (None,))[0] for v in values],
        a.capacity,
        a.margin_bytes,
        a.recommended,
        best[0] if best else None,
        f"{a.title}: memory and throughput ({_device_words(a)})",
        unit,
    )
    return Image(
        name,
        png,
        f"Peak `{a.used_counter}` (observed) and {RATE_WORDS[unit]} (measured, the median over the warm "
        f"iterations, {_device_words(a)}) against {a.axis}; the recommended value (inside the margin, "
        "assumed) and the fastest measured one are marked.",
    )


def throughput_section(doc: Doc, axes: list[AxisResult], plots) -> None:
    """Append "Throughput beside memory": per axis with a timed run, a table of its values and the
    figure; nothing when no run was timed.

    Args:
        doc: the document appended to.
        axes: the axis results.
        plots: ``analysis.plots``, or a stand-in whose every figure is empty bytes.
    """
    timed = [a for a in axes if value_rates(a.runs, a.axis)]
    if not timed:
        return
    doc.h(1, "Throughput beside memory")
    doc.p(
        "Samples per second of each value, the median over the warm iterations (inference: warm forwards; "
        "train: optimizer steps of the global batch; generate: whole generations, prefill and decode tokens "
        "apart), each iteration timed between two synchronizations of the device; noise: median absolute "
        "deviation / median. Along context a sample holds more tokens at each value, so its fastest value "
        "is the one with the most tokens per second (a workload whose context counts no tokens: samples). "
        "A rate is as fast as the device it was timed on, named in each heading."
    )
    for i, a in enumerate(timed):
        doc.h(2, f"{a.title} ({_device_words(a)})")
        rates = value_rates(a.runs, a.axis)
        rows = [_row(a, s.value, rates, s.runs) for s in a.values]
        doc.table(
            [a.axis, "outcome", f"peak {a.used_counter} B", "GiB", "headroom", "samples/s", "tokens/s"]
            + ["prefill tokens/s", "decode tokens/s", "noise", "iterations"],
            rows,
        )
        doc.ul(throughput_answer(a))
        doc.image(throughput_image(a, plots, f"throughput_{i}_{a.axis}.png"))
