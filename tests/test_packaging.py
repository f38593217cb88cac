"""The built wheel: one import name (``memsweep``, plus Hydra's ``hydra_plugins``), every package
folder in it, and a regular (not editable) install that works outside the repository: ``memsweep run``
and a short API script, both importing memsweep from the installed wheel.

How the fresh environment is made, and why it is honest: a new venv (``python -m venv --without-pip``,
from the base interpreter, no system site-packages) gets the wheel installed with ``--no-deps``; its
dependencies (torch, hydra, pandas...) come from this test venv's site-packages, named in a ``.pth``
file of the new venv as plain directories on ``sys.path``. Python runs only the ``.pth`` files of its
own site directories, so the editable memsweep of this venv (a ``.pth`` that installs setuptools'
finder) is never loaded there: the only ``memsweep`` the new venv can import is the wheel's, which
the tests assert (``memsweep.__file__`` lies in the new venv's site-packages). Installing the
dependencies from wheels instead would take minutes (torch), and nothing can be downloaded in CI.
"""

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.data.loads import SMALLEST_CPU

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

# Every top-level folder that is a package (an __init__.py): memsweep.<folder>.
PACKAGE_ROOTS = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file())
"""The repository's folders that are memsweep's subpackages."""
DATA_SUFFIXES = (".yaml", ".json")
"""Files that make a folder a package of data (``conf/sweep``...), installed as package data."""
IGNORED = shutil.ignore_patterns(
    ".git", ".venv", "build", "results", "multirun", "outputs", "*.egg-info", "__pycache__", ".pytest_cache", ".hyp*"
)
"""What the wheel is not built from: this checkout's venv, outputs and caches."""


def package_folders() -> set[str]:
    """The packages the repository's folders make: the root, every folder under ``PACKAGE_ROOTS``
    holding an ``__init__.py`` or data files, and the Hydra plugin shim."""
    found = {"memsweep", "hydra_plugins", "hydra_plugins.memsweep"}
    for top in PACKAGE_ROOTS:
        for folder in [ROOT / top, *(p for p in (ROOT / top).rglob("*") if p.is_dir())]:
            if folder.name == "__pycache__":
                continue
            if (folder / "__init__.py").is_file() or any(f.suffix in DATA_SUFFIXES for f in folder.iterdir()):
                found.add("memsweep." + ".".join(folder.relative_to(ROOT).parts))
    return found


def test_pyproject_lists_every_package_folder():
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert len(listed) == len(set(listed)) and set(listed) == package_folders()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built offline from a copy of the checkout with this venv's setuptools."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "src"
    shutil.copytree(ROOT, source, ignore=IGNORED)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
        + ["-w", str(base / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (built,) = (base / "dist").glob("memsweep-*.whl")
    return built


def test_wheel_installs_one_import_name_and_every_file(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert sorted(z.read(top_level).decode().split()) == ["hydra_plugins", "memsweep"]
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"hydra_plugins", "memsweep"}
    for top in PACKAGE_ROOTS:  # every module and data file of the package folders is in it
        for path in (ROOT / top).rglob("*"):
            if path.suffix in (".py", *DATA_SUFFIXES) and "__pycache__" not in path.parts:
                assert "memsweep/" + path.relative_to(ROOT).as_posix() in names, path
    assert "memsweep/__init__.py" in names and not any(n.startswith("memsweep/tests/") for n in names)


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding the wheel (``--no-deps``) and this venv's dependencies (module docstring)."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    base_python = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    fresh_site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    ours = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (fresh_site / "_memsweep_test_dependencies.pth").write_text("".join(f"{p}\n" for p in ours))
    out = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return venv


def clean_env(venv: Path) -> dict:
    """The environment of a user's shell in the fresh venv: no PYTHONPATH, none of memsweep's own
    variables (a fork server of this test process must not serve it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSWEEP_") and k != "PYTHONPATH"}
    return {**env, "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "VIRTUAL_ENV": str(venv)}


API_SCRIPT = """
import sys
import memsweep
import memsweep.worker
print("FILE", memsweep.__file__)
print("WORKER", memsweep.worker.__file__)
r = memsweep.run(batch=2, context=8, width=16, workload={"depth": 2}, warmup=1, repeats=1, threads=1,
                 device="cpu", capacity="256MiB", progress=False)
print("OUTCOME", r.outcome, r.peak, r.run_dir)
"""


def test_installed_wheel_runs_outside_the_repository(installed, tmp_path):
    env, project = clean_env(installed), tmp_path / "elsewhere"
    project.mkdir()
    proc = subprocess.run(
        [str(installed / "bin" / "memsweep"), "run", "batch=2", "capacity=256MiB", *SMALLEST_CPU],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record,) = project.glob("results/run/*/record.json")
    api = subprocess.run(
        [str(installed / "bin" / "python"), "-c", API_SCRIPT],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert api.returncode == 0, api.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in api.stdout.splitlines() if line.split(" ")[0].isupper())
    site_packages = next(installed.glob("lib/python*/site-packages"))
    for key in ("FILE", "WORKER"):
        assert Path(lines[key]).resolve().is_relative_to(site_packages.resolve()), lines[key]
    assert lines["OUTCOME"].startswith("ok ") and str(project) in lines["OUTCOME"]
