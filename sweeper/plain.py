"""OmegaConf nodes as plain Python containers, typed (``OmegaConf.to_container`` returns a union)."""

from __future__ import annotations

from typing import Any


def plain_dict(node: Any, resolve: bool) -> dict:
    """A mapping node as a plain dict.

    Args:
        node: a DictConfig.
        resolve: whether interpolations are resolved.

    Returns:
        ``OmegaConf.to_container(node, resolve=resolve)``.

    Raises:
        TypeError: the node is not a mapping.
    """
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(node, resolve=resolve)
    if not isinstance(data, dict):
        raise TypeError(f"expected a mapping config node, got {type(data).__name__}")
    return data


def plain_list(node: Any, resolve: bool) -> list:
    """A sequence node as a plain list.

    Args:
        node: a ListConfig.
        resolve: whether interpolations are resolved.

    Returns:
        ``OmegaConf.to_container(node, resolve=resolve)``.

    Raises:
        TypeError: the node is not a sequence.
    """
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(node, resolve=resolve)
    if not isinstance(data, list):
        raise TypeError(f"expected a sequence config node, got {type(data).__name__}")
    return data
