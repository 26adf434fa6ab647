"""Item 8: a hostile server. Episode ids and task names that try to leave the results root, and
metric / episode_result values of the wrong type, through the real wire (a rewriting proxy in
front of a real testbed, bench/reliability/hostile.py) and through the recorder's path check.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from genmanip.cli.main import main
from genmanip_testbed import serve_testbed
from hostile import HostileProxy, rewrite_key

pytestmark = pytest.mark.slow

#: (label, episode id the server sends, must be refused?) — unicode look-alikes of "." and "/" are
#: ordinary file names on POSIX: accepting them is safe as long as they stay under the root.
HOSTILE_IDS: list[tuple[str, str, bool]] = [
    ("dotdot", "../../../../outside/x/y/000", True),
    ("dotdot inside", "testbed/r/../../../outside/000", True),
    ("dotdot at end", "testbed/r/task/..", True),
    ("dot segment", "testbed/./r/task/000", True),
    ("absolute", "/{outside}/testbed/r/task/000", True),
    ("absolute double slash", "//{outside}/r/task/000", True),
    ("NUL", "testbed/r/ta\x00sk/000", True),
    ("newline", "testbed/r/ta\nsk/000", True),
    ("backslash", "testbed\\..\\..\\outside\\000", True),
    ("drive letter", "C:/outside/r/task/000", True),
    ("drive letter segment", "testbed/r/D:/000", True),
    ("empty segment", "testbed//r/task/000", True),
    ("trailing slash", "testbed/r/task/000/", True),
    ("long segment", "testbed/r/" + "a" * 300 + "/000", True),
    ("long path", "testbed/r/" + "/".join(["b" * 200] * 25) + "/000", True),
    ("too few parts", "testbed/000", True),
    ("not a string", 12345, True),  # type: ignore[list-item]
    ("one-dot leader", "testbed/r/\u2024\u2024/\u2024\u2024/000", False),
    ("fullwidth dots", "testbed/r/\uff0e\uff0e/\uff0e\uff0e/000", False),
    ("fraction slash", "testbed/r/..\u2215..\u2215outside/000", False),
    ("RTL override", "testbed/r/task\u202egpj.exe/000", False),
    ("percent-encoded", "testbed/r/%2e%2e/%2e%2e/000", False),
    ("combining dot", "testbed/r/.\u0307./task/000", False),
]


def _files_outside(tmp: Path, root: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(tmp):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p == root or root in p.parents or p in root.parents:
                continue
            out.append(str(p))
    return out


def test_recorder_path_check_refuses_every_escape(tmp_path: Path) -> None:
    """Every hostile id goes through the recorder's check; none produces a path outside the root."""
    from genmanip_eval.errors import GenmanipEvalError
    from genmanip_eval.recording import Recorder

    root = tmp_path / "results"
    rec = Recorder(root)
    try:
        refused = accepted = 0
        for label, template, must_refuse in HOSTILE_IDS:
            eid = template.replace("{outside}", str(tmp_path / "outside").lstrip("/")) if isinstance(template, str) else template
            try:
                directory, run_dir, *_ = rec._split(eid)
            except GenmanipEvalError as exc:
                refused += 1
                assert "refusing to record episode id" in str(exc), label
                continue
            assert not must_refuse, f"{label}: {eid!r} accepted as {directory}"
            accepted += 1
            for p in (directory, run_dir):
                resolved = Path(os.path.normpath(p))
                assert root == resolved or root in resolved.parents, f"{label}: {p} leaves {root}"
        assert refused == sum(1 for *_, r in HOSTILE_IDS if r)
        assert accepted == sum(1 for *_, r in HOSTILE_IDS if not r)
    finally:
        rec.close(timeout=10)


def _eval(url: str, results: Path, *extra: str) -> int:
    return main(["eval", "--url", url, "--policy", "expert", "--codec", "msgpack",
                 "--results-dir", str(results), "--max-episodes", "1", *extra])


#: over the wire (every id also goes through the recorder check above): two refused, two accepted
E2E_IDS = ["dotdot", "absolute", "fullwidth dots", "RTL override"]


