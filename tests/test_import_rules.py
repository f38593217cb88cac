"""The import rules of the one-way flow conf -> sweeper -> worker -> record file -> analysis.

Checked on the source of every module (imports inside functions included), by its syntax tree:

* the worker imports no Hydra, omegaconf, pandas, pyarrow, sweeper, estimate or analysis;
* the analysis never imports torch or the sweeper; it may import the estimate;
* the sweeper never imports torch (it starts the worker as a process); it imports the estimate
  before a run, and the analysis only in the modules of ``SWEEPER_USES_ANALYSIS``;
* the estimator (estimator/) imports the standard library and the contract only: no torch,
  Hydra, pandas, sweeper, worker or analysis;
* the contract (conf/contract) imports the standard library only.

And, in a fresh interpreter, importing the sweeper's CLI, the analysis tables and the contract
leaves torch out of ``sys.modules``.

And only the command-line layer prints or exits (``print``, ``sys.exit``, ``exit``,
``SystemExit``): library code raises typed errors that the command line turns into a message
and an exit status.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "worker": {"hydra", "omegaconf", "pandas", "pyarrow", "sweeper", "estimator", "analysis", "hydra_plugins"},
    "analysis": {"torch", "sweeper", "hydra_plugins"},
    "sweeper": {"torch"},
    "estimator": {"torch", "hydra", "omegaconf", "pandas", "pyarrow", "sweeper", "worker", "analysis", "hydra_plugins"},
}

# The sweeper's modules that reach the analysis (an import, or a module name it imports when
# called), and why; the rest of the sweeper uses the estimate and the contract only.
SWEEPER_USES_ANALYSIS = {
    "sweeper/callbacks.py": "a sweep's end (Hydra's on_multirun_end): the sweep's tables and its report",
    "sweeper/cli.py": "memsweep analyze, report and compare run the analysis' command lines (ANALYSIS_COMMANDS)",
    "sweeper/api.py": "the Python API's sweep, compare and load_tables return the analysis' tables and answers",
}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, relative ones resolved."""
    package = ("memsweep", *path.relative_to(ROOT).with_suffix("").parts[:-1])
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


def layer(name: str) -> str:
    """The top of an import name as the layers are named: ``memsweep.worker.x`` -> ``worker``."""
    parts = name.split(".")
    return parts[1] if parts[0] == "memsweep" and len(parts) > 1 else parts[0]


def sources(top: str) -> list[Path]:
    return sorted((ROOT / top).rglob("*.py"))


@pytest.mark.parametrize("top", sorted(FORBIDDEN))
def test_layer_imports_nothing_forbidden(top):
    assert sources(top), f"no modules under {top}/"
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in sources(top)
        for line, name in imported_modules(path)
        if layer(name) in FORBIDDEN[top]
    ]
    assert not bad, f"{top}/ must not import {', '.join(sorted(FORBIDDEN[top]))}:\n" + "\n".join(bad)


