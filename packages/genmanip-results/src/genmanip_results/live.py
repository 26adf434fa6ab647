"""The live-view contract: what a running ``gmp eval`` publishes and ``gmp viz`` shows.

One directory per worker of a run (client layout, ``docs/architecture.md``)::

    <run_dir>/.live/<worker_id>/
        <camera>.jpg    the worker's newest frame of that camera (the JPEG bytes as received)
        live.json       the worker's state: {"worker_id", "step", "episode_id", "instruction",
                        "task_name", "updated" (epoch s), "episodes", "successes", "sr",
                        "sr_ci95", "cameras"} — "cameras" lists the .jpg files written with it

The writer (:func:`write_live_view`, used by eval's recorder) replaces every file atomically
(tmp + rename; no fsync: a live view is disposable), frames first and ``live.json`` last, so a
reader never sees half a file. The readers (:func:`live_workers`, :func:`live_state_path`,
:func:`live_frame_path`, :func:`read_live_state`, used by viz) never follow anything out of the
run directory.

Path safety: worker ids and camera names come from the wire (the server names workers, the
observation names cameras) and end up both in file names here and in viz URLs, so both sides
apply one rule, :func:`genmanip_results.paths.safe_component` (letters, digits, ``_ . @ + = -``,
not starting with a dot or dash, at most 128 characters): a name eval would write is exactly a
name viz will show, and a hostile one is refused on both sides. Every path is then joined with
:func:`genmanip_results.paths.safe_join` / :func:`genmanip_results.paths.safe_file` and every file
read is opened through :func:`genmanip_results.paths.open_within` (symlinks resolved where the file
is opened, so one swapped in after the listing is not followed either).

Whether the process behind a run is still there is :func:`process_alive` (the pid and host a
writer recorded, checked on this machine: a pid reused by a later process does not count; a pid
recorded as text is read by :func:`parse_pid`, and :func:`owner_alive` answers it for a note's
file-name pid and host: may its writer still run) and how
recently its files changed is :func:`live_activity` and :data:`ACTIVE_S`; the run's state built
from them (``live``, ``interrupted``, its outcome) is :attr:`genmanip_results.discovery.RunInfo.state`.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .layout import LIVE_DIR, LIVE_FRAME_SUFFIX, LIVE_STATE
from .paths import (
    UnsafePathError,
    is_within,
    read_bytes_within,
    safe_component,
    safe_file,
    safe_join,
)

__all__ = [
    "ACTIVE_S",
    "LIVE_FRESH_S",
    "STALE_AFTER_S",
    "LiveWorker",
    "live_activity",
    "live_dir",
    "live_frame_path",
    "live_state_path",
    "live_workers",
    "owner_alive",
    "parse_pid",
    "process_alive",
    "read_live_frame",
    "read_live_state",
    "write_live_view",
]

#: A worker whose newest live file is older than this (seconds) no longer counts as live.
LIVE_FRESH_S = 60.0
#: Writes this recent (seconds) show a writer at work whatever else is known: a run whose
#: process looks gone from here (a container with its own pids under the same host name) but
#: whose episode files still change is live for this much longer, and a crashed one says so
#: this long after its last write.
ACTIVE_S = 5.0
#: A write older than this (seconds) no longer shows a live writer when nothing else can be
#: checked (a run recorded on another host, a recording without a process record): the real
#: server's rule for its episode locks.
STALE_AFTER_S = 300.0
#: How much later than the time a writer recorded for itself its process may seem to have started
#: (boot time and clock ticks are coarse) before the pid counts as reused by another process.
_START_SLACK_S = 2.0


def live_dir(run_dir: str | os.PathLike[str], worker_id: str) -> Path:
    """``<run_dir>/.live/<worker_id>`` for a worker id that passes
    :func:`~genmanip_results.paths.safe_component` and a directory that does not resolve out of
    ``run_dir`` (a symlink); :class:`~genmanip_results.paths.UnsafePathError` otherwise."""
    safe_component(worker_id, field="worker_id")
    return safe_join(run_dir, LIVE_DIR, worker_id, field="worker_id")


def write_live_view(
    run_dir: str | os.PathLike[str],
    worker_id: str,
    frames: Mapping[str, bytes | bytearray | memoryview],
    state: Mapping[str, Any],
    *,
    within: str | os.PathLike[str] | None = None,
) -> Path:
    """Publish a worker's newest frames and state; return its live directory.

    Args:
        run_dir: the run directory (``<results_root>/<benchmark>/<run_id>``).
        worker_id: the worker's id as the server sent it.
        frames: camera name (``left_camera``) -> JPEG bytes. Cameras whose name fails the name
            rule are left out (and so not listed in ``cameras``).
        state: the ``live.json`` content; ``cameras`` (the frames written) is added.
        within: a directory the live directory must also resolve inside (eval: the results root).

    Raises:
        UnsafePathError: ``worker_id`` fails the name rule or the directory resolves outside
            ``run_dir`` / ``within``.
        OSError: the files cannot be written.
    """
    from genmanip_runtime.atomic import atomic_write_bytes, atomic_write_json

    d = live_dir(run_dir, worker_id)
    d.mkdir(parents=True, exist_ok=True)
    # Checked again after mkdir: the directory may have been a symlink created meanwhile.
    if not is_within(d, run_dir) or (within is not None and not is_within(d, within)):
        raise UnsafePathError(f"worker_id: {worker_id!r}: live directory resolves outside the run")
    cams: list[str] = []
    for cam, data in frames.items():
        try:
            target = safe_file(d, cam, suffix=LIVE_FRAME_SUFFIX, field="camera")
        except UnsafePathError:
            continue  # a camera viz could not serve: not published
        atomic_write_bytes(target, bytes(data), fsync=False)
        cams.append(cam)
    atomic_write_json(d / LIVE_STATE, {**state, "cameras": cams}, fsync=False)
    return d


# ----------------------------------------------------------------------------- the writer process


def _process_start(pid: int) -> tuple[str, float] | None:
    """(state letter, start time in epoch seconds) of ``pid`` from Linux ``/proc``; None when
    ``/proc`` cannot tell."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        # fields[0] is field 3 of proc_pid_stat(5) (the state), fields[19] field 22 (starttime,
        # clock ticks after boot).
        return fields[0], boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def parse_pid(text: object) -> int | None:
    """The pid a writer recorded as text (a field of a note's file name, of a segment id), or
    None when ``text`` is no positive decimal number: the one reading of a recorded pid."""
    if not isinstance(text, str) or not text.isascii() or not text.isdigit():
        return None  # (isascii: str.isdigit also takes other scripts' digits)
    pid = int(text)
    return pid if pid > 0 else None


