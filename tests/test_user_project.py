"""memsweep run from the root of a user's own project that has packages named like memsweep's
folders (``worker/``, ``analysis/``, ``conf/``, ``sweeper/``, each with an ``__init__.py``) and its own
model in ``worker/model.py``: the command and the Python API measure that model, and none of
memsweep's processes (the command, the fork server, the worker) takes the user's packages for its own.

The user's ``analysis``, ``conf`` and ``sweeper`` raise when imported (memsweep has no business
importing them); the user's ``worker`` prints a marker, which must appear only where the user's model
is imported: in the run's worker, through ``worker.model``.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memsweep.conf.contract import read_json
from tests.data.loads import MEMSWEEP, SMALLEST_CPU

LOAD = [o for o in SMALLEST_CPU if not o.startswith("workload.")]
"""The smallest CPU load's settings (context 8, width 16), without the mlp's depth."""

MARKER = "USER WORKER PACKAGE"
MODEL = """
import torch
from torch import nn


def build(load, hidden=5):
    return nn.Sequential(nn.Linear(load.width, hidden), nn.ReLU(), nn.Linear(hidden, 2))


def make_inputs(load):
    x = torch.randn(load.batch, load.width, generator=load.generator, device=load.device)
    return x, torch.randint(0, 2, (load.batch,), generator=load.generator, device=load.device)
"""
PARAMETERS = 16 * 5 + 5 + 5 * 2 + 2
"""The user's model at width 16 (``LOAD``): Linear(16, 5) and Linear(5, 2)."""
USER_OVERRIDES = [
    "workload=user",
    "workload.model={_target_:worker.model.build}",
    "workload.inputs={_target_:worker.model.make_inputs}",
]


@pytest.fixture
def project(tmp_path):
    """The user's project: its own worker/ (with the model), analysis/, conf/ and sweeper/ packages."""
    root = tmp_path / "project"
    (root / "worker").mkdir(parents=True)
    (root / "worker" / "__init__.py").write_text(f"print({MARKER!r})\n")
    (root / "worker" / "model.py").write_text(MODEL)
    for name in ("analysis", "conf", "sweeper"):
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(f"raise RuntimeError('the user\\'s {name} package was imported')\n")
    (root / "conf" / "config.yaml").write_text("batch: 999\n")  # not memsweep's config
    return root


def user_env() -> dict:
    """A user's shell: none of memsweep's variables (no fork server of this test process)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MEMSWEEP_")}


def check_run(run_dir) -> None:
    """The run measured the user's model (its parameter count) and imported it in the worker only."""
    record = read_json(run_dir / "record.json", "record")
    assert record["outcome"] == "ok" and record["model"]["parameters"] == PARAMETERS
    assert record["spec"]["workload"]["model"]["_target_"] == "worker.model.build"
    assert record["spec"]["batch"] == 2
    assert MARKER in (run_dir / "stdout.log").read_text()


def test_memsweep_run_from_the_projects_root(project):
    proc = subprocess.run(
        [MEMSWEEP, "run", *USER_OVERRIDES, "batch=2", "capacity=256MiB", *LOAD],
        cwd=project,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "was imported" not in proc.stderr and MARKER not in proc.stdout
    (run_dir,) = (project / "results" / "run").iterdir()
    check_run(run_dir)


API_SCRIPT = textwrap.dedent(
    """
    import sys
    import memsweep
    from worker.model import build, make_inputs  # the user's own package, imported here by the user

    load = dict(batch=2, context=8, width=16, warmup=1, repeats=1, threads=1, device="cpu", capacity="256MiB")
    by_name = memsweep.run(model="worker.model:build", inputs="worker.model:make_inputs", progress=False, **load)
    as_object = memsweep.run(model=build, inputs=make_inputs, progress=False, **load)
    print("RUNS", by_name.run_dir, as_object.run_dir)
    print("MODULES", sys.modules["worker"].__file__, memsweep.__file__, sorted(
        m for m in ("analysis", "conf", "sweeper") if m in sys.modules))
    """
)


def test_the_api_from_the_projects_root(project):
    proc = subprocess.run(
        [sys.executable, "-c", API_SCRIPT], cwd=project, env=user_env(), capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.split(" ")[0] in ("RUNS", "MODULES"))
    user_worker, memsweep_file, imported = lines["MODULES"].split(" ", 2)
    assert user_worker == str(project / "worker" / "__init__.py") and imported == "[]"
    assert not memsweep_file.startswith(str(project))
    for run_dir in lines["RUNS"].split():
        check_run(Path(run_dir))
