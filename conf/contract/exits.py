"""Exit statuses: the worker's (read by the sweeper), ``memsweep run``'s and ``memsweep predict``'s
(read by a shell).

Documented in the README ("Worker exit codes"); a test keeps the two in step.
"""

from __future__ import annotations

EXIT_OK = 0
"""The worker ran every phase."""

EXIT_UNAVAILABLE = 2
"""PyTorch, the asked-for device (or bfloat16 on it) or an optional package is missing: nothing was measured."""

EXIT_OOM = 3
"""A phase ran out of memory; the record says which."""

EXIT_ERROR = 4
"""A phase (or the set-up) raised something else; the record says which and what."""

EXIT_BAD_SPEC = 5
"""spec.json missing, unreadable or invalid."""

EXIT_BAD_INPUT = 2
"""A memsweep command refused its input (a SpecError) before anything ran."""

EXIT_INTERRUPTED = 130
"""A memsweep command interrupted (Ctrl-C, SIGTERM, SIGHUP), said in one line; a sweep resumes when
started again, and what ``analyze``, ``report`` and ``compare`` publish is whole or nothing."""

EXIT_STOPPED = 1
"""``memsweep sweep`` / ``run``: stopped midway by a file it could not write or read (a disk that
fills, a run directory removed while its run ran): one line says which; the finished runs are
kept and the same command resumes once the cause is gone."""

EXIT_AFTER_RUNS = 8
"""``memsweep sweep``: the runs ended but a step after them failed (the analysis or the report at
the sweep's end; one line says which and why): the runs are kept, ``memsweep analyze DIR`` tries
again."""

RUN_EXIT = {"ok": 0, "oom": 3, "error": 4, "crash": 6, "timeout": 7}
"""``memsweep run``'s exit status by the run's outcome, so that ``memsweep run ... && echo
fits`` can be trusted (``EXIT_BAD_INPUT``: refused before the run)."""

PREDICT_EXIT = {"edge": EXIT_OK, "nothing_fits": EXIT_OOM, "error": EXIT_ERROR}
"""``memsweep predict``'s exit status: ``edge`` an edge was predicted, ``nothing_fits`` the
smallest value is predicted not to fit (as a dry run's ``memsweep run`` exits with oom),
``error`` a dry run failed (``EXIT_BAD_INPUT``: refused before any dry run). With ``--cards``:
``error`` when a dry run failed on some card, else ``edge``."""
