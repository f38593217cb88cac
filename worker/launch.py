"""Entry of a worker forked by memsweep's forkserver (``isolation=forkserver``).

Called in the forked child by ``worker/forkserver.py``; the server has imported torch
(never touching a device), so every run is still a fresh process, with its own CUDA context
and caching allocator, that skips the import.
"""

from __future__ import annotations

import os
import signal
import sys

from conf.contract import PARENT_ENV

from .main import main


def run(spec_path: str, stdout_path: str, stderr_path: str, env: dict, parent: int | None = None) -> None:
    """Runs in the forked child: its own session, environment and output files, then the worker.

    Args:
        spec_path: the run's spec.json.
        stdout_path: the file that becomes the worker's stdout (fd 1).
        stderr_path: the file that becomes the worker's stderr (fd 2).
        env: the worker's whole environment (replaces the server's).
        parent: the handler's pid, which the worker dies with (``conf.contract.PARENT_ENV``).

    Never returns: the process exits with the worker's exit code (``conf.contract.EXIT_*``).
    """
    os.setsid()  # its own process group, so a timeout kills the worker and anything it started
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the server ignores it; a worker does not
    os.environ.clear()
    os.environ.update(env)
    if parent is not None:
        os.environ[PARENT_ENV] = str(parent)
    for fd, path in ((1, stdout_path), (2, stderr_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    code = main([spec_path])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the worker's own exit code, without multiprocessing's clean-up
