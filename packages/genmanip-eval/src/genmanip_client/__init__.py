"""Compatibility import path of the reference GenManip client.

``from genmanip_client.eval_client import EvalClient`` keeps working; the implementation is
:class:`genmanip_eval.EvalClient` (shipped in the genmanip-eval wheel).
"""

from __future__ import annotations

from genmanip_eval import EvalClient

__all__ = ["EvalClient"]
