"""Results-tree discovery: the one reader of both on-disk layouts (server and client).

Layouts (``docs/architecture.md``):

* **server** ``saved/eval_results/<benchmark>/<run_id>/<task_name>/<seed>/result_info.json`` plus
  ``result.json`` / ``progress.json`` (metric dicts) and ``<task_name>/<seed>.lock`` files;
* **client** ``<results_root>/<benchmark>/<run_id>/`` with ``run.json`` and
  ``<task_name>/<seed>/{steps.jsonl, <camera>.mp4, result.json, INCOMPLETE}``.

An *episode directory* is a directory named like a seed (digits) that holds ``result_info.json``
(server) or ``result.json`` / ``steps.jsonl`` / ``INCOMPLETE`` (client), or that has a sibling
``<seed>.lock`` (an episode the server is running now). Its task name is its parent's path
relative to the run directory. Scans never raise for a bad file: corrupt JSON marks the episode
incomplete with an ``error``; symlinks that leave the scanned root are skipped with a warning.
Which directories are searched is :mod:`genmanip_results.roots`; containment is
:func:`genmanip_results.paths.is_within`, and every file is opened through
:func:`genmanip_results.paths.open_within` (checked again where it is opened, so a file swapped for
a symlink after the listing is not read). Each :class:`EpisodeInfo` carries the ``root`` it was
found under: the series loader and the viewer open its files within that same root.

A run's state (:attr:`RunInfo.state`: ``live``, ``interrupted``, or how its last ``gmp eval``
ended) comes from the segments ``gmp eval`` records in ``run.json`` (each names the host and pid of
its invocation and, once it ends, its outcome), checked against the process
(:func:`genmanip_results.live.process_alive`) and the run's newest write; runs without segments
(the server layout, older recordings) go by their episode locks and recent writes. Runs are
addressed by :func:`run_key` of :func:`run_rel` (``gmp viz``'s URLs, ``gmp report``'s links).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from genmanip_protocol.schema import TaskMetric, is_success, parse_metric

from .layout import (
    EPISODE_RRD,
    EVAL_RESULTS_DIR,
    FRAME_STORE_SUFFIX,
    FRAMES_DIR,
    INCOMPLETE,
    LOCK_SUFFIX,
    MERGED_VIDEO,
    META_RECORD,
    PROGRESS_JSON,
    RESULT_INFO,
    RESULT_JSON,
    RRD_SUFFIX,
    RUN_JSON,
    STEPS_JSONL,
    SUBMITTED_FLAG,
    VIDEO_SUFFIX,
)
from .live import ACTIVE_S, LIVE_FRESH_S, STALE_AFTER_S, live_activity, parse_pid, process_alive
from .paths import UnsafePathError, is_within, open_within
from .roots import project_trees

__all__ = [
    "EpisodeInfo",
    "LockInfo",
    "RunInfo",
    "RunScanner",
    "find_episode_dirs",
    "find_runs",
    "is_episode_dir",
    "is_run_dir",
    "load_episode",
    "load_run",
    "policy_label",
    "read_locks",
    "run_key",
    "run_policy",
    "run_rel",
]

log = logging.getLogger(__name__)

Layout = Literal["server", "client"]

#: A lock is stale after this many seconds without a touch (the server's rule).
LOCK_STALE_AFTER = STALE_AFTER_S
_SEED = re.compile(r"^\d+$")
_RUN_MARKERS = (RUN_JSON, PROGRESS_JSON, SUBMITTED_FLAG)
_EPISODE_MARKERS = (RESULT_INFO, RESULT_JSON, STEPS_JSONL, INCOMPLETE)
_MAX_DEPTH = 16
_LOCK_LEN = len(LOCK_SUFFIX)
_RACY_NS = 2_000_000_000

# (name, is_dir, is_file, is_symlink)
_Entry = tuple[str, bool, bool, bool]


@dataclass(frozen=True)
class LockInfo:
    """A server episode lock ``<task_name>/<seed>.lock`` (JSON ``{worker_id, timestamp, pid, host,
    task_name, seed}``). ``timestamp`` is the newer of the JSON timestamp and the file mtime
    (epoch seconds); ``stale`` means no touch for ``stale_after`` seconds or the episode is done."""

    path: Path
    task_name: str
    seed: str
    worker_id: str | None
    timestamp: float
    pid: int | None
    host: str | None
    stale: bool


@dataclass(frozen=True)
class EpisodeInfo:
    """One episode directory.

    ``complete`` is true once the result file exists and parses (``result_info.json`` for the
    server layout, ``result.json`` for the client layout). ``score`` is in [0, 1]; ``success`` is
    ``score == 1`` within 1e-6 (``None`` while incomplete). ``steps`` is the number of executed
    actions when known. ``videos`` maps camera names (file stems, e.g. ``left_camera``) to mp4
    files, or to the camera's JPEG frame store (``<camera>.jpegs``) when it has no mp4 yet. ``error`` explains a corrupt or unreadable result file. ``mtime`` is epoch seconds.
    ``root`` is the resolved directory the episode was found under (the scanned root, or the run
    directory for :func:`load_episode`): readers of its files open them within it
    (:func:`genmanip_results.paths.open_within`); ``None`` means the episode directory itself.
    """

    path: Path
    layout: Layout
    benchmark: str
    run_id: str
    task_name: str
    seed: str
    episode_id: str
    complete: bool
    score: float | None
    success: bool | None
    steps: int | None
    videos: dict[str, Path]
    steps_file: Path | None
    meta_record: Path | None
    rrd: Path | None
    mtime: float
    error: str | None = None
    instruction: str | None = None
    robot_id: str | None = None
    result: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    root: Path | None = field(default=None, compare=False, repr=False)

    @property
    def containment(self) -> Path:
        """The directory every file of this episode must resolve inside (``root``, else the
        episode directory)."""
        return self.root if self.root is not None else Path(self.path)


@dataclass
class RunInfo:
    """One run directory ``<benchmark>/<run_id>`` of either layout.

    ``created``/``updated`` are epoch seconds (``run.json`` start time when present, else the
    earliest / latest mtime seen). ``total_episodes`` comes from ``run.json``, else from the
    metric dict's ``(done/total)`` keys when every task has one.

    ``state`` is what the run is doing (``state_detail`` says why, in a few words; ``live`` is
    ``state == "live"``):

    * ``"live"``: a ``gmp eval`` segment of ``run.json`` is still running and its process is
      alive (same host), or the run was written to within :data:`~genmanip_results.live.ACTIVE_S`
      (a process in another pid namespace under the same host name), or it was recorded on
      another host and the run was written to within :data:`~genmanip_results.live.STALE_AFTER_S`;
      without segments: a fresh episode lock (server), an ``INCOMPLETE`` episode written to within
      the stale window, or live frames newer than :data:`~genmanip_results.live.LIVE_FRESH_S`;
    * ``"interrupted"``: the newest segment still says running but its process is gone (killed,
      crashed; or nothing written within the stale window on another host), or it ended with
      Ctrl-C; without segments: an episode lock went stale before its episode finished;
    * ``"complete"``, ``"stopped"``, ``"failed"``: the newest segment's outcome (a server run
      whose final ``result.json`` exists is ``"complete"``); ``"finished"``: ``run.json`` says
      finished but not how;
    * ``None``: nothing tells (an older recording, a server run that has claimed nothing).
    """

    path: Path
    layout: Layout
    benchmark: str
    run_id: str
    created: float
    updated: float
    episodes: list[EpisodeInfo]
    total_episodes: int | None
    manifest: dict[str, Any] | None
    submitted: dict[str, Any] | None
    locks: list[LockInfo]
    live: bool
    metric: dict[str, TaskMetric] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    state: str | None = None
    state_detail: str = ""

    @property
    def key(self) -> str:
        """``<benchmark>/<run_id>``."""
        return f"{self.benchmark}/{self.run_id}"

    @property
    def n_complete(self) -> int:
        return sum(1 for e in self.episodes if e.complete)

    @property
    def n_success(self) -> int:
        return sum(1 for e in self.episodes if e.complete and e.success)

    @property
    def success_rate(self) -> float | None:
        """Successes over complete episodes (``None`` when nothing is complete)."""
        n = self.n_complete
        return self.n_success / n if n else None

    @property
    def mean_score(self) -> float | None:
        """Mean score of complete episodes (``None`` when nothing is complete)."""
        scores = [e.score for e in self.episodes if e.complete and e.score is not None]
        return sum(scores) / len(scores) if scores else None

    def tasks(self) -> dict[str, list[EpisodeInfo]]:
        """Episodes grouped by task name (tasks sorted, seeds sorted)."""
        out: dict[str, list[EpisodeInfo]] = {}
        for e in sorted(self.episodes, key=lambda e: (e.task_name, _seed_key(e.seed))):
            out.setdefault(e.task_name, []).append(e)
        return out


def _seed_key(seed: str) -> tuple[int, str]:
    return (int(seed), seed) if seed.isdigit() else (1 << 62, seed)


# --------------------------------------------------------------------------------------------
# Directory listing with an mtime-keyed cache (shared by one-shot loads and RunScanner)


class _Lister:
    """Lists directories, reusing a cached listing while the directory's mtime is unchanged."""

    def __init__(self) -> None:
        self.cache: dict[str, tuple[int, list[_Entry]]] = {}
        self.seen: set[str] = set()

    def mtime_ns(self, path: str | Path) -> int | None:
        try:
            return os.stat(path).st_mtime_ns
        except OSError:
            return None

    def list_m(self, path: str | Path) -> tuple[int | None, list[_Entry]]:
        """(mtime_ns, entries) of a directory; ``(None, [])`` when it cannot be read."""
        key = os.fspath(path)
        self.seen.add(key)
        m = self.mtime_ns(key)
        if m is None:
            return None, []
        hit = self.cache.get(key)
        if hit is not None and hit[0] == m:
            return m, hit[1]
        entries: list[_Entry] = []
        try:
            with os.scandir(key) as it:
                for de in it:
                    try:
                        is_link = de.is_symlink()
                        entries.append((de.name, de.is_dir(), de.is_file(), is_link))
                    except OSError:
                        continue
        except OSError as exc:
            log.warning("cannot list %s: %s", key, exc)
            return None, []
        entries.sort()
        self.cache[key] = (m, entries)
        return m, entries

    def list(self, path: str | Path) -> list[_Entry]:
        return self.list_m(path)[1]

    def prune(self) -> None:
        """Forget directories not listed since the last prune (deleted runs)."""
        for k in list(self.cache):
            if k not in self.seen:
                del self.cache[k]
        self.seen.clear()