def analysis_references(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every import of ``memsweep.analysis`` in ``path``, and of every string that
    is such a module name (a module imported when called, ``importlib.import_module``)."""
    out = [(line, name) for line, name in imported_modules(path) if layer(name) == "analysis"]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"memsweep\.analysis(\.\w+)*", node.value):
                out.append((node.lineno, node.value))
    return out


def test_the_sweeper_reaches_the_analysis_only_where_listed():
    """The sweeper runs the analysis at a sweep's end and dispatches its subcommands; what it uses
    before a run (estimate, fit, cards, labels) is the estimate's, so the arrow sweeper -> analysis
    exists only in the modules listed, each of which has it."""
    found = {path.relative_to(ROOT).as_posix(): analysis_references(path) for path in sources("sweeper")}
    bad = [
        f"{rel}:{line}: {name}"
        for rel, refs in found.items()
        if rel not in SWEEPER_USES_ANALYSIS
        for line, name in refs
    ]
    assert not bad, "the sweeper reaches the analysis outside SWEEPER_USES_ANALYSIS:\n" + "\n".join(bad)
    stale = [rel for rel in SWEEPER_USES_ANALYSIS if not found.get(rel)]
    assert not stale, f"listed in SWEEPER_USES_ANALYSIS but reaching no analysis module: {stale}"


def test_the_estimate_imports_the_standard_library_and_the_contract_only():
    paths = sources("estimator")
    assert paths
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in paths
        for line, name in imported_modules(path)
        if name.split(".")[0] not in sys.stdlib_module_names
        and not name.startswith(("memsweep.conf.contract", "memsweep.estimator"))
    ]
    assert not bad, "estimator/ imports beyond the standard library and conf.contract:\n" + "\n".join(bad)


def test_the_contract_imports_the_standard_library_only():
    paths = sorted((ROOT / "conf" / "contract").glob("*.py"))
    assert paths
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in paths
        for line, name in imported_modules(path)
        if name.split(".")[0] not in sys.stdlib_module_names and not name.startswith("memsweep.conf.contract")
    ]
    assert not bad, "conf/contract imports beyond the standard library:\n" + "\n".join(bad)


def test_the_worker_is_imported_by_nobody_but_itself():
    """The sweeper starts the worker as a process (``python -m memsweep.worker``); the analysis reads its
    files. Neither imports it: what they share is in conf.contract."""
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for top in ("sweeper", "estimator", "analysis", "hydra_plugins", "conf")
        for path in sources(top)
        for line, name in imported_modules(path)
        if layer(name) == "worker"
    ]
    assert not bad, "\n".join(bad)


def test_memsweep_is_imported_by_its_one_name_only():
    """Every import of memsweep's own modules, in the product and the tests, is ``memsweep.*``: a bare
    ``worker``, ``conf``, ``sweeper``, ``estimate`` or ``analysis`` would be a user's package of that name."""
    bare = {"worker", "conf", "sweeper", "estimator", "analysis"}
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in sorted(ROOT.glob("*.py")) + [p for top in (*bare, "hydra_plugins", "tests") for p in sources(top)]
        for line, name in imported_modules(path)
        if name.split(".")[0] in bare
    ]
    assert not bad, "\n".join(bad)


def test_sweeper_cli_analysis_and_contract_leave_torch_unimported():
    code = (
        "import sys; import memsweep.sweeper.cli, memsweep.estimator, memsweep.analysis.tables; "
        "import memsweep.conf.contract; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# Where printing and exiting belong, and why (paths relative to the repository).
COMMAND_LINE = {
    "sweeper/cli.py": "the memsweep command",
    "sweeper/callbacks.py": "Hydra's hooks into the terminal of a multirun: progress lines, the report's path",
    "analysis/cli.py": "memsweep analyze (also shown at a sweep's end)",
    "analysis/report/cli.py": "memsweep report",
    "estimator/cli.py": "memsweep estimate",
    "analysis/compare/cli.py": "memsweep compare (its exit statuses are the regression gate's answer)",
    "worker/main.py": "the worker process's command lines",
    "worker/__main__.py": "python -m memsweep.worker",
    "worker/forkserver.py": "the fork server process: its 'ready' line is the handshake its client reads",
}
EXIT_NAMES = {"exit", "quit", "SystemExit"}


def _stderr_print(node: ast.Call) -> bool:
    """``print(..., file=sys.stderr)``: in the worker, the run's own log (stderr.log)."""
    return any(
        k.arg == "file" and isinstance(k.value, ast.Attribute) and k.value.attr == "stderr" for k in node.keywords
    )


def prints_and_exits(path: Path) -> list[tuple[int, str]]:
    """(line, what) of every print, sys.exit/exit/quit call and SystemExit in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "print":
                if not (path.relative_to(ROOT).parts[0] == "worker" and _stderr_print(node)):
                    out.append((node.lineno, "print"))
            elif isinstance(f, ast.Name) and f.id in EXIT_NAMES:
                out.append((node.lineno, f.id))
            elif isinstance(f, ast.Attribute) and f.attr == "exit" and isinstance(f.value, ast.Name):
                out.append((node.lineno, f"{f.value.id}.exit"))
        elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Name) and node.exc.id == "SystemExit":
            out.append((node.lineno, "raise SystemExit"))
    return out


def test_only_the_command_line_layer_prints_or_exits():
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for top in ("worker", "sweeper", "estimator", "analysis", "conf", "hydra_plugins")
        for path in sources(top)
        if path.relative_to(ROOT).as_posix() not in COMMAND_LINE
        for line, what in prints_and_exits(path)
    ]
    assert not bad, "print or exit outside the command-line layer (raise a typed error instead):\n" + "\n".join(bad)
