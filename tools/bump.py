#!/usr/bin/env python3
"""Bump one package's version: rewrite ``__about__.py``, move the CHANGELOG's ``## Unreleased``
notes under a new ``## <version>`` heading (``## Unreleased`` stays, empty), and re-pin the package
in every dependent's pyproject (dependencies and extras) to the lockstep range
``>=<version>,<X.(Y+1)``: a minor bump 0.1.x -> 0.2.0 moves the pins to ``>=0.2.0,<0.3``, a patch
bump raises their lower bound. Prints every change; ``--dry-run`` prints them and writes nothing.

Usage: python tools/bump.py <dist> <version> [--root DIR] [--dry-run]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workspace import ROOT, VERSION_RE, Package, load_packages, normalize, parse_requirement, repin

_PEP440 = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$")
_UNRELEASED = re.compile(r"^##\s+Unreleased\s*$", re.M | re.I)
_NEXT_HEADING = re.compile(r"^##\s+", re.M)


def bump_changelog(text: str, version: str) -> str:
    """Return ``text`` with the Unreleased notes moved under ``## <version>``."""
    if re.search(rf"^##\s+{re.escape(version)}\s*$", text, re.M):
        raise ValueError(f"the changelog already has a '## {version}' heading")
    m = _UNRELEASED.search(text)
    if not m:
        raise ValueError("the changelog has no '## Unreleased' heading")
    body_start = m.end()
    nxt = _NEXT_HEADING.search(text, body_start)
    body_end = nxt.start() if nxt else len(text)
    notes = text[body_start:body_end].strip("\n")
    if not notes.strip():
        raise ValueError("'## Unreleased' is empty: write the release notes first")
    rest = text[body_end:]
    return f"{text[: m.start()]}## Unreleased\n\n## {version}\n\n{notes}\n" + (f"\n{rest}" if rest else "")


def repin_dependents(
    pkgs: dict[str, Package], dist: str, version: str, root: Path
) -> tuple[dict[Path, str], list[str]]:
    """New pyproject texts of every package that depends on ``dist`` (by path, changed ones only)
    and one line per rewritten pin. The texts are edited in place: only the quoted requirement
    strings change, comments and layout stay."""
    texts: dict[Path, str] = {}
    lines: list[str] = []
    for name, pkg in pkgs.items():
        if name == dist:
            continue
        pyproject = pkg.path / "pyproject.toml"
        original = text = pyproject.read_text(encoding="utf-8")
        done: set[str] = set()
        for where, req in pkg.requirements():
            if req in done or parse_requirement(req)[0] != dist:
                continue
            done.add(req)
            new = repin(req, version)
            if new == req:
                continue
            pattern = re.compile(rf"""(["']){re.escape(req)}\1""")
            text, n = pattern.subn(lambda m, new=new: f"{m.group(1)}{new}{m.group(1)}", text)
            if n == 0:
                raise ValueError(f"{pyproject}: cannot find the requirement string {req!r}")
            lines.append(f"{name}: {where}: {req} -> {new} ({pyproject.relative_to(root)})")
        if text != original:
            texts[pyproject] = text
    return texts, lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dist", help="distribution name, e.g. genmanip-eval")
    ap.add_argument("version", help="new version (PEP 440), e.g. 0.2.0")
    ap.add_argument("--root", type=Path, default=ROOT, help="workspace root (default: this repo)")
    ap.add_argument("--dry-run", action="store_true", help="show, do not write")
    args = ap.parse_args(argv)
    if not _PEP440.match(args.version):
        print(f"error: {args.version!r} is not a PEP 440 version like 1.2.3 or 1.2.3rc1", file=sys.stderr)
        return 2
    pkgs = load_packages(args.root.resolve())
    pkg = pkgs.get(normalize(args.dist))
    if pkg is None:
        print(f"error: no package {args.dist!r}; known: {', '.join(sorted(pkgs))}", file=sys.stderr)
        return 2
    if pkg.version == args.version:
        print(f"error: {pkg.name} is already {args.version}", file=sys.stderr)
        return 1
    try:
        changelog = bump_changelog(pkg.changelog.read_text(encoding="utf-8"), args.version)
    except (OSError, ValueError) as exc:
        print(f"error: {pkg.changelog}: {exc}", file=sys.stderr)
        return 1
    about = VERSION_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}{args.version}{m.group(2)}",
                           pkg.about.read_text(encoding="utf-8"), count=1)
    root = args.root.resolve()
    try:
        pyprojects, pins = repin_dependents(pkgs, pkg.name, args.version, root)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.dry_run:
        print(f"would set {pkg.about} to {args.version} and add '## {args.version}' to {pkg.changelog}")
        for line in pins:
            print(f"would pin {line}")
        return 0
    pkg.about.write_text(about, encoding="utf-8")
    pkg.changelog.write_text(changelog, encoding="utf-8")
    for path, text in pyprojects.items():
        path.write_text(text, encoding="utf-8")
    print(f"{pkg.name}: {pkg.version} -> {args.version}")
    for line in pins:
        print(f"pinned {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
