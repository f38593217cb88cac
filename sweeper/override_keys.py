"""A misspelt setting refused before Hydra composes anything: every plain ``key=value`` override
must name a key memsweep reads (``sweeper.inputs.top_keys``; under ``workload.`` a key of the
chosen workload's file), else ``sweeper.inputs.unknown_key``'s refusal names it, the closest
accepted key and the accepted keys (exit 2).

Hydra's own refusal ("Could not override 'bacth'. To append to your config use +bacth=2") exits 1
and suggests adding the misspelt key. Only the first segment of a key is checked (the second under
``workload.``), so nested values stay free; ``+``/``~`` overrides are checked once composed.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from typing import Any

from .inputs import top_keys, unknown_key
from .spec import LOAD_KEYS


def _workload_keys(name: str) -> set[str]:
    """The keys of conf/workload/<name>.yaml (empty for a file memsweep does not ship)."""
    import yaml

    node = resources.files("memsweep.conf").joinpath("workload", f"{name}.yaml")
    data: Any = yaml.safe_load(node.read_text()) if node.is_file() else None
    return {str(k) for k in data} - {"defaults"} if isinstance(data, dict) else set()


def _split(arg: str) -> tuple[str, str] | None:
    """(key, value) of a plain ``key=value`` override; None for ``+``/``++``/``~`` overrides, group
    choices written with a slash (``hydra/sweeper=frontier``) and Hydra's own options."""
    if arg.startswith(("+", "~", "-")) or "=" not in arg:
        return None
    key, _, value = arg.partition("=")
    key = key.split("@", 1)[0]
    return None if "/" in key else (key, value)


def check_override_keys(argv: Iterable[str]) -> None:
    """Refuse a plain override whose key memsweep does not read.

    Args:
        argv: the overrides as after ``memsweep run``/``sweep`` (Hydra's options are skipped).

    Raises:
        SpecError: the first override whose key is not a setting (field: the key as typed).
    """
    pairs = [p for p in map(_split, argv) if p is not None]
    root = top_keys(LOAD_KEYS) | {"hydra"}
    chosen = [value for key, value in pairs if key == "workload"]
    workload = chosen[-1] if chosen else "mlp"
    for key, value in pairs:
        first, _, rest = key.partition(".")
        if first not in root:
            raise unknown_key(key, value, root - {"hydra"})
        known = _workload_keys(workload) if first == "workload" and rest else set()
        if known and rest.split(".")[0] not in known:
            raise unknown_key(key, value, {f"workload.{k}" for k in known})
