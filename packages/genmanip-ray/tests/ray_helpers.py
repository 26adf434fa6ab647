"""What the tests of genmanip-ray share: a real Ray per module, the testbed, the tree checks."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
# The reliability checker (bench/reliability/checks.py): the same one the fault runs use.
sys.path.insert(0, str(ROOT / "bench" / "reliability"))

from checks import RunCheck, check_run, unrecorded_with_reason  # noqa: E402

__all__ = ["EventLog", "RunCheck", "assert_exactly_once", "check_run", "last_attempts", "wait_for"]


class EventLog:
    """The launcher's ``emit``: keeps every event; :meth:`wait` for a condition on them."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._cv = threading.Condition()

    def __call__(self, kind: str, payload: dict[str, Any]) -> None:
        with self._cv:
            self.events.append((kind, payload))
            self._cv.notify_all()

    def count(self, kind: str) -> int:
        with self._cv:
            return sum(1 for k, _ in self.events if k == kind)

    def steps(self) -> int:
        with self._cv:
            return sum(int(p["n"]) for k, p in self.events if k == "steps")

    def wait(self, cond: Callable[[], bool], timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        with self._cv:
            while not cond():
                left = deadline - time.monotonic()
                assert left > 0, "timed out waiting for the run"
                self._cv.wait(min(left, 0.5))


def wait_for(cond: Callable[[], bool], timeout: float = 60.0, what: str = "condition", *,
             poll_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll_s)


def mid_episode(tb: Any, worker_ids: list[str]) -> bool:
    """Every one of ``worker_ids`` is past the first step of an episode, on the testbed itself.

    The server's state is now; the driver hears of a lane's steps (``EventLog``) a batch of events
    later, by when a short episode may have ended. A kill now cannot land between a worker's
    destructive ``/reset_result`` read and the recording of its result (the protocol's known
    gap, docs/reliability.md) unless the worker's episode ends and its next reset is read before
    the kill takes effect: at least one step's latency and a poll away.
    """
    for wid in worker_ids:
        w = tb.core.workers.get(wid)
        if w is None or w.pending is not None or w.episode is None or w.episode.timestep < 1:
            return False
    return True


def last_attempts(snapshot: Mapping[str, Any]) -> dict[str, int]:
    """The testbed's actions of the attempt it scored, per episode id."""
    return {eid: v[-1] for eid, v in snapshot["steps_by_attempt"].items() if v}


def assert_exactly_once(tb: Any, run_dir: Path, summary: Any, total: int, *, killed: int = 0) -> RunCheck:
    """0 duplicated actions, 0 lost episodes, nothing counted twice; the tree passes the checker.

    ``killed``: workers whose process was killed outright (SIGKILL, ``ray.kill``). As for any client killed so
    (bench/reliability/client_kill.py), an episode whose result reply reached a process that was
    killed before writing it stays unrecorded, its INCOMPLETE marker giving the reason and the
    server keeping its score: at most one per such worker (each worker's lane has one request in
    flight), and never silently."""
    assert tb.wait_finalizes(60)
    snap = tb.stats.snapshot()
    server_done = {str(p.parent.relative_to(tb.run_dir.parent.parent)) for p in tb.run_dir.rglob("result_info.json")}
    chk = check_run(run_dir, server_steps=last_attempts(snap), decode_videos=True)
    assert chk.problems == [], chk.problems
    assert chk.incomplete == {} or all((d / "INCOMPLETE").exists() for d in chk.incomplete.values())
    # every episode the server scored is recorded, and exactly once
    assert len(server_done) == total, (len(server_done), total)
    assert set(chk.finished) <= server_done, sorted(set(chk.finished) - server_done)
    unrecorded = sorted(server_done - set(chk.finished))
    assert all(unrecorded_with_reason(run_dir.parent.parent / e) for e in unrecorded), unrecorded
    assert len(unrecorded) <= killed, unrecorded
    # the summary counts each once
    ids = [e["episode_id"] for e in summary.episodes]
    assert len(ids) == len(set(ids))
    # a step is never applied twice: the rows of each finished episode are the scored attempt's
    for eid, n in chk.rows.items():
        assert last_attempts(snap)[eid] == n, (eid, n, snap["steps_by_attempt"][eid])
    return chk


def run_json(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "run.json").read_text()))


def ray_named(prefix: str) -> list[str]:
    import ray

    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if str(a["name"]).startswith(prefix))


#: The driver script of the resume test.
HERE_DRIVER = Path(__file__).resolve().parent / "driver.py"
