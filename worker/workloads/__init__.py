"""Workloads: a model, its inputs and its loss, and the bodies of every phase of every mode.

``Workload`` (``base.py``) holds what is common to all workloads (precision, optimizer, the
training step's sub-phases, evaluation, export, generation with a KV cache); each subclass
supplies the model-specific hooks: ``build_model``, ``make_inputs``, ``call``, ``loss_fn`` and,
for generation, ``prefill`` / ``decode``.

Built-in workloads (random weights, nothing is downloaded), one module each:

* ``mlp`` (``mlp.py``), the seed's small dense network: inputs x (batch, context, width);
  ``depth`` blocks Linear(width -> hidden) -> activation -> Linear(hidden -> width); training
  loss: mean squared error against a random target of the same shape.
* ``transformer`` (``transformer.py``): the decoder-only LM of ``worker.models`` on token ids
  (batch, context); loss: next-token cross-entropy on float32 logits (batch * context, vocab).
* ``hf`` (``hf.py``): a ``transformers`` causal LM built from a config
  (``pip install 'memsweep[hf]'``); same inputs and loss as ``transformer``.
* ``user`` (``user.py``): the user's own functions, named by dotted path (``_target_``, as in
  Hydra): ``model(load, **kwargs) -> nn.Module``, ``inputs(load, **kwargs) -> (inputs, target)``
  and optionally ``loss(output, target, **kwargs) -> scalar tensor``; ``load`` is a ``Load``.

Losses are in ``losses.py``, optimizers in ``optimizers.py``. The worker imports torch and the
standard library only; ``transformers`` (hf), ``bitsandbytes`` (optimizer=adamw8bit) and the
user's modules are imported by ``prepare``, before the first phase, only when the spec asks for
them.

To add a workload: a ``Workload`` subclass in its own module, its name in ``WORKLOAD_CLASSES``
(and its parameters in ``conf.contract``' spec validation, its config in conf/workload/).
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
