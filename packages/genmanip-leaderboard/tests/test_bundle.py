from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest
from genmanip_leaderboard import (
    BundleError,
    IncompleteRunError,
    build_bundle,
    check_member_name,
    collect_members,
    completeness,
    verify_bundle,
)
from genmanip_protocol.errors import ExitCode
from genmanip_results.discovery import load_run


def _names(path: Path) -> set[str]:
    with zipfile.ZipFile(path) as zf:
        return set(zf.namelist())


def test_server_run_bundle_has_relative_paths_hashes_and_no_videos(project, server_run, tmp_path):
    run_dir = server_run(project)
    (run_dir / "submitted.flag").write_text("{}")
    (run_dir / "testbed/reach/red_easy/000.lock").write_text("{}")
    (run_dir / ".live").mkdir()
    (run_dir / ".live" / "frame.jpg").write_bytes(b"x")
    (run_dir / ".result.json.abc123.tmp").write_text("partial")
    (run_dir / "notes.txt~").write_text("editor backup")
    (run_dir / "compress_old.zip").write_bytes(b"zip")
    run = load_run(run_dir)
    b = build_bundle(run, str(tmp_path / "out") + "/")
    assert b.path == tmp_path / "out" / "results_run1.zip"
    names = _names(b.path)
    expected = {"result.json", "manifest.json"}
    for task in ("testbed/reach/red_easy", "testbed/reach/blue_easy"):
        for seed in ("000", "001"):
            expected |= {f"{task}/{seed}/result_info.json", f"{task}/{seed}/meta_record.pkl"}
    assert names == expected
    m = b.manifest
    assert m["benchmark"] == "testbed" and m["run_id"] == "run1" and m["layout"] == "server"
    assert m["complete"] is True and m["missing"] == []
    assert m["counts"]["files"] == len(expected) - 1
    assert m["counts"]["episodes_complete"] == 4 and m["counts"]["episodes_expected"] == 4
    assert m["counts"]["episodes_success"] == 2
    assert "genmanip-leaderboard" in m["versions"] and "genmanip-protocol" in m["versions"]
    by_path = {f["path"]: f for f in m["files"]}
    for name, entry in by_path.items():
        data = (run_dir / name).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
        assert entry["size"] == len(data)
    assert b.sha256 == hashlib.sha256(b.path.read_bytes()).hexdigest()
    reasons = {s.name: s.reason for s in b.skipped}
    assert reasons["submitted.flag"] == "submission marker"
    assert reasons["testbed/reach/red_easy/000.lock"] == "temporary or lock file"
    assert reasons[".live/"] == "hidden"
    assert "video" in reasons["testbed/reach/red_easy/000/left_camera.mp4"]
    assert "video" in reasons["testbed/reach/red_easy/000/episode.rrd"]
    # No temporary file is left next to the bundle.
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["results_run1.zip"]


def test_include_videos_and_stable_content_digest(project, server_run, tmp_path):
    run = load_run(server_run(project))
    a = build_bundle(run, tmp_path / "a.zip", include_videos=True)
    assert "testbed/reach/red_easy/001/left_camera.mp4" in _names(a.path)
    assert "testbed/reach/red_easy/001/episode.rrd" in _names(a.path)
    b = build_bundle(run, tmp_path / "b.zip", include_videos=True)
    assert a.content_sha256 == b.content_sha256
    c = build_bundle(run, tmp_path / "c.zip")
    assert c.content_sha256 != a.content_sha256


def test_client_layout_bundle_includes_run_manifest(tmp_path, client_run):
    root = tmp_path / "client_results"
    run_dir = client_run(root, tasks={"testbed/reach/red_easy": 2, "testbed/place/cup_hard": 1})
    b = build_bundle(load_run(run_dir), tmp_path / "x.zip")
    names = _names(b.path)
    assert "run.json" in names and "testbed/reach/red_easy/episode_result.json" in names
    assert "testbed/place/cup_hard/000/steps.jsonl" in names
    assert b.manifest["run_manifest"]["run_id"] == "crun"
    assert b.manifest["layout"] == "client"
    assert b.manifest["counts"]["episodes_complete"] == 3


def test_symlinks_never_escape_the_run(project, server_run, tmp_path):
    run_dir = server_run(project)
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    outside_dir = tmp_path / "outside"
    outside_dir.mkdir()
    (outside_dir / "x.json").write_text("{}")
    (run_dir / "leak.json").symlink_to(secret)
    (run_dir / "leakdir").symlink_to(outside_dir, target_is_directory=True)
    (run_dir / "up.json").symlink_to("../../../../../secret.txt")
    (run_dir / "extra").mkdir()
    (run_dir / "extra" / "notes.txt").write_text("inside")
    (run_dir / "inner").symlink_to(run_dir / "extra", target_is_directory=True)
    (run_dir / "alias.json").symlink_to(run_dir / "result.json")
    b = build_bundle(load_run(run_dir), tmp_path / "o.zip")
    names = _names(b.path)
    assert not any(n.startswith(("leak", "up.json", "inner")) for n in names)
    assert "alias.json" in names  # a link to a file inside the run is stored as that file
    assert "extra/notes.txt" in names
    with zipfile.ZipFile(b.path) as zf:
        for n in zf.namelist():
            assert b"TOP SECRET" not in zf.read(n)
            assert not n.startswith("/") and ".." not in n.split("/")
        assert zf.read("alias.json") == (run_dir / "result.json").read_bytes()
    reasons = {s.name: s.reason for s in b.skipped}
    assert "outside" in reasons["leak.json"] and "outside" in reasons["up.json"]
    assert "outside" in reasons["leakdir"]
    assert "not followed" in reasons["inner"]


