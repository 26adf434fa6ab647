"""genmanip-testbed: a faithful local GenManip evaluation server with a tiny deterministic world.

Start one in-process with :func:`serve_testbed` (tests, demos) or from the command line with
``gmp testbed serve``. The scripted policy :func:`expert_policy` follows the genmanip-eval policy
interface (``gmp eval --policy expert``, through the ``genmanip.policies`` entry point).
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
from .policies import ExpertPolicy, expert_policy
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
    "__version__",
    "expert_policy",
    "parse_fault_spec",
    "resolve_configs",
    "serve_testbed",
]
