#!/usr/bin/env python3
"""Check the workspace's versions: every package version has a CHANGELOG heading, and every
sibling pin (``genmanip-protocol>=0.1.0,<0.2`` in another package's pyproject, dependencies and
extras alike) has the lockstep form ``>=X.Y.Z,<X.(Y+1)`` and admits the sibling's current version
(a bare lower bound is a problem). Prints a table; exits 1 listing every problem.

Usage: python tools/check_versions.py [--root DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workspace import (
    ROOT,
    load_packages,
    lockstep_problem,
    lockstep_spec,
    parse_requirement,
    specifier_allows,
)


def check(root: Path) -> tuple[list[list[str]], list[str]]:
    """Return (table rows, problems)."""
    pkgs = load_packages(root)
    rows: list[list[str]] = []
    problems: list[str] = []
    for name, pkg in pkgs.items():
        headings = pkg.changelog_headings()
        has_heading = pkg.version in headings
        if not pkg.changelog.exists():
            problems.append(f"{name}: {pkg.changelog.relative_to(root)} is missing")
        elif not has_heading:
            problems.append(
                f"{name}: version {pkg.version} ({pkg.about.relative_to(root)}) has no "
                f"'## {pkg.version}' heading in {pkg.changelog.relative_to(root)}"
            )
        pins = []
        for where, req in pkg.requirements():
            dep, spec = parse_requirement(req)
            if dep not in pkgs or dep == name:
                continue
            sibling = pkgs[dep].version
            admits = specifier_allows(spec, sibling)
            form = lockstep_problem(spec)
            pins.append(f"{dep}{spec or ''}{'' if admits and form is None else ' (!)'}")
            expected = f"expected the lockstep pin {dep}{lockstep_spec(sibling)}"
            if not admits:
                problems.append(
                    f"{name}: {where} pins {dep}{spec}, which excludes the workspace's "
                    f"{dep} {sibling}; {expected}"
                )
            elif form is not None:
                problems.append(f"{name}: {where} pins {dep}{spec or ' (any version)'}, {form}; {expected}")
        rows.append([name, pkg.version, "yes" if has_heading else "NO", ", ".join(sorted(set(pins))) or "-"])
    return rows, problems


def render(rows: list[list[str]]) -> str:
    headers = ["package", "version", "changelog", "sibling pins"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out.extend(line(r) for r in rows)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="workspace root (default: this repo)")
    args = ap.parse_args(argv)
    rows, problems = check(args.root.resolve())
    print(render(rows))
    if problems:
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        return 1
    print(f"ok: {len(rows)} packages consistent", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
