"""MkDocs hooks (mkdocs.yml ``hooks:``): the reference pages that are generated, not written.

- ``reference/cli.md`` from the argparse parsers of ``vaswani.cli`` (every command, its usage,
  every argument with its help and default);
- ``reference/config.md`` from the config dataclasses of ``vaswani.config`` (every key, its
  type, default and the attribute docstring under it);
- ``changelog.md`` from ``CHANGELOG.md`` at the repository's root;
- ``source/PACKAGE/MODULE.md``: the code of ``src/vaswani/nn/``, ``cpu/``, ``models/`` and
  ``generation/``, one heading per top-level class and function (anchored by its name) with
  its lines, which "Reading the Transformer" (docs/reading.md) links to.

A new flag or config key appears on the next build without editing a page; a key without a
docstring is an error here and a failing test (tests/test_docs.py).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# --- config keys --------------------------------------------------------------------------

def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass: the string literal under each field."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, [*body[1:], None], strict=True):
        if (isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def sections() -> list[type]:
    """Every config section's class, each followed by its own sections (``[model.rope]``)."""
    from vaswani.config import SECTIONS

    return [part for cls in SECTIONS.values() for part in (cls, *cls.parts().values())]


def undocumented_keys() -> list[str]:
    """``section.key`` for every config key without a docstring (should be none)."""
    missing = []
    for cls in sections():
        docs = field_docs(cls)
        missing += [f"{cls.SECTION}.{f.name}" for f in dataclasses.fields(cls)
                    if not docs.get(f.name)]
    return missing


def _type_name(annotation) -> str:
    if isinstance(annotation, str):
        return annotation
    if typing.get_origin(annotation) is typing.Literal:
        return " | ".join(f'"{a}"' for a in typing.get_args(annotation))
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        return repr(field.default).replace("'", '"')
    if field.default_factory is not dataclasses.MISSING:
        return repr(field.default_factory()).replace("'", '"')
    return "(required)"


