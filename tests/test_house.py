"""The house rules, checked on every product module: functions fit on a screen, module docstrings
stay short, and the code names nothing a reader of the repository cannot open."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("conf", "worker", "sweeper", "analysis", "estimator", "hydra_plugins")
MAX_FUNCTION_LINES = 60
MAX_MODULE_DOC_LINES = 15
# Documents outside the repository, and history that belongs in the commit log.
OUTSIDE = re.compile(
    r"seed\s*0\d\d|seeds/|design\.md|style-anchors|\bissue\s*#?\d+|older client|versions? before|memsweep versions",
    re.I,
)


def modules() -> list[Path]:
    paths = [p for top in PRODUCT if (ROOT / top).is_dir() for p in sorted((ROOT / top).rglob("*.py"))]
    return [*paths, ROOT / "__init__.py"]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_there_are_modules_to_check():
    assert len(modules()) > 50


@pytest.mark.parametrize("path", modules(), ids=_rel)
def test_functions_fit_on_a_screen(path):
    tree = ast.parse(path.read_text(), str(path))
    long = [
        f"{n.name} ({n.end_lineno - n.lineno + 1} lines)"
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{_rel(path)}: over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"


@pytest.mark.parametrize("path", modules(), ids=_rel)
def test_module_docstrings_are_short(path):
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path)), clean=False) or ""
    assert len(doc.splitlines()) <= MAX_MODULE_DOC_LINES, f"{_rel(path)}: {len(doc.splitlines())} lines"


@pytest.mark.parametrize("path", modules(), ids=_rel)
def test_no_reference_a_reader_cannot_open(path):
    hits = [f"{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1) if OUTSIDE.search(line)]
    assert not hits, f"{_rel(path)}:\n" + "\n".join(hits)


def test_the_checks_catch_what_they_look_for(tmp_path):
    """The three checks fail on a module that breaks each rule (so a pass means something)."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    src = '"""' + "\n".join(["doc"] * (MAX_MODULE_DOC_LINES + 1)) + '"""\n' + f"def f():\n{body}\n# see seed 003\n"
    tree = ast.parse(src)
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    assert fn.end_lineno - fn.lineno + 1 > MAX_FUNCTION_LINES
    assert len((ast.get_docstring(tree, clean=False) or "").splitlines()) > MAX_MODULE_DOC_LINES
    assert OUTSIDE.search(src)
