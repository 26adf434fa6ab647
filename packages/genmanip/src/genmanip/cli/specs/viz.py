"""``gmp viz`` (serve the results browser) and ``gmp viz build`` (genmanip-viz)."""

from __future__ import annotations

import argparse
from typing import Any

from .._args import add_command, add_flag, add_group, add_replaced

__all__ = ["register"]

_DIST = "genmanip-viz"


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register ``viz`` (serves when no action is given) and ``viz build``.

    The reference client's ``visualize`` is accepted as a hidden spelling of ``viz``.
    """
    for name in ("viz", "visualize"):
        _register_viz(subparsers, name, hidden=name != "viz")


def _register_viz(subparsers: argparse._SubParsersAction[Any], name: str, *, hidden: bool) -> None:
    p = add_command(
        subparsers, name, handler="genmanip_viz.cli:serve", dist=_DIST, extra="viz",
        command="gmp viz", hidden=hidden,
        help="browse recorded runs and episodes in a web browser",
    )
    add_flag(p, "--root", aliases=["--project-root", "--project_root"], metavar="DIR",
             default=".", help="project root holding results (default: the current directory)")
    add_flag(p, "--port", metavar="PORT", type=int, default=55077,
             help="port; the next 19 are tried when it is busy (default: %(default)s)")
    add_flag(p, "--host", metavar="HOST", default="127.0.0.1",
             help="bind address (default: %(default)s)")
    tls = p.add_mutually_exclusive_group()
    # Default (None): plain HTTP on loopback (http://localhost is a secure context), HTTPS with a
    # self-signed certificate and an access token when bound beyond loopback.
    tls.add_argument("--https", dest="https", action="store_const", const=True, default=None,
                     help="force HTTPS (self-signed certificate; default only beyond loopback)")
    tls.add_argument("--http", dest="https", action="store_const", const=False,
                     help="force plain HTTP (beyond loopback the access token is still required)")
    add_flag(p, "--open", action="store_true", default=False, help="open the URL in a browser")
    add_replaced(p, "--flush-cache", "--flush_cache",
                 replacement="gmp clean removes the viewer's caches (gmp clean --dry-run lists them)")

    actions = add_group(p, dest="viz_action")
    b = add_command(
        actions, "build", handler="genmanip_viz.cli:build", dist=_DIST, extra="viz",
        command="gmp viz build", help="prebuild the viewer files of a run",
    )
    b.add_argument("run_dir", metavar="RUN_DIR", help="run directory")
    add_flag(b, "--jobs", "-j", metavar="N", type=int, default=None,
             help="parallel build processes (default: 2, at most the CPU count)")
