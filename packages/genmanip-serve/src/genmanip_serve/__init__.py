"""genmanip-serve: serve a gmp policy over WebSocket + msgpack, and the ``ws://`` client of gmp eval.

* ``gmp policy serve --policy SPEC`` (:class:`PolicyServer`, :func:`serve_policy`) loads a policy
  once and serves it on openpi's policy-server wire (an ``openpi-client`` works unchanged), batching
  the observations of every connected client into one policy call (genmanip-eval's ``Batcher``).
* ``gmp eval --policy ws://HOST:PORT`` uses :func:`connect_policy` (entry points
  ``genmanip.policy_schemes`` ``ws``/``wss``): a batched policy with one connection per worker;
  ``--policy-arg keymap=PATH`` (:func:`load_keymap`) adapts an openpi server that does not speak
  GenManip keys.

websockets is used only in this package. The wire format is :mod:`genmanip_serve.wire`.
"""

from __future__ import annotations

from .__about__ import __version__
from .client import API_KEY_ENV, DEFAULT_TIMEOUT_S, RemotePolicy, connect_policy
from .errors import (
    GenmanipServeError,
    KeyMapError,
    PolicyServerAuthError,
    PolicyServerGone,
    PolicyServerRejected,
    PolicyServerTimeout,
    PolicyServerUnreachable,
    RemotePolicyError,
    ServeConfigError,
    WireError,
)
from .keymap import KeyMap, load_keymap
from .server import DEFAULT_MAX_MESSAGE_BYTES, GMP_FIELDS, PolicyServer, ServeOptions, serve_policy
from .wire import decode_message, encode_message

__all__ = [
    "API_KEY_ENV",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_TIMEOUT_S",
    "GMP_FIELDS",
    "GenmanipServeError",
    "KeyMap",
    "KeyMapError",
    "PolicyServer",
    "PolicyServerAuthError",
    "PolicyServerGone",
    "PolicyServerRejected",
    "PolicyServerTimeout",
    "PolicyServerUnreachable",
    "RemotePolicy",
    "RemotePolicyError",
    "ServeConfigError",
    "ServeOptions",
    "WireError",
    "__version__",
    "connect_policy",
    "decode_message",
    "encode_message",
    "load_keymap",
    "serve_policy",
]
