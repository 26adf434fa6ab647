"""``gmp policy serve`` (genmanip-serve): serve a policy over WebSocket + msgpack."""

from __future__ import annotations

import argparse
from typing import Any

from .._args import add_command, add_flag, add_group

__all__ = ["register"]

_DIST = "genmanip-serve"


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register ``policy`` and its ``serve`` action."""
    group = add_command(
        subparsers, "policy", handler=None, dist=_DIST,
        help="serve a policy to many clients over WebSocket (openpi's wire, dynamic batching)",
    )
    actions = add_group(group, dest="policy_action")
    p = add_command(
        actions, "serve", handler="genmanip_serve.cli:serve", dist=_DIST,
        command="gmp policy serve",
        help="load a policy once and serve it until interrupted (Ctrl-C stops it)",
        epilog="Clients: gmp eval --policy ws://HOST:PORT, or openpi-client's WebsocketClientPolicy.\n"
               "GET /healthz answers ok; GET /stats gives the batching counters as JSON.\n"
               "example:\n  gmp policy serve --policy mypkg.policy:make --policy-arg ckpt=last.pt "
               "--port 8000 --max-batch 16",
    )
    pol = p.add_argument_group("policy")
    add_flag(pol, "--policy", metavar="SPEC", required=True,
             help="pkg.module:factory, or a name from the genmanip.policies entry points (zero, "
                  "expert, your own)")
    add_flag(pol, "--policy-arg", aliases=["--policy_arg"], metavar="KEY=VALUE", action="append",
             default=[], help="argument for the policy factory (repeatable)")
    srv = p.add_argument_group("server")
    add_flag(srv, "--host", metavar="HOST", default="127.0.0.1",
             help="bind address (default: %(default)s; anything else exposes the policy)")
    add_flag(srv, "--port", metavar="PORT", type=int, default=8000,
             help="port; 0 picks a free one (default: %(default)s)")
    add_flag(srv, "--api-key", aliases=["--api_key"], metavar="KEY", default=None,
             help="require 'Authorization: Api-Key KEY' (default: $GMP_POLICY_API_KEY, else the "
                  "config file's [policy] token, else no auth)")
    add_flag(srv, "--max-message-mb", aliases=["--max_message_mb"], metavar="N", type=float,
             default=None, help="largest request message in MiB (default: 64)")
    batch = p.add_argument_group("batching")
    add_flag(batch, "--max-batch", aliases=["--max_batch"], metavar="N", type=int, default=None,
             help="largest batch of observations per policy call (default: 32)")
    add_flag(batch, "--max-wait-ms", aliases=["--max_wait_ms"], metavar="MS", type=float,
             default=None,
             help="longest wait for more observations from due clients once one waits and the "
                  "policy is idle (default: 200, the batcher's)")
