"""Every public definition of the product code says what it does (design.md: Google-style
docstrings with arguments, returns, units, errors and the source of a formula).

Checked by syntax tree over worker, sweeper, estimate, analysis, conf and hydra_plugins: each public
module-level function and class, and each public method of a module-level class (a private
class's methods included: they are called from elsewhere in the module), has a docstring.
Names starting with ``_`` (dunders included: a class's docstring covers ``__init__``) and
helpers nested inside functions are exempt.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("worker", "sweeper", "estimator", "analysis", "conf", "hydra_plugins")
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def undocumented(path: Path) -> list[str]:
    """``path:line: name`` of every public definition in ``path`` without a docstring."""
    out = []
    for node in ast.parse(path.read_text(), str(path)).body:
        if not isinstance(node, DEFINITIONS):
            continue
        members = [(node, node.name)]
        if isinstance(node, ast.ClassDef):
            members += [(m, f"{node.name}.{m.name}") for m in node.body if isinstance(m, DEFINITIONS)]
        for member, name in members:
            if not member.name.startswith("_") and ast.get_docstring(member) is None:
                out.append(f"{path.relative_to(ROOT)}:{member.lineno}: {name}")
    return out


@pytest.mark.parametrize("top", PACKAGES)
def test_public_definitions_have_docstrings(top):
    paths = sorted((ROOT / top).rglob("*.py"))
    assert paths, f"no modules under {top}/"
    missing = [line for path in paths for line in undocumented(path)]
    assert not missing, "public definitions without a docstring:\n" + "\n".join(missing)
