"""How a comparison names a load's workload parameters: compactly, never as their whole JSON.

Loads of one workload are told apart by the parameters whose values differ between them
(``model.blocks=2``, nested keys joined by dots); past ``NAMED_PARAMS`` such keys, or for loads
that differ in no parameter, by a short stable digest of the parameters (``params#1a2b3c4d``,
the same for the same parameters in every comparison). A workload whose compared loads all have
the same parameters needs no name beyond the workload's.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

NAMED_PARAMS = 3
"""The most differing workload parameters named as ``key=value``; past it the digest names them."""
UNSET = "unset"
"""The value named for a parameter a load does not have (another load of its workload has it)."""


def _parsed(text: Any) -> Any:
    """``workload_params`` as read (JSON text, a mapping, or None) -> its value; unreadable text as is."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def canonical(params: Any) -> str:
    """The workload parameters as canonical JSON text (sorted keys, no spaces): one text per value.

    Args:
        params: ``workload_params`` as a runs-table row holds it (JSON text), a mapping, or None.

    Returns:
        The text (``null`` for None; unreadable JSON text as a JSON string of it).
    """
    if isinstance(params, str):
        return _canonical_text(params)
    return json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)


@functools.lru_cache(maxsize=4096)
def _canonical_text(text: str) -> str:
    """``canonical`` of JSON text, once per text (every run of a sweep holds its load's)."""
    return json.dumps(_parsed(text), sort_keys=True, separators=(",", ":"), default=str)


def digest(params: Any) -> str:
    """A short stable name of the workload parameters: ``params#`` and 8 hex digits of the SHA-256
    of their ``canonical`` text.

    Args:
        params: as for ``canonical``.

    Returns:
        e.g. ``params#1a2b3c4d``.
    """
    return "params#" + hashlib.sha256(canonical(params).encode()).hexdigest()[:8]


def flat(params: Any) -> dict[str, str]:
    """The workload parameters as dotted keys -> their values as text.

    Args:
        params: as for ``canonical``.

    Returns:
        e.g. ``{"model._target_": "pkg.build", "model.blocks": "3"}``: strings as they are, other
        values as JSON; a value that is no mapping (None, unreadable text) under ``workload_params``.
    """
    out: dict[str, str] = {}

    def walk(prefix: str, v: Any) -> None:
        if isinstance(v, Mapping) and v:
            for k in sorted(v, key=str):
                walk(f"{prefix}.{k}" if prefix else str(k), v[k])
        else:
            out[prefix or "workload_params"] = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)

    walk("", _parsed(params))
    return out


def param_names(loads: Iterable[Mapping]) -> dict[tuple[str, str], str]:
    """The name of each load's workload parameters among ``loads``.

    Args:
        loads: runs-table rows or series loads (``workload`` a name, ``workload_params`` JSON text).

    Returns:
        (workload, ``canonical`` parameters) -> name: ``""`` where every load of that workload has
        the same parameters; the differing keys as ``key=value`` words (``UNSET`` where a load lacks
        one) when at most ``NAMED_PARAMS``; else the parameters' ``digest``.
    """
    groups: dict[str, dict[str, dict[str, str]]] = {}
    for load in loads:
        text = canonical(load.get("workload_params"))
        groups.setdefault(str(load.get("workload")), {}).setdefault(text, {})
    out = {}
    for workload, texts in groups.items():
        flats = {t: flat(t) for t in texts}
        keys = sorted({k for f in flats.values() for k in f})
        differ = [k for k in keys if len({f.get(k, UNSET) for f in flats.values()}) > 1]
        for t, f in flats.items():
            if not differ:
                name = ""
            elif len(differ) <= NAMED_PARAMS:
                name = " ".join(f"{k}={f.get(k, UNSET)}" for k in differ)
            else:
                name = digest(t)
            out[(workload, t)] = name
    return out


def name_of(names: Mapping[tuple[str, str], str], load: Mapping) -> str:
    """The name ``param_names`` gave ``load``'s workload parameters (``""``: none needed or not named).

    Args:
        names: ``param_names``'s answer.
        load: a runs-table row or a series load.

    Returns:
        The name.
    """
    return names.get((str(load.get("workload")), canonical(load.get("workload_params"))), "")
