"""`make gpu-check`'s set-up on a machine as it is: the interpreter that holds PyTorch, no venv.

Standard library only (it runs before anything is installed). It

* describes the PyTorch build it finds in one line (``describe_build``): too old (below
  ``MIN_TORCH``), a "CPU-only build", "no GPU visible", or the GPUs it sees;
* installs only the missing pure-Python dependencies of memsweep (``NEEDED``) from the wheels
  brought along in ``WHEELS_DIR`` (an ignored folder that ``make gpu-wheels`` fills, carried to
  the GPU machine), by unpacking them into ``SITE_DIR`` (``install_missing``): a pure wheel
  (``Root-Is-Purelib: true``) is its files under site-packages, so no pip and no index is needed;
* installs what the fine-tuning check needs where it is missing (``install_finetune``: transformers,
  peft and accelerate with their dependencies, every brought wheel whose distribution is not
  installed and whose tags fit this interpreter, pure or built for it); without them the fine-tuning
  parts skip, saying so;
* gives the environment for the check's subprocesses (``child_env``): this checkout as
  ``memsweep`` (a link in the temporary directory), the repository and ``SITE_DIR`` on PYTHONPATH.

``python tests/gpu_env.py`` prints the build line and what it installed, as JSON on its last line.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS_DIR = ROOT / ".gpu-wheels"
SITE_DIR = ROOT / ".gpu-site"
MIN_TORCH = (2, 4)

NEEDED = {
    "hydra": "hydra-core",
    "omegaconf": "omegaconf",
    "antlr4": "antlr4-python3-runtime",
    "yaml": "PyYAML",
    "pandas": "pandas",
    "pyarrow": "pyarrow",
    "filelock": "filelock",
    "matplotlib": "matplotlib",
}
"""Module -> distribution memsweep needs beside torch (pyproject.toml's dependencies)."""

FINETUNE = ("transformers", "peft", "accelerate")
"""The distributions of the fine-tuning check (tests/gpu_finetune.py), optional: brought by
``make gpu-wheels`` with their dependencies, which ``install_finetune`` installs where missing."""

PROBE = (
    "import json, torch\n"
    "info = {'torch': torch.__version__, 'cuda': torch.version.cuda, 'hip': getattr(torch.version, 'hip', None)}\n"
    "info['device_count'] = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
    "info['names'] = [torch.cuda.get_device_name(i) for i in range(info['device_count'])]\n"
    "print(json.dumps(info))\n"
)


def torch_info(python: str = sys.executable) -> dict:
    """What the PyTorch of ``python`` is, read in a short process of its own.

    torch.cuda.is_available and device_count (torch/cuda/__init__.py) ask the driver (NVML where it
    can) without creating a CUDA context; get_device_name reads the device's properties.

    Args:
        python: the interpreter.

    Returns:
        ``torch`` (version), ``cuda`` / ``hip`` (torch.version's, None for a CPU-only build),
        ``device_count``, ``names``; or ``error`` (the probe's failure) alone.
    """
    proc = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=120)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the PyTorch probe failed (exit {proc.returncode}): {tail}"}
    return json.loads(lines[-1])


def torch_version(text: str) -> tuple[int, int]:
    """(major, minor) of a torch.__version__ such as ``2.11.0+cu130``; (0, 0) when unreadable."""
    match = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def describe_build(info: dict) -> tuple[bool, str]:
    """One line on the PyTorch build found, and whether a GPU check can run on it.

    Args:
        info: ``torch_info``'s answer.

    Returns:
        (usable, line): usable only for a CUDA or ROCm build of PyTorch >= MIN_TORCH that sees
        at least one GPU.
    """
    if "error" in info:
        return False, f"gpu-check: no usable PyTorch in {sys.executable}: {info['error']}"
    version = info["torch"]
    if torch_version(version) < MIN_TORCH:
        need = ".".join(map(str, MIN_TORCH))
        return False, f"gpu-check: PyTorch {version} is too old (memsweep needs {need} or newer); nothing checked"
    if not info.get("cuda") and not info.get("hip"):
        return False, f"gpu-check: PyTorch {version} is a CPU-only build (no CUDA, no ROCm); nothing checked"
    build = f"ROCm {info['hip']}" if info.get("hip") else f"CUDA {info['cuda']}"
    if not info.get("device_count"):
        return False, f"gpu-check: PyTorch {version}, a {build} build: no GPU visible; nothing checked"
    names = ", ".join(info.get("names") or [])
    return True, f"gpu-check: PyTorch {version}, a {build} build: {info['device_count']} GPU(s) visible ({names})"


