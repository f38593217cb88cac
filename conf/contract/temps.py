"""The temporary files of memsweep's atomic writes, named by their writer, and the removal of those
whose writer is dead.

Every writer that publishes ``NAME`` by rename first writes ``.NAME.PID.<anything>.tmp`` (or a
directory ``.NAME.PID.tmp``) beside it, PID its own process id (``temp_prefix``). A writer killed
outright (SIGKILL, the OOM killer, a node lost) leaves it behind; no ``finally`` can. A resume
removes such files (``remove_stale_temps``) only when their writer is gone: no process has that
pid, or the one that has it started after the file was last written (the pid was given to
another process since). A live writer's file is never removed.
"""

from __future__ import annotations

import glob
import os
import shutil
import time
from pathlib import Path

from .host import pid_exists, process_started_epoch

TEMP_SUFFIX = ".tmp"
"""The suffix of every temporary file (and directory) of an atomic write."""

START_SLACK_S = 2.0
"""A process that started more than this after a temporary file was last written is not its writer
(seconds; a process's start time is known to the second: /proc/stat ``btime``)."""


def temp_prefix(name: str, pid: int | None = None) -> str:
    """The start of the temporary file names of ``name``'s writer: ``.NAME.PID.``.

    Args:
        name: the file (or directory) the write publishes, without its directory.
        pid: the writer's process id; None: this process.
    """
    return f".{name}.{os.getpid() if pid is None else pid}."


def temp_writer(tmp: Path, name: str) -> int | None:
    """The writer's pid a temporary file of ``name`` is named with (``temp_prefix``).

    Args:
        tmp: the temporary file.
        name: the name of the file it stands in for.

    Returns:
        The pid, or None (a name without one: an older memsweep's).
    """
    rest = tmp.name[len(name) + 2 :] if tmp.name.startswith(f".{name}.") else ""
    pid = rest.partition(".")[0]
    return int(pid) if pid.isdigit() and 0 < int(pid) < 2**22 else None  # Linux pids: at most 4194304


def writer_gone(tmp: Path, name: str, min_age_s: float = 0.0) -> bool:
    """Whether the process that wrote the temporary file ``tmp`` of ``name`` is gone.

    Args:
        tmp: the temporary file or directory.
        name: what it was to become (``temp_writer`` reads the pid after it).
        min_age_s: a file whose pid names no process here is taken to be gone only once it has
            not been written for this long (seconds): its writer may be a process of another host
            of a shared file system, writing it now. 0: the caller knows no such writer exists.

    Returns:
        True when no live process can be its writer: no process has its pid (and it is older
        than ``min_age_s``), or the process with its pid started after it was last written; False
        for a live writer, and for a file gone meanwhile.
    """
    try:
        written = tmp.lstat().st_mtime
    except OSError:
        return False
    pid = temp_writer(tmp, name)
    if pid is None or not pid_exists(pid):
        return time.time() - written >= min_age_s
    began = process_started_epoch(pid)
    return began is not None and began > written + START_SLACK_S


def remove_stale_temps(directory: Path | str, names: tuple[str, ...], min_age_s: float = 0.0) -> list[Path]:
    """Remove the temporary files (and directories) left for ``names`` in ``directory`` by writers
    that are gone (``writer_gone``): a write killed mid-way (a timeout's SIGKILL, a handler dying with
    its server, an orchestrator killed). A live writer's are left alone.

    Args:
        directory: the directory (a run directory, a sweep directory, an analysis's).
        names: the files whose temporaries are removed (``RECORD_FILE``...).
        min_age_s: see ``writer_gone`` (a sweep resumed while another host may write in it).

    Returns:
        The paths removed.
    """
    removed = []
    for name in names:
        for tmp in Path(directory).glob(f".{glob.escape(name)}.*{TEMP_SUFFIX}"):
            if not writer_gone(tmp, name, min_age_s):
                continue
            try:
                if tmp.is_dir() and not tmp.is_symlink():
                    shutil.rmtree(tmp)
                else:
                    tmp.unlink()
                removed.append(tmp)
            except FileNotFoundError:
                pass
    return removed
