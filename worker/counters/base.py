"""The protocol every counter object follows, and the null values of the fields a backend lacks.

``run_phase`` (worker/protocol.py) reads a run's counters only through ``Counters``; the
kinds (``cpu.CpuCounters``, ``cuda.CudaCounters``, ``cuda.MultiDeviceCounters``,
``dryrun.DryRunCounters``) each implement it.
"""

from __future__ import annotations

from typing import Protocol

from memsweep.conf.contract import EXTRA_COUNTERS, PEAK_SPLIT_FIELDS

# The extra counters of a phase record (``extra()``), null where a backend has none (never 0).
NO_EXTRA = dict.fromkeys(EXTRA_COUNTERS)

NO_PEAK_SPLIT = dict.fromkeys(PEAK_SPLIT_FIELDS)  # a measured run has no split: null, never 0


class Counters(Protocol):
    """The memory counters of one run, read by the per-phase protocol (``run_phase``).

    The four counters carry PyTorch's names and meanings (PyTorch docs:
    torch.cuda.memory_allocated, memory_reserved, max_memory_allocated, max_memory_reserved):
    an ``int`` number of bytes, or ``None`` when the backend cannot read it (never 0 for
    "unknown"). The peaks cover the window since the last ``reset_peak_memory_stats``.

    Attributes:
        kind: ``"cpu"``, ``"cuda"`` or ``"dry_run"``.
        sources: record field name -> where its value comes from (str), or None where this
            kind has no such value; recorded as the run's ``counter_sources``.

    A counter object of a run on several devices also offers ``per_device()`` (see
    ``cuda.MultiDeviceCounters``); ``run_phase`` asks for it only where it exists.
    """

    kind: str
    sources: dict[str, str | None]

    def start(self) -> None:
        """Prepare the counters before the first phase (enter a tracker, initialise a device)."""

    def synchronize(self) -> None:
        """Wait until every operator queued on the device has completed."""

    def memory_allocated(self) -> int | None:
        """Bytes currently allocated to tensors, or None."""

    def memory_reserved(self) -> int | None:
        """Bytes currently reserved (by the caching allocator; the resident set on the CPU), or None."""

    def max_memory_allocated(self) -> int | None:
        """Peak of ``memory_allocated`` since the last reset, bytes, or None."""

    def max_memory_reserved(self) -> int | None:
        """Peak of ``memory_reserved`` since the last reset, bytes, or None."""

    def reset_peak_memory_stats(self) -> None:
        """Start a new peak window (both peaks restart from the current values)."""

    def extra(self) -> dict[str, int | None]:
        """The phase record's extra fields (``NO_EXTRA``'s and ``NO_PEAK_SPLIT``'s keys), bytes
        or counts, null where this kind has none."""

    def oom_detail(self) -> dict | None:
        """What an out-of-memory phase adds to its record (the refused request), or None."""
