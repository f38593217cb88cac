"""A sweep's directory, checked and claimed before anything runs: it must be able to hold one clean
sweep (not the working directory, no other sweep's runs below its first level, a folder of its own
inside it for each job, a job name that is a file name), no other orchestrator may be running in
it (the sweep's lock), and its manifest (``conf.contract.sweep``) is written before the first
worker starts; each job adds its run to it before its worker starts (``register_job``).

Called by ``sweeper.upfront.CheckBeforeLaunch`` (the multirun's start), ``sweeper.job`` (each job)
and ``sweeper.api.hydra_jobs`` (the end: ``release_sweep_dirs``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from memsweep.conf.contract import (
    SESSION_ENV,
    SPEC_FILE,
    SWEEP_FILE,
    SpecError,
    SweepBusy,
    hold_sweep_lock,
    register_run,
    remove_stale_temps,
)
from memsweep.conf.contract.sweep import MANIFEST_LOCK, SWEEP_LOCK

from .plain import plain_dict

NESTED_DEPTH = 4
"""How deep below a sweep directory's first level another sweep's run directories are looked for."""

PER_JOB_KEYS = ("hydra.job.num", "hydra.job.override_dirname")
"""What a ``hydra.sweep.subdir`` must name to give each job a folder of its own."""

FOREIGN_TEMP_S = 60.0
"""How long a temporary file whose writer's pid names no process on this host must have been left
unwritten before a claim removes it (seconds): its writer may run on another host of a shared file
system (an atomic write lasts milliseconds)."""

SWEEP_FILES = (SWEEP_FILE, SWEEP_LOCK, MANIFEST_LOCK)
"""The files claiming a sweep directory writes (put back as they were when the sweep is refused)."""


@dataclass
class _Claim:
    """A sweep directory this process claimed: its lock's descriptor and what it created."""

    sweep_dir: Path
    fd: int
    created: list[Path] = field(default_factory=list)  # folders made, outermost first
    before: dict[str, bytes | None] = field(default_factory=dict)  # the sweep's files before: None, none


CLAIMS: list[_Claim] = []
"""The sweep directories this process holds (released by ``release_sweep_dirs``)."""


def check_job_name(config: Any) -> None:
    """Refuse a ``hydra.job.name`` that is not a plain file name (the job's log is ``NAME.log`` in
    its run directory: a ``/`` or ``..`` would write it elsewhere).

    Raises:
        SpecError: field ``hydra.job.name``.
    """
    name = str(OmegaConf.select(config, "hydra.job.name", default="") or "")
    if not name or "/" in name or "\\" in name or name in (".", "..") or "\0" in name:
        raise SpecError("hydra.job.name", name, "a plain file name (no '/', not '..'), such as memsweep")


def check_resolvable(config: Any) -> None:
    """Refuse a setting whose interpolation cannot be resolved (``batch=${context} context=${batch}``:
    a cycle; a key that does not exist), before anything is written; Hydra's own settings aside.

    Raises:
        SpecError: the setting's full key, its value as given.
    """
    from omegaconf.errors import OmegaConfBaseException

    for key in config:
        if key == "hydra":
            continue
        try:
            node = config[key]  # a scalar resolves when read
            if OmegaConf.is_config(node):
                OmegaConf.to_container(node, resolve=True)
        except OmegaConfBaseException as exc:
            where = str(getattr(exc, "full_key", None) or key)
            raw = OmegaConf.to_container(config, resolve=False)
            value: Any = raw
            for part in where.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            raise SpecError(
                where, value, f"a value whose interpolation resolves ({str(exc).splitlines()[0]})"
            ) from None


