"""The optimizers of ``spec.optimizer`` (train mode)."""

from __future__ import annotations

from typing import Any

import torch

from .errors import DependencyMissing


def make_optimizer(name: str, params, foreach: bool | None = None) -> torch.optim.Optimizer:
    """The optimizer of ``spec.optimizer``, at its library defaults.

    adamw: torch.optim.AdamW (two states per parameter, exp_avg and exp_avg_sq, in the
    parameter's dtype); sgd: torch.optim.SGD(lr=1e-3), no momentum, no state; adafactor:
    torch.optim.Adafactor (PyTorch >= 2.5; factored second moment); adamw8bit:
    bitsandbytes.optim.AdamW8bit (states quantised to 8 bits). States are allocated lazily,
    in the first optimizer step.

    ``foreach``: passed to the torch optimizers (adamw, sgd, adafactor); None keeps their
    default, which is the foreach implementation when every parameter is a plain CUDA tensor
    (torch.optim.optimizer._default_to_fused_or_foreach). Fake tensors are not plain tensors,
    so a CUDA dry run passes True to run what the GPU runs (foreach temporaries included), for
    adamw and sgd (Adafactor's foreach step reads a value, which fake tensors cannot give).

    Args:
        name: one of ``conf.contract.vocabulary.OPTIMIZERS``.
        params: the parameters to optimize (an iterable of tensors).
        foreach: see above.

    Returns:
        The optimizer, with no state yet.

    Raises:
        DependencyMissing: adafactor on a PyTorch without it; adamw8bit without bitsandbytes.
        ValueError: an unknown optimizer name.
    """
    check_optimizer(name)
    kw: dict[str, Any] = {} if foreach is None else {"foreach": foreach}
    if name == "adamw":
        return torch.optim.AdamW(params, **kw)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, **kw)
    if name == "adafactor":
        return torch.optim.Adafactor(params, **kw)
    if name == "adamw8bit":
        import bitsandbytes  # optional: imported only when the spec asks for it

        return bitsandbytes.optim.AdamW8bit(params)
    raise ValueError(f"unknown optimizer {name!r}")


def check_optimizer(name: str) -> None:
    """Check that the optimizer ``name`` can be built here (imports bitsandbytes for adamw8bit).

    Raises:
        DependencyMissing: adafactor on a PyTorch without it; adamw8bit without bitsandbytes.
    """
    if name == "adafactor" and not hasattr(torch.optim, "Adafactor"):
        raise DependencyMissing(
            f"optimizer=adafactor needs torch.optim.Adafactor (PyTorch >= 2.5); this is PyTorch {torch.__version__}"
        )
    if name == "adamw8bit":
        try:
            import bitsandbytes  # noqa: F401  - optional: imported only when the spec asks for it
        except ImportError as exc:
            raise DependencyMissing(
                f"optimizer=adamw8bit needs bitsandbytes, which is not installed ({exc}): pip install bitsandbytes"
            ) from None
