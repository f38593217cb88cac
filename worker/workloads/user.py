"""The ``user`` workload: the user's own model, inputs and loss, named by dotted path.

``model(load, **kwargs) -> nn.Module``, ``inputs(load, **kwargs) -> (inputs, target)`` and
optionally ``loss(output, target, **kwargs) -> scalar tensor`` (``_target_``, as in Hydra);
``load`` is a ``Load``. The user's modules are imported by ``prepare``, before the first phase.
Optionally ``optimizer(params, **kwargs)`` and ``train_step(model, batch, optimizer, **kwargs)``,
the user's whole training step (``batch`` the pair ``inputs`` returned, ``optimizer`` what the
optimizer factory returned: an optimizer, or a list, tuple or dict of them), run as one sub-phase.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
from typing import Any

import torch
from torch import nn

from memsweep.conf.contract import SpecError

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


TRAIN_STEP_ARGS = ("model", "batch", "optimizer")
"""The positional arguments of the user's ``workload.train_step``, in order."""


def check_train_step(fn: Any, kwargs: dict, path: str) -> None:
    """Check that the user's train step can be called as ``fn(model, batch, optimizer, **kwargs)``
    (``inspect.Signature.bind``; a callable without a readable signature is let through).

    Args:
        fn: the callable ``workload.train_step._target_`` names.
        kwargs: its other keys (keyword arguments).
        path: its ``_target_``, for the message.

    Raises:
        SpecError: field ``workload.train_step``, when the call would not bind (wrong arity, an
            unknown keyword), with its signature and the accepted form.
    """
    why = _unbound(fn, TRAIN_STEP_ARGS, kwargs)
    if why:
        form = ", ".join((*TRAIN_STEP_ARGS, *(f"{k}=..." for k in kwargs)))
        raise SpecError("workload.train_step", path, f"a function called as train_step({form}); {path}{why}")


