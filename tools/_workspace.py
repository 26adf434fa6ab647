"""Shared helpers of the workspace tools: find packages, read versions and changelogs (stdlib)."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
VERSION_RE = re.compile(r"""^(__version__\s*=\s*)(["'])([^"']+)\2""", re.M)
HEADING_RE = re.compile(r"^##\s+(.+?)\s*$", re.M)


@dataclass
class Package:
    """One ``packages/<dist>/`` member of the workspace."""

    name: str
    path: Path
    about: Path
    version: str
    pyproject: dict[str, Any] = field(repr=False)

    @property
    def changelog(self) -> Path:
        return self.path / "CHANGELOG.md"

    def changelog_headings(self) -> list[str]:
        try:
            text = self.changelog.read_text(encoding="utf-8")
        except OSError:
            return []
        return [h.strip() for h in HEADING_RE.findall(text)]

    def requirements(self) -> list[tuple[str, str]]:
        """``(where, requirement)`` of every dependency and optional dependency."""
        project = self.pyproject.get("project", {})
        out = [("dependencies", r) for r in project.get("dependencies", [])]
        for extra, reqs in project.get("optional-dependencies", {}).items():
            out.extend((f"optional-dependencies.{extra}", r) for r in reqs)
        return out


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def load_packages(root: Path = ROOT) -> dict[str, Package]:
    """Every ``packages/*/pyproject.toml`` with a hatch version file, by normalised name."""
    pkgs: dict[str, Package] = {}
    for pp in sorted((root / "packages").glob("*/pyproject.toml")):
        data = tomllib.loads(pp.read_text(encoding="utf-8"))
        name = data.get("project", {}).get("name")
        vpath = data.get("tool", {}).get("hatch", {}).get("version", {}).get("path")
        if not name or not vpath:
            raise SystemExit(f"{pp}: needs [project].name and [tool.hatch.version].path")
        about = pp.parent / vpath
        m = VERSION_RE.search(about.read_text(encoding="utf-8"))
        if not m:
            raise SystemExit(f"{about}: no __version__ = \"...\" line")
        pkgs[normalize(name)] = Package(normalize(name), pp.parent, about, m.group(3), data)
    return pkgs


def parse_requirement(req: str) -> tuple[str, str]:
    """``"genmanip-eval[x]>=0.1,<1; python_version>'3'"`` -> ``("genmanip-eval", ">=0.1,<1")``."""
    req = req.split(";", 1)[0].strip()
    m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$", req)
    if not m:
        raise ValueError(f"cannot parse requirement {req!r}")
    return normalize(m.group(1)), m.group(3).strip().strip("()")


def split_requirement(req: str) -> tuple[str, str, str, str]:
    """``"genmanip-viz[x] >=0.1.0 ; python_version >= '3.11'"`` -> ``("genmanip-viz", "[x]",
    ">=0.1.0", " ; python_version >= '3.11'")``: name and extras as written, the specifier, and the
    rest (marker with its separator, or ``""``), so that a pin can be rewritten in place."""
    m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([^;]*?)(\s*;.*)?$", req, re.S)
    if not m:
        raise ValueError(f"cannot parse requirement {req!r}")
    return m.group(1), m.group(2) or "", m.group(3).strip(), m.group(4) or ""


def next_minor(version: str) -> str:
    """``"0.1.3"`` -> ``"0.2"``: the exclusive upper bound of a lockstep pin on ``version``."""
    m = re.match(r"^\s*v?(\d+)(?:\.(\d+))?", version)
    if not m:
        raise ValueError(f"not a version: {version!r}")
    return f"{int(m.group(1))}.{int(m.group(2) or 0) + 1}"


def lockstep_spec(version: str) -> str:
    """``"0.1.3"`` -> ``">=0.1.3,<0.2"``: how a sibling pins a workspace package at ``version``."""
    return f">={version},<{next_minor(version)}"


def repin(req: str, version: str) -> str:
    """``req`` with its specifier replaced by :func:`lockstep_spec` of ``version`` (the name, the
    extras brackets and the environment marker are kept as written)."""
    name, extras, _spec, rest = split_requirement(req)
    return f"{name}{extras}{lockstep_spec(version)}{rest}"


def lockstep_problem(spec: str) -> str | None:
    """``None`` when ``spec`` has the lockstep form ``>=X.Y.Z,<X.(Y+1)`` (one minor series from
    its lower bound on); else what is wrong with it. Whether it admits a version is
    :func:`specifier_allows`."""
    bounds: dict[str, str] = {}
    for raw in spec.split(",") if spec.strip() else []:
        m = re.match(r"^\s*(~=|===|==|!=|<=|>=|<|>)\s*(\S+)\s*$", raw)
        if not m or m.group(1) not in (">=", "<") or m.group(1) in bounds:
            return "not of the form >=X.Y.Z,<X.(Y+1)"
        bounds[m.group(1)] = m.group(2)
    if ">=" not in bounds:
        return "no lower bound"
    if "<" not in bounds:
        return "a bare lower bound"
    try:
        upper = next_minor(bounds[">="])
        ok = _release(bounds["<"]) == _release(upper)
    except ValueError:
        return "not of the form >=X.Y.Z,<X.(Y+1)"
    if not ok:
        return f"an upper bound other than the next minor (<{upper})"
    return None


def _release(v: str) -> tuple[int, ...]:
    m = re.match(r"^\s*v?(\d+(?:\.\d+)*)", v)
    if not m:
        raise ValueError(f"not a version: {v!r}")
    parts = [int(x) for x in m.group(1).split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def specifier_allows(spec: str, version: str) -> bool:
    """Whether PEP 440 ``spec`` (``">=0.1.0,<2"``) admits ``version``.

    Uses ``packaging`` when installed; otherwise compares release numbers (enough for the
    workspace's ``X.Y.Z`` versions).
    """
    if not spec:
        return True
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version
    except ImportError:
        pass
    else:
        return Version(version) in SpecifierSet(spec, prereleases=True)
    v = _release(version)
    for raw in spec.split(","):
        clause = raw.strip()
        m = re.match(r"^(~=|==|!=|<=|>=|<|>|===)\s*(.+)$", clause)
        if not m:
            raise ValueError(f"cannot parse specifier {clause!r}")
        op, target = m.groups()
        if op in ("==", "===", "!=") and target.endswith(".*"):
            prefix = _release(target[:-2])
            hit = v[: len(prefix)] == prefix
            ok = hit if op != "!=" else not hit
        else:
            t = _release(target)
            ok = {
                "==": v == t, "===": v == t, "!=": v != t, "<=": v <= t, ">=": v >= t,
                "<": v < t, ">": v > t,
                "~=": v >= t and v[: max(1, len(target.split(".")) - 1)]
                == _release(target)[: max(1, len(target.split(".")) - 1)],
            }[op]
        if not ok:
            return False
    return True
