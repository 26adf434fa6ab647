"""Which gmp distribution provides each named plugin (for install hints).

genmanip-eval finds policies (``genmanip.policies``) and episode hooks (``genmanip.episode_hooks``)
by name through entry points and never names the distributions above it. When a name is not
installed, it reads the tables registered in the ``genmanip.providers`` group to say what to
install; this meta package, which depends on every gmp distribution anyway, registers this one.
A test checks it against the entry points the distributions really register.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["PROVIDERS"]

#: Entry-point group -> {name -> the distribution that registers it in that group}.
PROVIDERS: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {
        "genmanip.policies": MappingProxyType(
            {
                "zero": "genmanip-eval",
                "expert": "genmanip-testbed",
            }
        ),
        "genmanip.episode_hooks": MappingProxyType({"plot": "genmanip-artifacts"}),
        "genmanip.policy_schemes": MappingProxyType(
            {"ws": "genmanip-serve", "wss": "genmanip-serve"}
        ),
        "genmanip.launchers": MappingProxyType({"ray": "genmanip-ray"}),
    }
)
