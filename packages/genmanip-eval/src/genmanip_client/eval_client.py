"""``from genmanip_client.eval_client import EvalClient`` (the reference client's import path).

:class:`EvalClient` here is :class:`genmanip_eval.EvalClient` with what scripts written for the
reference client expect of it:

* it **records by default** (the reference's ``save_process``); ``save_result=True`` records too,
  ``record=False`` / ``save_process=False`` turn it off;
* ``load_config(config_path, run_id=None)`` starts a job (``POST /start_new_job``, what
  ``gmp submit`` does; the reference's earliest ``/load_config`` route no longer exists);
* ``kill_workers(worker_ids=None)`` is :meth:`genmanip_eval.EvalClient.kill`;
* ``reset()`` on a job with nothing left raises :class:`genmanip_eval.JobComplete` instead of
  returning ``obs=None`` for every worker (a seed-style loop would die later on
  ``None["..."]`` with an ``AttributeError``/``TypeError`` that says nothing).

New code should use :class:`genmanip_eval.EvalClient` (the same client, without these
compatibility behaviours).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from genmanip_eval.client import EvalClient as _EvalClient
from genmanip_eval.errors import JobComplete
from genmanip_protocol.errors import ResponseError, Violation
from genmanip_runtime.text import safe_text

__all__ = ["EvalClient"]


class EvalClient(_EvalClient):
    """The reference client's interface (see the module docstring); every argument of
    :class:`genmanip_eval.EvalClient` is accepted."""

    def __init__(self, *args: Any, save_result: bool | None = None, **kwargs: Any) -> None:
        if "record" not in kwargs and "save_process" not in kwargs:
            kwargs["record"] = True if save_result is None else bool(save_result)
        elif save_result:
            kwargs["record"] = True
        super().__init__(*args, **kwargs)

    def load_config(self, config_path: str | Sequence[str], run_id: str | None = None) -> None:
        """Start a job from benchmark config path(s) on the server (``POST /start_new_job``)."""
        paths = [config_path] if isinstance(config_path, str) else [str(p) for p in config_path]
        payload = self._json_call(
            "/start_new_job", {"data": {"config_path": paths, "run_id": run_id or self.run_id}},
            timeout_key="start_new_job", retry=False,
        )
        data = payload.get("data") if isinstance(payload, dict) else None
        if not (isinstance(data, dict) and data.get("success") is True):
            raise ResponseError(Violation(
                "POST /start_new_job.data.success", "true",
                safe_text(json.dumps(payload, default=str), limit=120),
            ))

    def kill_workers(self, worker_ids: Iterable[str | int] | None = None) -> None:
        """``POST /kill`` of the given (default: this client's) worker ids."""
        self.kill(None if worker_ids is None else [str(w) for w in worker_ids])

    def reset(self) -> dict[str, dict[str, Any]]:
        """As :meth:`genmanip_eval.EvalClient.reset`; a job with nothing left raises
        :class:`genmanip_eval.JobComplete` naming the server and its run."""
        entries = super().reset()
        if self.done and not self.episode_results:
            try:
                st = self.status(retry=False)
            except Exception:  # (the message below is enough without the run's name)
                st = {}
            run = safe_text(str(st.get("run_id") or self.run_id or "?"), limit=80)
            raise JobComplete(
                f"the server at {self.base_url} has nothing left to evaluate for worker(s) "
                f"{', '.join(self.worker_ids)}: its job (run {run}) is complete",
                hint="start a new job: client.load_config(CONFIG_PATH, run_id=...) or gmp submit "
                "CONFIG...",
            )
        return entries
