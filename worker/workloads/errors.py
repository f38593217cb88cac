"""The error of a workload whose optional package is missing."""


class DependencyMissing(RuntimeError):
    """An optional package the spec needs is not installed (nothing was measured).

    Raised by ``Workload.prepare`` (before any phase): transformers for workload=hf,
    bitsandbytes for optimizer=adamw8bit, torch.optim.Adafactor (PyTorch >= 2.5) for
    optimizer=adafactor. The worker records it with exit code 2 (``EXIT_UNAVAILABLE``).
    """