def _dist_key(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def install_missing(wheels: Path = WHEELS_DIR, site: Path = SITE_DIR, needed: dict | None = None) -> list[str]:
    """Unpack the wheels of the missing modules into ``site`` and put it first on sys.path.

    Only modules that cannot be imported (importlib.util.find_spec) are installed, and only
    from pure wheels (``Root-Is-Purelib: true`` in the wheel's WHEEL file: its files are laid
    out as site-packages holds them, PEP 427).

    Args:
        wheels: the folder of wheels (``make gpu-wheels``).
        site: where they are unpacked (created).
        needed: module -> distribution (``NEEDED`` when None).

    Returns:
        The wheel file names installed.

    Raises:
        RuntimeError: a missing module has no wheel in ``wheels``, or its wheel is not pure.
    """
    needed = NEEDED if needed is None else needed
    site.mkdir(parents=True, exist_ok=True)
    if str(site) not in sys.path:
        sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    missing = {mod: dist for mod, dist in needed.items() if importlib.util.find_spec(mod) is None}
    found = {_dist_key(p.name.split("-")[0]): p for p in sorted(wheels.glob("*.whl"))} if wheels.is_dir() else {}
    installed = []
    for mod, dist in missing.items():
        wheel = found.get(_dist_key(dist))
        if wheel is None:
            raise RuntimeError(
                f"gpu-check: module {mod!r} ({dist}) is missing and {wheels} holds no wheel of it: run "
                f"`make gpu-wheels` on a machine with a package index and bring {wheels.name}/ along"
            )
        with zipfile.ZipFile(wheel) as zf:
            meta = next(n for n in zf.namelist() if n.endswith(".dist-info/WHEEL"))
            if "Root-Is-Purelib: true" not in zf.read(meta).decode():
                raise RuntimeError(f"gpu-check: {wheel.name} is not a pure-Python wheel; bring a pure one")
            zf.extractall(site)
        installed.append(wheel.name)
    importlib.invalidate_caches()
    still = [mod for mod in missing if importlib.util.find_spec(mod) is None]
    if still:
        raise RuntimeError(f"gpu-check: still missing after installing {installed}: {still}")
    return installed


def wheel_fits(name: str) -> bool:
    """Whether a wheel file runs on this interpreter, read from its name's tags (PEP 427, PEP 425):
    a pure wheel (platform ``any``, Python ``py3``), or one built for it (``cpXY``, or
    ``cpXY``-``abi3`` with XY at most this Python's, on a ``manylinux_*`` platform of this machine)."""
    python, abi, plat = name[: -len(".whl")].split("-")[-3:]
    major, minor = sys.version_info[:2]
    if plat == "any":
        return any(t in ("py3", f"py{major}", f"cp{major}{minor}") for t in python.split("."))
    machine = platform.machine()
    if not sys.platform.startswith("linux") or not any(
        p.startswith("manylinux") and p.endswith("_" + machine) for p in plat.split(".")
    ):
        return False
    for tag in python.split("."):
        match = re.fullmatch(rf"cp{major}(\d+)", tag)
        if match and (int(match.group(1)) == minor or (abi == "abi3" and int(match.group(1)) <= minor)):
            return True
    return False


def _installed(dist: str) -> bool:
    try:
        metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


def _unpack(wheel: Path, site: Path) -> None:
    """A wheel's files laid out in ``site`` (PEP 427): its root, and its ``.data/purelib`` and
    ``.data/platlib`` moved up (its scripts and headers are not needed by an import)."""
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    for data in site.glob("*.data"):
        for item in [*data.glob("purelib/*"), *data.glob("platlib/*")]:
            if item.is_dir():
                shutil.copytree(item, site / item.name, dirs_exist_ok=True)
            else:
                shutil.copy2(item, site)
        shutil.rmtree(data)


def install_finetune(wheels: Path = WHEELS_DIR, site: Path = SITE_DIR, needed: tuple = FINETUNE) -> list[str]:
    """Install what the fine-tuning check needs where one of ``needed`` is missing: every wheel
    in ``wheels`` whose distribution is not installed and that fits this interpreter
    (``wheel_fits``), unpacked into ``site`` (put first on sys.path).

    Args:
        wheels: the folder of wheels (``make gpu-wheels``).
        site: where they are unpacked (created).
        needed: the distributions of the check (``FINETUNE``).

    Returns:
        The wheel file names installed; none when every ``needed`` distribution is there, or
        ``wheels`` brings none (the fine-tuning parts then skip, saying which is missing).
    """
    site.mkdir(parents=True, exist_ok=True)
    if str(site) not in sys.path:
        sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    if all(_installed(d) for d in needed) or not wheels.is_dir():
        return []
    brought = [p for p in sorted(wheels.glob("*.whl")) if wheel_fits(p.name)]
    installed = []
    for wheel in brought:
        if not _installed(wheel.name.split("-")[0]):
            _unpack(wheel, site)
            installed.append(wheel.name)
    importlib.invalidate_caches()
    return installed


def package_dir(base: Path | None = None) -> Path:
    """A folder that makes this checkout importable as ``memsweep`` without installing it: it holds
    one link, ``memsweep``, to the repository root (the package's root, pyproject's package-dir).
    Outside the checkout (``base``, else the temporary directory), so no copy of the tree loops."""
    folder = base if base is not None else Path(tempfile.gettempdir()) / f"memsweep-package-{os.getuid()}"
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "memsweep"
    if link.is_symlink() and link.resolve() != ROOT:
        link.unlink()
    if not link.exists():
        link.symlink_to(ROOT, target_is_directory=True)
    return folder


def child_env(site: Path = SITE_DIR) -> dict:
    """The environment of the check's subprocesses: this checkout as ``memsweep``
    (``package_dir``), the repository (for ``tests``) and ``site`` first on PYTHONPATH."""
    env = dict(os.environ)
    parts = [str(package_dir()), str(ROOT), str(site), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def memsweep(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``memsweep ARGS`` as the check runs it: ``python -m memsweep.sweeper.cli`` in the repository with
    ``child_env`` (the console script is not installed on the GPU machine), output captured as text.

    Args: args: the command's arguments; timeout: seconds before ``subprocess.TimeoutExpired``.
    Returns: the finished process.
    """
    cmd = [sys.executable, "-m", "memsweep.sweeper.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env(), cwd=ROOT)


if __name__ == "__main__":
    info = torch_info()
    usable, line = describe_build(info)
    print(line)
    try:
        installed = install_missing() + install_finetune()
    except RuntimeError as exc:
        print(exc)
        installed = None
    print(json.dumps({"usable": usable, "torch": info.get("torch"), "installed": installed}))
    sys.exit(0 if usable and installed is not None else 2)
