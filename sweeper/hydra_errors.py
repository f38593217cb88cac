"""What stops Hydra's app, said in one line instead of a traceback.

Hydra prints every exception that ends its app (a stack trace, unless it is one of its own
compact errors) and exits 1. ``raised_errors`` has Hydra raise them instead
(``HYDRA_FULL_ERROR``, unless the user set it: then Hydra's own report stands), and turns the
faults of the machine and of the input into a ``HydraStopped`` that ``sweeper.cli`` prints as
one line with its exit status: a config file that is no plain YAML (a ``!!python/...`` tag: never
constructed) is refused input (2); a file that cannot be written or read (the disk full, a run
directory deleted mid-sweep) stops the sweep (1, finished runs kept for a resume). Anything
else is a fault of memsweep: its traceback is printed as Hydra would (1).
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Iterator

from memsweep.conf.contract import EXIT_BAD_INPUT, EXIT_STOPPED, SpecError

FULL_ERROR_ENV = "HYDRA_FULL_ERROR"


class HydraStopped(BaseException):
    """Hydra's app stopped: ``message`` (one line) and the exit status ``code``; a
    ``BaseException``, as ``InputRefused`` is, so that nothing between here and the command line
    reports it again."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def stopped(exc: Exception) -> HydraStopped | None:
    """The one-line ``HydraStopped`` of ``exc`` (or of an error it was raised from), or None
    when it is none of the faults this module names (a fault of memsweep itself)."""
    import yaml
    from hydra.errors import CompactHydraException

    for error in _chain(exc):
        if isinstance(error, yaml.YAMLError):
            words = " ".join(str(error).split())
            return HydraStopped(
                f"a config file is not plain YAML ({words}); tags such as !!python/... are never constructed",
                EXIT_BAD_INPUT,
            )
        if isinstance(error, OSError) and error.strerror:
            where = f": {error.filename}" if error.filename else ""
            return HydraStopped(
                f"{error.strerror}{where}; memsweep stopped (finished runs are kept: the same command with the same "
                "hydra.sweep.dir resumes without running them again)",
                EXIT_STOPPED,
            )
    if isinstance(exc, CompactHydraException):  # Hydra's own one-line errors, as Hydra prints them
        cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
        return HydraStopped(" ".join(f"{exc}{cause}".split()), EXIT_STOPPED)
    return None


@contextlib.contextmanager
def raised_errors() -> Iterator[None]:
    """Run Hydra's app inside: its errors raised (``HYDRA_FULL_ERROR=1`` for the block) and turned
    into ``HydraStopped`` (``stopped``), refusals (``SpecError``, ``RunDirError``) raised as they are;
    an error of memsweep itself has its traceback printed and
    stops with ``EXIT_STOPPED``. A user who set ``HYDRA_FULL_ERROR`` gets Hydra's own report.

    Raises:
        HydraStopped: the app ended with an exception.
    """
    from .process import RunDirError

    if os.environ.get(FULL_ERROR_ENV):
        yield
        return
    try:
        with full_errors():
            yield
    except (SpecError, RunDirError):  # refusals: the command line prints them in one line itself
        raise
    except Exception as exc:
        found = stopped(exc)
        if found is None:
            traceback.print_exc()
            found = HydraStopped(
                f"{type(exc).__name__}: {exc} (a fault of memsweep: the traceback above)", EXIT_STOPPED
            )
        raise found from None


@contextlib.contextmanager
def full_errors() -> Iterator[None]:
    """Let Hydra raise an app's error instead of printing it and exiting (``HYDRA_FULL_ERROR=1``
    for the block; the variable as it was afterwards)."""
    saved = os.environ.get(FULL_ERROR_ENV)
    os.environ[FULL_ERROR_ENV] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(FULL_ERROR_ENV, None)
        else:
            os.environ[FULL_ERROR_ENV] = saved