@pytest.mark.parametrize("label", E2E_IDS)
def test_hostile_episode_id_over_the_wire(label: str, tmp_path: Path, capsys: Any) -> None:
    _, template, must_refuse = next(h for h in HOSTILE_IDS if h[0] == label)
    box = tmp_path / "box"  # the client's side of the disk: results root and its surroundings
    outside = box / "outside"
    eid_value = template.replace("{outside}", str(outside).lstrip("/"))
    results = box / "results"

    def hostile(v: Any) -> Any:
        # keep the real seed, so that distinct episodes stay distinct
        if isinstance(v, str) and not must_refuse:
            return eid_value.rsplit("/", 1)[0] + "/" + v.rsplit("/", 1)[-1]
        return eid_value if isinstance(v, str) else v

    def mutate(route: str, tree: Any) -> Any:
        return rewrite_key(tree, "episode_id", hostile)

    with serve_testbed(tasks="testbed/smoke", run_id="hostile", results_root=tmp_path / "srv") as tb:
        with HostileProxy(tb.url, mutate) as url:
            rc = _eval(url, results)
    err = capsys.readouterr().err
    assert rc != 70, err  # never a crash
    if must_refuse:
        assert rc != 0
        assert "gmp: error:" in err and "episode id" in err, err
    else:
        assert rc == 0, err
        assert list(results.rglob("result.json")), "the accepted episode was recorded"
    assert not outside.exists()
    assert _files_outside(box, results) == [], "written outside the results root"


WRONG_TYPES: list[tuple[str, str, Any]] = [
    ("metric string", "metric", "oops"),
    ("metric list", "metric", [1, 2, 3]),
    ("metric entry string", "metric", {"testbed/smoke/red_block_easy": "high"}),
    ("metric score string", "metric", {"testbed/smoke/red_block_easy": {"score": "1.0", "sr": None}}),
    ("episode_result string", "episode_result", "oops"),
    ("episode_result score string", "episode_result", {"score": "high", "sr": [1]}),
    ("episode_result list", "episode_result", [0.5, 1.0]),
]


@pytest.mark.parametrize(("label", "key", "value"), WRONG_TYPES, ids=[w[0] for w in WRONG_TYPES])
def test_wrong_types_from_server_are_typed_errors(label: str, key: str, value: Any, tmp_path: Path,
                                                  capsys: Any) -> None:
    results = tmp_path / "results"

    def mutate(route: str, tree: Any) -> Any:
        return rewrite_key(tree, key, lambda v: value if v is not None else v)

    with serve_testbed(tasks="testbed/smoke", run_id="types", results_root=tmp_path / "srv") as tb:
        with HostileProxy(tb.url, mutate) as url:
            rc = _eval(url, results)
    err = capsys.readouterr().err
    # the run either survives (the field is advisory) or stops with a typed remote error naming it
    assert rc in (0, 5), f"{label}: exit {rc}\n{err}"
    if rc == 5:
        assert "gmp: error:" in err and key in err, err
    # whatever happened, every episode that claims to be finished is complete and parses
    for res in results.rglob("result.json"):
        data = json.loads(res.read_text())
        assert isinstance(data["score"], (int, float)) and isinstance(data["sr"], (int, float)), data
        assert not (res.parent / "INCOMPLETE").exists()
    for er in results.rglob("episode_result.json"):
        for seed, v in json.loads(er.read_text()).items():
            assert isinstance(v["score"], (int, float)), (seed, v)


