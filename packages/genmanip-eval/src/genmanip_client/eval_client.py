"""``from genmanip_client.eval_client import EvalClient`` (the reference client's import path)."""

from __future__ import annotations

from genmanip_eval.client import EvalClient

__all__ = ["EvalClient"]
