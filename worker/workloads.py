"""Built-in workloads, built from the spec with random weights (nothing is downloaded).

mlp (the seed's small dense network): inputs x of shape (batch, context, width); ``depth``
blocks of Linear(width -> hidden) -> activation -> Linear(hidden -> width); in training,
the loss is the mean squared error against a random target of the same shape, then
backward and an AdamW step (torch.optim.AdamW defaults).
"""

from __future__ import annotations

import torch
from torch import nn

from .records import RunSpec

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU, "tanh": nn.Tanh}


class MLP(nn.Module):
    """``depth`` blocks Linear(width, hidden) -> activation -> Linear(hidden, width).

    Input and output shape: (batch, context, width).
    """

    def __init__(self, width: int, hidden: int, depth: int, activation: str = "gelu"):
        super().__init__()
        self.blocks = nn.Sequential(*[
            nn.Sequential(nn.Linear(width, hidden), ACTIVATIONS[activation](), nn.Linear(hidden, width))
            for _ in range(depth)
        ])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class MlpWorkload:
    """The phases' bodies for the mlp workload; each method is one protocol phase."""

    def __init__(self, spec: RunSpec, device: torch.device):
        self.spec, self.device = spec, device
        self.dtype = DTYPES[spec.dtype]
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.x = self.target = None

    def model_load(self) -> None:
        torch.manual_seed(self.spec.seed)
        s, w = self.spec, self.spec.workload
        hidden = w["hidden"] if w["hidden"] is not None else 4 * s.width
        self.model = MLP(s.width, hidden, w["depth"], w["activation"]).to(device=self.device, dtype=self.dtype)
        if s.mode == "train":
            self.model.train()
            # Created here, but AdamW allocates its states (exp_avg, exp_avg_sq) lazily, in the first step.
            self.optimizer = torch.optim.AdamW(self.model.parameters())
        else:
            self.model.eval()

    def inputs(self) -> None:
        s = self.spec
        shape = (s.batch, s.context, s.width)
        gen = torch.Generator(device=self.device).manual_seed(s.seed + 1)
        self.x = torch.randn(shape, device=self.device, dtype=self.dtype, generator=gen)
        if s.mode == "train":
            self.target = torch.randn(shape, device=self.device, dtype=self.dtype, generator=gen)

    def forward(self) -> None:
        with torch.inference_mode():
            y = self.model(self.x)
        del y

    def step(self) -> None:
        """One training step: forward, loss, backward, optimizer step."""
        self.optimizer.zero_grad(set_to_none=True)
        y = self.model(self.x)
        loss = nn.functional.mse_loss(y, self.target)
        del y
        loss.backward()
        self.optimizer.step()
        del loss

    def iteration(self) -> None:
        """The unit repeated by the cold, warmup and warm phases."""
        if self.spec.mode == "train":
            self.step()
        else:
            self.forward()


def build_workload(spec: RunSpec, device: torch.device) -> MlpWorkload:
    if spec.workload_name == "mlp":
        return MlpWorkload(spec, device)
    raise ValueError(f"unknown workload {spec.workload_name!r}")