def test_unsafe_file_name_refused(project, server_run, tmp_path):
    run_dir = server_run(project)
    (run_dir / "evil\\..\\name.json").write_text("{}")
    with pytest.raises(BundleError, match="backslash"):
        build_bundle(load_run(run_dir), tmp_path / "o.zip")
    assert not (tmp_path / "o.zip").exists()


@pytest.mark.parametrize("name", ["../x", "/abs", "a/../b", "a//b", "./a", "C:/x", "a\\b", "a\x00b", ""])
def test_check_member_name_rejects(name):
    with pytest.raises(BundleError):
        check_member_name(name)


def test_incomplete_run_refused_listing_missing_seeds(project, server_run, tmp_path):
    run_dir = server_run(project, tasks={"testbed/a/x": 3, "testbed/b/y": 2},
                         done={"testbed/a/x": [0, 2], "testbed/b/y": []})
    run = load_run(run_dir)
    comp = completeness(run)
    assert comp.missing == ("testbed/a/x/001", "testbed/b/y/*")
    with pytest.raises(IncompleteRunError) as ei:
        build_bundle(run, tmp_path / "o.zip")
    assert ei.value.exit_code == ExitCode.REFUSED
    assert "testbed/a/x/001" in str(ei.value)
    assert not (tmp_path / "o.zip").exists()
    b = build_bundle(run, tmp_path / "o.zip", allow_incomplete=True)
    assert b.manifest["complete"] is False
    assert b.manifest["missing"] == ["testbed/a/x/001", "testbed/b/y/*"]


def test_incomplete_client_episode_listed(tmp_path, client_run):
    run_dir = client_run(tmp_path / "cr", incomplete=[("testbed/reach/red_easy", 1)])
    with pytest.raises(IncompleteRunError, match="testbed/reach/red_easy/001"):
        build_bundle(load_run(run_dir), tmp_path / "o.zip")


def test_output_inside_results_tree_refused(project, server_run):
    run_dir = server_run(project)
    run = load_run(run_dir)
    for out in (run_dir / "b.zip", project / "saved" / "eval_results" / "b.zip", run_dir):
        with pytest.raises(BundleError, match="inside the results tree"):
            build_bundle(run, out)
    assert not list(run_dir.glob("*.zip"))


def test_default_output_is_cache_dir(project, server_run, tmp_path):
    b = build_bundle(load_run(server_run(project)))
    assert b.path == tmp_path / "cache" / "genmanip" / "bundles" / "testbed" / "results_run1.zip"


def test_collect_members_skips_special_files(project, server_run):
    run_dir = server_run(project)
    os.mkfifo(run_dir / "pipe")
    members, skipped = collect_members(run_dir)
    assert "pipe" not in {m.name for m in members}
    assert {s.name: s.reason for s in skipped}["pipe"] == "not a regular file"


def test_top_level_manifest_name_clash_refused(project, server_run, tmp_path):
    run_dir = server_run(project)
    (run_dir / "manifest.json").write_text("{}")
    with pytest.raises(BundleError, match="manifest"):
        build_bundle(load_run(run_dir), tmp_path / "o.zip")


def _rewrite(src: Path, dst: Path, mutate) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            name, data = mutate(info.filename, zin.read(info.filename))
            if name is not None:
                zout.writestr(zipfile.ZipInfo(name), data)


def test_verify_detects_tampering_and_bad_members(project, server_run, tmp_path):
    b = build_bundle(load_run(server_run(project)), tmp_path / "good.zip")
    assert verify_bundle(b.path)["content_sha256"] == b.content_sha256

    _rewrite(b.path, tmp_path / "t1.zip",
             lambda n, d: (n, b"9.9" if n == "result.json" else d))
    with pytest.raises(BundleError, match="does not match"):
        verify_bundle(tmp_path / "t1.zip")

    _rewrite(b.path, tmp_path / "t2.zip",
             lambda n, d: ("../evil.json" if n == "result.json" else n, d))
    with pytest.raises(BundleError, match="unsafe member name"):
        verify_bundle(tmp_path / "t2.zip")

    def drop_manifest(n, d):
        return (None, d) if n == "manifest.json" else (n, d)

    _rewrite(b.path, tmp_path / "t3.zip", drop_manifest)
    with pytest.raises(BundleError, match=r"no manifest\.json"):
        verify_bundle(tmp_path / "t3.zip")

    def add_extra(n, d):
        if n == "manifest.json":
            m = json.loads(d)
            m["files"] = [f for f in m["files"] if f["path"] != "result.json"]
            return n, json.dumps(m).encode()
        return n, d

    _rewrite(b.path, tmp_path / "t4.zip", add_extra)
    with pytest.raises(BundleError, match="differ"):
        verify_bundle(tmp_path / "t4.zip")

    (tmp_path / "t5.zip").write_bytes(b"not a zip")
    with pytest.raises(BundleError, match="not a readable zip"):
        verify_bundle(tmp_path / "t5.zip")


def test_invalid_scores_refused(project, server_run, tmp_path):
    run_dir = server_run(project, scores={("testbed/reach/red_easy", 1): 1.5})
    with pytest.raises(BundleError, match=r"testbed/reach/red_easy/001 \(score 1.5\)"):
        build_bundle(load_run(run_dir), tmp_path / "o.zip")