def _safe_child(parent: Path, entry: _Entry, root: Path) -> Path | None:
    """The child path, or ``None`` when it is a symlink leaving ``root`` (warned)."""
    name, _is_dir, _is_file, is_link = entry
    p = parent / name
    if is_link and not is_within(p, root):
        log.warning("skipping %s: symlink leads outside %s", p, root)
        return None
    return p


def _read_json_file(path: Path, root: Path | None = None) -> tuple[Any, str | None]:
    """(value, error). A missing file is (None, None). A file that resolves outside ``root``
    (default: its own directory) is not read."""
    boundary = root if root is not None else path.parent
    try:
        with open_within(path, boundary, field=path.name) as fh:
            raw = fh.read()
    except UnsafePathError:
        log.warning("not reading %s: symlink leads outside %s", path, boundary)
        return None, f"{path.name}: symlink leads outside the results root"
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path.name}: cannot read ({exc.strerror or exc})"
    try:
        return json.loads(raw.decode("utf-8")), None
    except (UnicodeDecodeError, ValueError) as exc:
        return None, f"{path.name}: invalid JSON ({exc})"


def _mtime(path: Path) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _newest_file(directory: Path) -> float:
    """The newest mtime of the regular files directly in ``directory`` (0 when none); links are
    not followed."""
    newest = 0.0
    try:
        with os.scandir(directory) as it:
            for de in it:
                try:
                    if de.is_file(follow_symlinks=False):
                        newest = max(newest, de.stat(follow_symlinks=False).st_mtime)
                except OSError:
                    continue
    except OSError:
        pass
    return newest


