"""``torch.compile`` of a run's model (spec ``compile``), and what its backend needs.

``torch.compile(model, mode=...)`` returns an ``OptimizedModule`` that shares the model's
parameters; nothing is compiled until the first call, so compilation (Dynamo's tracing,
AOTAutograd, Inductor's code generation: forward graphs at the first forward, backward graphs at
the first backward) happens in the cold phase (``cold_forward``, ``cold_step.*``) and the warm
phases measure the compiled code alone.

Inductor, the default backend, compiles C++ (with OpenMP) for the CPU and Triton kernels for CUDA
(https://pytorch.org/docs/stable/generated/torch.compile.html; the CPU compiler is
``torch._inductor.config.cpp.cxx``, by default the ``CXX`` environment variable or ``g++``,
torch/_inductor/cpp_builder.py ``get_cpp_compiler``). ``compiler_missing`` says what is missing;
the sweeper refuses such a run before any worker starts (``sweeper.finetune``), the worker checks
again in case the host differs.
"""

from __future__ import annotations

import os
import shutil
from typing import cast

import torch
from torch import nn


def cpu_compiler() -> str:
    """The C++ compiler Inductor calls on the CPU: ``$CXX``, else ``g++`` (a name or a path)."""
    return os.environ.get("CXX") or "g++"


def compiler_missing(device_type: str) -> str | None:
    """Why ``torch.compile``'s Inductor backend cannot run on ``device_type`` here, or None.

    Args:
        device_type: ``cpu`` or ``cuda``.

    Returns:
        A sentence naming what is missing (the C++ compiler, Triton), or None.
    """
    if device_type == "cpu":
        cxx = cpu_compiler()
        if shutil.which(cxx) is None:
            return f"torch.compile on the CPU needs a C++ compiler ({cxx!r}, or set CXX): none found on PATH"
        return None
    try:
        import triton  # noqa: F401  - Inductor's CUDA kernels
    except ImportError:
        return "torch.compile on a CUDA device needs Triton (pip install triton), which is not installed"
    return None


def compile_model(model: nn.Module, mode: str) -> nn.Module:
    """``torch.compile(model, mode=mode)``: lazy, compiled at its first call.

    Args:
        model: the run's model.
        mode: a torch.compile mode: ``default``, ``reduce-overhead`` (CUDA graphs on CUDA),
            ``max-autotune``.

    Returns:
        The ``OptimizedModule`` (same parameters as ``model``).
    """
    return cast(nn.Module, torch.compile(model, mode=mode))  # an OptimizedModule for a Module
