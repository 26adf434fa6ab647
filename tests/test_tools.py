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
             extras={"test": ["genmanip-protocol[jpeg]>=0.1.0,<0.2; python_version >= '3.10'"]})
    return tmp_path


def pyproject(root: Path, dist: str) -> str:
    return (root / "packages" / dist / "pyproject.toml").read_text()


def test_check_versions_passes_on_consistent_workspace(tmp_path: Path) -> None:
    res = run("check_versions.py", "--root", str(workspace(tmp_path)))
    assert res.returncode == 0, res.stderr
    assert "| genmanip-eval " in res.stdout and "genmanip-protocol>=0.1.0,<0.2" in res.stdout


def test_bump_moves_unreleased_notes_and_repins_dependents(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    make_pkg(root, "genmanip-viz", "0.1.0", ["genmanip-eval>=0.1.0,<0.2", "numpy>=1.24"],
             "# Changelog\n\n## Unreleased\n\n## 0.1.0\n\n- First.\n")
    viz_before = pyproject(root, "genmanip-viz")
    res = run("bump.py", "genmanip-protocol", "0.2.0", "--root", str(root))
    assert res.returncode == 0, res.stderr
    about = root / "packages/genmanip-protocol/src/genmanip_protocol/__about__.py"
    assert about.read_text() == '__version__ = "0.2.0"\n'
    changelog = (root / "packages/genmanip-protocol/CHANGELOG.md").read_text()
    assert changelog == (
        "# Changelog\n\n## Unreleased\n\n## 0.2.0\n\n- Faster codec.\n- New schema.\n\n"
        "## 0.1.0\n\n- First.\n"
    )
    # A minor bump moves every dependent's pin (dependencies and extras) to the next series;
    # extras brackets and markers stay; a package that does not depend on it is untouched.
    eval_toml = pyproject(root, "genmanip-eval")
    assert 'dependencies = ["genmanip-protocol>=0.2.0,<0.3"]' in eval_toml
    assert 'test = ["genmanip-protocol[jpeg]>=0.2.0,<0.3; python_version >= \'3.10\'"]' in eval_toml
    assert pyproject(root, "genmanip-viz") == viz_before
    assert res.stdout.splitlines() == [
        "genmanip-protocol: 0.1.0 -> 0.2.0",
        "pinned genmanip-eval: dependencies: genmanip-protocol>=0.1.0,<0.2 -> "
        "genmanip-protocol>=0.2.0,<0.3 (packages/genmanip-eval/pyproject.toml)",
        "pinned genmanip-eval: optional-dependencies.test: genmanip-protocol[jpeg]>=0.1.0,<0.2; "
        "python_version >= '3.10' -> genmanip-protocol[jpeg]>=0.2.0,<0.3; python_version >= '3.10' "
        "(packages/genmanip-eval/pyproject.toml)",
    ]
    res = run("check_versions.py", "--root", str(root))
    assert res.returncode == 0, res.stderr
    # A patch bump raises the lower bound only.
    notes = root / "packages/genmanip-protocol/CHANGELOG.md"
    notes.write_text(notes.read_text().replace("## Unreleased\n", "## Unreleased\n\n- Fix.\n", 1))
    res = run("bump.py", "genmanip-protocol", "0.2.1", "--root", str(root))
    assert res.returncode == 0, res.stderr
    eval_toml = pyproject(root, "genmanip-eval")
    assert 'dependencies = ["genmanip-protocol>=0.2.1,<0.3"]' in eval_toml
    assert "genmanip-protocol[jpeg]>=0.2.1,<0.3; python_version" in eval_toml
    assert run("check_versions.py", "--root", str(root)).returncode == 0


def test_check_versions_catches_pins_outside_the_lockstep_form(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    # The sibling moved on without its dependents (no bump.py): the range excludes it.
    about = root / "packages/genmanip-protocol/src/genmanip_protocol/__about__.py"
    about.write_text('__version__ = "0.2.0"\n')
    changelog = root / "packages/genmanip-protocol/CHANGELOG.md"
    changelog.write_text(changelog.read_text().replace("## 0.1.0", "## 0.2.0\n\n- Next.\n\n## 0.1.0"))
    res = run("check_versions.py", "--root", str(root))
    assert res.returncode == 1
    assert ("genmanip-eval: dependencies pins genmanip-protocol>=0.1.0,<0.2, which excludes the "
            "workspace's genmanip-protocol 0.2.0; expected the lockstep pin "
            "genmanip-protocol>=0.2.0,<0.3") in res.stderr
    assert "optional-dependencies.test pins genmanip-protocol>=0.1.0,<0.2, which excludes" in res.stderr
    assert "(!)" in res.stdout
    # Admitting the version is not enough: a bare lower bound, a wider range, no bound at all.
    for spec, why in ((">=0.2.0", "a bare lower bound"),
                      (">=0.2.0,<1", "an upper bound other than the next minor (<0.3)"),
                      (">=0.1.0,<0.3", "an upper bound other than the next minor (<0.2)"),
                      ("", "no lower bound"),
                      ("==0.2.0", "not of the form >=X.Y.Z,<X.(Y+1)"),
                      (">=0.2.0,<0.3,!=0.2.1", "not of the form >=X.Y.Z,<X.(Y+1)")):
        (root / "packages/genmanip-eval/pyproject.toml").write_text(
            f'[project]\nname = "genmanip-eval"\ndynamic = ["version"]\n'
            f'dependencies = ["genmanip-protocol{spec}"]\n'
            '\n[tool.hatch.version]\npath = "src/genmanip_eval/__about__.py"\n')
        res = run("check_versions.py", "--root", str(root))
        assert res.returncode == 1, spec
        assert f"genmanip-eval: dependencies pins genmanip-protocol{spec or ' (any version)'}, {why}; " \
            "expected the lockstep pin genmanip-protocol>=0.2.0,<0.3" in res.stderr, res.stderr


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
    eval_before = pyproject(root, "genmanip-eval")
    res = run("bump.py", "genmanip-protocol", "0.3.0", "--root", str(root), "--dry-run")
    assert res.returncode == 0
    assert (root / "packages/genmanip-protocol/CHANGELOG.md").read_text() == before
    # The dry run shows the pins it would move, and moves none.
    assert ("would pin genmanip-eval: dependencies: genmanip-protocol>=0.1.0,<0.2 -> "
            "genmanip-protocol>=0.3.0,<0.4") in res.stdout
    assert pyproject(root, "genmanip-eval") == eval_before


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


def test_lockstep_helpers() -> None:
    sys.path.insert(0, str(TOOLS))
    try:
        import _workspace as ws
    finally:
        sys.path.remove(str(TOOLS))
    assert ws.next_minor("0.1.3") == "0.2" and ws.next_minor("1.9.0rc1") == "1.10"
    assert ws.lockstep_spec("0.2.0") == ">=0.2.0,<0.3"
    assert ws.repin("genmanip-viz>=0.1.0; python_version >= '3.11'", "0.2.0") == (
        "genmanip-viz>=0.2.0,<0.3; python_version >= '3.11'")
    assert ws.repin("genmanip-results[video] >= 0.1.0 , <0.2", "0.1.1") == (
        "genmanip-results[video]>=0.1.1,<0.2")
    assert ws.repin("genmanip-eval", "0.1.0") == "genmanip-eval>=0.1.0,<0.2"
    assert ws.lockstep_problem(">=0.1.0,<0.2") is None
    assert ws.lockstep_problem("<0.2.0, >=0.1.4") is None
    assert ws.lockstep_problem(">=1.2.0,<1.3") is None
    assert ws.lockstep_problem(">=0.1.0") == "a bare lower bound"
    assert ws.lockstep_problem(">=0.1.0,<0.2,<0.3") == "not of the form >=X.Y.Z,<X.(Y+1)"