def test_resent_finished_episode_id_keeps_results_consistent(tmp_path: Path, capsys: Any) -> None:
    """A server that serves a finished episode's id again (a re-queued seed, a confused server):
    the re-run replaces the old attempt, and episode_result.json must never claim a seed whose
    directory is not complete (found by this suite: the stale entry stayed)."""
    results = tmp_path / "results"

    def mutate(route: str, tree: Any) -> Any:
        # every episode gets the same id: the second one re-runs the first one's seed
        return rewrite_key(tree, "episode_id",
                           lambda v: "testbed/same/testbed/smoke/red_block_easy/000" if isinstance(v, str) else v)

    with serve_testbed(tasks="testbed/smoke", run_id="same", results_root=tmp_path / "srv") as tb:
        with HostileProxy(tb.url, mutate) as url:
            rc = _eval(url, results)
    err = capsys.readouterr().err
    assert rc != 70, err
    task = results / "testbed" / "same" / "testbed" / "smoke" / "red_block_easy"
    merged = json.loads((task / "episode_result.json").read_text()) if (task / "episode_result.json").exists() else {}
    complete = {p.parent.name for p in task.glob("*/result.json")}
    assert set(merged) == complete, (merged, complete)
    for seed in complete:
        assert not (task / seed / "INCOMPLETE").exists()


# =============================================================================================
# Names from the wire became paths (issue "Hostile input, for real", class 1).
# A camera key (``video.<name>_view``) is a file name of the recording (``.frames/<cam>.jpegs``,
# ``<cam>.mp4``): before the fix a hostile server made ``gmp eval`` write them outside the
# results root and overwrite a user's file there, exit 0. Every case below runs the real wire
# (testbed behind the rewriting proxy) and asserts: a typed error naming the field with a named
# exit code, nothing new or changed outside the results root (a sentinel directory and a user file
# right next to the root are hashed before and after), no user file inside it modified.
# =============================================================================================

import hashlib  # noqa: E402 - this block is kept apart from the one above
import http.client  # noqa: E402

from genmanip_protocol.errors import ExitCode  # noqa: E402

# <box>/results/testbed/<run>/testbed/smoke/red_block_easy/<seed>: seven levels below the box
_UP_TO_BOX = "../" * 7

#: (label, hostile camera key or "{rename}" spec) -- the proxy renames one camera key of every
#: observation to it
HOSTILE_CAMERA_KEYS: list[tuple[str, str]] = [
    ("dotdot onto a user file", f"video.{_UP_TO_BOX}x_view"),  # <ep>/<cam>.mp4 == <box>/x.mp4
    ("absolute into the sentinel", "video./{sentinel}/victim_view"),
    ("slash", "video.a/b_view"),
    ("empty", "video._view"),
    ("NUL", "video.a\x00b_view"),
    ("newline", "video.a\nb_view"),
    ("300 bytes", "video." + "c" * 300 + "_view"),
    ("fullwidth look-alike", "video.\uff0e\uff0e\uff0fx_view"),
    ("collides with another camera", "video.left_camera"),  # and video.left_camera_view
]


