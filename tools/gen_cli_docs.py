#!/usr/bin/env python3
"""Generate the command reference of docs/cli.md from the real ``gmp`` parser.

The part of docs/cli.md between the BEGIN/END GENERATED markers is rewritten; the rest is
hand-written. ``--check`` exits 1 (and writes nothing) when the file is out of date.

Usage: python tools/gen_cli_docs.py [--check]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "cli.md"
BEGIN = "<!-- BEGIN GENERATED: gmp command reference (python tools/gen_cli_docs.py) -->"
END = "<!-- END GENERATED -->"


def _load_parser() -> argparse.ArgumentParser:
    # argparse wraps usage lines at the terminal width: fix it so the output is reproducible.
    os.environ["COLUMNS"] = "100"
    sys.path.insert(0, str(ROOT / "packages" / "genmanip" / "src"))
    try:
        from genmanip.cli.parser import build_parser
    finally:
        sys.path.pop(0)
    return build_parser()


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def _options_table(parser: argparse.ArgumentParser) -> list[str]:
    fmt = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        if isinstance(action, argparse._HelpAction):
            continue
        if action.option_strings:
            name = ", ".join(f"`{s}`" for s in action.option_strings)
        else:
            name = f"`{action.metavar or action.dest}`"
        if action.nargs == 0 or not action.option_strings:
            arg = ""
        elif action.choices:
            arg = "`" + "\\|".join(str(c) for c in action.choices) + "`"
        else:
            arg = f"`{action.metavar or action.dest.upper()}`"
        if action.nargs in ("+", "*") and action.option_strings:
            arg += " ..."
        if action.required and action.option_strings:
            arg = (arg + " " if arg else "") + "(required)"
        helptext = fmt._expand_help(action) if action.help else ""
        if not action.option_strings and action.nargs in ("+", "*"):
            name += " ..."
        rows.append(f"| {name} | {arg} | {_md(helptext)} |")
    if not rows:
        return []
    return ["| option | argument | description |", "|---|---|---|", *rows]


def _walk(parser: argparse.ArgumentParser, path: list[str], out: list[str]) -> None:
    subs: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            subs = {n: p for n, p in action.choices.items() if not getattr(p, "_gmp_hidden", False)}
    if path:
        title = "gmp " + " ".join(path)
        out.append(f"### `{title}`")
        out.append("")
        if parser.description:
            out.append(parser.description.strip())
            out.append("")
        out.append("```")
        out.append(parser.format_usage().strip())
        out.append("```")
        out.append("")
        table = _options_table(parser)
        if table:
            out.extend(table)
            out.append("")
        if parser.epilog:
            out.append("```")
            out.append(parser.epilog.strip())
            out.append("```")
            out.append("")
        handler = parser.get_default("handler")
        dist = parser.get_default("dist")
        if handler:
            out.append(f"Handler: `{handler}` ({dist}).")
            out.append("")
    for name, sub in subs.items():
        _walk(sub, [*path, name], out)


def render_reference() -> str:
    """The generated markdown (between the markers, markers excluded)."""
    out: list[str] = []
    _walk(_load_parser(), [], out)
    return "\n".join(out).rstrip() + "\n"


def updated_doc(text: str) -> str:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC}: markers missing ({BEGIN} ... {END})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n\n{render_reference()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if docs/cli.md is out of date")
    args = ap.parse_args(argv)
    text = DOC.read_text(encoding="utf-8")
    new = updated_doc(text)
    if args.check:
        if new != text:
            print(f"error: {DOC.relative_to(ROOT)} is out of date: run python tools/gen_cli_docs.py",
                  file=sys.stderr)
            return 1
        print(f"{DOC.relative_to(ROOT)} is up to date")
        return 0
    if new != text:
        DOC.write_text(new, encoding="utf-8")
        print(f"updated {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
