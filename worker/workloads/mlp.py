"""The ``mlp`` workload: the seed's small dense network on random inputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..models import MLP
from .base import Workload


class MlpWorkload(Workload):
    """A small dense network (``worker.models.MLP``): ``depth`` blocks Linear(width -> hidden)
    -> activation -> Linear(hidden -> width), hidden = 4 * width unless given.

    Built in float32 on the host, then moved and cast (model_load briefly
    holds both copies). Inputs x and target (batch, context, width) ~ N(0, 1) in the parameter
    dtype; loss: mean squared error (torch.nn.functional.mse_loss).
    """

    name = "mlp"
    build_on_host = True

    def build_model(self) -> nn.Module:
        """``MLP(width, hidden, depth, activation)`` with random weights."""
        s, w = self.spec, self.spec.workload
        hidden = w["hidden"] if w["hidden"] is not None else 4 * s.width
        return MLP(s.width, hidden, w["depth"], w["activation"])

    def make_inputs(self, batch, generator, with_target):
        """x (batch, context, width) and, when ``with_target``, a target of the same shape."""
        shape = (batch, self.spec.context, self.spec.width)
        x = torch.randn(shape, device=self.device, dtype=self.param_dtype, generator=generator)
        target = (
            torch.randn(shape, device=self.device, dtype=self.param_dtype, generator=generator) if with_target else None
        )
        return x, target

    def loss_fn(self, output, target):
        """Mean squared error of ``output`` against ``target`` (both (batch, context, width))."""
        return F.mse_loss(output, target)