def owner_alive(pid: str | None, host: object, *, this_host: str | None = None) -> bool:
    """May the process that left a note still be running: its ``pid`` (as recorded: the text of
    the note's file name, read by :func:`parse_pid`) on ``host`` (as the note says: any JSON
    value)?

    False only when this machine knows it is gone: a note of this host whose pid no live process
    has, or that has no pid (nothing is left to own it). True when it runs, and when this
    machine cannot tell (another host, or none recorded): a note of another machine's writer on
    a shared filesystem is never raced. The tri-state answer is :func:`process_alive`.
    """
    here = this_host if this_host is not None else socket.gethostname()
    n = parse_pid(pid)
    if host == here and n is None:
        return False
    return process_alive(n, host if isinstance(host, str) else None, this_host=here) is not False


def process_alive(
    pid: int | None,
    host: str | None,
    *,
    started: float | None = None,
    this_host: str | None = None,
) -> bool | None:
    """Is the process ``pid`` on ``host`` that recorded itself at epoch ``started`` still running?

    None when this machine cannot tell: ``host`` is another machine (or unknown) or there is no
    pid. On this host: False for a pid no process has, a zombie (killed, never reaped), or a
    process that started after ``started`` (the pid was reused); True otherwise, also when the
    process is someone else's (it exists). ``this_host`` defaults to :func:`socket.gethostname`.
    """
    if not host or host != (this_host if this_host is not None else socket.gethostname()):
        return None
    if pid is None or isinstance(pid, bool) or pid <= 0:
        return None
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, it is not ours
    except OSError:
        return None
    proc = _process_start(pid)
    if proc is None:
        return True  # no /proc: the signal said it exists
    state, start = proc
    if state == "Z":
        return False
    return not (started is not None and start > started + _START_SLACK_S)


def live_activity(run_dir: str | os.PathLike[str]) -> float:
    """Epoch seconds of the newest ``live.json`` under ``<run_dir>/.live`` (0 when none): one stat
    per worker, nothing parsed, nothing followed out of the run."""
    run = Path(run_dir)
    newest = 0.0
    try:
        entries = list((run / LIVE_DIR).iterdir())
    except OSError:
        return newest
    for wdir in entries:
        if not _valid(wdir.name, "worker_id"):
            continue
        state = wdir / LIVE_STATE
        if not is_within(state, run):
            continue
        try:
            newest = max(newest, state.stat().st_mtime)
        except OSError:
            continue
    return newest


# ------------------------------------------------------------------------------------ reading


