"""Compatibility import path of the reference GenManip client.

``from genmanip_client.eval_client import EvalClient`` keeps working: it is
:class:`genmanip_eval.EvalClient` with the reference's defaults and methods (recording on,
``load_config``, ``kill_workers``; see :mod:`genmanip_client.eval_client`). It ships in the
genmanip-eval wheel.
"""

from __future__ import annotations

from .eval_client import EvalClient

__all__ = ["EvalClient"]
