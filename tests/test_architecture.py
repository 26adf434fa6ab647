"""The workspace's structure, enforced: one owner per concern, dependencies flowing one way.

* (a) every ``genmanip*`` import of a package is declared in its ``pyproject.toml``;
* (b) library code never imports, nor names in a string, a package above it (or an undeclared
  sibling of its own floor);
* (c) results-tree names are spelled only in ``genmanip_results.layout``;
* (d) the ``genmanip_protocol`` facade exports only the wire vocabulary.

Sources are parsed with :mod:`ast`, not imported (a module that fails to import still gets
checked); only ``genmanip_results.layout`` (for its values) and the ``genmanip_protocol`` facade
(for its exports) are imported. Every failure lists every offence as ``file:line: what``; a string
is reported at the line where it starts (for implicitly concatenated f-strings on Python < 3.12,
where the whole expression starts).
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import FunctionType
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10: the same parser under its PyPI name
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "packages"

#: The layering, bottom up. A library may use what is on a lower floor; on its own floor only
#: what its ``[project] dependencies`` declare; never anything above. The meta package ``genmanip``
#: (the ``gmp`` command) sits on top and may use everything.
FLOORS: dict[str, int] = {
    "genmanip-protocol": 0,
    "genmanip-runtime": 1,
    "genmanip-results": 2,
    "genmanip-eval": 3,
    "genmanip-online": 3,
    "genmanip-leaderboard": 3,
    "genmanip-testbed": 3,
    "genmanip-artifacts": 4,
    "genmanip-viz": 4,
    "genmanip-serve": 4,
    "genmanip-ray": 4,
    "genmanip": 5,
}

#: Layout constants too generic to police by value: they are also ordinary suffixes outside any
#: results tree (``manifest.json``/``openapi.json``, genmanip-runtime's generic ``<stem>.lock``
#: lock files, leaderboard's lists of media suffixes ``(".mp4", ..., ".rrd")`` and of
#: already-compressed ones ``(..., ".jpg", ...)``), so matching them would only report noise.
GENERIC_LAYOUT_VALUES = frozenset({".json", ".lock", ".mp4", ".rrd", ".jpg"})

#: The `gmp` parser is stdlib-only and is imported at wheel-build time (the man page) where no
#: sibling is installed, so its help texts and defaults spell the few layout names they show.
#: Each such literal is pinned to its layout constant by test_parser_layout_literals_match below.
PARSER_SPELLINGS: dict[str, frozenset[str]] = {
    "packages/genmanip/src/genmanip/cli/manpage.py": frozenset({"GENMANIP_RESULT_DIR"}),
    "packages/genmanip/src/genmanip/cli/specs/eval.py": frozenset({"gmp-demo"}),
}


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(req: str) -> str:
    """``"genmanip-results[video]>=0.1; python_version>'3'"`` -> ``"genmanip-results"``."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    assert m, f"cannot parse requirement {req!r}"
    return _normalize(m.group(1))


@dataclass(frozen=True)
class Dist:
    """One ``packages/<dist>/`` of the workspace, as its pyproject declares it."""

    name: str
    path: Path
    #: The top-level import packages its wheel ships (genmanip-eval ships two).
    import_names: tuple[str, ...]
    #: ``[project] dependencies`` (normalized distribution names).
    deps: frozenset[str]
    #: ``deps`` plus the ``test`` extra: what its tests may import.
    test_deps: frozenset[str]


@cache
def workspace() -> dict[str, Dist]:
    """Every workspace distribution by name, read from ``packages/*/pyproject.toml``."""
    dists: dict[str, Dist] = {}
    for pp in sorted(PACKAGES.glob("*/pyproject.toml")):
        data = tomllib.loads(pp.read_text(encoding="utf-8"))
        project = data["project"]
        wheel = data["tool"]["hatch"]["build"]["targets"]["wheel"]
        imports = tuple(Path(p).name for p in wheel["packages"])
        deps = frozenset(_requirement_name(r) for r in project.get("dependencies", []))
        test = project.get("optional-dependencies", {}).get("test", [])
        name = _normalize(project["name"])
        dists[name] = Dist(
            name, pp.parent, imports, deps, deps | {_requirement_name(r) for r in test}
        )
    return dists


