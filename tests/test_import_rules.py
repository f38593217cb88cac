"""The import rules of the one-way flow conf -> sweeper -> worker -> record file -> analysis.

Checked on the source of every module (imports inside functions included), by its syntax tree:

* the worker imports no Hydra, omegaconf, pandas, pyarrow, sweeper or analysis;
* the analysis never imports torch or the sweeper;
* the sweeper never imports torch (it starts the worker as a process);
* the contract (conf/contract) imports the standard library only.

And, in a fresh interpreter, importing the sweeper's CLI, the analysis tables and the contract
leaves torch out of ``sys.modules``.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "worker": {"hydra", "omegaconf", "pandas", "pyarrow", "sweeper", "analysis", "hydra_plugins"},
    "analysis": {"torch", "sweeper", "hydra_plugins"},
    "sweeper": {"torch"},
}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, relative ones resolved."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                out.append((node.lineno, ".".join(base + ((node.module,) if node.module else ()))))
            else:
                out.append((node.lineno, node.module))
    return out


def sources(top: str) -> list[Path]:
    return sorted((ROOT / top).rglob("*.py"))


@pytest.mark.parametrize("top", sorted(FORBIDDEN))
def test_layer_imports_nothing_forbidden(top):
    assert sources(top), f"no modules under {top}/"
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in sources(top)
        for line, name in imported_modules(path)
        if name.split(".")[0] in FORBIDDEN[top]
    ]
    assert not bad, f"{top}/ must not import {', '.join(sorted(FORBIDDEN[top]))}:\n" + "\n".join(bad)


def test_the_contract_imports_the_standard_library_only():
    paths = sorted((ROOT / "conf" / "contract").glob("*.py"))
    assert paths
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in paths
        for line, name in imported_modules(path)
        if name.split(".")[0] not in sys.stdlib_module_names and not name.startswith("conf.contract")
    ]
    assert not bad, "conf/contract imports beyond the standard library:\n" + "\n".join(bad)


def test_the_worker_is_imported_by_nobody_but_itself():
    """The sweeper starts the worker as a process (``python -m worker``); the analysis reads its
    files. Neither imports it: what they share is in conf.contract."""
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for top in ("sweeper", "analysis", "hydra_plugins", "conf")
        for path in sources(top)
        for line, name in imported_modules(path)
        if name.split(".")[0] == "worker"
    ]
    assert not bad, "\n".join(bad)


def test_sweeper_cli_analysis_and_contract_leave_torch_unimported():
    code = (
        "import sys; import sweeper.cli, analysis.tables, conf.contract; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
