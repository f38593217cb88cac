"""What a caller sees of the runs it started: a progress bar or nothing (the Python API), and the
words of the command line's progress (``counts_text``).

The command line's progress is ``sweeper.callbacks.Progress``, a Hydra callback: a bar on a
terminal (an ``Observer``), else one line per finished job, with the jobs done and left and the
time left (``counts_text``); ``memsweep
predict`` says each dry run as it ends (``sweeper.callbacks.report_dry_run``). A call of the Python API
(``memsweep.run``, ``memsweep.sweep``...) runs the same Hydra callbacks in its own process; while
it runs, an ``Observer`` is installed here (``observing``), and ``Progress`` hands it what it would
have printed: the observer shows a bar (tqdm's ``tqdm.auto``: a widget in a notebook, a text bar on
a terminal) or nothing (``progress=False``, quiet: ``quiet_overrides``, ``quiet``), and keeps the
sweep directory Hydra chose. Jobs that a launcher runs in other processes (joblib, submitit) have no
observer there and print ``Progress``'s lines as on the command line."""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FALLBACK_SIZE = (80, 24)
"""The bar's width and the screen's height (characters, lines) on a terminal that reports no size:
a pseudo-terminal whose size was never set (``script -qc``, some CI runners) says 0 x 0, and tqdm
sized by it draws nothing at all."""


def bar_size(stream: Any = None) -> dict[str, Any]:
    """How tqdm sizes the bar on ``stream``: with the terminal (``dynamic_ncols``), or, on a
    terminal that reports no usable size, ``FALLBACK_SIZE``.

    Args:
        stream: the bar's stream; None: ``sys.stderr`` (tqdm's).

    Returns:
        tqdm keyword arguments: ``{"dynamic_ncols": True}``, or ``{"ncols": 80, "nrows": 24}`` on a
        terminal of fewer than 2 columns or no lines. Not a terminal (a notebook, a pipe): the former.
    """
    stream = sys.stderr if stream is None else stream
    try:
        fd = stream.fileno()
        if not os.isatty(fd):
            return {"dynamic_ncols": True}
        size = os.get_terminal_size(fd)
    except (AttributeError, OSError, ValueError):  # no file descriptor (a notebook's stream), closed
        return {"dynamic_ncols": True}
    if size.columns >= 2 and size.lines >= 1:
        return {"dynamic_ncols": True}
    return {"ncols": FALLBACK_SIZE[0], "nrows": FALLBACK_SIZE[1]}


