"""The report's figures, drawn while its document is built: in worker processes when this process
may use more than one core, else in place.

The sections call ``plots.<figure>(...)`` and put the bytes returned into an ``analysis.doc.Image``.
Given a ``FigurePool``, such a call hands the figure to a worker and returns a placeholder at
once (bytes that are no PNG); ``FigurePool.fill`` then puts each figure's PNG bytes in the place
of its placeholder. The figures are the same bytes either way: the same ``analysis.plots``
functions draw them, only elsewhere.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any, NamedTuple

from memsweep.conf.contract import fork_is_safe, usable_cores

from ..doc import Doc

MAX_WORKERS = 4
"""The most processes drawing a report's figures (a report has about a dozen)."""

PLACEHOLDER = b"memsweep: figure being drawn "
"""The start of a placeholder's bytes (followed by its number); never the start of a PNG."""


def _draw(name: str, args: tuple, kwargs: dict) -> bytes:
    """In a worker: the PNG bytes of ``analysis.plots.<name>(*args, **kwargs)``."""
    from .. import plots

    return getattr(plots, name)(*args, **kwargs)


class _Job(NamedTuple):
    """A figure handed to a worker: its future and the call, to draw it here if the pool breaks."""

    future: Future[bytes]
    name: str
    args: tuple
    kwargs: dict


class FigurePool:
    """Stands in for ``analysis.plots``: each figure is drawn in one of the worker processes of
    ``pool``; what a figure function returns here is a placeholder until ``fill``. A figure whose
    worker died (the pool broken: killed, out of memory) is drawn in this process instead.

    Args:
        pool: the executor whose processes draw (each imports ``analysis.plots`` as it starts, or
            has it from the fork).
    """

    def __init__(self, pool: ProcessPoolExecutor):
        self._pool = pool
        self._pending: dict[bytes, _Job] = {}
        self._count = itertools.count()

    def __getattr__(self, name: str) -> Callable[..., bytes]:
        if name.startswith("_"):  # a figure function's name, never a special method's
            raise AttributeError(name)

        def submit(*args: Any, **kwargs: Any) -> bytes:
            try:
                future = self._pool.submit(_draw, name, args, kwargs)
            except BrokenProcessPool:
                return _draw(name, args, kwargs)
            token = PLACEHOLDER + str(next(self._count)).encode()
            self._pending[token] = _Job(future, name, args, kwargs)
            return token

        return submit

    def fill(self, doc: Doc) -> None:
        """Put the PNG bytes of each figure of ``doc`` in the place of its placeholder, waiting for
        the figures still being drawn.

        Raises:
            Exception: what drawing a figure raised (as drawing it in place would have).
        """
        for image in doc.images:
            job = self._pending.pop(image.png, None)
            if job is None:
                continue
            try:
                image.png = job.future.result()
            except BrokenProcessPool:
                image.png = _draw(job.name, job.args, job.kwargs)


def _workers() -> int:
    """How many processes draw the figures: one per usable core (``conf.contract.usable_cores``),
    at most ``MAX_WORKERS``; 1 (drawn in place) where a fork is not available or not safe (another
    thread of this process alive: a fork copies the locks it may hold)."""
    if not fork_is_safe():
        return 1
    return min(usable_cores(), MAX_WORKERS)


def _import_plots() -> None:
    """A worker's start: import ``analysis.plots`` (matplotlib: seconds), while this process goes on."""
    from .. import plots  # noqa: F401


@contextmanager
def figure_pool() -> Iterator[Any]:
    """``analysis.plots``, imported here, or, when several cores may be used, a ``FigurePool`` of
    forked workers that import it as they start (while this process reads the rows); the workers
    end when the block ends.

    Yields:
        What the sections call the figure functions on; fill the document with ``fill_figures``.
    """
    pool = _forked(_workers())
    if pool is None:
        from .. import plots

        yield plots
        return
    try:
        yield FigurePool(pool)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _forked(workers: int) -> ProcessPoolExecutor | None:
    """``workers`` processes forked now (before the report's rows fill this process's memory),
    importing ``analysis.plots`` as they start; None for one worker, or where no process could be
    forked (a process limit, no memory: the figures are then drawn in place)."""
    if workers == 1:
        return None
    before = set(mp.active_children())
    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("fork"), initializer=_import_plots)
    try:
        pool.submit(int)  # a fork starts every worker at the first task
    except OSError:
        for started in set(mp.active_children()) - before:  # those forked before the one that failed
            started.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        return None
    return pool


def fill_figures(plots: Any, doc: Doc) -> None:
    """The figures of ``doc`` drawn: ``FigurePool.fill`` where ``plots`` is a pool; nothing to do
    where they were drawn in place."""
    if isinstance(plots, FigurePool):
        plots.fill(doc)
