"""Docs move with code: the CLI reference matches the parser, and relative links resolve."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import check_docs  # noqa: E402
import gen_cli_docs  # noqa: E402


def test_cli_reference_is_up_to_date() -> None:
    text = gen_cli_docs.DOC.read_text(encoding="utf-8")
    assert gen_cli_docs.updated_doc(text) == text, (
        "docs/cli.md is stale: run python tools/gen_cli_docs.py"
    )


def test_cli_reference_covers_every_command() -> None:
    ref = gen_cli_docs.render_reference()
    for cmd in ("eval", "submit", "status", "demo", "testbed serve", "validate", "plot", "clean",
                "viz", "viz build", "online create", "online run", "leaderboard submit"):
        assert f"### `gmp {cmd}`" in ref
    assert "visualize" not in ref and "--worker_ids" not in ref


def test_relative_links_resolve() -> None:
    assert check_docs.check_links(ROOT) == []


def test_link_checker_finds_broken_links(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "packages").mkdir()
    (tmp_path / "README.md").write_text("[a](docs/x.md) [b](docs/y.md#nope) [c](https://e.org)\n")
    (tmp_path / "docs" / "y.md").write_text("# Title\n")
    problems = check_docs.check_links(tmp_path)
    assert problems == ["README.md: broken link docs/x.md", "README.md: no heading for #nope in docs/y.md"]


def test_man_page_environment_matches_cli_doc() -> None:
    sys.path.insert(0, str(ROOT / "packages" / "genmanip" / "src"))
    try:
        from genmanip.cli.manpage import ENVIRONMENT
    finally:
        sys.path.pop(0)
    doc = gen_cli_docs.DOC.read_text(encoding="utf-8")
    for names, _ in ENVIRONMENT:
        for name in names.split(", "):
            assert f"`{name}`" in doc, name