def _nested_run(sweep_dir: Path) -> Path | None:
    """A run directory (one with a spec.json) below ``sweep_dir``'s first level, outside dot folders."""
    level = [p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    for _ in range(NESTED_DEPTH):
        level = [c for p in level for c in p.iterdir() if c.is_dir() and not c.name.startswith(".")]
        for d in level:
            if (d / SPEC_FILE).is_file():
                return d
        if not level:
            break
    return None


JOB_KEY = re.compile(r"\$\{hydra\.job\.[A-Za-z_][A-Za-z_0-9.]*\}")
"""An interpolation of the job's own fields (``${hydra.job.num}``, ``${hydra.job.id}``...), known
only once a job runs."""


def _resolved_subdir(config: Any, subdir: str) -> str:
    """``subdir`` with its interpolations resolved in ``config`` (the sweep's settings, ``hydra.*`` and
    resolvers such as ``${oc.env:HOME}``), each of the job's own fields (``JOB_KEY``) read as ``0``:
    what a job's folder would be, checked before Hydra makes it.

    Raises:
        SpecError: an interpolation that cannot be resolved (field ``hydra.sweep.subdir``).
    """
    text = JOB_KEY.sub("0", subdir)
    if "${" not in text:
        return text
    settings = OmegaConf.to_container(config, resolve=False)
    assert isinstance(settings, dict)  # a multirun's config is a mapping
    probe = OmegaConf.create({**settings, SUBDIR_PROBE: text})
    try:
        return str(OmegaConf.select(probe, SUBDIR_PROBE, throw_on_resolution_failure=True))
    except Exception as exc:  # omegaconf's resolution errors have no common public base
        raise SpecError("hydra.sweep.subdir", subdir, f"a folder name whose interpolations resolve ({exc})") from None


SUBDIR_PROBE = "_memsweep_subdir_probe"
"""The key ``_resolved_subdir`` resolves the subdir under, beside the config's own keys."""


def check_sweep_layout(config: Any, per_job_subdir: bool) -> Path:
    """Refuse a sweep directory that cannot hold one clean sweep, before anything is written.

    Args:
        config: the multirun's composed config.
        per_job_subdir: whether the sweeper launches jobs under ``hydra.sweep.subdir`` as given
            (the frontier sweeper names each probe's folder itself).

    Returns:
        The sweep directory (absolute).

    Raises:
        SpecError: field ``hydra.sweep.dir`` (empty, the working directory or one above it, or
            holding run directories below its first level: another sweep's),
            ``hydra.sweep.subdir`` (absolute, with ``..``, or not naming the job) or
            ``hydra.job.name``.
    """
    check_job_name(config)
    given = str(OmegaConf.select(config, "hydra.sweep.dir", default="") or "")
    sweep_dir = Path(given).absolute()
    cwd = Path.cwd()
    if not given.strip() or Path(os.path.realpath(sweep_dir)) in (cwd, *cwd.parents):
        raise SpecError("hydra.sweep.dir", given, "a folder of its own for the sweep, not the working directory")
    subdir = str(plain_dict(config.hydra.sweep, resolve=False).get("subdir") or "")
    for text in (subdir, _resolved_subdir(config, subdir)):
        if Path(text).is_absolute() or ".." in Path(text).parts:
            raise SpecError("hydra.sweep.subdir", subdir, "a folder inside the sweep directory (not absolute, no '..')")
    if per_job_subdir and not any(key in subdir for key in PER_JOB_KEYS):
        raise SpecError(
            "hydra.sweep.subdir", subdir, "a folder of its own for each job: ${hydra.job.num} (the default)"
        )
    if sweep_dir.is_dir() and (nested := _nested_run(sweep_dir)) is not None:
        raise SpecError(
            "hydra.sweep.dir",
            given,
            f"a directory that holds one sweep; {nested} is a run of another sweep below it (give a new directory)",
        )
    return sweep_dir


def sweep_identity(config: Any) -> str:
    """What makes a sweep this one: its sweeper and its overrides (two orchestrators of one
    identity share a directory; of two, the second is refused while the first runs)."""
    import hashlib
    import json

    target = OmegaConf.select(config, "hydra.sweeper._target_", default=None)
    overrides = sorted(str(o) for o in (OmegaConf.select(config, "hydra.overrides.task", default=None) or []))
    return hashlib.sha256(json.dumps([target, overrides]).encode()).hexdigest()[:16]


def claim_sweep_dir(sweep_dir: Path, identity: str | None = None) -> None:
    """Create ``sweep_dir`` when missing, take its lock (shared with orchestrators of the same
    sweep) and write its manifest (unless it has one); name this process's session for its jobs
    (``SESSION_ENV``).

    Raises:
        SpecError: field ``hydra.sweep.dir``: another sweep runs in it now.
    """
    from .owner import session_id

    created = [p for p in (sweep_dir, *sweep_dir.parents) if not p.exists()][::-1]
    sweep_dir.mkdir(parents=True, exist_ok=True)
    before = {n: (sweep_dir / n).read_bytes() if (sweep_dir / n).is_file() else None for n in SWEEP_FILES}
    try:
        fd = hold_sweep_lock(sweep_dir, identity)
    except SweepBusy as exc:
        raise SpecError("hydra.sweep.dir", str(sweep_dir), f"a directory no other sweep runs in now ({exc})") from None
    CLAIMS.append(_Claim(sweep_dir, fd, created, before))
    # a killed writer's temporary files (the manifest's, a refused sweep's restores); another host's
    # orchestrator of this sweep may be writing now: a file whose pid is not here is old first
    remove_stale_temps(sweep_dir, SWEEP_FILES, min_age_s=FOREIGN_TEMP_S)
    os.environ[SESSION_ENV] = session_id()


def release_sweep_dirs(refused: bool) -> None:
    """Release the sweep directories this process claimed; when the sweep was refused before it
    ran, put back what claiming them changed (the manifest and the lock files as they were, the
    folders made removed)."""
    while CLAIMS:
        claim = CLAIMS.pop()
        if refused:
            for name, data in claim.before.items():
                path = claim.sweep_dir / name
                if data is None:
                    path.unlink(missing_ok=True)
                elif not path.is_file() or path.read_bytes() != data:
                    tmp = path.with_name(f".{name}.{os.getpid()}.restore.tmp")
                    tmp.write_bytes(data)
                    os.replace(tmp, path)
            for folder in reversed(claim.created):
                try:
                    folder.rmdir()
                except OSError:
                    break
        os.close(claim.fd)
    os.environ.pop(SESSION_ENV, None)


def register_job(sweep_dir: Path, run_dir: Path, overrides: list[str]) -> str | None:
    """Add a job's run to its sweep's manifest before its worker starts (``conf.contract.register_run``).

    Returns:
        The token of the run's manifest entry, for its spec.json (None: the entry has none).

    Raises:
        InputRefused: field ``hydra.sweep.subdir``: the run directory is outside the sweep
            directory, or another job of this sweep has it.
    """
    from .errors import InputRefused

    try:
        return register_run(sweep_dir, run_dir, overrides, os.environ.get(SESSION_ENV))
    except SpecError as exc:
        raise InputRefused(exc) from None