def _cell(text: str) -> str:
    """One table cell: one line, its pipes escaped, and ``<eos>`` or ``runs/<config name>``
    kept as text rather than read as HTML tags."""
    text = " ".join(text.split()).replace("|", "\\|")
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def config_reference() -> str:
    missing = undocumented_keys()
    if missing:
        raise ValueError(f"config keys without a docstring: {', '.join(missing)}")
    out = ["# Config keys", "",
           "Every key of a config file, by section, generated from the dataclasses in "
           "`src/vaswani/config/` (the docstring under each field). Any key can be "
           "set on the command line: `vaswani train CONFIG.toml --set section.key=value`; a "
           "misspelt key is an error naming the closest one.", ""]
    parts = sections()
    for cls in parts:
        hints = typing.get_type_hints(cls, include_extras=False)
        docs = field_docs(cls)
        out += [f"## [{cls.SECTION}]", "", inspect.cleandoc(cls.__doc__ or ""), "",
                "| key | type | default | what |", "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            if hint in parts:  # a section of its own, listed below
                out.append(f"| `{f.name}` | section | its keys below | {_cell(docs[f.name])} |")
                continue
            out.append(f"| `{f.name}` | {_cell(_type_name(hint))} | "
                       f"`{_default(f)}` | {_cell(docs[f.name])} |")
        out.append("")
    return "\n".join(out)


# --- the command line ---------------------------------------------------------------------

def _subcommands(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name), sub


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
        if action.metavar and action.option_strings:
            names += f" `{action.metavar}`" if isinstance(action.metavar, str) else ""
        default = ("" if action.default in (None, False, argparse.SUPPRESS, [])
                   or isinstance(action, argparse._VersionAction) else f"`{action.default}`")
        choices = (f" One of: {', '.join(f'`{c}`' for c in action.choices)}."
                   if action.choices and not isinstance(action.choices, dict) else "")
        what = (action.help or "").replace("%(default)s", str(action.default))
        rows.append(f"| {names} | {_cell(what + choices)} | {default} |")
    return rows


def undocumented_flags() -> list[str]:
    """``command --flag`` for every argument without help text (should be none)."""
    from vaswani.cli import build_parser

    missing = []

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            if not action.help and not isinstance(action, argparse._HelpAction):
                missing.append(f"{path} {(action.option_strings or [action.dest])[0]}")
        for name, _, sub in _subcommands(parser):
            walk(sub, f"{path} {name}")

    walk(build_parser(), "vaswani")
    return missing


def cli_reference() -> str:
    from vaswani.cli import build_parser

    out = ["# Command line", "",
           "Every `vaswani` command and its arguments, generated from the argparse parsers in "
           "`src/vaswani/cli/` (what `vaswani COMMAND --help` prints).", ""]

    def walk(parser, path, summary, depth):
        subs = list(_subcommands(parser))
        out.extend([f"{'#' * min(depth + 2, 4)} `{path}`", ""])
        if summary:
            out.extend([summary[0].upper() + summary[1:] + ".", ""])
        if parser.description and parser.description != summary:
            text = parser.description.strip()
            # a description laid out by hand (RawDescriptionHelpFormatter) stays as it is
            out.extend(["```text", text, "```", ""] if "\n  " in text else [text, ""])
        usage = parser.format_usage().removeprefix("usage: ").strip()
        out.extend(["```text", " ".join(usage.split()), "```", ""])
        rows = _arguments(parser)
        if rows:
            out.extend(["| argument | what | default |", "|---|---|---|", *rows, ""])
        if parser.epilog:
            out.extend(["```text", parser.epilog.strip(), "```", ""])
        for name, helptext, sub in subs:
            walk(sub, f"{path} {name}", helptext, depth + 1)

    walk(build_parser(), "vaswani", None, 0)
    return "\n".join(out)


# --- the code the reading guide walks through ---------------------------------------------

SOURCE_PACKAGES = ("nn", "cpu", "models", "generation")


def source_modules() -> list[Path]:
    """The modules that get a source page (``__init__.py`` included where it holds code)."""
    out = []
    for package in SOURCE_PACKAGES:
        for path in sorted((ROOT / "src" / "vaswani" / package).glob("*.py")):
            if path.name != "__init__.py" or ast.parse(path.read_text()).body[1:]:
                out.append(path)
    return out


def source_uri(path: Path) -> str:
    return f"source/{path.parent.name}/{path.stem}.md"


def top_level_symbols(path: Path) -> dict[str, tuple[int, int]]:
    """Each top-level class and function of a module -> its (first, last) line, decorators
    included."""
    tree = ast.parse(path.read_text())
    return {node.name: (min([node.lineno] + [d.lineno for d in node.decorator_list]),
                        node.end_lineno)
            for node in tree.body
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}


def source_page(path: Path) -> str:
    lines = path.read_text().splitlines()
    rel = path.relative_to(ROOT)
    symbols = top_level_symbols(path)
    first = min((a for a, _ in symbols.values()), default=len(lines) + 1)
    out = [f"# `{rel}`", "",
           f"The code of `{rel}` as it is in this version, one section per class and function "
           "(each with its line numbers in the file). Back to "
           "[Reading the Transformer](../../reading.md).", "",
           "## The module {#module}", "", '```python linenums="1"',
           *lines[:first - 1], "```", ""]
    for name, (a, b) in symbols.items():
        out += [f"## `{name}` {{#{name}}}", "", f"Lines {a}-{b}.", "",
                f'```python linenums="{a}"', *lines[a - 1:b], "```", ""]
    return "\n".join(out)


# --- MkDocs -------------------------------------------------------------------------------

def on_files(files, config):
    from mkdocs.structure.files import File

    pages = {"reference/cli.md": cli_reference(), "reference/config.md": config_reference(),
             "changelog.md": (ROOT / "CHANGELOG.md").read_text()}
    pages.update({source_uri(path): source_page(path) for path in source_modules()})
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    return files
