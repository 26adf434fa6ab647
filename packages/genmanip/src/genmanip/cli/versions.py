"""``gmp --version``: installed ``genmanip*`` distributions and their versions (stdlib only)."""

from __future__ import annotations

import platform
import sys
from importlib import metadata

__all__ = ["format_versions", "installed_distributions"]


def installed_distributions() -> list[tuple[str, str]]:
    """``(name, version)`` of every installed distribution whose name starts with ``genmanip``.

    Names are normalised (``genmanip_eval`` -> ``genmanip-eval``), sorted, deduplicated (a package
    on ``sys.path`` twice, e.g. installed and editable, is listed once: the first one found).
    """
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").strip()
        norm = name.lower().replace("_", "-").replace(".", "-")
        if norm.startswith("genmanip") and norm not in found:
            found[norm] = dist.version
    return sorted(found.items())


def format_versions() -> str:
    """The text printed by ``gmp --version`` (ends with a newline)."""
    lines = []
    dists = installed_distributions()
    width = max((len(n) for n, _ in dists), default=8)
    for name, version in dists:
        lines.append(f"{name:<{width}}  {version}")
    if not dists:
        # Running from a source tree without installing: still say which gmp this is.
        from genmanip.__about__ import __version__

        lines.append(f"{'genmanip':<{width}}  {__version__} (not installed)")
    impl = platform.python_implementation()
    lines.append(f"{'python':<{width}}  {impl} {sys.version.split()[0]}")
    return "\n".join(lines) + "\n"
