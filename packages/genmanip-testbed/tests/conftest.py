"""pytest fixtures of genmanip-testbed; the helpers live in ``_tbhelpers`` (importable by tests)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from _tbhelpers import Raw


@pytest.fixture
def raw_factory() -> Any:
    made: list[Raw] = []

    def make(url: str, token: str | None = None) -> Raw:
        r = Raw(url, token)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()
