from __future__ import annotations

import json
import multiprocessing as mp
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from genmanip_protocol.errors import EncodeError, ExitCode
from genmanip_runtime.atomic import (
    FileLock,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    merge_json,
    read_json,
)
from genmanip_runtime.errors import GenmanipRuntimeError, LockTimeout


def test_atomic_write_bytes_replaces_and_leaves_no_tmp(tmp_path: Path) -> None:
    target = tmp_path / "a.bin"
    target.write_bytes(b"old")
    atomic_write_bytes(target, b"new content")
    assert target.read_bytes() == b"new content"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"]


def test_atomic_write_respects_umask_mode(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        p = atomic_write_text(tmp_path / "t.txt", "héllo")
    finally:
        os.umask(old)
    assert p.read_text(encoding="utf-8") == "héllo"
    assert (p.stat().st_mode & 0o777) == 0o644


def test_atomic_write_failure_keeps_old_file_and_removes_tmp(tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    atomic_write_json(target, {"a": 1})
    with pytest.raises(EncodeError, match=r"\$\.b\[1\]"):
        atomic_write_json(target, {"a": 2, "b": [1.0, float("nan")]})
    assert json.loads(target.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_atomic_write_json_numpy_and_paths(tmp_path: Path) -> None:
    target = tmp_path / "n.json"
    atomic_write_json(
        target,
        {"arr": np.arange(3, dtype=np.float32), "s": np.int64(7), "p": Path("/x/y")},
    )
    assert read_json(target) == {"arr": [0.0, 1.0, 2.0], "s": 7, "p": "/x/y"}
    assert target.read_text().endswith("\n")


def test_atomic_write_json_unserializable(tmp_path: Path) -> None:
    with pytest.raises(EncodeError, match="object is not JSON serializable"):
        atomic_write_json(tmp_path / "x.json", {"o": object()})
    assert not (tmp_path / "x.json").exists()


def test_read_json_default(tmp_path: Path) -> None:
    assert read_json(tmp_path / "missing.json", default={"d": 1}) == {"d": 1}


def test_filelock_excludes_second_instance_and_times_out(tmp_path: Path) -> None:
    lock_path = tmp_path / "x.lock"
    with FileLock(lock_path, timeout=1) as held:
        assert held.locked
        t0 = time.monotonic()
        with pytest.raises(LockTimeout) as ei:
            FileLock(lock_path, timeout=0.2).acquire()
        assert time.monotonic() - t0 >= 0.19
        assert isinstance(ei.value, GenmanipRuntimeError)
        assert ei.value.exit_code == ExitCode.TIMEOUT
        assert str(lock_path) in str(ei.value)
    # Released: can be taken at once, and the lock file stays.
    with FileLock(lock_path, timeout=0):
        pass
    assert lock_path.exists()


def test_filelock_not_reentrant(tmp_path: Path) -> None:
    lk = FileLock(tmp_path / "r.lock")
    with lk:
        with pytest.raises(RuntimeError):
            lk.acquire()
    assert not lk.locked
    lk.release()  # no-op when not held


def test_filelock_threads_serialize(tmp_path: Path) -> None:
    counter = tmp_path / "c.txt"
    counter.write_text("0")

    def work() -> None:
        for _ in range(50):
            with FileLock(tmp_path / "c.lock", timeout=10):
                v = int(counter.read_text())
                counter.write_text(str(v + 1))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter.read_text() == "200"


def _hold_lock(path: str, ready: mp.synchronize.Event, hold: float) -> None:  # type: ignore[name-defined]
    with FileLock(path, timeout=5):
        ready.set()
        time.sleep(hold)


def test_filelock_cross_process_and_released_when_holder_dies(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    lock_path = str(tmp_path / "p.lock")
    proc = ctx.Process(target=_hold_lock, args=(lock_path, ready, 30.0))
    proc.start()
    try:
        assert ready.wait(30)
        with pytest.raises(LockTimeout):
            FileLock(lock_path, timeout=0.1).acquire()
        proc.kill()  # dies holding the lock: the kernel must release it
        proc.join(10)
        with FileLock(lock_path, timeout=5):
            pass
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()


def test_merge_json_basic_and_in_place(tmp_path: Path) -> None:
    target = tmp_path / "episode_result.json"
    out = merge_json(target, lambda d: {**d, "000": {"score": 1.0, "sr": 1.0}})
    assert out == {"000": {"score": 1.0, "sr": 1.0}}

    def inplace(d: dict) -> None:
        d["001"] = {"score": 0.5, "sr": 0.0}

    out = merge_json(target, inplace)
    assert read_json(target) == {"000": {"score": 1.0, "sr": 1.0}, "001": {"score": 0.5, "sr": 0.0}}
    assert out == read_json(target)
    # default lock file next to it, as the reference client names it
    assert (tmp_path / "episode_result.lock").exists()


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b"\xff\xfe"])
def test_merge_json_quarantines_corrupt_file(tmp_path: Path, content: bytes) -> None:
    target = tmp_path / "episode_result.json"
    target.write_bytes(content)
    out = merge_json(target, lambda d: {**d, "k": len(d)})
    assert out == {"k": 0}
    corrupt = sorted(tmp_path.glob("episode_result.corrupt-*.json"))
    assert len(corrupt) == 1
    assert corrupt[0].read_bytes() == content
    stamp = corrupt[0].name[len("episode_result.corrupt-") : -len(".json")]
    assert len(stamp) == 15 and stamp[8] == "-" and stamp.replace("-", "").isdigit()
    # a second corruption in the same second is not overwritten
    target.write_bytes(content)
    merge_json(target, lambda d: d)
    assert len(list(tmp_path.glob("episode_result.corrupt-*.json"))) == 2


def test_merge_json_lock_timeout_leaves_file(tmp_path: Path) -> None:
    target = tmp_path / "m.json"
    atomic_write_json(target, {"a": 1})
    with FileLock(tmp_path / "m.lock"):
        with pytest.raises(LockTimeout):
            merge_json(target, lambda d: {"a": 2}, timeout=0.1)
    assert read_json(target) == {"a": 1}


def test_merge_json_rejects_non_dict_result(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        merge_json(tmp_path / "m.json", lambda d: [1])  # type: ignore[arg-type,return-value]


def _merge_worker(path: str, worker: int, n: int) -> None:
    for i in range(n):

        def upd(d: dict, i: int = i) -> None:
            d[f"{worker}-{i}"] = i
            d["count"] = d.get("count", 0) + 1

        merge_json(path, upd, timeout=60)


@pytest.mark.slow  # ~1000 renames + fsyncs: seconds on a loaded CI disk
def test_merge_json_four_processes_lose_no_update(tmp_path: Path) -> None:
    target = str(tmp_path / "shared.json")
    ctx = mp.get_context("spawn")  # no fork: threads of other tests may hold locks
    procs = [ctx.Process(target=_merge_worker, args=(target, w, 250)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    data = read_json(target)
    assert data["count"] == 1000
    assert len(data) == 1001
    assert all(data[f"{w}-{i}"] == i for w in range(4) for i in range(250))
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


_REMOVING_LOCKER = """
import sys
from pathlib import Path
from genmanip_runtime.atomic import FileLock

lock, counter, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
for _ in range(n):
    with FileLock(lock, timeout=60, remove=True):
        # read-modify-write with a gap: a second holder at the same time loses an update
        v = int(counter.read_text() or 0)
        counter.write_text(str(v + 1))
"""


def test_a_lock_that_removes_its_file_still_excludes(tmp_path: Path) -> None:
    # Four processes take turns 150 times each; every holder deletes the file as it releases.
    # A waiter that locked the deleted file notices and waits on the new one: no update is lost
    # (two holders at once would lose some), and no lock file is left behind.
    import subprocess
    import sys

    lock, counter = tmp_path / ".video.lock", tmp_path / "counter"
    counter.write_text("0")
    procs = [subprocess.Popen([sys.executable, "-c", _REMOVING_LOCKER, str(lock), str(counter), "150"])
             for _ in range(4)]
    for p in procs:
        assert p.wait(120) == 0
    assert counter.read_text() == "600"
    assert not lock.exists()


def test_a_kept_lock_file_and_a_removing_one_share_the_lock(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    with FileLock(lock, timeout=1, remove=True):
        assert lock.exists()
        with pytest.raises(LockTimeout):
            FileLock(lock, timeout=0.1).acquire()
    assert not lock.exists()
    with FileLock(lock, timeout=1):
        pass
    assert lock.exists()  # (the default keeps it)