def _unbound(fn: Any, args: tuple[str, ...], kwargs: dict) -> str | None:
    """Why ``fn(*args, **kwargs)`` would not bind (``inspect.Signature.bind``): its signature and
    the TypeError; None when it binds, or when ``fn`` has no readable signature (a builtin: the
    call itself will tell)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        return f"{signature} does not bind ({exc})"
    return None


FACTORY_FORMS = {
    "model": (("load",), "a factory fn(load, **kwargs) returning an nn.Module"),
    "inputs": (("load",), "a function fn(load, **kwargs) returning the pair (inputs, target)"),
    "loss": (("output", "target"), "a function fn(output, target, **kwargs) returning a scalar tensor"),
    "optimizer": (("params",), "a factory fn(params, **kwargs) returning an optimizer"),
}
"""Per user function but ``train_step``: the positional arguments memsweep calls it with, and the
form expected, in words."""


def check_factory(fn: Any, kwargs: dict, fn_name: str, path: str) -> None:
    """Check that a user function binds to the call memsweep makes (``FACTORY_FORMS``): a module
    class given as the model or loss (``nn.Linear`` where ``fn(load, **kwargs)`` is expected) is
    refused, and so is a call ``inspect.Signature.bind`` refuses (a wrong keyword, a wrong arity;
    a callable without a readable signature is let through).

    Args:
        fn: the callable ``workload.<fn_name>._target_`` names.
        kwargs: its other keys (keyword arguments).
        fn_name: ``model``, ``inputs``, ``loss`` or ``optimizer``.
        path: its ``_target_``, for the message.

    Raises:
        SpecError: field ``workload.<fn_name>._target_``, with the form expected.
    """
    args, form = FACTORY_FORMS[fn_name]
    field = f"workload.{fn_name}._target_"
    if fn_name in ("model", "loss") and inspect.isclass(fn) and issubclass(fn, nn.Module):
        raise SpecError(
            field,
            path,
            f"{form}; {path} is the class {fn.__name__}, not a factory (wrap it: "
            f"def make(load, **kwargs): return {fn.__name__}(...))",
        )
    why = _unbound(fn, args, kwargs)
    if why:
        call = ", ".join((*args, *(f"{k}=..." for k in kwargs)))
        raise SpecError(field, path, f"{form}, called as ({call}); {path}{why}")


def _target_problem(workload: dict, fn_name: str) -> dict | None:
    """The first problem of ``workload.<fn_name>`` as ``{"field", "value", "accepted"}``; None when it
    imports and binds (or is not set)."""
    description = workload.get(fn_name)
    if not description:
        return None
    field = f"workload.{fn_name}._target_"
    try:
        fn, kwargs = resolve_target(description, f"workload.{fn_name}")
    except (ImportError, AttributeError) as exc:  # its message opens with the field and value: not twice
        accepted = "a function that can be imported: " + str(exc).split(": ", 1)[-1]
        return {"field": field, "value": description["_target_"], "accepted": accepted}
    except Exception as exc:  # noqa: BLE001 - the user's module raised while importing
        accepted = f"a module that imports ({type(exc).__name__}: {exc})"
        return {"field": field, "value": description["_target_"], "accepted": accepted}
    try:
        if fn_name == "train_step":
            check_train_step(fn, kwargs, description["_target_"])
        else:
            check_factory(fn, kwargs, fn_name, description["_target_"])
    except SpecError as exc:
        return {"field": exc.field, "value": exc.value, "accepted": exc.accepted}
    return None


def check_user_targets(workload: dict) -> dict:
    """Import a user workload's functions and check each binds to memsweep's call (``python -m
    memsweep.worker --check-user``, asked by the sweeper before any worker starts: its own process
    never imports the user's code).

    Args:
        workload: the validated user workload (``path``; ``model``, ``inputs``, ``loss``,
            ``optimizer``, ``train_step``, each None or a ``_target_`` description).

    Returns:
        ``{"ok": True}``, or ``{"field", "value", "accepted"}`` of the first problem: a module
        that cannot be imported or has no such callable (field ``workload.<fn>._target_``), a
        class where a factory is expected or a call that would not bind (``check_factory``,
        ``check_train_step``).
    """
    for directory in reversed(workload.get("path") or []):
        if directory not in sys.path:
            sys.path.insert(0, directory)
    for fn_name in ("model", "inputs", "loss", "optimizer", "train_step"):
        problem = _target_problem(workload, fn_name)
        if problem is not None:
            return problem
    return {"ok": True}


def _describe(held: Any) -> str:
    """``SGD``, ``list[SGD, AdamW]`` or ``dict[body: SGD, head: AdamW]``: what a factory returned."""
    if isinstance(held, dict):
        return "dict[" + ", ".join(f"{k}: {type(v).__name__}" for k, v in held.items()) + "]"
    if isinstance(held, (list, tuple)):
        return f"{type(held).__name__}[" + ", ".join(type(v).__name__ for v in held) + "]"
    return type(held).__name__


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
            SpecError: ``workload.train_step`` cannot be called as train_step(model, batch, optimizer).
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
        self._train_step = resolve_target(w["train_step"], "workload.train_step") if w["train_step"] else None
        if self._train_step is not None:
            fn, kwargs = self._train_step
            check_train_step(fn, kwargs, w["train_step"]["_target_"])

    def build_optimizer(self, params, foreach):
        """The user's optimizer (``workload.optimizer``: ``fn(params, **kwargs)``), else the spec's.
        With the user's own ``train_step`` the factory may return anything that step takes (a
        list, tuple or dict of optimizers, say): it is handed over as it is.

        Raises:
            TypeError: without ``train_step``, the factory did not return a ``torch.optim.Optimizer``.
        """
        if self._optimizer is None:
            return super().build_optimizer(params, foreach)
        fn, kwargs = self._optimizer
        optimizer = fn(params, **kwargs)
        if self._train_step is None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"workload.optimizer {self.spec.workload['optimizer']['_target_']} returned "
                f"{type(optimizer).__name__}, expected a torch.optim.Optimizer (any object with your own "
                "workload.train_step)"
            )
        return optimizer

    def model_info(self) -> dict:
        """``Workload.model_info`` plus ``optimizer``: the user's factory and the class it built."""
        info = super().model_info()
        if self._optimizer is not None and self.optimizer is not None:
            info["optimizer"] = f"{self.spec.workload['optimizer']['_target_']} -> {_describe(self.optimizer)}"
        return info

    def user_step(self) -> None:
        """The user's whole training step: ``train_step(model, (inputs, target), optimizer, **kwargs)``
        (``workload.train_step``); what it returns is released at once."""
        assert self._train_step is not None, "a run without workload.train_step has no user step"
        fn, kwargs = self._train_step
        fn(self._built_model(), (self.x, self.target), self.optimizer, **kwargs)

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
            return self._built_model()(**inputs)
        if isinstance(inputs, (tuple, list)):
            return self._built_model()(*inputs)
        return self._built_model()(inputs)

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
