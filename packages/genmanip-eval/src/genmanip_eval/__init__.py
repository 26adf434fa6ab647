"""genmanip-eval: evaluate a robot policy on a GenManip server without losing a step.

* :class:`EvalClient` — the Python API a model repo imports (also as
  ``genmanip_client.eval_client.EvalClient``, the reference client's import path).
* :func:`run_eval` / :class:`EvalConfig` — the policy runner behind ``gmp eval``.
* :class:`Recorder` — episode recording (``steps.jsonl``, H.264 mp4 per camera, results).
"""

from __future__ import annotations

from .__about__ import __version__
from .actions import ActionInputError, is_action_dict, normalize_step_input
from .client import DEFAULT_TIMEOUTS, DEFAULT_URL, EvalClient, StepListener, StepTiming
from .errors import (
    EpisodeIdError,
    GenmanipEvalError,
    Interrupted,
    JobComplete,
    PolicyCodeError,
    PolicyError,
    RecordingError,
    ResetTimeout,
    StepError,
    StepTimeout,
    WorkerProcessError,
)
from .hooks import EPISODE_HOOK_GROUP, HookNotInstalledError, load_episode_hook
from .policy import (
    POLICY_GROUP,
    PolicyHandle,
    PolicyNotInstalledError,
    ZeroPolicy,
    installed_policies,
    load_policy_factory,
    parse_policy_args,
    zero_policy,
)
from .recording import Recorder, camera_name, resolve_results_root
from .runner import EvalConfig, RunSummary, run_eval, run_workers

__all__ = [
    "DEFAULT_TIMEOUTS",
    "DEFAULT_URL",
    "EPISODE_HOOK_GROUP",
    "POLICY_GROUP",
    "ActionInputError",
    "EpisodeIdError",
    "EvalClient",
    "EvalConfig",
    "GenmanipEvalError",
    "HookNotInstalledError",
    "Interrupted",
    "JobComplete",
    "PolicyCodeError",
    "PolicyError",
    "PolicyHandle",
    "PolicyNotInstalledError",
    "Recorder",
    "RecordingError",
    "ResetTimeout",
    "RunSummary",
    "StepError",
    "StepListener",
    "StepTimeout",
    "StepTiming",
    "WorkerProcessError",
    "ZeroPolicy",
    "__version__",
    "camera_name",
    "installed_policies",
    "is_action_dict",
    "load_episode_hook",
    "load_policy_factory",
    "normalize_step_input",
    "parse_policy_args",
    "resolve_results_root",
    "run_eval",
    "run_workers",
    "zero_policy",
]
