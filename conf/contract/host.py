"""The host as Linux reports it in /proc (proc(5)): its memory, read by the worker (its resident
set, the machine's memory) and by the sweeper (a CPU capacity above MemTotal is refused); and
the identity and state of a process, which name it even when its pid is reused (the worker
records its own; the sweeper checks a resumed run's old worker, a sweep's orchestrator, the
fork server); the pid at the other end of a Unix socket (``peer_pid``); the processes a worker
left behind, killed by its session (``kill_session``)."""

from __future__ import annotations

import os
import signal
import socket
import struct
from collections.abc import Iterator


def proc_kb_fields(path: str, keys: tuple[str, ...]) -> dict[str, int | None]:
    """Read ``kB`` fields of a /proc file, in bytes, in one read of the file.

    Args:
        path: the file (``/proc/self/status``, ``/proc/meminfo``).
        keys: the fields (VmRSS, VmHWM, VmData; MemTotal, MemAvailable).

    Returns:
        Each key's value in bytes (kB * 1024), or None when the file or that field cannot be read.
    """
    out: dict[str, int | None] = dict.fromkeys(keys)
    try:
        with open(path) as f:
            for line in f:
                key = line.partition(":")[0]
                if key in out and out[key] is None:
                    try:
                        out[key] = int(line.split()[1]) * 1024
                    except (ValueError, IndexError):
                        pass
    except OSError:
        return dict.fromkeys(keys)
    return out


def proc_kb_field(path: str, key: str) -> int | None:
    """Read one ``kB`` field of a /proc file, in bytes (``proc_kb_fields``).

    Args:
        path: the file (``/proc/self/status``, ``/proc/meminfo``).
        key: the field (VmRSS, VmHWM, VmData; MemTotal, MemAvailable).

    Returns:
        The value in bytes (kB * 1024), or None when the file or the field cannot be read.
    """
    return proc_kb_fields(path, (key,))[key]


def meminfo_bytes(key: str) -> int | None:
    """Read a field of /proc/meminfo in bytes.

    Args:
        key: MemTotal or MemAvailable.

    Returns:
        The value in bytes, or None when it cannot be read (not Linux, no such field).
    """
    return proc_kb_field("/proc/meminfo", key)


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat from the state on (proc(5): field 3 is index 0), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except (OSError, ValueError):
        return None
    _, _, rest = text.rpartition(")")  # the command name may hold spaces and parentheses
    fields = rest.split()
    return fields if len(fields) > 19 else None


def first_line(path: str) -> str | None:
    """The first line of a (/proc) text file, stripped.

    Args:
        path: the file.

    Returns:
        The line, or None when the file cannot be read or the line is empty.
    """
    try:
        with open(path) as f:
            return f.readline().strip() or None
    except OSError:
        return None


def boot_id() -> str | None:
    """This boot's random id (/proc/sys/kernel/random/boot_id, one line), or None when it cannot be read."""
    return first_line("/proc/sys/kernel/random/boot_id")


def process_identity(pid: int | str = "self") -> str | None:
    """Name a process by more than its pid: ``BOOT_ID:START`` (the boot's id, and the process's
    start time in clock ticks since boot, /proc/<pid>/stat field 22).

    Two processes with the same pid (a pid reused after a restart, or on another host of a
    shared file system) never have the same identity.

    Args:
        pid: the process id, or ``"self"``.

    Returns:
        The identity, or None when the process does not exist here or /proc cannot be read.
    """
    return _identity(_stat_fields(pid))


def _identity(fields: list[str] | None) -> str | None:
    """``BOOT_ID:START`` of a process from its /proc/<pid>/stat ``fields`` (``_stat_fields``), or None."""
    boot = boot_id()
    return None if fields is None or boot is None else f"{boot}:{fields[19]}"


def child_identity(pid: int, parent: int | None) -> str | None:
    """``process_identity`` of ``pid`` while it is ``parent``'s child (/proc/<pid>/stat field 4),
    read from one reading of its stat: a pid not yet reaped by its parent names that process,
    and the identity then tells it from a later process given the same pid.

    Args:
        pid: the process id.
        parent: the pid its parent should have; None: unknown (no identity).

    Returns:
        The identity, or None when ``pid`` is not ``parent``'s child (gone, re-parented, another
        process's pid now) or /proc cannot be read.
    """
    fields = _stat_fields(pid)
    if parent is None or fields is None or fields[1] != str(parent):
        return None
    return _identity(fields)


