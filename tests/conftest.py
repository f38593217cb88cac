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


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real one-node SLURM cluster (tests/slurm_cluster.py), started once per session; the tests
    that use it skip, saying why, where it cannot start (not root, SLURM not installed). Its
    teardown checks that no job is left, stops the daemons and checks that none of them runs."""
    from tests.slurm_cluster import start, unavailable

    why = unavailable()
    if why:
        pytest.skip(f"no SLURM cluster here: {why}")
    cluster = start(tmp_path_factory.mktemp("slurm"))
    yield cluster
    jobs = cluster.jobs()
    cluster.stop()
    left = cluster.processes()
    assert not jobs, f"SLURM jobs left at the end of the session: {jobs}"
    assert not left, f"SLURM daemons still running after stop: {left}"
