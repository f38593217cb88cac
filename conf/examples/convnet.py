"""An example user workload: a small convolutional image classifier.

memsweep's load axes mean what the workload says they mean; here ``context`` is the image
resolution (images are (batch, 3, context, context)) and ``width`` the number of channels.
Configured by conf/workload/user_convnet.yaml; run it with
``memsweep run workload=user_convnet mode=train context=64 width=32 batch=16``.
"""

import torch
import torch.nn.functional as F
from torch import nn


def build_model(load, blocks: int = 3, classes: int = 10) -> nn.Module:
    """``blocks`` of Conv2d(3x3) -> ReLU at ``load.width`` channels, global average pool,
    Linear(width, classes). The worker moves it to ``load.device`` in ``load.dtype``."""
    layers, channels = [], 3
    for _ in range(blocks):
        layers += [nn.Conv2d(channels, load.width, 3, padding=1), nn.ReLU()]
        channels = load.width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(load.width, classes)]
    return nn.Sequential(*layers)


def make_inputs(load, classes: int = 10):
    """Random images (batch, 3, context, context) in ``load.dtype`` and labels (batch,)."""
    images = torch.randn(
        load.batch, 3, load.context, load.context, dtype=load.dtype, device=load.device, generator=load.generator
    )
    labels = torch.randint(0, classes, (load.batch,), device=load.device, generator=load.generator)
    return images, labels


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of logits (batch, classes) against labels (batch,)."""
    return F.cross_entropy(output.float(), target)


def make_optimizer(params, lr: float = 0.01, momentum: float = 0.9) -> torch.optim.Optimizer:
    """The user's own optimizer factory (``workload.optimizer``): SGD with momentum, one state
    tensor (``momentum_buffer``) per parameter, created at the first step
    (https://pytorch.org/docs/stable/generated/torch.optim.SGD.html)."""
    return torch.optim.SGD(params, lr=lr, momentum=momentum)


def make_optimizers(params, lr: float = 0.01, momentum: float = 0.9) -> dict[str, torch.optim.Optimizer]:
    """Two optimizers, for the user's own ``train_step``: SGD with momentum on the convolutions
    (one ``momentum_buffer`` per parameter) and AdamW on the classifier head, the last Linear's
    weight and bias (``exp_avg``, ``exp_avg_sq`` and a float32 ``step`` per parameter;
    https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html)."""
    params = list(params)
    return {
        "body": torch.optim.SGD(params[:-2], lr=lr, momentum=momentum),
        "head": torch.optim.AdamW(params[-2:], lr=lr),
    }


def train_step(model: nn.Module, batch, optimizer: dict, max_norm: float = 1.0) -> torch.Tensor:
    """The user's own training step (``workload.train_step``): ``batch`` is what ``make_inputs``
    returned, ``optimizer`` what ``make_optimizers`` returned. Zero every gradient, forward,
    cross-entropy, backward, clip the gradients' global norm to ``max_norm``
    (``torch.nn.utils.clip_grad_norm_``), then step both optimizers. memsweep records the whole
    function as one sub-phase, ``user_step``."""
    images, labels = batch
    for opt in optimizer.values():
        opt.zero_grad(set_to_none=True)
    out = loss(model(images), labels)
    out.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    for opt in optimizer.values():
        opt.step()
    return out
