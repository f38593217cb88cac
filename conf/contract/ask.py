"""Ask the worker a question in a separate process: ``python -m memsweep.worker FLAG ARGS...``.

The sweeper (``--probe``, ``--env``) and the analysis (``--count-params``) never import torch
themselves; they start the worker and read the JSON object it prints on its last stdout line.
Standard library only.
"""

from __future__ import annotations

import json
import subprocess
import sys


def ask_worker(flag: str, *args: str, timeout: float = 300) -> dict:
    """``python -m memsweep.worker FLAG ARGS...`` in a separate process: its answer, the JSON object on
    its last stdout line (whatever its exit status).

    Args:
        flag: the worker's flag (``--probe``, ``--env``, ``--count-params``).
        args: its arguments.
        timeout: seconds before the process is killed.

    Returns:
        the parsed JSON object.

    Raises:
        RuntimeError: no answer (the worker's stderr, last 500 characters).
        subprocess.TimeoutExpired: it ran past ``timeout``.
    """
    proc = subprocess.run(
        [sys.executable, "-m", "memsweep.worker", flag, *args], capture_output=True, text=True, timeout=timeout
    )
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise RuntimeError(proc.stderr.strip()[-500:] or f"exit {proc.returncode}, no output") from None
