"""The fitted limits in words: where the fit puts the largest value within a level, and, beside a
recommendation that is only as large as the values the sweep happened to run, the larger value the
fit puts under the margin with the command that would measure it.

The values come from ``AxisResult.limits`` (``fit.capacity_limits``: the fitted crossing floored
to the axis's lattice), the one definition every section prints; they are calculated, never
presented as measured.
"""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

from .fmt import axis_label
from .stats import AxisResult

OVERRIDES_FILE = Path(".hydra") / "overrides.yaml"
"""Where Hydra keeps a run's command-line overrides, under its run directory."""


def run_command(a: AxisResult, value: int) -> str:
    """The ``memsweep run`` command that measures the load of ``a`` at ``value`` of its axis.

    The overrides are those of a run of the load (Hydra's ``.hydra/overrides.yaml`` in its run
    directory, the run at the edge first), with the axis's override replaced by ``value``; the
    ``sweep=`` group (it lists a sweep's axes, not the load) and Hydra's own are left out.

    Args:
        a: the axis result.
        value: the value of ``a.axis`` to measure.

    Returns:
        ``memsweep run OVERRIDES AXIS=VALUE``; ``memsweep run ... AXIS=VALUE`` (the sweep's other
        overrides left to the reader) when no run's overrides can be read.
    """
    edge = a.stat(a.edge)
    runs = (edge.runs if edge else []) + a.runs
    for r in runs:
        overrides = run_overrides(str(r.get("run_dir")))
        if overrides is not None:
            kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in (a.axis, "sweep")]
            kept = [o for o in kept if not o.lstrip("+~").startswith("hydra")]
            return " ".join(["memsweep run", *kept, axis_label(a.axis, value)])
    return f"memsweep run ... {axis_label(a.axis, value)}"


@functools.lru_cache(maxsize=1024)
def run_overrides(run_dir: str) -> tuple[str, ...] | None:
    """A run's command-line overrides (Hydra's ``.hydra/overrides.yaml``), read once per run directory
    (the answer, the summary card and the chosen setting each print the command).

    Args:
        run_dir: the run directory.

    Returns:
        The overrides, in order; None when the file is missing, unreadable or not a list of strings.
    """
    try:
        overrides = yaml.safe_load((Path(run_dir) / OVERRIDES_FILE).read_text())
    except (OSError, yaml.YAMLError):
        return None
    if isinstance(overrides, list) and all(isinstance(o, str) for o in overrides):
        return tuple(overrides)
    return None


def limit_words(a: AxisResult, key: str) -> str:
    """One fitted limit of ``a`` in words (``AxisResult.limits[key]``).

    Args:
        a: the axis result.
        key: ``"capacity"`` or ``"capacity - margin"`` (a key of ``a.limits``).

    Returns:
        ``"the largest batch within the capacity - margin is 39 (not run)"`` (or ``(run: ok)``,
        the outcomes of the runs at that value), or that the fit never reaches the level (no
        limit) or that no value of the lattice stays within it.
    """
    x = a.limits.get(key)
    if x is None:
        return f"never reaches the {key}"
    if x == 0:
        return f"no value of {a.axis} stays within the {key}"
    st = a.stat(x)
    return f"the largest {a.axis} within the {key} is {x} ({'not run' if st is None else 'run: ' + st.status})"


def unmeasured_limit_note(a: AxisResult) -> str | None:
    """The sentence set beside a recommendation when the fit puts a larger, unmeasured value under
    the margin (``AxisResult.margin_limit_unmeasured``).

    Args:
        a: the axis result.

    Returns:
        ``"the fit puts the largest value under the margin at batch=39 (not measured; confirm with
        `memsweep run ... batch=39`)"``; None when there is no such value.
    """
    x = a.margin_limit_unmeasured
    if x is None:
        return None
    return (
        f"the fit puts the largest value under the margin at {axis_label(a.axis, x)} "
        f"(not measured; confirm with `{run_command(a, x)}`)"
    )
