"""A run whose ranks are SLURM tasks (spec ``nodes`` / ``tasks_per_node``): SLURM's environment ->
torch.distributed's ``env://`` rendezvous.

Every task runs the worker once and is one rank. From ``SLURM_PROCID``, ``SLURM_LOCALID``,
``SLURM_NTASKS`` and ``SLURM_JOB_NODELIST`` (compressed, ``gpu[01-03,07]``) this module sets
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` (the nodelist's first host, expanded by
``scontrol show hostnames`` or ``expand_nodelist``) and ``MASTER_PORT`` (derived from the job id,
the same in every task). A ``MASTER_ADDR`` or ``MASTER_PORT`` already set wins.

Standard library only. References: https://slurm.schedmd.com/srun.html (OUTPUT ENVIRONMENT
VARIABLES), https://slurm.schedmd.com/scontrol.html (show hostnames),
https://pytorch.org/docs/stable/distributed.html (Environment variable initialization).
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping

from memsweep.conf.contract import SpecError

PORT_BASE = 20000
"""The lowest ``MASTER_PORT`` derived from a job id (above the usual ephemeral-port floor of
well-known services, below Linux's default ephemeral range 32768-60999)."""

PORT_SPAN = 10000
"""Ports ``PORT_BASE`` .. ``PORT_BASE + PORT_SPAN - 1``: ``MASTER_PORT = PORT_BASE + job_id % PORT_SPAN``."""

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets (``a[1,2],b`` -> ``a[1,2]``, ``b``)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p]


def _expand_ranges(body: str, nodelist: str) -> list[str]:
    """The values of one bracket's ``01-03,07`` (zero padding kept), in order."""
    out = []
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if not m:
            raise SpecError("SLURM_JOB_NODELIST", nodelist, "a SLURM hostlist such as gpu[01-03,07] or node1,node2")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        width = len(lo)
        out += [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
    return out


def expand_nodelist(nodelist: str) -> list[str]:
    """Every hostname of a SLURM hostlist, in SLURM's order (the fallback of ``scontrol show hostnames``).

    Args:
        nodelist: ``SLURM_JOB_NODELIST``: hostnames separated by commas, each with any number of
            bracketed ranges (``gpu[01-03,07]``, ``rack[1-2]-n[1-2]``, ``a1,b[3-4]``).

    Returns:
        The hostnames, zero padding kept (``gpu[01-03,07]`` -> gpu01, gpu02, gpu03, gpu07); bracket
        groups of one name expand as a product, the leftmost slowest.

    Raises:
        SpecError: field ``SLURM_JOB_NODELIST``, an empty list, unbalanced brackets or a range that
            is not ``N`` or ``N-M``.
    """
    hosts: list[str] = []
    for part in _split_top(nodelist.strip()):
        pieces = re.split(r"(\[[^\[\]]*\])", part)
        if any(("[" in p or "]" in p) and not (p.startswith("[") and p.endswith("]")) for p in pieces):
            raise SpecError("SLURM_JOB_NODELIST", nodelist, "a SLURM hostlist with balanced brackets")
        choices = [_expand_ranges(p[1:-1], nodelist) if p.startswith("[") else [p] for p in pieces]
        hosts += ["".join(combo) for combo in itertools.product(*choices)]
    if not hosts:
        raise SpecError("SLURM_JOB_NODELIST", nodelist, "at least one hostname")
    return hosts


def scontrol_first_host(nodelist: str) -> str | None:
    """The first hostname by ``scontrol show hostnames NODELIST``; None when scontrol is missing or fails."""
    if shutil.which("scontrol") is None:
        return None
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None


def _int_env(env: Mapping[str, str], name: str) -> int:
    value = env.get(name)
    if value is None or not value.strip().isdigit():
        raise SpecError(name, value, "a non-negative integer, as SLURM sets it in every task of a job")
    return int(value)


def slurm_rendezvous(
    env: Mapping[str, str], first_host: Callable[[str], str | None] = scontrol_first_host
) -> dict[str, str] | None:
    """torch.distributed's ``env://`` variables for this SLURM task, from SLURM's own.

    Args:
        env: the task's environment (``os.environ``).
        first_host: how to name the nodelist's first host (``scontrol_first_host``; None falls back
            to ``expand_nodelist``). A test passes its own.

    Returns:
        None when ``env`` is no SLURM task (no ``SLURM_PROCID``); else the ``env://`` variables
        (and torchrun's LOCAL_RANK) as strings: MASTER_ADDR (``env['MASTER_ADDR']``, else the first
        host of ``SLURM_JOB_NODELIST`` / ``SLURM_NODELIST``), MASTER_PORT (``env['MASTER_PORT']``, else
        ``PORT_BASE + SLURM_JOB_ID % PORT_SPAN``), RANK = SLURM_PROCID, WORLD_SIZE = SLURM_NTASKS,
        LOCAL_RANK = SLURM_LOCALID.

    Raises:
        SpecError: a SLURM variable missing or not an integer, or SLURM_PROCID / SLURM_LOCALID
            not below SLURM_NTASKS, named as the field.
    """
    if "SLURM_PROCID" not in env:
        return None
    rank = _int_env(env, "SLURM_PROCID")
    world = _int_env(env, "SLURM_NTASKS")
    local = _int_env(env, "SLURM_LOCALID")
    if not rank < world:
        raise SpecError("SLURM_PROCID", rank, f"below SLURM_NTASKS={world}")
    if not local < world:
        raise SpecError("SLURM_LOCALID", local, f"below SLURM_NTASKS={world}")
    addr = env.get("MASTER_ADDR")
    if not addr:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodelist:
            raise SpecError("SLURM_JOB_NODELIST", nodelist, "the job's hostlist, as SLURM sets it")
        addr = first_host(nodelist) or expand_nodelist(nodelist)[0]
    port = env.get("MASTER_PORT") or str(PORT_BASE + _int_env(env, "SLURM_JOB_ID") % PORT_SPAN)
    return {
        "MASTER_ADDR": addr,
        "MASTER_PORT": port,
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local),
    }