@dataclass(frozen=True)
class LiveWorker:
    """One worker that published a live view under ``<run_dir>/.live/<worker_id>/``.

    Attributes:
        worker_id: the directory name (passed the name rule).
        cameras: the cameras with a frame file, sorted.
        state: ``live.json`` (empty when missing or unreadable).
        updated: epoch seconds of the newest live file (0 when none).
        fresh: ``updated`` is less than :data:`LIVE_FRESH_S` seconds old.
    """

    worker_id: str
    cameras: tuple[str, ...]
    state: dict[str, Any]
    updated: float
    fresh: bool
    task_name: str | None = None
    seed: str | None = None


def _valid(name: str, field: str) -> bool:
    try:
        safe_component(name, field=field)
    except UnsafePathError:
        return False
    return True


def live_workers(
    run_dir: str | os.PathLike[str], *, now: float | None = None, fresh_s: float = LIVE_FRESH_S
) -> list[LiveWorker]:
    """Every worker that published a live view in ``run_dir``, sorted by worker id.

    Entries whose name fails the name rule (hidden files, hostile names) and directories that
    resolve out of ``run_dir`` (symlinks) are not workers; frame files with such names are not
    cameras. ``now`` (epoch s, default: the current time) decides ``fresh``.
    """
    now = time.time() if now is None else now
    run = Path(run_dir)
    out: list[LiveWorker] = []
    try:
        entries = sorted((run / LIVE_DIR).iterdir())
    except OSError:
        return out
    for wdir in entries:
        if not _valid(wdir.name, "worker_id") or not wdir.is_dir() or not is_within(wdir, run):
            continue
        state: dict[str, Any] = {}
        updated = 0.0
        info = wdir / LIVE_STATE
        try:
            raw = json.loads(read_bytes_within(info, run, field="live_state").decode("utf-8"))
            if isinstance(raw, dict):
                state = raw
            updated = info.stat().st_mtime
        except (OSError, ValueError, UnsafePathError):
            pass
        cams = []
        for f in sorted(wdir.glob(f"*{LIVE_FRAME_SUFFIX}")):
            if not _valid(f.stem, "camera"):
                continue  # not a camera name we serve
            cams.append(f.stem)
            try:
                updated = max(updated, f.stat().st_mtime)
            except OSError:
                pass
        out.append(
            LiveWorker(
                worker_id=wdir.name,
                cameras=tuple(cams),
                state=state,
                updated=updated,
                fresh=(now - updated) < fresh_s,
            )
        )
    return out


def _live_file(
    run_dir: str | os.PathLike[str],
    worker_id: str,
    name: str,
    within: str | os.PathLike[str] | None,
) -> Path | None:
    try:
        path = live_dir(run_dir, worker_id) / name
    except UnsafePathError:
        return None
    if not is_within(path, run_dir) or (within is not None and not is_within(path, within)):
        return None  # a symlinked file pointing out of the run (or the served root)
    return path if path.is_file() else None


def live_state_path(
    run_dir: str | os.PathLike[str],
    worker_id: str,
    *,
    within: str | os.PathLike[str] | None = None,
) -> Path | None:
    """The worker's ``live.json`` when it exists and stays inside ``run_dir`` (and ``within``);
    None for a missing file, an unsafe worker id or a symlink out."""
    return _live_file(run_dir, worker_id, LIVE_STATE, within)


def live_frame_path(
    run_dir: str | os.PathLike[str],
    worker_id: str,
    camera: str,
    *,
    within: str | os.PathLike[str] | None = None,
) -> Path | None:
    """The worker's newest frame of ``camera`` (JPEG) under the same rules as
    :func:`live_state_path`; None also for a camera name that fails the name rule."""
    if not _valid(camera, "camera"):
        return None
    return _live_file(run_dir, worker_id, f"{camera}{LIVE_FRAME_SUFFIX}", within)


def read_live_state(
    path: str | os.PathLike[str], *, within: str | os.PathLike[str] | None = None
) -> dict[str, Any] | None:
    """``live.json`` at ``path`` as a dict, or None when it cannot be read, is not an object
    (written atomically, so that is a real but usually transient problem) or resolves outside
    ``within`` (default: its own directory) where it is opened."""
    boundary = within if within is not None else Path(path).parent
    try:
        data = json.loads(read_bytes_within(path, boundary, field="live_state").decode("utf-8"))
    except (OSError, ValueError, UnsafePathError):
        return None
    return data if isinstance(data, dict) else None


def read_live_frame(
    path: str | os.PathLike[str], *, within: str | os.PathLike[str]
) -> bytes | None:
    """The JPEG bytes at ``path`` (from :func:`live_frame_path`), opened within ``within``; None
    when it is gone or resolves outside it where it is opened."""
    try:
        return read_bytes_within(path, within, field="camera")
    except (OSError, UnsafePathError):
        return None