# --------------------------------------------------------------------------------------------
# Predicates


def is_episode_dir(path: str | os.PathLike[str]) -> bool:
    """A seed-named directory holding a result file, ``steps.jsonl`` or ``INCOMPLETE``, or with a
    sibling ``<seed>.lock``."""
    p = Path(path)
    if not _SEED.match(p.name) or not p.is_dir():
        return False
    if any((p / m).exists() for m in _EPISODE_MARKERS):
        return True
    return (p.parent / f"{p.name}{LOCK_SUFFIX}").is_file()


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """True for a ``<benchmark>/<run_id>`` directory of either layout.

    Recognized by ``run.json``, ``progress.json``, ``submitted.flag``, a metric-dict
    ``result.json`` (not an episode's), or — for a server run that has written none of those yet —
    a child directory named after the benchmark (task names start with the benchmark id).
    """
    p = Path(path)
    if not p.is_dir() or is_episode_dir(p):
        return False
    if any((p / m).is_file() for m in _RUN_MARKERS):
        return True
    res = p / RESULT_JSON
    if res.is_file():
        value, err = _read_json_file(res)
        if err is None and isinstance(value, dict) and "score" not in value:
            return True
    bench = p.parent.name
    return bool(bench) and (p / bench).is_dir()


# --------------------------------------------------------------------------------------------
# Episodes


def _layout_of_files(names: set[str]) -> Layout:
    # Without any client file the directory was found through its sibling <seed>.lock: a server
    # episode in progress.
    if RESULT_INFO in names:
        return "server"
    return "client" if names & {RESULT_JSON, STEPS_JSONL, INCOMPLETE} else "server"