def _hash_tree(top: Path, skip: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p == skip or skip in p.parents:
                continue
            out[str(p.relative_to(top))] = (
                f"link:{os.readlink(p)}" if p.is_symlink()
                else hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            )
    return out


def _box(tmp_path: Path) -> tuple[Path, Path, Path]:
    box = tmp_path / "box"
    sentinel = box / "sentinel"
    sentinel.mkdir(parents=True)
    for name in ("victim.mp4", "victim.jpegs", "x.mp4"):
        (sentinel / name).write_bytes(b"user data " + name.encode())
    (box / "x.mp4").write_bytes(b"the user's video right next to the results root")
    (box / "x.jpegs").write_bytes(b"the user's frames right next to the results root")
    return box, sentinel, box / "results"


def _rename_camera(tree: Any, new_key: str) -> Any:
    """Rename one camera key (not ``video.left_camera_view``) of every observation to ``new_key``."""
    if isinstance(tree, dict):
        cams = sorted(k for k in tree if isinstance(k, str) and k.startswith("video.") and k != "video.left_camera_view")
        if cams and "video.left_camera_view" in tree:
            tree[new_key] = tree.pop(cams[0])
        for v in list(tree.values()):
            _rename_camera(v, new_key)
    elif isinstance(tree, list):
        for v in tree:
            _rename_camera(v, new_key)
    return tree


@pytest.mark.parametrize(("label", "key"), HOSTILE_CAMERA_KEYS, ids=[h[0] for h in HOSTILE_CAMERA_KEYS])
def test_hostile_camera_key_over_the_wire(label: str, key: str, tmp_path: Path, capsys: Any) -> None:
    box, sentinel, results = _box(tmp_path)
    key = key.replace("{sentinel}", str(sentinel).lstrip("/"))
    before = _hash_tree(box, results)

    def mutate(route: str, tree: Any) -> Any:
        return _rename_camera(tree, key)

    with serve_testbed(tasks="testbed/smoke", run_id="camkeys", results_root=tmp_path / "srv") as tb:
        proxy = HostileProxy(tb.url, mutate)
        with proxy as url:
            rc = _eval(url, results)
    err = capsys.readouterr().err
    assert proxy.mutated > 0
    assert rc == ExitCode.FAILURE, f"{label}: exit {rc}\n{err}"  # typed RecordingError, never 0/70
    assert "gmp: error: camera:" in err, err
    assert "nothing was written outside the results root" in err, err
    assert _hash_tree(box, results) == before, f"{label}: something outside the root changed"
    # inside the root: the episode is refused (INCOMPLETE, with the reason), never "complete"
    assert not list(results.rglob("result.json")), "a refused recording claims to be complete"
    markers = [json.loads(p.read_text()) for p in results.rglob("INCOMPLETE")]
    assert markers and all("recording refused: camera:" in (m.get("reason") or "") for m in markers)
    assert not [p for p in results.rglob("*") if p.suffix in (".mp4", ".jpegs")]


def test_episode_directory_holding_user_files_is_not_taken_over(tmp_path: Path, capsys: Any) -> None:
    """The server's episode id names a directory that exists in the results root and holds the
    user's files (one of them named like a camera video): refused, every file untouched."""
    box, _sentinel, results = _box(tmp_path)
    ep = results / "testbed" / "userdir" / "testbed" / "smoke" / "red_block_easy" / "000"
    ep.mkdir(parents=True)
    (ep / "left_camera.mp4").write_bytes(b"the user's own recording")
    (ep / "notes.txt").write_text("mine")
    before = _hash_tree(box, results / "testbed" / "userdir" / "run.json")

    with serve_testbed(tasks="testbed/smoke", run_id="userdir", results_root=tmp_path / "srv") as tb:
        rc = _eval(tb.url, results)
    err = capsys.readouterr().err
    assert rc == ExitCode.FAILURE, err
    assert "gmp: error: episode:" in err and "holds files gmp did not write" in err, err
    after = _hash_tree(box, results / "testbed" / "userdir" / "run.json")
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert {Path(k).name for k in changed} <= {".run.json.lock"}, changed
    assert (ep / "left_camera.mp4").read_bytes() == b"the user's own recording"


#: run ids a client may send the testbed's /start_new_job (the testbed is a server: a request
#: names its run directory)
HOSTILE_RUN_IDS = ["../../outside", "a/../../../outside", "/abs/outside", "C:/outside", "a\x00b",
                   "a\nb", "a\\..\\..\\outside", "x" * 300, "a//b", "a/./b", ".", ""]


def test_testbed_refuses_hostile_run_ids(tmp_path: Path) -> None:
    srv = tmp_path / "srv"
    with serve_testbed(tasks="testbed/smoke", run_id="ok", results_root=srv) as tb:
        host, port = tb.url.split("//", 1)[1].split(":")
        refused = 0
        for rid in HOSTILE_RUN_IDS:
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            body = json.dumps({"data": {"config_path": ["testbed/smoke"], "run_id": rid}})
            conn.request("POST", "/start_new_job", body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            detail = json.loads(resp.read() or b"{}")
            conn.close()
            if rid == "":
                continue  # an empty run id means "keep the current one" (the real server's rule)
            assert resp.status == 500 and detail == {"detail": "ValueError: run_id contains invalid path segments"}, (rid, resp.status, detail)
            refused += 1
    assert refused == len(HOSTILE_RUN_IDS) - 1
    assert _files_outside(tmp_path, srv) == []
    runs = srv / "saved" / "eval_results" / "testbed"
    assert not runs.exists() or {p.name for p in runs.iterdir()} <= {"ok"}
