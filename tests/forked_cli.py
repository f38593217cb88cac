"""``memsweep ARGS`` as a process of its own, forked from a server that imported memsweep's command
line once: for the tables of commands that are refused before any worker starts, which would
otherwise pay the interpreter's start and the imports (Hydra and its plugins, the sweepers, the
contract: about a second of CPU) once per case.

Each command is a fresh process (a fork of the server, which never runs a command itself), in its
own working directory, stdout and stderr captured into files, stdin from /dev/null. The child runs
what the console script runs (``sys.argv[0]`` the script, ``sys.exit(main())``) and ends as a
Python interpreter ends: an uncaught exception prints its traceback and exits 1, ``atexit``
handlers run, the streams are flushed; the server kills it (SIGKILL) at its timeout. Only the
imports are done before the command's arguments are known. Each of test_bad_input's refusal tables
gave the same exit status, stderr (but for its log lines' times), stdout and files this way as the
console script run with ``subprocess``; the commands that start workers, and every refusal of
tests/test_cli.py, run the console script (``tests.data.loads.MEMSWEEP``) as a user runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.data.loads import MEMSWEEP

PRELOAD = (
    "memsweep.sweeper.cli",
    "hydra.main",
    "hydra.core.plugins",
    "memsweep.sweeper.api",
    "memsweep.sweeper.process",
    "memsweep.sweeper.callbacks",
    "memsweep.sweeper.predict",
    "hydra_plugins.memsweep.memsweep_sweepers",
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher",
)
"""The modules the server imports (those a ``run`` or ``sweep`` imports before it reads its
arguments' values); a module left out is imported by the command itself, as in a new process."""
SERVER = (
    "PRELOAD = "
    + repr(PRELOAD)
    + r"""
import importlib, json, os, select, signal, sys
for name in PRELOAD:  # the imports every command pays, done once
    importlib.import_module(name)

def serve():
    for line in sys.stdin.buffer:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            return request
        pidfd = os.pidfd_open(pid)
        ended, _, _ = select.select([pidfd], [], [], request["timeout"])
        os.close(pidfd)
        if not ended:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        sys.stdout.write(json.dumps({"status": os.waitstatus_to_exitcode(status), "timed_out": not ended}) + "\n")
        sys.stdout.flush()
    sys.exit(0)

request = serve()
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
os.chdir(request["cwd"])
sys.argv = [request["script"], *request["argv"]]
from memsweep.sweeper.cli import main
sys.exit(main())
"""
)


class ForkedCLI:
    """The server (started on first use) and ``run``, which answers as ``subprocess.run`` does."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def _server(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", SERVER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=tempfile.gettempdir(),
            )
        return self.proc

    def run(self, argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
        """``memsweep ARGV`` in ``cwd``, forked from the server. Returns: the finished process
        (returncode, stdout and stderr as text). Raises: subprocess.TimeoutExpired when it ran
        ``timeout`` seconds (it is killed then, as ``subprocess.run`` kills it)."""
        proc = self._server()
        assert proc.stdin is not None and proc.stdout is not None
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"argv": list(argv), "cwd": str(cwd), "stdout": str(out), "stderr": str(err)}
            proc.stdin.write(json.dumps({**request, "script": MEMSWEEP, "timeout": timeout}) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the forked memsweep server exited ({proc.wait()})")
            answer = json.loads(line)
            if answer["timed_out"]:
                raise subprocess.TimeoutExpired([MEMSWEEP, *argv], timeout)
            return subprocess.CompletedProcess([MEMSWEEP, *argv], answer["status"], out.read_text(), err.read_text())

    def close(self) -> None:
        """Stop the server (its stdin closed, it exits)."""
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