def _count_lines(path: Path, root: Path) -> int | None:
    """Complete rows of a JSONL file (a last row still being written does not count)."""
    try:
        n = 0
        with open_within(path, root, field=path.name) as fh:
            while chunk := fh.read(1 << 20):
                n += chunk.count(b"\n")
        return n
    except (OSError, UnsafePathError):
        return None


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _build_episode(
    ep_dir: Path,
    entries: list[_Entry],
    *,
    root: Path,
    benchmark: str,
    run_id: str,
    task_name: str,
) -> EpisodeInfo:
    names = {e[0] for e in entries}
    files: dict[str, Path] = {}
    for entry in entries:
        if not entry[2]:  # regular files only (symlinks to files count when inside root)
            continue
        child = _safe_child(ep_dir, entry, root)
        if child is not None:
            files[entry[0]] = child
    layout = _layout_of_files(names)
    seed = ep_dir.name
    error: str | None = None
    result: Any = None
    score: float | None = None
    steps: int | None = None
    instruction: str | None = None
    robot_id: str | None = None
    episode_id = f"{benchmark}/{run_id}/{task_name}/{seed}"
    complete = False

    result_name = RESULT_INFO if layout == "server" else RESULT_JSON
    if result_name in files:
        result, error = _read_json_file(files[result_name], root)
        if error is None:
            if not isinstance(result, dict):
                error = f"{result_name}: expected a JSON object, got {type(result).__name__}"
            else:
                score = _num(result.get("score"))
                if score is None:
                    error = f"{result_name}: 'score' is not a number ({result.get('score')!r})"
                else:
                    complete = True
                s = result.get("steps")
                if isinstance(s, int) and not isinstance(s, bool) and s >= 0:
                    steps = s
                if isinstance(result.get("instruction"), str):
                    instruction = result["instruction"]
                if isinstance(result.get("robot_id"), str):
                    robot_id = result["robot_id"]
        if error is not None:
            score = None
            log.warning("episode %s: %s", ep_dir, error)

    steps_file = files.get(STEPS_JSONL)
    if steps is None and steps_file is not None:
        steps = _count_lines(steps_file, root)

    videos: dict[str, Path] = {}
    for name in sorted(files):
        # gmp plot's overlay video is made from the cameras, it is none of them.
        if name.endswith(VIDEO_SUFFIX) and not name.startswith(".") and name != MERGED_VIDEO:
            videos[name[: -len(VIDEO_SUFFIX)]] = files[name]
    # A camera recorded without an mp4 yet (``--transcode deferred``) is read from its JPEG frame
    # store; every video reader takes either (genmanip_results.video / .frames).
    for name in sorted(files):
        if name.endswith(FRAME_STORE_SUFFIX) and not name.startswith("."):
            videos.setdefault(name[: -len(FRAME_STORE_SUFFIX)], files[name])
    rrd = files.get(EPISODE_RRD)
    if rrd is None:
        rrds = sorted(n for n in files if n.endswith(RRD_SUFFIX))
        rrd = files[rrds[0]] if rrds else None
    mt = _mtime(ep_dir) or 0.0
    if result_name in files:
        mt = max(mt, _mtime(files[result_name]) or 0.0)
    if steps_file is not None:
        mt = max(mt, _mtime(steps_file) or 0.0)
    if not complete and FRAMES_DIR in names:
        # An episode being recorded grows its frame spools at every observation (steps.jsonl is
        # buffered): their newest write is the episode's, which tells a running writer.
        mt = max(mt, _newest_file(ep_dir / FRAMES_DIR))
    return EpisodeInfo(
        path=ep_dir,
        layout=layout,
        benchmark=benchmark,
        run_id=run_id,
        task_name=task_name,
        seed=seed,
        episode_id=episode_id,
        complete=complete,
        score=score if complete else None,
        success=is_success(score) if complete else None,
        steps=steps,
        videos=videos,
        steps_file=steps_file,
        meta_record=files.get(META_RECORD),
        rrd=rrd,
        mtime=mt,
        error=error,
        instruction=instruction,
        robot_id=robot_id,
        result=result if isinstance(result, dict) else None,
        root=root,
    )


# (path, task_name, entries, dir mtime_ns)
_EpisodeHit = tuple[str, str, list[_Entry], int | None]


def _walk(
    run_dir: Path, root: Path, lister: _Lister
) -> tuple[list[_EpisodeHit], list[tuple[Path, str]]]:
    """Episode dirs and lock files ``(path, task_name)`` under a run.

    Works on plain strings: on a rescan of a large unchanged tree this loop is the whole cost.
    """
    episodes: list[_EpisodeHit] = []
    locks: list[tuple[Path, str]] = []
    visited: set[str] = set()
    root_s = os.fspath(root)

    def visit(d: str, rel: tuple[str, ...], depth: int) -> None:
        real = os.path.realpath(d)
        if real in visited or depth > _MAX_DEPTH:
            return
        visited.add(real)
        entries = lister.list(d)
        lock_seeds: set[str] = set()
        task = "/".join(rel)
        for name, _is_dir, is_file, is_link in entries:
            if is_file and rel and name.endswith(LOCK_SUFFIX) and _SEED.match(name[:-_LOCK_LEN]):
                lock_seeds.add(name[:-_LOCK_LEN])
                path = os.path.join(d, name)
                if is_link and not is_within(path, root_s):
                    log.warning("skipping %s: symlink leads outside %s", path, root_s)
                    continue
                locks.append((Path(path), task))
        for name, is_dir, _is_file, is_link in entries:
            if not is_dir or name.startswith("."):
                continue
            child = os.path.join(d, name)
            if is_link:
                # Task names are the real directory path: a linked directory would list its
                # episodes twice, or under a made-up task name. Never descend into one.
                if not is_within(child, root_s):
                    log.warning("skipping %s: symlink leads outside %s", child, root_s)
                else:
                    log.debug("skipping %s: a symlinked directory inside a run", child)
                continue
            if rel and _SEED.match(name):
                m, sub = lister.list_m(child)
                if name in lock_seeds or any(s[0] in _EPISODE_MARKERS for s in sub):
                    episodes.append((child, task, sub, m))
                    continue
            visit(child, (*rel, name), depth + 1)

    visit(os.fspath(run_dir), (), 0)
    return episodes, locks


