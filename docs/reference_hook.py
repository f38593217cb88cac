"""MkDocs hook (``hooks:`` in mkdocs.yml): the reference pages' tables, generated from the code's own
declarations each time the site is built, so that they cannot drift from it.

A page asks for a table with a marker line ``<!-- memsweep:NAME -->``; ``on_page_markdown`` replaces
it with ``GENERATORS[NAME]()``. An unknown marker fails the build. The sources:

* ``config-keys``: ``conf/config.yaml``, every key with its default and its comment;
* ``workload-keys``: ``conf/workload/*.yaml`` and the contract's ``WORKLOAD_PARAMS``;
* ``sweeper-keys``: the sweepers' settings dataclasses (``hydra.sweeper.*``);
* ``cli``: the top-level usage and each subcommand's argparse parser (``memsweep predict``: its
  options tuple and usage text, it is not argparse);
* ``exit-codes``: ``conf/contract/exits.py``;
* ``files``: the fields of ``spec.json`` (the ``RunSpec`` dataclass), of ``record.json``,
  ``result.json`` and their nested objects (the contract's ``Field`` tables, read from the published
  JSON Schema) and the Parquet tables' columns (``analysis.schemas``).

Run as a script (``python docs/reference_hook.py NAME``) it prints one table.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- memsweep:([a-z-]+) -->$", re.M)
# A top-level or nested key of a YAML file, its raw value and its comment.
YAML_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w]*):(?P<value>[^#]*?)\s*(?:#\s?(?P<doc>.*))?$")
YAML_MORE = re.compile(r"^ +#\s?(?P<doc>.*)$")


def cell(text: object) -> str:
    """One Markdown table cell: ``|`` escaped, newlines folded, None as ``null``."""
    text = "null" if text is None else str(text)
    return " ".join(text.split()).replace("|", "\\|")


def rst(text: str) -> str:
    """A docstring's reStructuredText literals (````x````) as Markdown code (```x```)."""
    return text.replace("``", "`")


def code(text: object) -> str:
    """A cell in code style (empty stays empty)."""
    text = cell(text)
    return f"`{text}`" if text else ""


def table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """A Markdown table of already formatted cells."""
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def yaml_keys(path: Path) -> list[tuple[str, str, str]]:
    """The keys of a YAML config with scalar values, as (dotted key, raw value, comment).

    Lists (``defaults``) are skipped; a comment line indented under a key continues its comment;
    a mapping's own key (``hydra:``) is a prefix, not a row.
    """
    rows: list[list[str]] = []
    stack: list[tuple[int, str]] = []
    last: list[str] | None = None
    for line in path.read_text().splitlines():
        more = YAML_MORE.match(line)
        if more and last is not None:
            last[2] = (last[2] + " " + more.group("doc")).strip()
            continue
        m = YAML_KEY.match(line)
        if not m:
            last = None
            continue
        indent, key, value, doc = len(m.group("indent")), m.group("key"), m.group("value").strip(), m["doc"] or ""
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = ".".join([k for _, k in stack] + [key])
        if value == "":
            stack.append((indent, key))
            last = None
            if doc:
                rows.append([dotted, "", doc])
                last = rows[-1]
            continue
        rows.append([dotted, value, doc])
        last = rows[-1]
    return [(k, v, d) for k, v, d in rows if k != "defaults"]


def config_keys() -> str:
    """Every key of ``conf/config.yaml``: its default and the comment beside it."""
    rows = yaml_keys(ROOT / "conf" / "config.yaml")
    top = [(code(k), code(v), cell(d)) for k, v, d in rows if not k.startswith("hydra.")]
    hydra = [(code(k), code(v), cell(d)) for k, v, d in rows if k.startswith("hydra.")]
    return "\n\n".join(
        [
            "## Every key of the load (`conf/config.yaml`)",
            table(("key", "default", "meaning"), top),
            "## Hydra settings memsweep sets (`conf/config.yaml`)",
            table(("key", "default", "meaning"), hydra),
        ]
    )


def workload_keys() -> str:
    """Per workload config file, its settings (``workload.KEY``) with their defaults; the accepted
    settings of each workload kind from the contract's ``WORKLOAD_PARAMS``."""
    from memsweep.conf.contract.workload import WORKLOAD_PARAMS

    parts = ["## Workload settings (`workload.KEY`)"]
    kinds = [(code(name), ", ".join(code(p) for p in params)) for name, (params, _) in WORKLOAD_PARAMS.items()]
    parts += [
        "Accepted by each kind of workload (any other is refused, naming it):",
        table(("name", "settings"), kinds),
    ]
    for path in sorted((ROOT / "conf" / "workload").glob("*.yaml")):
        rows = [(code(f"workload.{k}"), code(v), cell(d)) for k, v, d in yaml_keys(path)]
        parts += [
            f"### `workload={path.stem}` (`conf/workload/{path.name}`)",
            table(("key", "default", "meaning"), rows),
        ]
    return "\n\n".join(parts)


