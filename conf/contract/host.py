"""The host's memory as Linux reports it in /proc (proc(5)): read by the worker (its resident
set, the machine's memory) and by the sweeper (a CPU capacity above MemTotal is refused)."""

from __future__ import annotations


def proc_kb_field(path: str, key: str) -> int | None:
    """Read a ``kB`` field of a /proc file, in bytes.

    Args:
        path: the file (``/proc/self/status``, ``/proc/meminfo``).
        key: the field (VmRSS, VmHWM, VmData; MemTotal, MemAvailable).

    Returns:
        The value in bytes (kB * 1024), or None when the file or the field cannot be read.
    """
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def meminfo_bytes(key: str) -> int | None:
    """Read a field of /proc/meminfo in bytes.

    Args:
        key: MemTotal or MemAvailable.

    Returns:
        The value in bytes, or None when it cannot be read (not Linux, no such field).
    """
    return proc_kb_field("/proc/meminfo", key)
