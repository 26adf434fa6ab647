"""``gmp testbed serve`` as a killable process for the server-restart runs (tests and bench only).

Usage::

    python _testbed_proc.py PORT ROOT RUN_ID TASKS LOCK_STALE_S [FAULTS]
        [--die-at MOMENT] [--stats-out FILE] [--no-job]

* ``LOCK_STALE_S``: the testbed mirrors the real server, whose crashed server's seed locks block
  those seeds for 300 s. CI cannot wait that long, so the fast subset lowers
  ``CoreConfig.lock_stale_s`` (an existing tunable); ``-`` keeps the real 300 s.
* ``--die-at MOMENT``: the process SIGKILLs *itself* at a server-side moment, so a test kills the
  server at the same point of the protocol on every run, whatever the machine's speed (a kill
  after a wall-clock delay lands wherever the client happens to be — see
  tests/reliability/test_server_restart.py for the race that caused). ``MOMENT`` is one of
  :data:`MOMENTS`, optionally ``:N`` (the N-th action, default 10).
* ``--stats-out FILE``: the server's :class:`~genmanip_testbed.Stats` snapshot as JSON, rewritten
  while it changes, right before a ``--die-at`` kill and on SIGTERM: the per-attempt action counts
  of a server that died are not lost with it.
* ``--no-job``: start idle (the real server after a restart: its job is gone until someone sends
  ``/start_new_job`` again).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from genmanip_testbed import server as server_mod
from genmanip_testbed.app import build_asgi_app
from genmanip_testbed.core import EvalCore
from genmanip_testbed.server import ServerOptions, serve_testbed

#: Where ``--die-at`` kills the server (what the client is doing at that moment):
MOMENTS = {
    # the first /step has arrived, nothing executed yet: the client waits for its reply
    "first_step": "the first /step arrived; nothing executed",
    # right before the N-th action is applied: a /step in flight (the others of it may have run)
    "mid_episode": "before the N-th action, its /step in flight",
    # once the reply to the N-th action has left entirely: the client holds its answer and sends
    # its next request on a connection whose server is gone (the race the old test hit)
    "after_reply": "after the N-th action's reply left: the client between requests",
    # the client's first /reset in flight (nothing created yet)
    "reset_request": "the first /reset in flight",
    # during the first background resets, in the client's next /reset_result poll: the poll in
    # flight (the resets are held until then)
    "first_reset": "during the first reset, a /reset_result poll in flight",
    # during the reset after the first finished episode (its files written, its result not
    # handed out yet: in the dead server's memory only), once a poll's pending-form reply has
    # left: the client between two /reset_result polls (the same race as after_reply)
    "during_reset": "during the reset after the first episode, the client between polls",
    # once the reply handing out the first finished episodes' results has left (every ended
    # episode's result handed out): the next episode's first observation is with the client
    "between_episodes": "after the first results' reply left, before the next episode's first step",
}


class _Killer:
    """Counts server-side progress and SIGKILLs the process at the chosen moment."""

    def __init__(self, moment: str | None, stats_out: Path | None) -> None:
        name, _, n = (moment or "").partition(":")
        if moment and name not in MOMENTS:
            raise SystemExit(f"--die-at: expected one of {', '.join(MOMENTS)}, got {moment!r}")
        self.moment = name or None
        self.n = int(n) if n else 10
        self.stats_out = stats_out
        self.core: EvalCore | None = None
        self.lock = threading.Lock()
        # One writer of the stats file at a time (the main loop's rewrites and a dying request
        # thread share the tmp name), and one death: two lanes' requests may reach the moment
        # together; the second waits for the SIGKILL the first sends.
        self.dump_lock = threading.Lock()
        self.death = threading.Lock()
        self.actions = 0  # applied (or about to be: counted before _apply runs)
        self.handed_out = 0  # finished episodes' results handed out (_consume)
        self.ending_reply_left = threading.Event()
        self.armed = threading.Event()  # during_reset: die after a /reset_result reply
        self.reset_started = threading.Event()  # first_reset: die in the next poll
        self.last_poll = 0.0
        self.episodes_ended = 0

    # ----------------------------------------------------------------------- stats
    def dump(self) -> None:
        if self.stats_out is None or self.core is None:
            return
        with self.dump_lock:
            tmp = self.stats_out.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.core.stats.snapshot()))
            os.replace(tmp, self.stats_out)

    def die(self, where: str) -> None:
        self.death.acquire()  # never released: the process ends here
        self.dump()
        print(f"_testbed_proc: SIGKILL at {self.moment} ({where})", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    # ----------------------------------------------------------------------- hooks
    def install(self) -> None:
        killer = self
        orig_apply, orig_step, orig_chunk = EvalCore._apply, EvalCore.step, EvalCore.step_chunk
        orig_do_reset, orig_consume, orig_end = EvalCore._do_reset, EvalCore._consume, EvalCore._end_episode
        orig_reset, orig_reset_result = EvalCore.reset, EvalCore.reset_result

        def _apply(self: EvalCore, w: Any, action: Any, method: str) -> None:
            with killer.lock:
                killer.actions += 1
                nth = killer.actions
            if killer.moment == "mid_episode" and nth == killer.n:
                killer.die(f"before action {nth}")
            orig_apply(self, w, action, method)

        def step(self: EvalCore, actions: Any) -> Any:
            if killer.moment == "first_step":
                killer.die("first /step")
            return orig_step(self, actions)

        def step_chunk(self: EvalCore, chunk: Any, **kw: Any) -> Any:
            if killer.moment == "first_step":
                killer.die("first /step_chunk")
            return orig_chunk(self, chunk, **kw)

        def _end_episode(self: EvalCore, w: Any) -> Any:
            with killer.lock:
                killer.episodes_ended += 1
            return orig_end(self, w)

        def _do_reset(self: EvalCore, w: Any, previous: Any, key: Any, cancel: Any) -> Any:
            if killer.moment == "first_reset":
                # Hold the first resets: the client got its pending forms and polls; the first
                # poll that comes now dies in the server (see reset_result below).
                killer.reset_started.set()
                cancel.wait(60)
            if killer.moment == "during_reset" and previous is not None and not killer.armed.is_set():
                # Deterministic: the finished episode's result_info.json is on disk (the new
                # server keeps its score) and the reply ending it reached the client; only the
                # result itself, held for the next /reset_result, dies with the process. The
                # reset then never finishes: the next poll's (pending) reply is the last one.
                self.wait_finalizes(30)
                _wait(killer.ending_reply_left.is_set)
                killer.armed.set()
                cancel.wait(60)
            return orig_do_reset(self, w, previous, key, cancel)

        def reset(self: EvalCore, worker_ids: Any) -> Any:
            if killer.moment == "reset_request":
                killer.die("the first /reset")
            return orig_reset(self, worker_ids)

        def reset_result(self: EvalCore, worker_ids: Any) -> Any:
            # (the client's polls before its /reset ask for a previous client's leftovers)
            if killer.moment == "first_reset" and killer.reset_started.is_set():
                killer.die("a /reset_result poll during the first reset")
            return orig_reset_result(self, worker_ids)

        def _consume(self: EvalCore, w: Any) -> Any:
            entry = orig_consume(self, w)
            if isinstance(entry, dict) and entry.get("episode_result") is not None:
                with killer.lock:
                    killer.handed_out += 1
            return entry

        EvalCore._apply = _apply  # type: ignore[method-assign]
        EvalCore.step = step  # type: ignore[method-assign]
        EvalCore.step_chunk = step_chunk  # type: ignore[method-assign]
        EvalCore._end_episode = _end_episode  # type: ignore[method-assign]
        EvalCore._do_reset = _do_reset  # type: ignore[method-assign]
        EvalCore._consume = _consume  # type: ignore[method-assign]
        EvalCore.reset = reset  # type: ignore[method-assign]
        EvalCore.reset_result = reset_result  # type: ignore[method-assign]

        orig_build = build_asgi_app

        def build(server: Any, *args: Any, **kwargs: Any) -> Any:
            killer.core = server.core
            return _Watch(orig_build(server, *args, **kwargs), killer)

        # (LocalServer calls the name imported into genmanip_testbed.server)
        server_mod.build_asgi_app = build  # type: ignore[attr-defined]


def _wait(cond: Any, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.002)


class _Watch:
    """Outermost ASGI wrapper: kills the process once a chosen reply has entirely left it."""

    def __init__(self, app: Any, killer: _Killer) -> None:
        self.app = app
        self.k = killer

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path not in ("/step", "/step_chunk", "/reset_result"):
            await self.app(scope, receive, send)
            return
        k = self.k
        now = time.monotonic()
        # The client's poll backoff grows (10 ms x 1.5 per poll up to 0.5 s): once two polls are
        # 0.1 s apart, a kill after a poll's reply comes well before the next poll, so the client
        # finds the connection closed before it sends (the between-requests case, every time).
        slow_polls = path == "/reset_result" and now - k.last_poll >= 0.1
        if path == "/reset_result":
            k.last_poll = now
        before = (k.actions, k.handed_out, k.episodes_ended)
        await self.app(scope, receive, send)
        after = (k.actions, k.handed_out, k.episodes_ended)
        if before[2] == 0 < after[2]:
            # (the request that ended the first episode: its pending-form reply is out)
            await _drained(receive)
            k.ending_reply_left.set()
        hit = (
            (k.moment == "after_reply" and path != "/reset_result" and before[0] < k.n <= after[0])
            # (and no other ended episode's result still held: two workers' episodes often end
            # together, and their results may leave in two polls' replies)
            or (k.moment == "between_episodes" and before[1] < after[1] == after[2])
            or (k.moment == "during_reset" and slow_polls and k.armed.is_set())
        )
        if hit:
            await _drained(receive)
            transport = getattr(getattr(receive, "__self__", None), "transport", None)
            sock = transport.get_extra_info("socket") if transport is not None else None
            if sock is not None:
                # What the kernel does when it reaps the process (a FIN after the queued reply),
                # done now: tearing down a large address space can take longer than the client's
                # think time on a loaded machine, and the moment would vary with the load.
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_WR)
            k.die(f"after the reply to {path}")


async def _drained(receive: Any) -> None:
    """Wait until the reply's bytes are in the kernel (a kill then still delivers them: the
    socket is closed with FIN after its queued data, so the client reads the whole reply)."""
    transport = getattr(getattr(receive, "__self__", None), "transport", None)
    end = time.monotonic() + 5
    while transport is not None and transport.get_write_buffer_size() and time.monotonic() < end:
        await asyncio.sleep(0.001)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("port", type=int)
    ap.add_argument("root")
    ap.add_argument("run_id")
    ap.add_argument("tasks")
    ap.add_argument("lock_stale_s")
    ap.add_argument("faults", nargs="?", default="")
    ap.add_argument("--die-at", default=None)
    ap.add_argument("--stats-out", type=Path, default=None)
    ap.add_argument("--no-job", action="store_true")
    a = ap.parse_args()
    killer = _Killer(a.die_at, a.stats_out)
    killer.install()
    if a.lock_stale_s != "-":
        original = ServerOptions.core_config

        def core_config(self: ServerOptions, **overrides: Any) -> Any:
            overrides.setdefault("lock_stale_s", float(a.lock_stale_s))
            return original(self, **overrides)

        ServerOptions.core_config = core_config  # type: ignore[method-assign]

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    with serve_testbed(tasks=a.tasks, run_id=a.run_id, results_root=a.root, port=a.port,
                       faults=a.faults or None, job=not a.no_job):
        try:
            last = ""
            while True:
                if a.stats_out is not None and killer.core is not None:
                    now = json.dumps(killer.core.stats.snapshot())
                    if now != last:
                        killer.dump()
                        last = now
                time.sleep(0.05)
        finally:
            killer.dump()


if __name__ == "__main__":
    main()
