"""Workloads: a model, its inputs and its loss, and the bodies of every phase of every mode.

``Workload`` (``base.py``) holds what is common (precision, optimizer, the training step's
sub-phases, evaluation, export, generation with a KV cache); a subclass supplies
``build_model``, ``make_inputs``, ``call``, ``loss_fn`` and, for generation, ``prefill`` /
``decode``. Built-in workloads (random weights, nothing downloaded): ``mlp`` (a dense network on
x (batch, context, width), MSE loss), ``transformer`` (the decoder-only LM of ``worker.models``
on token ids (batch, context), next-token cross-entropy), ``hf`` (a ``transformers`` causal LM
built from a config) and ``user`` (the user's own ``model``, ``inputs`` and ``loss`` functions
named by ``_target_``). Optional packages (transformers, bitsandbytes, the user's modules) are
imported by ``prepare``, before the first phase, only when the spec asks for them.

To add a workload: a ``Workload`` subclass in its own module, its name in ``WORKLOAD_CLASSES``
(its parameters in ``conf.contract``'s spec validation, its config in conf/workload/).
"""

from __future__ import annotations

from pathlib import Path

import torch

from memsweep.conf.contract import RunSpec

from .base import DTYPES, Workload
from .errors import DependencyMissing
from .hf import HfWorkload
from .losses import default_loss, lm_loss
from .mlp import MlpWorkload
from .optimizers import check_optimizer, make_optimizer
from .transformer import TokenWorkload, TransformerWorkload, transformer_dims
from .user import Load, UserWorkload, resolve_target

__all__ = [
    "DTYPES",
    "WORKLOAD_CLASSES",
    "DependencyMissing",
    "HfWorkload",
    "Load",
    "MlpWorkload",
    "TokenWorkload",
    "TransformerWorkload",
    "UserWorkload",
    "Workload",
    "build_workload",
    "check_optimizer",
    "default_loss",
    "lm_loss",
    "make_optimizer",
    "resolve_target",
    "transformer_dims",
]

WORKLOAD_CLASSES: dict[str, type[Workload]] = {
    "mlp": MlpWorkload,
    "transformer": TransformerWorkload,
    "hf": HfWorkload,
    "user": UserWorkload,
}


def build_workload(spec: RunSpec, device: torch.device, run_dir: Path | None = None) -> Workload:
    """The workload of ``spec`` (``spec.workload_name``), not prepared (``prepare`` imports what
    it needs) and with no model yet (``model_load`` builds it).

    Args:
        spec: the run's spec.
        device: the run's device.
        run_dir: the run directory (the export phase writes its temporary file there); None
            means the system's temporary directory.

    Returns:
        An instance of the ``WORKLOAD_CLASSES`` entry of the spec's workload name.

    Raises:
        ValueError: an unknown workload name.
    """
    try:
        cls = WORKLOAD_CLASSES[spec.workload_name]
    except KeyError:
        raise ValueError(f"unknown workload {spec.workload_name!r}") from None
    return cls(spec, device, run_dir)
