"""Failure classification with injected fake errors (no GPU needed)."""

import pytest
import torch

from worker.classify import OOM_MESSAGES, classify_failure

CUDA_OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.06 GiB is free."
)


@pytest.mark.parametrize(
    "message",
    [
        CUDA_OOM,
        "HIP out of memory. Tried to allocate 20.00 MiB",
        "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "cuDNN error: CUDNN_STATUS_NOT_ENOUGH_MEMORY",
        "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 83886080 bytes. Error code 12 (Cannot allocate memory)",
    ],
)
def test_known_oom_messages(message):
    assert classify_failure(RuntimeError(message)) == "oom"


def test_every_listed_fragment_is_recognised():
    for fragment in OOM_MESSAGES:
        assert classify_failure(RuntimeError(f"prefix {fragment} suffix")) == "oom"


def test_torch_out_of_memory_error_type():
    assert classify_failure(torch.OutOfMemoryError("anything")) == "oom"
    assert classify_failure(MemoryError()) == "oom"


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x8)"),
        RuntimeError("CUDA error: device-side assert triggered"),
        RuntimeError("Expected all tensors to be on the same device"),
        ValueError("CUDA out of memory"),  # not a RuntimeError: a user's own error text, not the allocator
        KeyError("x"),
    ],
)
def test_other_errors_are_not_oom(exc):
    assert classify_failure(exc) == "error"
