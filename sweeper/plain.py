"""OmegaConf nodes as plain Python containers, typed (``OmegaConf.to_container`` returns a union)."""

from __future__ import annotations

from typing import Any, TypeVar

_Container = TypeVar("_Container", dict, list)


def _plain(node: Any, resolve: bool, kind: type[_Container]) -> _Container:
    """``OmegaConf.to_container(node, resolve=resolve)``, checked to be a ``kind``.

    Raises:
        TypeError: the node is not of that kind (a mapping for dict, a sequence for list).
    """
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(node, resolve=resolve)
    if not isinstance(data, kind):
        raise TypeError(f"expected a {kind.__name__} config node, got {type(data).__name__}")
    return data


def plain_dict(node: Any, resolve: bool) -> dict:
    """A mapping node (DictConfig) as a plain dict, interpolations resolved when ``resolve``.

    Raises:
        TypeError: the node is not a mapping.
    """
    return _plain(node, resolve, dict)


def plain_list(node: Any, resolve: bool) -> list:
    """A sequence node (ListConfig) as a plain list, interpolations resolved when ``resolve``.

    Raises:
        TypeError: the node is not a sequence.
    """
    return _plain(node, resolve, list)