def field_comments(cls: type) -> dict[str, str]:
    """The comments of a dataclass's fields in its source: the comment lines right above a field
    and the comment at the end of its line."""
    import inspect

    source = inspect.getsource(cls).splitlines()
    out: dict[str, str] = {}
    prev: tuple[str, int] | None = None  # the field a comment-less field's comment block belongs to
    for node in ast.parse("\n".join(source)).body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above = []
            i = node.lineno - 2
            while i >= 0 and source[i].strip().startswith("#"):
                above.insert(0, source[i].strip().lstrip("#").strip())
                i -= 1
            line = source[node.lineno - 1]
            inline = line.split("#", 1)[1].strip() if "#" in line and "'#'" not in line else ""
            doc = " ".join([*above, inline]).strip()
            if not doc and prev is not None and prev[1] == node.lineno - 1:  # under the same comment
                doc = f"with `{prev[0]}` (the comment above it)"
            out[node.target.id] = doc
            prev = (node.target.id if not doc.startswith("with `") else prev[0], node.end_lineno or node.lineno)
    return out


def dataclass_rows(cls: type, prefix: str) -> list[tuple[str, str, str, str]]:
    """(key, type, default, comment) of every public field of a settings dataclass."""
    comments = field_comments(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if f.name.startswith("_"):
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "(required)"
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        rows.append((code(prefix + f.name), code(kind), code(default), cell(comments.get(f.name, ""))))
    return rows


def sweeper_keys() -> str:
    """The settings of ``hydra/sweeper=ovat`` (the default) and ``hydra/sweeper=frontier``."""
    from memsweep.sweeper.frontier_settings import FrontierSweeperConf
    from memsweep.sweeper.ovat import OvatSweeperConf

    head = ("key", "type", "default", "meaning")
    return "\n\n".join(
        [
            "## Sweeper settings (`hydra.sweeper.KEY`)",
            "### `hydra/sweeper=ovat` (the default: one variable at a time)",
            table(head, dataclass_rows(OvatSweeperConf, "hydra.sweeper.")),
            "### `hydra/sweeper=frontier` (the exact edge)",
            table(head, dataclass_rows(FrontierSweeperConf, "hydra.sweeper.")),
        ]
    )


class _Captured(Exception):
    """Raised by a patched ``parse_args`` to hand the parser out of a command's ``main``."""

    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__(parser.prog)
        self.parser = parser


@contextmanager
def _capturing() -> Iterator[None]:
    """While active, ``ArgumentParser.parse_args`` raises ``_Captured`` with the parser."""

    def capture(self, *args, **kwargs):
        raise _Captured(self)

    saved = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    argparse.ArgumentParser.parse_known_args = capture  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = saved  # type: ignore[method-assign]


def command_parser(main: Callable[[list[str]], object]) -> argparse.ArgumentParser:
    """The argparse parser a command's ``main(argv)`` builds, taken from it before it parses."""
    with _capturing():
        try:
            main([])
        except _Captured as got:
            return got.parser
    raise RuntimeError(f"{main.__module__}.{main.__name__} parsed no arguments with argparse")


def parser_rows(parser: argparse.ArgumentParser) -> list[tuple[str, str, str]]:
    """(option, default, help) of every argument of a parser, positional ones included."""
    rows = []
    for action in parser._actions:  # argparse keeps no public list of its arguments
        if isinstance(action, argparse._HelpAction):
            continue
        if action.option_strings:
            name = ", ".join(action.option_strings)
            if action.nargs != 0:
                name += " " + (action.metavar or action.dest.upper())
        else:
            name = str(action.metavar or action.dest) + (" ..." if action.nargs in ("+", "*") else "")
        default = (
            "" if action.default in (None, argparse.SUPPRESS, False) or not action.option_strings else action.default
        )
        helptext = (action.help or "") % {"default": action.default, "prog": parser.prog} if action.help else ""
        rows.append((code(name), code(default), cell(helptext)))
    return rows


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """The argparse parser of every subcommand that has one, by name, as ``memsweep`` dispatches."""
    from memsweep.sweeper import cli

    parsers = {name: command_parser(importlib.import_module(mod).main) for name, mod in cli.ANALYSIS_COMMANDS.items()}
    parsers["env"] = command_parser(cli.env_command)
    return parsers


def cli_reference() -> str:
    """The command line: the top-level usage, each subcommand's options, ``memsweep predict``'s."""
    from memsweep.sweeper import cli

    usage = cli.USAGE.strip().split("\n", 1)[1].strip("\n")  # after the docstring's title line
    parts = ["## `memsweep`", "```text\n" + usage.replace("``", "") + "\n```"]
    parts += [
        "## `memsweep run` and `memsweep sweep`",
        "Their arguments are Hydra overrides (`key=value`; every key: [Configuration keys](config.md)) and "
        "Hydra's own options (`--cfg job`, `-c job`, `--cfg hydra`, `--info`: print and run nothing).",
    ]
    for name, parser in sorted(command_parsers().items()):
        parts += [f"## `memsweep {name}`"]
        if parser.description:
            parts += [rst(cell(parser.description.strip().split("\n\n")[0]))]
        parts += [table(("argument", "default", "meaning"), parser_rows(parser))]
    parts += [
        "## `memsweep predict`",
        "Options: "
        + ", ".join(code(o) for o in cli.PREDICT_OPTIONS)
        + "; everything else is an override (`key=value`).",
        "```text\n" + cli._predict_usage().strip() + "\n```",
    ]
    return "\n\n".join(parts)


def module_constants(path: Path) -> list[tuple[str, str, str]]:
    """(name, value source, docstring) of each module-level constant followed by a docstring."""
    tree = ast.parse(path.read_text())
    out = []
    for node, after in zip(tree.body, tree.body[1:]):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                out.append((node.targets[0].id, ast.unparse(node.value), str(after.value.value)))
    return out


def exit_codes() -> str:
    """The exit statuses declared in ``conf/contract/exits.py``, and the compare gate's."""
    from memsweep.conf.contract import exits

    rows = [(code(n), code(v), rst(cell(d))) for n, v, d in module_constants(Path(exits.__file__))]
    run = [(code(o), code(c)) for o, c in exits.RUN_EXIT.items()]
    predict = [(code(o), code(c)) for o, c in exits.PREDICT_EXIT.items()]
    parts = [
        "## Declared exit statuses (`conf/contract/exits.py`)",
        table(("name", "value", "meaning"), rows),
        "## `memsweep run`: by the run's outcome (`RUN_EXIT`)",
        table(("outcome", "exit status"), run),
        "## `memsweep predict` (`PREDICT_EXIT`)",
        table(("answer", "exit status"), predict),
    ]
    from memsweep.analysis.compare import cli as compare_cli

    gate = [(n, getattr(compare_cli, n)) for n in dir(compare_cli) if n.startswith("EXIT_")]
    if gate:
        parts += [
            "## `memsweep compare`",
            table(("name", "exit status"), [(code(n), code(v)) for n, v in sorted(gate, key=lambda g: g[1])]),
        ]
    return "\n\n".join(parts)


def files_reference() -> str:
    """The fields of spec.json, of the run files and their nested objects, and the Parquet columns."""
    from memsweep.analysis import schemas
    from memsweep.conf.contract import record
    from memsweep.conf.contract.spec import RunSpec

    spec_rows = []
    for f in dataclasses.fields(RunSpec):
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        spec_rows.append((code(f.name), code(kind)))
    parts = ["## `spec.json` (the `RunSpec` fields)", table(("field", "type"), spec_rows)]
    for definition in (
        "record",
        "phase",
        "phase_device",
        "rank",
        "phase_rank",
        "environment",
        "capacity",
        "model",
        "throughput",
    ):
        fields = record.schema_fields(definition)
        parts += [f"## `{definition}` fields", table(("field", "type", "meaning"), field_rows(fields))]
    for definition in ("result", "exit_status"):
        parts += [
            f"## `{definition}.json` fields",
            table(("field", "type", "meaning"), field_rows(record.schema_fields(definition))),
        ]
    for name in sorted(n for n in dir(schemas) if n.endswith("_SCHEMA")):
        schema = getattr(schemas, name)
        rows = [(code(f.name), code(f.type)) for f in schema]
        title = name.removesuffix("_SCHEMA").lower()
        parts += [f"## `{title}.parquet` columns", table(("column", "type"), rows)]
    return "\n\n".join(parts)


def field_rows(fields) -> list[tuple[str, str, str]]:
    """(name, JSON type, meaning) of the contract's ``Field`` tuples."""
    return [(code(f.name), code(f.type.__name__), cell(f.doc)) for f in fields]


GENERATORS: dict[str, Callable[[], str]] = {
    "config-keys": config_keys,
    "workload-keys": workload_keys,
    "sweeper-keys": sweeper_keys,
    "cli": cli_reference,
    "exit-codes": exit_codes,
    "files": files_reference,
}
"""Marker name -> the function that writes its Markdown."""


def expand(markdown: str) -> str:
    """The page with every ``<!-- memsweep:NAME -->`` marker replaced by its generated Markdown.

    Raises:
        KeyError: a marker that names no generator.
    """
    return MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """MkDocs' page event: expand the page's markers (an unknown one fails the build)."""
    from mkdocs.exceptions import PluginError

    try:
        return expand(markdown)
    except KeyError as exc:
        raise PluginError(f"{page.file.src_path}: unknown reference marker {exc}; known: {sorted(GENERATORS)}") from exc


if __name__ == "__main__":
    print(GENERATORS[sys.argv[1]]())
