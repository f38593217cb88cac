"""The training losses of the built-in and user workloads."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy: logits (batch, tokens, vocab), target (batch, tokens) int64.

    The logits are upcast to float32 first, as Hugging Face's causal-LM loss does
    (transformers ``ForCausalLMLoss``): a (batch * tokens, vocab) float32 copy.
    """
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))


def default_loss(output: Any, target: Any) -> torch.Tensor:
    """The user workload's loss when none is given.

    A scalar output is the loss itself (a model that computes its own); with an integer
    target, cross-entropy of output (..., classes) against target (...); with a floating
    target, mean squared error; without a target, mean(output ** 2), a stand-in that makes
    backward reach every parameter the output depends on.

    Args:
        output: the model's output: a tensor, or a tuple/list (its first item) or a dict (its
            ``loss``, else its first value) holding one.
        target: the target the user's ``inputs`` function returned, or None.

    Returns:
        A 0-dim tensor.

    Raises:
        TypeError: no tensor in ``output``.
    """
    if isinstance(output, (tuple, list)):
        output = output[0]
    if isinstance(output, dict):
        output = output["loss"] if "loss" in output else next(iter(output.values()))
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"the model returned {type(output).__name__}: give workload.loss to turn it into a scalar")
    if output.dim() == 0:
        return output
    if target is None:
        return output.float().pow(2).mean()
    if not target.is_floating_point():
        return lm_loss(output, target)
    return F.mse_loss(output, target)
