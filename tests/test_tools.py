"""tools/bump.py and tools/check_versions.py on a throw-away workspace (real files, subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"


def make_pkg(root: Path, dist: str, version: str, deps: list[str], changelog: str,
             extras: dict[str, list[str]] | None = None) -> Path:
    imp = dist.replace("-", "_")
    pkg = root / "packages" / dist
    (pkg / "src" / imp).mkdir(parents=True)
    (pkg / "src" / imp / "__about__.py").write_text(f'__version__ = "{version}"\n')
    extra_toml = ""
    if extras:
        extra_toml = "\n[project.optional-dependencies]\n" + "".join(
            f"{k} = {json.dumps(v)}\n" for k, v in extras.items())
    (pkg / "pyproject.toml").write_text(
        f'[project]\nname = "{dist}"\ndynamic = ["version"]\ndependencies = {json.dumps(deps)}\n'
        + extra_toml
        + f'\n[tool.hatch.version]\npath = "src/{imp}/__about__.py"\n'
    )
    (pkg / "CHANGELOG.md").write_text(changelog)
    return pkg


def run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOLS / tool), *args], capture_output=True,
                          text=True, check=False, timeout=60)


def workspace(tmp_path: Path) -> Path:
    make_pkg(tmp_path, "genmanip-protocol", "0.1.0", ["numpy"],
             "# Changelog\n\n## Unreleased\n\n- Faster codec.\n- New schema.\n\n## 0.1.0\n\n- First.\n")
    make_pkg(tmp_path, "genmanip-eval", "0.1.0", ["genmanip-protocol>=0.1.0,<0.2"],
             "# Changelog\n\n## Unreleased\n\n## 0.1.0\n\n- First.\n",
             extras={"test": ["genmanip-protocol[jpeg]>=0.1; python_version >= '3.10'"]})
    return tmp_path


def test_check_versions_passes_on_consistent_workspace(tmp_path: Path) -> None:
    res = run("check_versions.py", "--root", str(workspace(tmp_path)))
    assert res.returncode == 0, res.stderr
    assert "| genmanip-eval " in res.stdout and "genmanip-protocol>=0.1.0,<0.2" in res.stdout


def test_bump_moves_unreleased_notes_and_check_catches_pins(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    res = run("bump.py", "genmanip-protocol", "0.2.0", "--root", str(root))
    assert res.returncode == 0, res.stderr
    about = root / "packages/genmanip-protocol/src/genmanip_protocol/__about__.py"
    assert about.read_text() == '__version__ = "0.2.0"\n'
    changelog = (root / "packages/genmanip-protocol/CHANGELOG.md").read_text()
    assert changelog == (
        "# Changelog\n\n## Unreleased\n\n## 0.2.0\n\n- Faster codec.\n- New schema.\n\n"
        "## 0.1.0\n\n- First.\n"
    )
    # genmanip-eval pins <0.2: the check must now fail and name the pin.
    res = run("check_versions.py", "--root", str(root))
    assert res.returncode == 1
    assert "genmanip-eval: dependencies pins genmanip-protocol>=0.1.0,<0.2" in res.stderr
    assert "(!)" in res.stdout


def test_check_versions_requires_a_changelog_heading(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    about = root / "packages/genmanip-eval/src/genmanip_eval/__about__.py"
    about.write_text('__version__ = "0.1.1"\n')
    res = run("check_versions.py", "--root", str(root))
    assert res.returncode == 1
    assert "genmanip-eval: version 0.1.1" in res.stderr and "'## 0.1.1'" in res.stderr


def test_bump_refuses_bad_input(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    assert run("bump.py", "genmanip-nope", "0.2.0", "--root", str(root)).returncode == 2
    assert run("bump.py", "genmanip-eval", "two", "--root", str(root)).returncode == 2
    res = run("bump.py", "genmanip-eval", "0.2.0", "--root", str(root))
    assert res.returncode == 1 and "Unreleased' is empty" in res.stderr
    res = run("bump.py", "genmanip-protocol", "0.1.0", "--root", str(root))
    assert res.returncode == 1
    before = (root / "packages/genmanip-protocol/CHANGELOG.md").read_text()
    res = run("bump.py", "genmanip-protocol", "0.3.0", "--root", str(root), "--dry-run")
    assert res.returncode == 0
    assert (root / "packages/genmanip-protocol/CHANGELOG.md").read_text() == before


def test_specifier_fallback_without_packaging() -> None:
    sys.path.insert(0, str(TOOLS))
    try:
        import _workspace as ws
    finally:
        sys.path.remove(str(TOOLS))
    real = ws.specifier_allows
    import builtins

    orig_import = builtins.__import__

    def no_packaging(name: str, *a: object, **k: object) -> object:
        if name.startswith("packaging"):
            raise ImportError(name)
        return orig_import(name, *a, **k)

    builtins.__import__ = no_packaging  # type: ignore[assignment]
    try:
        cases = [(">=0.1.0", "0.1.0", True), (">=0.1.0,<0.2", "0.2.0", False),
                 ("==0.1.*", "0.1.5", True), ("~=0.1.2", "0.1.9", True), ("~=0.1.2", "0.2.0", False),
                 ("!=0.1.0", "0.1.0", False), ("", "9", True)]
        for spec, version, expected in cases:
            assert real(spec, version) is expected, (spec, version)
    finally:
        builtins.__import__ = orig_import
    assert ws.parse_requirement("genmanip-viz[x]>=0.1.0; python_version >= '3.11'") == ("genmanip-viz", ">=0.1.0")
