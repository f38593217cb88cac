"""Files published into an output directory as one set or not at all: the analysis's three tables
(``outputs.publish_set``), a report's markdown, HTML, plots and load pages (``publish_doc``).

A set is written aside first (temporary files, or a staging directory ``.KIND.PID.tmp``), then a
marker ``.KIND.PID.publishing`` naming the set is written and every entry is renamed into place
with SIGINT, SIGTERM and SIGHUP held back. A writer that fails before the renames leaves nothing;
one killed outright (SIGKILL) between two renames leaves its marker, and the next writer into that
directory undoes the partial set (``undo_partial``) before it writes. Every writer holds the
directory's ``LOCK`` while it writes or recovers.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

from filelock import FileLock, Timeout

from memsweep.conf.contract import remove_stale_temps

LOCK = ".analyze.lock"
"""The lock file of an output directory, held by each writer of its tables and reports."""

MARKER = ".{kind}.{pid}.publishing"
"""The marker of a set being renamed into place (its entries' names, JSON)."""

STAGING = ".{kind}.{pid}.tmp"
"""The directory a document's files are written into before they are published (``publish_doc``)."""

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def rename_set(moves: Sequence[tuple[Path, Path]], marker: Path, replace: bool) -> None:
    """Rename each source onto its target as one set: the marker (the targets' names, JSON) is
    written first and removed last, the renames done with ``HELD_SIGNALS`` held back.

    Args:
        moves: (source, target) pairs, targets in one directory.
        marker: the set's marker file.
        replace: ``os.replace`` each (the caller checked that no target exists); False: a file is
            linked to its target, a directory renamed, and an existing target is an error.

    Raises:
        OSError: a rename failed (``FileExistsError``: a target appeared): the targets already
            renamed are removed again, so that nothing of the set is published.
    """
    marker.write_text(json.dumps([target.name for _, target in moves]))
    done: list[Path] = []
    old = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    try:
        for source, target in moves:
            if replace:
                os.replace(source, target)
            else:
                _move_new(source, target)
            done.append(target)
        marker.unlink()
    except OSError:
        for target in done:
            _remove(target)
        marker.unlink(missing_ok=True)
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _move_new(source: Path, target: Path) -> None:
    """Move ``source`` to ``target``, never over an existing one: a file by a hard link (EEXIST when
    the target exists) then the source's removal, a directory by rename(2), which refuses a
    target that is a file or a directory with entries."""
    if source.is_dir():
        if target.exists():
            raise FileExistsError(17, "File exists", str(target))
        os.rename(source, target)
    else:
        os.link(source, target)
        source.unlink()


def _remove(path: Path) -> None:
    """Remove a published entry (a file, or a directory with its files)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def undo_partial(marker: Path, source_dir: Path, source_name: str = "{name}") -> list[Path]:
    """Undo a set a writer that died left half renamed: when one of the entries its marker names is
    still at its source, those already at their target are removed; a complete set is kept. The
    marker is removed. Call it holding the directory's ``LOCK``.

    Args:
        marker: the set's marker (beside the targets).
        source_dir: the directory the entries were renamed from.
        source_name: an entry's name there, ``{name}`` standing for its published name.

    Returns:
        The paths removed (the marker included).
    """
    try:
        names = [n for n in json.loads(marker.read_text()) if isinstance(n, str) and n == Path(n).name]
    except (OSError, ValueError, TypeError):
        names = []
    out_dir, removed = marker.parent, []

    def source(name: str) -> Path:
        return source_dir / source_name.format(name=name)

    left = [n for n in names if os.path.lexists(source(n))]
    if left:
        for n in names:
            target = out_dir / n
            if not os.path.lexists(target):
                continue
            if n not in left or os.path.samefile(source(n), target):  # moved, or linked but not yet unlinked
                _remove(target)
                removed.append(target)
    marker.unlink(missing_ok=True)
    return [*removed, marker]


def markers(out_dir: Path, kind: str) -> list[tuple[Path, int]]:
    """The markers (``MARKER``) of ``kind`` sets in ``out_dir`` with the pid of the writer each names;
    a marker not named by a pid is left out (and alone).

    Args:
        out_dir: the output directory.
        kind: ``tables``, ``report``, ``compare``.

    Returns:
        (marker, writer's pid) pairs.
    """
    found = []
    for marker in Path(out_dir).glob(MARKER.format(kind=glob.escape(kind), pid="*")):
        pid = marker.name[len(kind) + 2 :].partition(".")[0]
        if pid.isdigit():
            found.append((marker, int(pid)))
    return found


def recover_doc(out_dir: Path, kind: str) -> list[Path]:
    """Undo what writers of ``kind`` documents (``report``, ``compare``) that died left in
    ``out_dir``: a half published set (``undo_partial``), and their staging directories. Call it
    holding ``out_dir``'s ``LOCK``.

    Returns:
        The paths removed.
    """
    removed = []
    for marker, pid in markers(out_dir, kind):
        removed += undo_partial(marker, marker.with_name(STAGING.format(kind=kind, pid=pid)))
    return removed + remove_stale_temps(out_dir, (kind,))  # under the lock: no writer of them lives


def publish_doc(out_dir: Path, kind: str, names: Sequence[str], write: Callable[[Path], None]) -> None:
    """Write a document's entries into a staging directory, then publish them into ``out_dir`` as one
    set, never over an existing entry; what a dead writer left is undone first (``recover_doc``).

    Args:
        out_dir: the output directory (it exists).
        kind: the document's kind, naming its staging directory and marker (``report``).
        names: the entries ``write`` makes (files and directories, plain names).
        write: makes the entries inside the directory it is given.

    Raises:
        FileExistsError: an entry of that name exists in ``out_dir`` (nothing is written).
        OSError: writing failed (a full disk): nothing is published, no staging left.
    """
    with FileLock(Path(out_dir) / LOCK):
        recover_doc(out_dir, kind)
        for name in names:
            if os.path.lexists(out_dir / name):
                raise FileExistsError(17, "File exists", str(out_dir / name))
        staging = out_dir / STAGING.format(kind=kind, pid=os.getpid())
        staging.mkdir()
        try:
            write(staging)
            moves = [(staging / n, out_dir / n) for n in names if os.path.lexists(staging / n)]
            rename_set(moves, out_dir / MARKER.format(kind=kind, pid=os.getpid()), replace=False)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def recover_outputs(out_dirs: Sequence[Path], recoveries: Sequence[Callable[[Path], list[Path]]]) -> list[Path]:
    """Run each of ``recoveries`` (``outputs.recover_set``, ``recover_doc``...) on each of
    ``out_dirs`` that holds something a writer left (a temporary file or a marker) and whose
    ``LOCK`` is free now: a directory a live writer holds is left to it.

    Returns:
        The paths removed.
    """
    removed: list[Path] = []
    for out_dir in out_dirs:
        if not any(out_dir.glob(".*.tmp")) and not any(out_dir.glob(MARKER.format(kind="*", pid="*"))):
            continue
        try:
            with FileLock(out_dir / LOCK, timeout=0):
                for recover in recoveries:
                    removed += recover(out_dir)
        except Timeout:
            continue
    return removed
