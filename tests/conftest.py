"""Shared fixtures: tiny loads that run in a second on the CPU, real worker processes."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# A load that fits easily and runs fast on the CPU.
TINY = dict(
    batch=2,
    context=8,
    width=16,
    dtype="float32",
    mode="inference",
    device="cpu",
    workload={"name": "mlp", "depth": 2},
    warmup=1,
    repeats=1,
    timeout_s=120,
    threads=1,
)


@pytest.fixture
def tiny():
    return dict(TINY)
