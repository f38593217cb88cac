"""How memsweep's fork server (``worker/forkserver.py``) starts a run's worker process.

``isolation=forkserver``: ``run`` is called in the forked child; the server has imported torch
(never touching a device), so every run is still a fresh process, with its own CUDA context
and caching allocator, that skips the import. ``isolation=spawn``: ``spawn`` starts a new
interpreter, ``python -m memsweep.worker SPEC``, exactly as ``sweeper.launch.run_spawn`` does: it
inherits nothing of the server (no module, no descriptor, no ignored signal) and imports torch
itself; only its parent is the server's handler instead of the launcher's worker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from memsweep.conf.contract import PARENT_ENV, WORKER_COMMAND

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


def spawn(spec_path: str, stdout_path: str, stderr_path: str, env: dict, parent: int) -> subprocess.Popen:
    """Start the worker in a new interpreter (``isolation=spawn``), from a fork-server handler.

    The same process as ``sweeper.launch.run_spawn`` starts: ``python -m memsweep.worker SPEC``
    (``conf.contract.WORKER_COMMAND``) in a session of its own, in the run directory, stdin
    from /dev/null, stdout and stderr into the given files (truncated), every other descriptor
    closed, and every signal at its default disposition: subprocess restores SIGPIPE and
    SIGXFSZ, and SIGINT, which the server ignores (an ignored signal stays ignored across
    execve(2)), is set back to its default in the child before the exec.

    Args:
        spec_path: the run's spec.json (its directory is the worker's working directory).
        stdout_path: the file that becomes the worker's stdout.
        stderr_path: the file that becomes the worker's stderr.
        env: the worker's whole environment.
        parent: the handler's pid, which the worker dies with (``conf.contract.PARENT_ENV``).

    Returns:
        The started process (the caller waits for it by pid with os.waitid/os.waitpid, and keeps
        this object referenced until then, so that subprocess never reaps it first).

    Raises:
        OSError: the interpreter could not be started.
    """
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        return subprocess.Popen(
            [sys.executable, *WORKER_COMMAND, spec_path],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            cwd=os.path.dirname(spec_path),
            env={**env, PARENT_ENV: str(parent)},
            start_new_session=True,
            preexec_fn=_default_sigint,  # noqa: PLW1509 - the handler has one thread when it spawns
        )


def _default_sigint() -> None:  # in the child, between fork and exec
    signal.signal(signal.SIGINT, signal.SIG_DFL)