def find_episode_dirs(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Every episode directory under ``run_dir``, sorted by (task name, seed)."""
    rd = Path(run_dir)
    eps, _ = _walk(rd, rd.resolve(), _Lister())
    eps.sort(key=lambda t: (t[1], _seed_key(os.path.basename(t[0]))))
    return [Path(t[0]) for t in eps]


def _find_run_ancestor(ep_dir: Path) -> Path | None:
    for anc in list(ep_dir.parents)[1:_MAX_DEPTH]:
        if is_run_dir(anc):
            return anc
    return None


def load_episode(
    ep_dir: str | os.PathLike[str], *, run_dir: str | os.PathLike[str] | None = None
) -> EpisodeInfo:
    """Read one episode directory. ``run_dir`` defaults to the nearest ancestor that
    :func:`is_run_dir` accepts (else the grandparent); it fixes benchmark, run id and task name."""
    ep = Path(ep_dir)
    rd = Path(run_dir) if run_dir is not None else (_find_run_ancestor(ep) or ep.parent.parent)
    try:
        task = ep.parent.relative_to(rd).as_posix()
    except ValueError:
        task = ep.parent.name
    lister = _Lister()
    bench, run_id = _run_names(rd, _manifest_of(rd)[0])
    return _build_episode(
        ep, lister.list(ep), root=rd.resolve(), benchmark=bench, run_id=run_id, task_name=task
    )


# --------------------------------------------------------------------------------------------
# Locks


def _lock_info(
    path: Path, task_name: str, now: float, stale_after: float, root: Path | None = None
) -> LockInfo:
    seed = path.name[: -len(LOCK_SUFFIX)]
    data, _err = _read_json_file(path, root)
    data = data if isinstance(data, dict) else {}
    mt = _mtime(path) or 0.0
    ts_val = _num(data.get("timestamp"))
    ts = max(mt, ts_val) if ts_val is not None else mt
    done = (path.parent / seed / RESULT_INFO).exists()
    pid = data.get("pid")
    host = data.get("host")
    wid = data.get("worker_id")
    return LockInfo(
        path=path,
        task_name=task_name,
        seed=seed,
        worker_id=None if wid is None else str(wid),
        timestamp=ts,
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        host=host if isinstance(host, str) else None,
        stale=done or (now - ts) > stale_after,
    )


def read_locks(
    run_dir: str | os.PathLike[str],
    *,
    now: float | None = None,
    stale_after: float = LOCK_STALE_AFTER,
) -> list[LockInfo]:
    """Every ``<task_name>/<seed>.lock`` under ``run_dir`` with its staleness (sorted by task,
    seed). ``now`` defaults to ``time.time()``."""
    rd = Path(run_dir)
    _, locks = _walk(rd, rd.resolve(), _Lister())
    t = time.time() if now is None else now
    out = [_lock_info(p, task, t, stale_after, rd.resolve()) for p, task in locks]
    out.sort(key=lambda li: (li.task_name, _seed_key(li.seed)))
    return out


# --------------------------------------------------------------------------------------------
# Runs


def _manifest_of(
    run_dir: Path, root: Path | None = None
) -> tuple[dict[str, Any] | None, str | None]:
    value, err = _read_json_file(run_dir / RUN_JSON, root or run_dir.resolve())
    if err is not None:
        return None, err
    if value is not None and not isinstance(value, dict):
        return None, "run.json: expected a JSON object"
    return value, None


def _run_names(run_dir: Path, manifest: Mapping[str, Any] | None) -> tuple[str, str]:
    bench = run_dir.parent.name
    run_id = run_dir.name
    if manifest:
        b = manifest.get("benchmark") or manifest.get("benchmark_id")
        r = manifest.get("run_id")
        if isinstance(b, str) and b:
            bench = b
        if isinstance(r, str) and r:
            run_id = r
    return bench, run_id


def _epoch(value: Any) -> float | None:
    """Epoch seconds from a number, an ISO 8601 string or the server's
    ``%Y-%m-%d_%H_%M_%S_%f`` form."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str) or not value:
        return None
    try:
        return _dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        pass
    try:
        return _dt.datetime.strptime(value, "%Y-%m-%d_%H_%M_%S_%f").timestamp()
    except ValueError:
        pass
    return None


#: A ``run.json`` segment's ``outcome`` (genmanip_eval.runner) once its invocation has ended.
_OUTCOMES = ("complete", "stopped", "failed", "interrupted")


def _segment_process(seg: Mapping[str, Any]) -> tuple[str | None, int | None, float | None]:
    """(host, pid, start time) of the ``gmp eval`` invocation that wrote a ``run.json`` segment:
    its id is ``<host>:<pid>:<ISO start time>`` (genmanip_eval.runner); the pid is None when the
    id does not read so."""
    host = seg.get("host") if isinstance(seg.get("host"), str) else None
    pid: int | None = None
    started: float | None = None
    sid = seg.get("id")
    if isinstance(sid, str):
        parts = sid.split(":", 2)
        n = parse_pid(parts[1]) if len(parts) == 3 else None
        if n is not None and parts[0] and parts[0] == (host or parts[0]):
            host, pid, started = parts[0], n, _epoch(parts[2])
    return host, pid, started if started is not None else _epoch(seg.get("started"))


def _ago(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _run_state(
    manifest: Mapping[str, Any] | None,
    *,
    now: float,
    newest_write: float,
    live_written: float,
    fresh_lock: bool,
    abandoned_lock: bool,
    recent_incomplete: bool,
    final_metric: bool,
) -> tuple[str | None, str]:
    """(state, detail) of a run: the rules of :attr:`RunInfo.state`. ``newest_write`` and
    ``live_written`` are epoch seconds of the run's newest write and its newest live-view state
    (0: none)."""
    quiet = now - max(newest_write, live_written)  # seconds since anything of the run was written
    raw = manifest.get("segments") if isinstance(manifest, Mapping) else None
    segments = [s for s in raw if isinstance(s, Mapping)] if isinstance(raw, list) else []
    if segments:
        gone: list[str] = []
        for seg in segments:
            if seg.get("outcome") != "running":
                continue
            host, pid, started = _segment_process(seg)
            alive = process_alive(pid, host, started=started)
            if alive:
                return "live", f"gmp eval (pid {pid}) is running on {host}"
            where = f"recorded on {host}" if host else "recorded elsewhere"
            if alive is None:
                if quiet <= STALE_AFTER_S:
                    return "live", f"{where}, last written {_ago(max(quiet, 0.0))} ago"
                gone.append(f"{where}, nothing written for {_ago(quiet)}")
            elif quiet <= ACTIVE_S:
                # Its files still change: a process this machine cannot see (another pid
                # namespace under the same host name), not a dead one.
                return "live", f"written {_ago(max(quiet, 0.0))} ago"
            else:
                gone.append(f"gmp eval (pid {pid}) on {host} is gone")
        # An ended segment's outcome is final: a finished run is not "live" while its last
        # files settle.
        newest = max(segments, key=lambda s: _epoch(s.get("started")) or 0.0)
        outcome = newest.get("outcome")
        if outcome == "running":
            return "interrupted", "; ".join(gone)
        if outcome in _OUTCOMES:
            finished = newest.get("finished")
            return str(outcome), f"{outcome} at {finished}" if finished else str(outcome)
        return None, ""
    if fresh_lock:
        return "live", "an episode lock is fresh"
    finished = manifest.get("finished") if isinstance(manifest, Mapping) else None
    if finished:
        return "finished", f"finished at {finished}"
    if recent_incomplete:
        return "live", f"an unfinished episode was written {_ago(max(quiet, 0.0))} ago"
    if live_written and now - live_written < LIVE_FRESH_S:
        return "live", "a worker publishes live frames"
    if abandoned_lock:
        return "interrupted", "an episode lock went stale before its episode finished"
    if final_metric:
        return "complete", "the server wrote its final result.json"
    return None, ""


def _load_run(
    run_dir: Path,
    root: Path,
    lister: _Lister,
    ep_cache: dict[str, tuple[int | None, EpisodeInfo]] | None,
    now: float,
) -> RunInfo:
    errors: list[str] = []
    manifest, err = _manifest_of(run_dir, root)
    if err:
        errors.append(err)
    bench, run_id = _run_names(run_dir, manifest)
    top = {e[0] for e in lister.list(run_dir)}

    submitted: dict[str, Any] | None = None
    if SUBMITTED_FLAG in top:
        val, err = _read_json_file(run_dir / SUBMITTED_FLAG, root)
        if err:
            errors.append(err)
        submitted = val if isinstance(val, dict) else {}

    metric: dict[str, TaskMetric] = {}
    metric_file = None
    for name in (RESULT_JSON, PROGRESS_JSON):
        if name in top:
            metric_file = name
            val, err = _read_json_file(run_dir / name, root)
            if err:
                errors.append(err)
                continue
            try:
                metric = parse_metric(val, where=name)
            except Exception as exc:  # ResponseError: report, never stop the scan
                errors.append(f"{name}: {exc}")
            break
    if metric_file is None and manifest and isinstance(manifest.get("metric"), dict):
        try:
            metric = parse_metric(manifest["metric"], where="run.json metric")
        except Exception as exc:
            errors.append(f"run.json metric: {exc}")

    ep_dirs, lock_paths = _walk(run_dir, root, lister)
    episodes: list[EpisodeInfo] = []
    for ep_path, task, entries, dir_mtime in ep_dirs:
        # Result files are written atomically (rename), which changes the directory's mtime:
        # the directory mtime is the whole signature of a complete episode.
        hit = ep_cache.get(ep_path) if ep_cache is not None else None
        if hit is not None and hit[0] == dir_mtime and hit[1].complete and hit[1].task_name == task:
            episodes.append(hit[1])
            continue
        info = _build_episode(
            Path(ep_path), entries, root=root, benchmark=bench, run_id=run_id, task_name=task
        )
        # A directory changed within the file system's timestamp granularity of this scan could
        # change again without a new mtime ("racy" entries, as git calls them): not cached.
        if (
            ep_cache is not None
            and dir_mtime is not None
            and abs(time.time_ns() - dir_mtime) > _RACY_NS
        ):
            ep_cache[ep_path] = (dir_mtime, info)
        episodes.append(info)
    episodes.sort(key=lambda e: (e.task_name, _seed_key(e.seed)))

    locks = [_lock_info(p, task, now, LOCK_STALE_AFTER, root) for p, task in lock_paths]
    locks.sort(key=lambda li: (li.task_name, _seed_key(li.seed)))

    if manifest is not None:
        layout: Layout = "client"
    elif any(e.layout == "server" for e in episodes) or locks or metric_file:
        layout = "server"
    elif episodes:
        layout = "client"
    else:
        layout = "server" if EVAL_RESULTS_DIR in run_dir.parts else "client"

    times = [e.mtime for e in episodes] + [li.timestamp for li in locks]
    for name in (RUN_JSON, RESULT_JSON, PROGRESS_JSON, SUBMITTED_FLAG):
        if name in top:
            t = _mtime(run_dir / name)
            if t is not None:
                times.append(t)
    run_mtime = _mtime(run_dir) or 0.0
    created = min(times) if times else run_mtime
    updated = max([*times, run_mtime]) if times else run_mtime
    if manifest:
        for k in ("started", "start", "start_time", "created"):
            t = _epoch(manifest.get(k))
            if t is not None:
                created = t
                break

    done = {(e.task_name, e.seed) for e in episodes if e.complete}
    state, detail = _run_state(
        manifest,
        now=now,
        newest_write=updated,
        live_written=live_activity(run_dir),
        fresh_lock=any(not li.stale for li in locks),
        abandoned_lock=any(li.stale and (li.task_name, li.seed) not in done for li in locks),
        recent_incomplete=any(
            not e.complete and e.layout == "client" and (now - e.mtime) <= LOCK_STALE_AFTER
            and (e.path / INCOMPLETE).exists()
            for e in episodes
        ),
        final_metric=metric_file == RESULT_JSON and layout == "server",
    )

    total: int | None = None
    if manifest is not None:
        t = manifest.get("total_episodes")
        if isinstance(t, int) and not isinstance(t, bool) and t >= 0:
            total = t
    if total is None and metric and all(m.total is not None for m in metric.values()):
        total = sum(m.total or 0 for m in metric.values())

    return RunInfo(
        path=run_dir,
        layout=layout,
        benchmark=bench,
        run_id=run_id,
        created=created,
        updated=updated,
        episodes=episodes,
        total_episodes=total,
        manifest=manifest,
        submitted=submitted,
        locks=locks,
        live=state == "live",
        metric=metric,
        errors=errors,
        state=state,
        state_detail=detail,
    )


def load_run(run_dir: str | os.PathLike[str], *, now: float | None = None) -> RunInfo:
    """Read one run directory (either layout); see :class:`RunInfo`."""
    rd = Path(run_dir)
    return _load_run(rd, rd.resolve(), _Lister(), None, time.time() if now is None else now)


def _results_roots(root: Path) -> list[Path]:
    """The known trees inside a project root (:func:`~genmanip_results.roots.project_trees`) that
    exist, or the root itself (a results root or a benchmark directory)."""
    found = [p for p in project_trees(root) if p.is_dir()]
    return found or [root]


def _candidate_runs(root: Path, lister: _Lister, real_root: Path) -> list[Path]:
    if is_run_dir(root):
        return [root]
    runs: list[Path] = []
    for base in _results_roots(root):
        for e1 in lister.list(base):
            if not e1[1] or e1[0].startswith("."):
                continue
            c1 = _safe_child(base, e1, real_root)
            if c1 is None:
                continue
            if is_run_dir(c1):  # ``base`` is a benchmark directory
                runs.append(c1)
                continue
            for e2 in lister.list(c1):
                if not e2[1] or e2[0].startswith("."):
                    continue
                c2 = _safe_child(c1, e2, real_root)
                if c2 is not None and is_run_dir(c2):
                    runs.append(c2)
    return runs


def _sort_runs(runs: Iterable[RunInfo]) -> list[RunInfo]:
    return sorted(runs, key=lambda r: (-r.created, str(r.path)))


def find_runs(root: str | os.PathLike[str], *, now: float | None = None) -> list[RunInfo]:
    """Every run under ``root``, newest (``created``) first.

    ``root`` may be a project root (holding any of the known trees ``saved/eval_results``,
    ``client_results``, ``gmp-demo``: :func:`genmanip_results.roots.project_trees`), a results
    root (``<benchmark>/<run_id>`` below it), a benchmark directory, or a run directory.
    """
    r = Path(root)
    if not r.is_dir():
        return []
    lister = _Lister()
    real = r.resolve()
    t = time.time() if now is None else now
    return _sort_runs(_load_run(p, real, lister, None, t) for p in _candidate_runs(r, lister, real))


class RunScanner:
    """Incremental :func:`find_runs` for a results browser that rescans often.

    Directory listings are cached by path + mtime and complete episodes by their directory and
    result-file mtimes, so a rescan of an unchanged tree only stats directories; incomplete
    episodes and locks are re-read each time (they change without a directory mtime change).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._lister = _Lister()
        self._episodes: dict[str, tuple[int | None, EpisodeInfo]] = {}
        # Servers call scan() from request threads; the caches are not safe to share unguarded.
        self._lock = threading.Lock()

    def scan(self, *, now: float | None = None) -> list[RunInfo]:
        """Rescan; returns the same shape as :func:`find_runs`. Thread-safe (scans serialize)."""
        with self._lock:
            return self._scan(now)

    def _scan(self, now: float | None) -> list[RunInfo]:
        if not self.root.is_dir():
            return []
        real = self.root.resolve()
        t = time.time() if now is None else now
        runs = [
            _load_run(p, real, self._lister, self._episodes, t)
            for p in _candidate_runs(self.root, self._lister, real)
        ]
        self._lister.prune()
        live = {str(e.path) for r in runs for e in r.episodes}
        for k in list(self._episodes):
            if k not in live:
                del self._episodes[k]
        return _sort_runs(runs)


def run_policy(run: RunInfo) -> dict[str, Any] | None:
    """The policy a client-recorded run was evaluated with (``run.json``: spec and args), every
    one of them when resumed with another (``segments``); None for a server-layout run."""
    manifest = run.manifest if isinstance(run.manifest, dict) else {}
    pol = manifest.get("policy")
    if not isinstance(pol, dict):
        return None
    out: dict[str, Any] = {"spec": str(pol.get("spec")), "args": dict(pol.get("args") or {})}
    seen = []
    for seg in manifest.get("segments") or []:
        p = seg.get("policy") if isinstance(seg, dict) else None
        if isinstance(p, dict):
            entry = {"spec": str(p.get("spec")), "args": dict(p.get("args") or {})}
            if entry not in seen:
                seen.append(entry)
    if len(seen) > 1:
        out["all"] = seen
    return out


def policy_label(policy: dict[str, Any] | None) -> str:
    """``spec k=v ...`` of :func:`run_summary`'s ``policy`` (``+N more`` when it changed)."""
    if not policy:
        return "-"
    text = str(policy["spec"]) + "".join(f" {k}={v}" for k, v in policy.get("args", {}).items())
    extra = len(policy.get("all") or []) - 1
    return text + (f" (+{extra} more)" if extra > 0 else "")


def run_rel(run_dir: str | os.PathLike[str], root: str | os.PathLike[str]) -> str:
    """The run directory's path under ``root`` (``/``-separated, both resolved), or just its name
    when it is not under ``root``: what :func:`run_key` is computed from."""
    try:
        return Path(run_dir).resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return Path(run_dir).name


def run_key(rel: str) -> str:
    """The opaque, stable id a run is addressed by (``gmp viz``'s ``/run/<key>`` URLs, and the
    links ``gmp report`` makes to them): 12 hex characters of the SHA-256 of its
    :func:`run_rel` under the root ``gmp viz`` serves."""
    return hashlib.sha256(rel.encode("utf-8")).hexdigest()[:12]