def process_started_epoch(pid: int) -> float | None:
    """When process ``pid`` started, in seconds since the epoch: the boot's time (/proc/stat
    ``btime``, whole seconds) plus its start in clock ticks (/proc/<pid>/stat field 22).

    Args:
        pid: the process.

    Returns:
        The time, or None when the process does not exist or /proc cannot be read.
    """
    fields = _stat_fields(pid)
    try:
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK") if fields else None
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def pid_exists(pid: int | None) -> bool:
    """Tell whether a process with this pid exists on this host (any process: its identity is
    ``process_identity``'s to tell).

    Args:
        pid: the process id, or None.

    Returns:
        True when signal 0 reaches it (or it exists but belongs to another user).
    """
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fork_is_safe() -> bool:
    """Whether this process may fork workers that go on running Python: the platform has ``fork`` and
    no other thread of this process is alive (a fork copies the locks another thread may hold).

    Returns:
        True when both hold.
    """
    import multiprocessing
    import threading

    return "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1


def process_state(pid: int | str) -> str | None:
    """The state letter of a process (/proc/<pid>/stat field 3: ``R`` running, ``S`` sleeping,
    ``D`` disk wait, ``T`` stopped by a signal, ``t`` stopped by a tracer, ``Z`` zombie...).

    Args:
        pid: the process id.

    Returns:
        The letter, or None when the process does not exist or /proc cannot be read.
    """
    fields = _stat_fields(pid)
    return fields[0] if fields else None


STOPPED_STATES = ("T", "t")
"""``process_state`` letters of a process that does not run until it is continued (SIGSTOP,
SIGTSTP, a tracer): it will never answer by itself."""


def peer_pid(conn: socket.socket) -> int | None:
    """The pid of the process at the other end of a connected Unix socket (SO_PEERCRED, unix(7)).

    Args:
        conn: the connected socket (AF_UNIX).

    Returns:
        The peer's pid; None where the platform does not say.
    """
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (AttributeError, OSError):
        return None
    pid = struct.unpack("3i", creds)[0]
    return pid if pid > 0 else None


def session_members(leader: int) -> list[int]:
    """The live processes of the process group or session led by ``leader`` (/proc/<pid>/stat
    fields 5 and 6, proc(5)).

    Args:
        leader: the pid that leads the group or session (a worker started with ``setsid``).

    Returns:
        Their pids, the leader itself excluded; [] where /proc cannot be read.
    """
    return [
        pid
        for pid, fields in process_stats()
        if pid != leader and fields[0] not in ("Z", "X") and str(leader) in (fields[2], fields[3])
    ]


def process_stats() -> Iterator[tuple[int, list[str]]]:
    """Every process of this host with its /proc/<pid>/stat fields (``_stat_fields``: from the state
    on), one reading each; a process gone meanwhile is passed over, and none where /proc cannot be
    listed.

    Yields:
        (pid, its fields).
    """
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        fields = _stat_fields(name) if name.isdigit() else None
        if fields is not None:
            yield int(name), fields


def kill_session(leader: int) -> None:
    """SIGKILL everything a worker started: its process group and every process of its session
    (a worker leads both, setsid(2)), also those re-parented to init after the worker ended.

    Call it before the leader is reaped (ended, a zombie: waitid(2) with WNOWAIT), or while it
    runs: its pid then cannot name another process's group. A process already gone is no error;
    a child that started a session of its own (setsid) is beyond it.

    Args:
        leader: the worker's pid (its group's and its session's id).
    """
    try:
        os.killpg(leader, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in session_members(leader):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def usable_core_ids() -> list[int]:
    """The CPU cores this process may run on (``os.sched_getaffinity`` where the platform has it,
    else 0..cpu_count-1), sorted."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """How many cores this process may run on (``usable_core_ids``), at least 1."""
    return max(1, len(usable_core_ids()))
