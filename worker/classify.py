"""Failure classification: is this exception an out-of-memory, or something else?

One small function, tested with injected fake errors on CPU (tests/test_classify.py),
in the spirit of accelerate's ``utils/memory.py``. No torch import: the exception type is
matched by name so that this module also runs where torch is missing.
"""

from __future__ import annotations

# Message fragments that mean "the allocator could not serve a request".
OOM_MESSAGES = (
    "CUDA out of memory",  # torch.OutOfMemoryError from the CUDA caching allocator
    "HIP out of memory",  # the same on ROCm builds
    "CUDA error: out of memory",  # cudaMalloc failing outside the caching allocator
    "CUBLAS_STATUS_ALLOC_FAILED",  # cuBLAS workspace allocation
    "CUDNN_STATUS_NOT_ENOUGH_MEMORY",  # cuDNN workspace
    "CUDNN_STATUS_ALLOC_FAILED",
    "can't allocate memory",  # c10 DefaultCPUAllocator: "can't allocate memory: you tried to allocate"
)


def classify_failure(exc: BaseException) -> str:
    """Return ``"oom"`` when ``exc`` says memory could not be allocated, else ``"error"``.

    Order: ``torch.OutOfMemoryError`` (matched by class name in the MRO, module ``torch``),
    Python's ``MemoryError``, then a RuntimeError whose message holds one of
    ``OOM_MESSAGES``. Anything else, a plain RuntimeError included, is ``"error"``.
    """
    for cls in type(exc).__mro__:
        if cls.__name__ == "OutOfMemoryError" and cls.__module__.startswith("torch"):
            return "oom"
    if isinstance(exc, MemoryError):
        return "oom"
    if isinstance(exc, RuntimeError):
        message = str(exc)
        if any(fragment in message for fragment in OOM_MESSAGES):
            return "oom"
    return "error"
