"""The ``user`` workload: the user's own model, inputs and loss, named by dotted path.

``model(load, **kwargs) -> nn.Module``, ``inputs(load, **kwargs) -> (inputs, target)`` and
optionally ``loss(output, target, **kwargs) -> scalar tensor`` (``_target_``, as in Hydra);
``load`` is a ``Load``. The user's modules are imported by ``prepare``, before the first phase.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys

import torch
from torch import nn

from .base import Workload
from .losses import default_loss


@dataclasses.dataclass(frozen=True)
class Load:
    """What a user workload's functions receive: the load of this run.

    ``dtype`` is the dtype of the weights and of floating-point inputs (float32 under
    precision=autocast), ``compute_dtype`` the spec's dtype. ``generator`` is a seeded
    ``torch.Generator`` on ``device``, for reproducible random inputs (None on a dry run on a
    CUDA device: fake tensors hold no values). ``batch`` is the batch
    of this call (``eval_batch`` for the eval phase). ``devices``: how many devices the run
    uses (spec ``devices``): a data-parallel load spreads over cuda:0 .. cuda:devices-1
    (``device`` is cuda:0 then), e.g. ``torch.nn.DataParallel(model, device_ids=range(devices))``.
    """

    batch: int
    context: int
    width: int
    dtype: torch.dtype
    compute_dtype: torch.dtype
    device: torch.device
    mode: str
    seed: int
    generator: torch.Generator | None = None
    devices: int = 1


def resolve_target(description: dict, field: str):
    """(callable, kwargs) of a ``{_target_: "pkg.module.function", **kwargs}`` description.

    Args:
        description: the spec's ``workload.model`` / ``inputs`` / ``loss`` entry.
        field: its name in the spec, for the error messages (``workload.model``).

    Returns:
        The callable named by ``_target_`` and the other keys as keyword arguments (dict).

    Raises:
        ImportError: the module cannot be imported (the message names the field and the path).
        AttributeError: the module has no callable of that name (idem).
    """
    path = description["_target_"]
    module_name, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(
            f"{field}._target_={path!r}: cannot import {module_name!r} ({exc}); "
            f"put its directory in workload.path or on PYTHONPATH"
        ) from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise AttributeError(f"{field}._target_={path!r}: {module_name} has no callable {attr!r}")
    return fn, {k: v for k, v in description.items() if k != "_target_"}


class UserWorkload(Workload):
    """The user's model, inputs and loss (see the module docstring and the README).

    ``call`` spreads a dict of inputs as keyword arguments and a tuple or list as positional
    ones; without ``workload.loss`` the loss is ``default_loss``.
    """

    name = "user"

    def prepare(self) -> None:
        """Put ``workload.path`` in front of sys.path and import the user's functions.

        Raises:
            DependencyMissing: the optimizer's package is missing.
            ImportError, AttributeError: a ``_target_`` cannot be resolved (``resolve_target``).
        """
        super().prepare()
        w = self.spec.workload
        for directory in reversed(w["path"] or []):
            if directory not in sys.path:
                sys.path.insert(0, directory)
        self._model = resolve_target(w["model"], "workload.model")
        self._inputs = resolve_target(w["inputs"], "workload.inputs")
        self._loss_fn = resolve_target(w["loss"], "workload.loss") if w["loss"] else None
        self._optimizer = resolve_target(w["optimizer"], "workload.optimizer") if w["optimizer"] else None

    def build_optimizer(self, params, foreach):
        """The user's optimizer (``workload.optimizer``: ``fn(params, **kwargs)``), else the spec's.

        Raises:
            TypeError: the factory did not return a ``torch.optim.Optimizer``.
        """
        if self._optimizer is None:
            return super().build_optimizer(params, foreach)
        fn, kwargs = self._optimizer
        optimizer = fn(params, **kwargs)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"workload.optimizer {self.spec.workload['optimizer']['_target_']} returned "
                f"{type(optimizer).__name__}, expected a torch.optim.Optimizer"
            )
        return optimizer

    def model_info(self) -> dict:
        """``Workload.model_info`` plus ``optimizer``: the user's factory and the class it built."""
        info = super().model_info()
        if self._optimizer is not None and self.optimizer is not None:
            info["optimizer"] = f"{self.spec.workload['optimizer']['_target_']} -> {type(self.optimizer).__name__}"
        return info

    def load(self, batch: int, generator: torch.Generator | None) -> Load:
        """The ``Load`` a user function receives for ``batch`` and ``generator``."""
        s = self.spec
        return Load(
            batch=batch,
            context=s.context,
            width=s.width,
            dtype=self.param_dtype,
            compute_dtype=self.compute_dtype,
            device=self.device,
            mode=s.mode,
            seed=s.seed,
            generator=generator,
            devices=s.devices,
        )

    def build_model(self) -> nn.Module:
        """The user's model (``workload.model``), given the load of ``spec.batch``.

        Raises:
            TypeError: the function did not return a ``torch.nn.Module``.
        """
        fn, kwargs = self._model
        model = fn(self.load(self.spec.batch, None), **kwargs)
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"workload.model {self.spec.workload['model']['_target_']} returned "
                f"{type(model).__name__}, expected a torch.nn.Module"
            )
        return model

    def make_inputs(self, batch, generator, with_target):
        """The user's (inputs, target) (``workload.inputs``); target None when not ``with_target``.

        Raises:
            TypeError: the function did not return a pair.
        """
        fn, kwargs = self._inputs
        out = fn(self.load(batch, generator), **kwargs)
        if not isinstance(out, tuple) or len(out) != 2:
            raise TypeError(
                f"workload.inputs {self.spec.workload['inputs']['_target_']} must return a pair "
                f"(inputs, target); got {type(out).__name__}"
            )
        return out[0], (out[1] if with_target else None)

    def call(self, inputs):
        """``model(**inputs)`` for a dict, ``model(*inputs)`` for a tuple or list, else ``model(inputs)``."""
        if isinstance(inputs, dict):
            return self.model(**inputs)
        if isinstance(inputs, (tuple, list)):
            return self.model(*inputs)
        return self.model(inputs)

    def loss_fn(self, output, target):
        """The user's loss (``workload.loss``), or ``default_loss``."""
        if self._loss_fn is None:
            return default_loss(output, target)
        fn, kwargs = self._loss_fn
        return fn(output, target, **kwargs)

    def enable_checkpointing(self, model):
        """Call the model's own ``gradient_checkpointing_enable()``.

        Raises:
            ValueError: the model has none.
        """
        enable = getattr(model, "gradient_checkpointing_enable", None)
        if enable is None:
            raise ValueError(
                f"checkpointing=true: {type(model).__name__} has no gradient_checkpointing_enable(); "
                "define one (e.g. wrapping blocks in torch.utils.checkpoint.checkpoint)"
            )
        enable()
