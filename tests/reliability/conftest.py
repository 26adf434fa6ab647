"""The reliability suite's fast subset. The long runs live in bench/reliability/ and share its code."""

from __future__ import annotations

import sys
from pathlib import Path

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "reliability"
if str(_BENCH) not in sys.path:
    sys.path.insert(0, str(_BENCH))
