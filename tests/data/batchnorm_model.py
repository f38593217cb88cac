"""A user's tiny classifier with BatchNorm1d, for the frontier search's errors of shape: in train
mode BatchNorm1d refuses a batch of one ("Expected more than 1 value per channel when training"),
an error that depends on the batch's shape, not on memory; every batch from 2 up runs."""

import torch
import torch.nn.functional as F
from torch import nn


def build(load, hidden: int = 256, classes: int = 10) -> nn.Module:
    """Linear(width, hidden) -> BatchNorm1d(hidden) -> ReLU -> Linear(hidden, classes)."""
    return nn.Sequential(nn.Linear(load.width, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, classes))


def inputs(load, classes: int = 10):
    """Random features (batch, width) in ``load.dtype`` and labels (batch,)."""
    x = torch.randn(load.batch, load.width, dtype=load.dtype, device=load.device, generator=load.generator)
    return x, torch.randint(0, classes, (load.batch,), device=load.device, generator=load.generator)


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of logits (batch, classes) against labels (batch,)."""
    return F.cross_entropy(output.float(), target)
