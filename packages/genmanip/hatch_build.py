"""Hatch build hook: generate the ``gmp(1)`` man page from the real parser at wheel build time.

The page is written to ``build/man/gmp.1`` and shipped as wheel shared data
(``<prefix>/share/man/man1/gmp.1``), so ``man gmp`` works after ``pip install genmanip``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def generate_manpage(root: str | Path, version: str, out: str | Path) -> Path:
    """Render ``gmp.1`` for the source tree at ``root`` into ``out``; returns the path."""
    src = str(Path(root) / "src")
    saved = {k: v for k, v in sys.modules.items() if k == "genmanip" or k.startswith("genmanip.")}
    sys.path.insert(0, src)
    try:
        for k in saved:
            del sys.modules[k]
        from genmanip.cli.manpage import render_manpage

        text = render_manpage(version)
    finally:
        sys.path.remove(src)
        for k in [k for k in sys.modules if k == "genmanip" or k.startswith("genmanip.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


class ManpageBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    """Adds ``share/man/man1/gmp.1`` to the wheel."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        out = Path(self.root) / "build" / "man" / "gmp.1"
        generate_manpage(self.root, self.metadata.version, out)
        build_data.setdefault("shared_data", {})[str(out)] = "share/man/man1/gmp.1"
