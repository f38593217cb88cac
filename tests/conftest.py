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


# The test files that take longest (measured one file at a time, wall and CPU seconds), longest
# first. Under ``-n N --dist loadfile`` (``make test``) they start first, the others after them in
# their usual order: a long file left to the end would run alone on one worker while the others
# have finished (xdist's own order, most tests first, puts files of few but long tests such as the
# SLURM cluster's and the docs' commands last).
LONGEST_FIRST = (
    "test_slurm_cluster.py",
    "test_docs.py",
    "test_bad_input.py",
    "test_cli.py",
    "test_capacity_mode.py",
    "test_margin_edge.py",
    "test_process_faults.py",
    "test_api.py",
    "test_ranks.py",
    "test_help_and_readme.py",
    "test_scale.py",
    "test_answers.py",
    "test_concurrency.py",
    "test_faults.py",
    "test_frontier_integration.py",
)


def pytest_configure(config):
    """Under ``--dist loadfile`` xdist hands out the files in the collection's order (its reordering
    by test count is turned off), so that LONGEST_FIRST's files start first."""
    if getattr(config.option, "dist", "no") == "loadfile":
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """LONGEST_FIRST's files first, in that order; the others after them as collected (a stable sort)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture
def tiny():
    return dict(TINY)


@pytest.fixture(scope="session")
def forked_memsweep():
    """``forked_memsweep.run(argv, cwd)``: ``memsweep ARGV`` as a process of its own, forked from a
    server that imported the command line once (tests/forked_cli.py), answered as ``subprocess.run``
    answers; for the tables of commands that are refused before any worker starts."""
    from tests.forked_cli import ForkedCLI

    cli = ForkedCLI()
    yield cli
    cli.close()


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
