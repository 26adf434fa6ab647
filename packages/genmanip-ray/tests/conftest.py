from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def pytest_configure(config: object) -> None:
    sys.path.insert(0, str(HERE))