@cache
def import_owner() -> dict[str, str]:
    """Top-level import name -> the distribution whose wheel ships it."""
    return {imp: d.name for d in workspace().values() for imp in d.import_names}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _files(dist: Dist, part: str) -> list[Path]:
    return sorted((dist.path / part).rglob("*.py"))


def imports_of(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of every absolute import, including ``importlib.import_module("x")``
    and ``__import__("x")`` with a literal name (a dynamic import is still an import)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                yield node.lineno, node.module
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            arg = node.args[0]
            if (
                fname in ("import_module", "__import__")
                and isinstance(arg, ast.Constant)
                and isinstance(arg.value, str)
            ):
                yield node.lineno, arg.value


def strings_of(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, text)`` of every string constant that is code: f-string pieces included;
    docstrings and other bare string statements (which do nothing at run time) left out."""
    bare: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            bare.add(id(node.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in bare:
            yield node.lineno, node.value


@cache
def _meta_modules() -> frozenset[str]:
    """The modules directly inside the meta package ``genmanip`` (``genmanip.cli``, ...)."""
    src = PACKAGES / "genmanip" / "src" / "genmanip"
    return frozenset(p.stem for p in src.iterdir() if p.suffix == ".py" or p.is_dir())


_IMPORT_NAME = re.compile(r"\bgenmanip_[a-z0-9_]*[a-z0-9]\b")
_DIST_NAME = re.compile(r"(?<![\w-])genmanip-[a-z0-9-]*[a-z0-9](?![\w-])")
# The meta package is plain "genmanip", a word that is everywhere ("GenManip server", the
# "genmanip.episode_hooks" entry-point group, "x-genmanip-msgpack"), so only its unambiguous
# spellings count: a pip spec with extras, "install genmanip", or a path into one of its real
# submodules ("genmanip.cli.main", "genmanip.demo:run"; not "genmanip.policy_providers", the
# entry-point group named after the module that fills it).
_META_EXTRAS = re.compile(r"(?<![\w.-])genmanip\[")
_META_INSTALL = re.compile(r"\binstall\s+['\"]?genmanip(?![\w-])")
_META_MODULE = re.compile(r"(?<![\w.-])genmanip\.([A-Za-z_]\w*)(?=[.:])")


def named_packages(text: str) -> set[tuple[str, str]]:
    """``(distribution, spelling)`` of every workspace package a string names."""
    owners = import_owner()
    found: set[tuple[str, str]] = set()
    for m in _IMPORT_NAME.finditer(text):
        if m.group(0) in owners:
            found.add((owners[m.group(0)], m.group(0)))
    for m in _DIST_NAME.finditer(text):
        if m.group(0) in workspace():
            found.add((m.group(0), m.group(0)))
    for m in (*_META_EXTRAS.finditer(text), *_META_INSTALL.finditer(text)):
        found.add(("genmanip", m.group(0)))
    for m in _META_MODULE.finditer(text):
        if m.group(1) in _meta_modules():
            found.add(("genmanip", m.group(0)))
    return found


#: One offence: file (relative to the repository), line, what is wrong there.
Offence = tuple[str, int, str]


def _fail_on(title: str, offences: Iterable[Offence]) -> None:
    """Fail listing every offence as ``file:line: what``, in file and line order."""
    found = sorted(set(offences))
    if found:
        lines = "\n  ".join(f"{f}:{line}: {what}" for f, line, what in found)
        pytest.fail(f"{len(found)} offence(s): {title}\n  {lines}", pytrace=False)


# --------------------------------------------------------------------------------------------
# The scanners see what they should (so the structural tests cannot pass by seeing nothing)


def test_scanners_find_imports_strings_and_packages() -> None:
    tree = ast.parse(
        '"""Docstring naming genmanip_testbed."""\n'
        "import genmanip_results.layout\n"
        "from genmanip_runtime import atomic\n"
        "from . import sibling\n"
        "importlib.import_module('genmanip_testbed.policies')\n"
        "x = f'{root}/saved/eval_results'\n"
    )
    assert sorted(imports_of(tree)) == [
        (2, "genmanip_results.layout"),
        (3, "genmanip_runtime"),
        (5, "genmanip_testbed.policies"),
    ]
    assert [s for _, s in strings_of(tree)] == ["genmanip_testbed.policies", "/saved/eval_results"]
    assert named_packages("pip install genmanip-testbed (or 'genmanip[testbed]')") == {
        ("genmanip-testbed", "genmanip-testbed"),
        ("genmanip", "genmanip["),
    }
    assert named_packages("genmanip_client.EvalClient") == {("genmanip-eval", "genmanip_client")}
    assert named_packages("genmanip.cli.main") == {("genmanip", "genmanip.cli")}
    # Not package names: an entry-point group, a content type, a viewer file, our own wording.
    for text in (
        "genmanip.episode_hooks",
        "application/x-genmanip-msgpack",
        ".genmanip_vis.rrd",
        "the GenManip server",
    ):
        assert named_packages(text) == set(), text


def test_workspace_is_fully_mapped() -> None:
    dists = workspace()
    assert import_owner()["genmanip_client"] == "genmanip-eval"
    problems: list[Offence] = [
        (_rel(d.path / "pyproject.toml"), 1, f"{d.name} has no floor in FLOORS")
        for d in dists.values()
        if d.name not in FLOORS
    ]
    problems += [
        (_rel(Path(__file__)), 1, f"FLOORS names {n}, which is not a workspace package")
        for n in FLOORS
        if n not in dists
    ]
    _fail_on("workspace packages vs FLOORS", problems)


# --------------------------------------------------------------------------------------------
# (a) declared dependencies


def test_imports_of_workspace_packages_are_declared() -> None:
    """src/ may import only its ``[project] dependencies``; tests/ also its ``test`` extra."""
    owners = import_owner()
    offences: list[Offence] = []
    for dist in workspace().values():
        for part, allowed, what in (
            ("src", dist.deps, "[project] dependencies"),
            ("tests", dist.test_deps, "[project] dependencies or the test extra"),
        ):
            for path in _files(dist, part):
                for line, module in imports_of(_parse(path)):
                    top = module.split(".")[0]
                    if not top.startswith("genmanip"):
                        continue
                    owner = owners.get(top)
                    if owner is None:
                        why = f"imports {module}, which no workspace package ships"
                        offences.append((_rel(path), line, why))
                    elif owner != dist.name and owner not in allowed:
                        why = f"imports {module} ({owner}), not in {what} of {dist.name}"
                        offences.append((_rel(path), line, why))
    _fail_on("imports of undeclared workspace packages", offences)


# --------------------------------------------------------------------------------------------
# (b) layering


def _layer_offence(dist: Dist, target: str) -> str | None:
    """Why ``dist`` may not use ``target`` (``None``: it may)."""
    mine, theirs = FLOORS.get(dist.name), FLOORS.get(target)
    if target == dist.name or mine is None or theirs is None:
        return None  # unmapped packages are reported by test_workspace_is_fully_mapped
    if theirs > mine:
        return f"{target} is above {dist.name} (floor {theirs} > {mine})"
    if theirs == mine and target not in dist.deps:
        return f"{target} is a same-floor sibling {dist.name} does not declare (floor {mine})"
    return None


def test_library_code_uses_nothing_above_it() -> None:
    """Neither an import nor a string (install hint, ``import_module`` name, handler path) of
    a library names a package above it or an undeclared sibling of its floor."""
    owners = import_owner()
    offences: dict[tuple[str, int, str], str] = {}
    for dist in workspace().values():
        for path in _files(dist, "src"):
            tree = _parse(path)
            for line, module in imports_of(tree):
                target = owners.get(module.split(".")[0])
                why = None if target is None else _layer_offence(dist, target)
                if target is not None and why is not None:
                    offences[(_rel(path), line, target)] = f"imports {module}: {why}"
            for line, text in strings_of(tree):
                for target, spelling in sorted(named_packages(text)):
                    why = _layer_offence(dist, target)
                    # An import_module("x") call is reported once, as the import it is.
                    if why is not None and (_rel(path), line, target) not in offences:
                        shown = text if len(text) <= 70 else text[:67] + "..."
                        offences[(_rel(path), line, target)] = (
                            f"names {spelling!r} in the string {shown!r}: {why}"
                        )
    _fail_on(
        "library code reaching up the layering",
        ((f, line, what) for (f, line, _), what in offences.items()),
    )


# --------------------------------------------------------------------------------------------
# (c) results-tree names live in genmanip_results.layout


def layout_names() -> dict[str, str]:
    """Value -> constant name of every upper-case str constant of ``genmanip_results.layout``
    (minus :data:`GENERIC_LAYOUT_VALUES`)."""
    layout = importlib.import_module("genmanip_results.layout")
    names = {
        value: name
        for name, value in vars(layout).items()
        if name.isupper() and isinstance(value, str) and value not in GENERIC_LAYOUT_VALUES
    }
    # The names every results reader and writer agreed on; losing one would blind this test.
    for must in (
        "INCOMPLETE",
        "run.json",
        "steps.jsonl",
        ".live",
        "submitted.flag",
        "result.json",
        "episode_result.json",
        "result_info.json",
        "progress.json",
        "meta_record.pkl",
        ".frames",
        "eval_results",
        "client_results",
        ".awaiting_result.",
        ".pending_result.",
    ):
        assert must in names, f"genmanip_results.layout no longer defines {must!r}"
    return names


def layout_literals(text: str, names: dict[str, str]) -> list[str]:
    """The layout constants ``text`` spells: the whole string, a segment of a path-like string
    (no whitespace: ``"saved/eval_results"``, the ``"/steps.jsonl"`` of an f-string), or
    anywhere for the dotted note prefixes (``.awaiting_result.``, ``.pending_result.``)."""
    hits = {names[text]} if text in names else set()
    if "/" in text and not any(c.isspace() for c in text):
        hits |= {names[seg] for seg in text.split("/") if seg in names}
    hits |= {
        name
        for value, name in names.items()
        if value.startswith(".") and value.endswith(".") and value in text
    }
    return sorted(hits)


#: Heavy third-party engines that exactly one distribution may import (its own concern).
OWNED_IMPORTS: dict[str, str] = {"ray": "genmanip-ray"}


def test_ray_is_imported_only_by_genmanip_ray() -> None:
    """Ray stays out of every other import path: only genmanip-ray (src and tests) imports it."""
    offences: list[Offence] = []
    for dist in workspace().values():
        for part in ("src", "tests"):
            for path in _files(dist, part):
                for line, module in imports_of(_parse(path)):
                    owner = OWNED_IMPORTS.get(module.split(".")[0])
                    if owner is not None and owner != dist.name:
                        offences.append((_rel(path), line, f"imports {module}: only {owner} may"))
    _fail_on("imports of an engine owned by another distribution", offences)


def test_layout_names_are_spelled_only_in_genmanip_results() -> None:
    names = layout_names()
    offences: list[Offence] = []
    for dist in workspace().values():
        if dist.name == "genmanip-results":
            continue
        for path in _files(dist, "src"):
            allowed = PARSER_SPELLINGS.get(_rel(path), frozenset())
            for line, text in strings_of(_parse(path)):
                hits = layout_literals(text, names)
                if hits and text not in allowed:
                    spelled = ", ".join(f"layout.{h}" for h in hits)
                    offences.append((_rel(path), line, f"{text!r} spells {spelled}"))
    _fail_on(
        "results-tree names spelled outside genmanip_results.layout (import them from there)",
        offences,
    )


def test_layout_matcher() -> None:
    names = {
        "saved": "SAVED_DIR",
        "eval_results": "EVAL_RESULTS_DIR",
        ".pending_result.": "PENDING_NOTE_PREFIX",
        "steps.jsonl": "STEPS_JSONL",
    }
    assert layout_literals("saved", names) == ["SAVED_DIR"]
    assert layout_literals("/saved/eval_results", names) == ["EVAL_RESULTS_DIR", "SAVED_DIR"]
    assert layout_literals(".pending_result.*.json", names) == ["PENDING_NOTE_PREFIX"]
    # Prose may mention a name; only the spelling a program uses counts.
    assert layout_literals("no steps.jsonl here", names) == []
    assert layout_literals("unsaved", names) == []


# --------------------------------------------------------------------------------------------
# (d) the protocol facade is the wire vocabulary only


def _defined_names(dist: str) -> dict[str, str]:
    """Name -> module of every ``__all__`` name defined (not imported) in a module of ``dist``."""
    out: dict[str, str] = {}
    src = workspace()[dist].path / "src"
    for path in sorted(src.rglob("*.py")):
        tree = _parse(path)
        module = ".".join(path.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
        exported: set[str] = set()
        defined: set[str] = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            targets: list[ast.expr] = []
            value: ast.expr | None = None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign):
                targets, value = [node.target], node.value
            for t in targets:
                if isinstance(t, ast.Name):
                    defined.add(t.id)
                    if t.id == "__all__" and isinstance(value, (ast.List, ast.Tuple)):
                        exported |= {
                            e.value
                            for e in value.elts
                            if isinstance(e, ast.Constant) and isinstance(e.value, str)
                        }
        for name in (exported & defined) - {"__all__"}:
            if not name.startswith("__"):
                out[name] = module
    return out


def test_protocol_facade_exports_only_wire_vocabulary() -> None:
    import genmanip_protocol

    above = ("genmanip_runtime", "genmanip_results")
    offences: list[Offence] = []
    init = workspace()["genmanip-protocol"].path / "src" / "genmanip_protocol" / "__init__.py"
    for line, module in imports_of(_parse(init)):
        if module.split(".")[0] in above:
            offences.append((_rel(init), line, f"imports {module}"))
    all_line = next(
        (
            n.lineno
            for n in _parse(init).body
            if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
        ),
        1,
    )
    elsewhere = {**_defined_names("genmanip-runtime"), **_defined_names("genmanip-results")}
    for name in genmanip_protocol.__all__:
        obj: Any = getattr(genmanip_protocol, name, None)
        origin = getattr(obj, "__module__", None) if isinstance(obj, (type, FunctionType)) else None
        if isinstance(origin, str) and origin.split(".")[0] in above:
            offences.append((_rel(init), all_line, f"__all__ exports {name}, i.e. {origin}.{name}"))
        elif name in elsewhere and origin is None:
            # A constant has no __module__: it is runtime's/results' own only if it is that object.
            owner = importlib.import_module(elsewhere[name])
            if getattr(owner, name, object()) is obj:
                what = f"__all__ exports {name}, i.e. {elsewhere[name]}.{name}"
                offences.append((_rel(init), all_line, what))
    _fail_on("genmanip_protocol exports names of genmanip-runtime/genmanip-results", offences)


def test_parser_layout_literals_match() -> None:
    # The parser's spellings (PARSER_SPELLINGS) are the layout's names, value for value.
    from genmanip.cli.manpage import ENVIRONMENT
    from genmanip.cli.parser import build_parser
    from genmanip_results import layout

    assert (layout.RESULTS_DIR_ENV, f"results root (default ./{layout.CLIENT_RESULTS_DIR})") in ENVIRONMENT
    demo = build_parser().parse_args(["demo"])
    assert demo.results_dir == layout.DEMO_RESULTS_DIR
    spelled = set().union(*PARSER_SPELLINGS.values())
    assert spelled <= set(layout_names())