class Observer:
    """The progress of one API call, fed by ``sweeper.callbacks.Progress``.

    Args:
        bar: show a progress bar (tqdm); False: show nothing.
        total: the jobs planned when the caller knows them (1 for one run); a sweep's plan,
            when it can be known up front, replaces it (``multirun_start``).

    Attributes:
        sweep_dir: the sweep directory of the multirun (absolute), once it started; else None.
        done: the jobs ended so far.
    """

    def __init__(self, bar: bool, total: int | None = None) -> None:
        self.show = bar
        self.total = total
        self.sweep_dir: Path | None = None
        self.done = 0
        self._bar: Any = None

    def _tqdm(self) -> Any:
        """The bar, made on first use (tqdm imported only then; sized by ``bar_size``); None when not
        shown."""
        if self.show and self._bar is None:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=self.total, desc="memsweep", unit="run", **bar_size())
        return self._bar

    def multirun_start(self, sweep_dir: str, total: int | None) -> None:
        """A sweep started in ``sweep_dir`` with ``total`` planned jobs (None: not known up front)."""
        self.sweep_dir = Path(sweep_dir).absolute()
        if total is not None:
            self.total = total
            if self._bar is not None:
                self._bar.reset(total=total)

    def job_start(self, condition: str) -> None:
        """A job started: its condition (``job N: batch=2 ...``) is shown beside the bar."""
        condition = condition.removeprefix("job ?: ")  # one run: no job number
        bar = self._tqdm()
        if bar is not None:
            bar.set_postfix_str(f"running {condition}", refresh=True)

    def job_end(self, condition: str, outcome: str) -> None:
        """A job ended with ``outcome`` (``ok``, ``oom in cold_forward``, ``failed``...)."""
        condition = condition.removeprefix("job ?: ")
        self.done += 1
        bar = self._tqdm()
        if bar is not None:
            bar.set_postfix_str(f"{condition} -> {outcome}", refresh=False)
            bar.update(1)

    def close(self) -> None:
        """Close the bar (it stays on screen)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


_OBSERVER: Observer | None = None


def observer() -> Observer | None:
    """The observer of the API call running in this process, or None (the command line)."""
    return _OBSERVER


def quiet() -> bool:
    """Whether an API call with ``progress=False`` is running in this process: its callbacks print
    nothing then (the sweep's summary, the report's path: the result holds them)."""
    return _OBSERVER is not None and not _OBSERVER.show


QUIET_OVERRIDES = {
    "hydra/hydra_logging": "++hydra.hydra_logging.handlers.console.level=WARNING",
    "hydra/job_logging": "++hydra.job_logging.handlers.console.level=WARNING",
    "hydra.job.env_set.MEMSWEEP_PROGRESS": "++hydra.job.env_set.MEMSWEEP_PROGRESS=0",
}
"""What a caller may choose itself -> the override that makes a call with ``progress=False`` quiet:
the console handler of Hydra's default logging configs (Hydra's own lines, ``[HYDRA] Launching
jobs...``, and memsweep's ``INFO`` lines of each job) kept to warnings and errors, the job's log
file (``memsweep.log``) keeping every line; no progress lines from jobs that a launcher runs in
other processes (joblib, submitit: ``sweeper.callbacks.Progress.mode``)."""


def quiet_overrides(argv: list[str]) -> list[str]:
    """The overrides that make a call with ``progress=False`` quiet (``QUIET_OVERRIDES``), but for
    what the caller chose itself in ``argv`` (``hydra/job_logging=disabled``: theirs).

    Args:
        argv: the call's overrides.

    Returns:
        The overrides, to go before ``argv`` (so that the caller's own settings win).
    """
    chosen = {a.split("=", 1)[0].lstrip("+~") for a in argv if "=" in a}
    return [override for key, override in QUIET_OVERRIDES.items() if key not in chosen]


@contextlib.contextmanager
def observing(bar: bool, total: int | None = None) -> Iterator[Observer]:
    """Install an ``Observer`` for the duration of one API call (the previous one is restored).

    Args:
        bar: show a progress bar; False: nothing.
        total: the jobs planned, when known (1 for one run).

    Yields:
        The observer.
    """
    global _OBSERVER
    previous, _OBSERVER = _OBSERVER, Observer(bar, total)
    try:
        yield _OBSERVER
    finally:
        _OBSERVER.close()
        _OBSERVER = previous


def time_left_s(elapsed_s: float, done: int, total: int | None) -> float | None:
    """Seconds left in a sweep, at the mean pace of the runs done so far.

    Args:
        elapsed_s: seconds since the sweep started.
        done: runs ended so far.
        total: runs planned; None when not known up front (an adaptive search).

    Returns:
        ``elapsed_s / done * (total - done)`` (0 when none are left); None when nothing ended
        yet or the total is not known.
    """
    if total is None or done <= 0:
        return None
    return elapsed_s / done * max(total - done, 0)


def counts_text(done: int, total: int | None, elapsed_s: float | None) -> str:
    """The progress of a sweep in words: ``3/8 done, 5 left, about 0:00:12 left``; ``3 done, time
    left not known (the search picks its next value as it goes)`` without a total.

    Args:
        done: runs ended so far.
        total: runs planned, or None.
        elapsed_s: seconds since the sweep started, or None when not known.
    """
    if total is None:
        return f"{done} done, time left not known (the search picks its next value as it goes)"
    left = time_left_s(elapsed_s, done, total) if elapsed_s is not None else None
    eta = "" if left is None else f", about {datetime.timedelta(seconds=round(left))} left"
    return f"{done}/{total} done, {max(total - done, 0)} left{eta}"
