"""``gmp --version``: installed ``genmanip*`` distributions and their versions (stdlib only)."""

from __future__ import annotations

import importlib.util
import platform
import re
import sys
from importlib import metadata
from pathlib import Path

__all__ = ["KNOWN_DISTRIBUTIONS", "format_versions", "installed_distributions"]

#: Distribution name -> import name of every package of the gmp workspace.
KNOWN_DISTRIBUTIONS: dict[str, str] = {
    "genmanip": "genmanip",
    "genmanip-protocol": "genmanip_protocol",
    "genmanip-runtime": "genmanip_runtime",
    "genmanip-results": "genmanip_results",
    "genmanip-eval": "genmanip_eval",
    "genmanip-testbed": "genmanip_testbed",
    "genmanip-artifacts": "genmanip_artifacts",
    "genmanip-viz": "genmanip_viz",
    "genmanip-online": "genmanip_online",
    "genmanip-leaderboard": "genmanip_leaderboard",
}

_VERSION_RE = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.M)


def _source_version(import_name: str) -> tuple[str, str] | None:
    """Version and location of an importable but not installed package, read without importing
    it (importing would pull in numpy and defeat a fast ``--version``)."""
    try:
        spec = importlib.util.find_spec(import_name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        about = Path(loc) / "__about__.py"
        try:
            m = _VERSION_RE.search(about.read_text(encoding="utf-8"))
        except OSError:
            continue
        if m:
            return m.group(1), str(Path(loc))
    return None


def installed_distributions() -> list[tuple[str, str]]:
    """``(name, version)`` of every ``genmanip*`` distribution, sorted.

    Installed distributions come from their metadata (names normalised: ``genmanip_eval`` ->
    ``genmanip-eval``; the first found wins when one is on ``sys.path`` twice). Workspace packages
    that are importable without being installed (a source checkout on ``sys.path``) are listed
    with ``"<version> (source: <dir>)"``.
    """
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").strip()
        norm = re.sub(r"[-_.]+", "-", name).lower()
        if norm.startswith("genmanip") and norm not in found:
            found[norm] = dist.version
    for dist_name, import_name in KNOWN_DISTRIBUTIONS.items():
        if dist_name in found:
            continue
        src = _source_version(import_name)
        if src is not None:
            found[dist_name] = f"{src[0]} (source: {src[1]})"
    return sorted(found.items())


def format_versions() -> str:
    """The text printed by ``gmp --version`` (ends with a newline)."""
    dists = installed_distributions()
    width = max([len(n) for n, _ in dists] + [len("python")])
    lines = [f"{name:<{width}}  {version}" for name, version in dists]
    impl = platform.python_implementation()
    lines.append(f"{'python':<{width}}  {impl} {sys.version.split()[0]}")
    return "\n".join(lines) + "\n"
