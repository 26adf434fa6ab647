"""genmanip-testbed: a faithful local GenManip evaluation server with a tiny deterministic world.

Start one in-process with :func:`serve_testbed` (tests, demos) or from the command line with
``gmp testbed serve``. The scripted policies :func:`expert_policy` and :func:`zero_policy` follow
the genmanip-eval policy interface.
"""

from __future__ import annotations

from .__about__ import __version__
from .errors import (
    FaultSpecError,
    GenmanipTestbedError,
    OptionError,
    ServerStartError,
    UnknownConfigError,
)
from .faults import FaultSpec, parse_fault_spec
from .policies import ExpertPolicy, ZeroPolicy, expert_policy, zero_policy
from .server import LocalServer, ServerHandle, ServerOptions, serve_testbed
from .stats import Stats
from .tasks import BENCHMARK_ID, CONFIG_NAMES, DEFAULT_CONFIG, TaskSpec, resolve_configs
from .world import Episode

__all__ = [
    "BENCHMARK_ID",
    "CONFIG_NAMES",
    "DEFAULT_CONFIG",
    "Episode",
    "ExpertPolicy",
    "FaultSpec",
    "FaultSpecError",
    "GenmanipTestbedError",
    "LocalServer",
    "OptionError",
    "ServerHandle",
    "ServerOptions",
    "ServerStartError",
    "Stats",
    "TaskSpec",
    "UnknownConfigError",
    "ZeroPolicy",
    "__version__",
    "expert_policy",
    "parse_fault_spec",
    "resolve_configs",
    "serve_testbed",
    "zero_policy",
]
