"""A user workload whose forward has a data-dependent output shape (nonzero): fake tensors
cannot run it, so its dry run must fail with DryRunUnsupported naming the operator."""

import torch
from torch import nn


class Gather(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):
        y = self.lin(x)
        return y[torch.nonzero(y > 0, as_tuple=True)]


def model(load):
    return Gather(load.width)


def inputs(load):
    return torch.randn(load.batch, load.width, generator=load.generator, device=load.device), None
