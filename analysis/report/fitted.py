"""The fitted limits in words: where the fit puts the largest value within a level, and, beside a
recommendation that is only as large as the values the sweep happened to run, the larger value the
fit puts under the margin with the command that would measure it (on the CPU at the host's own RAM,
no such command: an emulated capacity instead, as running out there is the kernel's OOM killer).

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
    kept = load_overrides(a)
    if kept is None:
        return f"memsweep run ... {axis_label(a.axis, value)}"
    return " ".join(["memsweep run", *kept, axis_label(a.axis, value)])


def load_overrides(a: AxisResult) -> list[str] | None:
    """The command-line overrides of the load of ``a`` without its axis: those of a run of the load
    (Hydra's ``.hydra/overrides.yaml``, the run at the edge first), less the axis's override, the
    ``sweep=`` group (it lists a sweep's axes, not the load) and Hydra's own.

    Args:
        a: the axis result.

    Returns:
        The overrides, in order; None when no run's overrides can be read.
    """
    edge = a.stat(a.edge)
    for r in (edge.runs if edge else []) + a.runs:
        overrides = run_overrides(str(r.get("run_dir")))
        if overrides is not None:
            kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in (a.axis, "sweep")]
            return [o for o in kept if not o.lstrip("+~").startswith("hydra")]
    return None


HOST_RAM = "device total_memory"
"""The ``capacity_method`` of a CPU run without an emulated ``capacity``: the host's whole RAM."""


def at_host_ram(a: AxisResult) -> bool:
    """Whether the capacity of ``a`` is the host's own RAM: CPU runs without an emulated ``capacity``
    (``capacity_method`` ``device total_memory``), where the tracker caps nothing and running out is
    the kernel's OOM killer (swap first), not an ``oom``."""
    return a.kind == "cpu" and any(r.get("capacity_method") == HOST_RAM for r in a.runs)


def emulated_command(a: AxisResult) -> str:
    """The frontier search of the axis of ``a`` under an emulated capacity (``capacity=1GiB``, a size
    to choose well below the host's free memory), with the load's overrides (``load_overrides``;
    ``...`` when none can be read)."""
    kept = load_overrides(a)
    load = ["..."] if kept is None else [o for o in kept if o.split("=", 1)[0].lstrip("+~") != "capacity"]
    return " ".join(["memsweep sweep hydra/sweeper=frontier", f"hydra.sweeper.axis={a.axis}", *load, "capacity=1GiB"])


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
        `memsweep run ... batch=39`)"``; at the host's own RAM (``at_host_ram``) no run of it is
        offered (it could fill the RAM): it is named an extrapolation, with a frontier search under
        an emulated capacity instead. None when there is no such value.
    """
    x = a.margin_limit_unmeasured
    if x is None:
        return None
    if at_host_ram(a):
        return (
            f"the fit puts the largest value under the margin at {axis_label(a.axis, x)} (an extrapolation "
            f"of the fit, not a measurement; not offered as a run: the capacity is this host's whole RAM, "
            f"where a run that large could swap or meet the kernel's OOM killer; to measure an edge, give an "
            f"emulated capacity well below the free memory: `{emulated_command(a)}`)"
        )
    return (
        f"the fit puts the largest value under the margin at {axis_label(a.axis, x)} "
        f"(not measured; confirm with `{run_command(a, x)}`)"
    )
