#!/usr/bin/env python3
"""Check the docs: every relative link in README.md, docs/*.md and packages/*/README.md points
at an existing file (and heading anchors exist), and the gmp(1) man page builds.

Usage: python tools/check_docs.py [--man-out build/man/gmp.1]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK_RE = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_RE = re.compile(r"```.*?```", re.S)


def _anchors(md: Path) -> set[str]:
    out = set()
    for line in CODE_RE.sub("", md.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def check_links(root: Path) -> list[str]:
    problems = []
    files = [root / "README.md", *sorted((root / "docs").glob("*.md")),
             *sorted((root / "packages").glob("*/README.md"))]
    for md in files:
        if not md.exists():
            problems.append(f"{md.relative_to(root)}: missing")
            continue
        text = CODE_RE.sub("", md.read_text(encoding="utf-8"))
        for target in LINK_RE.findall(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            if not dest.exists():
                problems.append(f"{md.relative_to(root)}: broken link {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                problems.append(f"{md.relative_to(root)}: no heading for #{anchor} in {path or md.name}")
    return problems


def build_manpage(root: Path, out: Path) -> Path:
    """Render gmp.1 from the source tree (what the wheel build hook ships)."""
    sys.path.insert(0, str(root / "packages/genmanip/src"))
    try:
        from genmanip.cli.manpage import render_manpage
    finally:
        sys.path.pop(0)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_manpage(), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--man-out", type=Path, default=ROOT / "build" / "man" / "gmp.1")
    args = ap.parse_args(argv)
    problems = check_links(ROOT)
    man = build_manpage(ROOT, args.man_out)
    sys.path.insert(0, str(ROOT / "tools"))
    from gen_cli_docs import DOC, updated_doc

    if updated_doc(DOC.read_text(encoding="utf-8")) != DOC.read_text(encoding="utf-8"):
        problems.append("docs/cli.md: command reference is stale: run python tools/gen_cli_docs.py")
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    print(f"man page: {man} ({man.stat().st_size} bytes)")
    if problems:
        return 1
    print("docs ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
