"""gmp clean deletes only what gmp provably created (genmanip_results.provenance).

Every test hashes the whole tree before and after: user files are byte-identical, nothing outside
the root or the cache dir is touched, and errors are typed with named exit codes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from genmanip_artifacts import execute_clean, plan_clean, plot_episode
from genmanip_artifacts.clean import NOT_PROVEN
from genmanip_artifacts.errors import CacheDirNotGmpError, GenmanipArtifactsError
from genmanip_protocol.errors import ExitCode
from genmanip_results.provenance import (
    CATEGORY_PLOTS,
    CATEGORY_VIEWER_CACHE,
    ensure_cache_dir,
    is_gmp_tmp_name,
    register_partial,
    write_generated,
)

OLD = 3 * 3600.0
MANIFEST = ".gmp-generated.jsonl"
PLOT_FILES = ("state_plot.png", "action_plot.png", "merged_with_plot.mp4", "plot.log")


def _write(p: Path, data: str | bytes = "x", *, age: float = 0.0) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    p.write_bytes(data)
    if age:
        t = time.time() - age
        os.utime(p, (t, t))
    return p


def _gen(p: Path, data: str = "gmp", category: str = CATEGORY_PLOTS) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    return write_generated(p, data.encode(), category=category, by="test")


def _hashes(base: Path) -> dict[str, str]:
    """Every entry under ``base`` (no symlink followed): content hash, link target or 'dir'."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(base):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, base)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = "link:" + os.readlink(p)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = "dir"
            elif stat.S_ISREG(st.st_mode):
                out[rel] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
            else:
                out[rel] = "special"
    return out


def _episode(root: Path, name: str = "000") -> Path:
    """A client-layout episode directory (steps, video, result) under ``root/client_results``."""
    ep = root / "client_results" / "bench" / "r1" / "bench" / "t" / name
    _write(ep.parents[2] / "run.json", json.dumps({"run_id": "r1", "benchmark": "bench"}))
    _write(ep / "steps.jsonl", "{}\n")
    _write(ep / "left_camera.mp4", "video")
    _write(ep / "result.json", json.dumps({"score": 1.0, "sr": 1.0}))
    return ep


# ------------------------------------------------------------------ user files named like ours


def test_user_folder_with_result_json_and_plot_names_is_kept(
    cmd: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "proj"
    mine = root / "analysis" / "exp1"
    _write(mine / "result.json", json.dumps({"score": 0.5}))
    for name in (*PLOT_FILES, "merged_with_plot.mp4.part", ".genmanip_vis.rrd",
                 ".genmanip_vis.rrd.json", ".genmanip_vis.rrd.123.part"):  # fmt: skip
        _write(mine / name, f"user's {name}", age=OLD)
    _write(mine / "plot.log", "# genmanip-artifacts plot log\noutput: state_plot.png\n")
    # Even a manifest copied from elsewhere (other inodes) proves nothing here.
    _write(mine / MANIFEST, "".join(
        json.dumps({"v": 1, "name": n, "category": "plots", "by": "x", "ino": 1, "size": 1,
                    "mtime_ns": 1}) + "\n" for n in PLOT_FILES))  # fmt: skip
    before = _hashes(tmp_path)
    rc = cmd.clean(root, plots=True, yes=True, cache_dir=tmp_path / "nocache")
    assert rc == ExitCode.REFUSED  # everything that matched was kept
    assert _hashes(tmp_path) == before
    err = capsys.readouterr().err
    assert err.count(NOT_PROVEN) == 8
    assert "by hand" in err and "find " in err


def test_user_files_named_like_ours_inside_a_results_episode_are_kept(
    cmd: Any, tmp_path: Path
) -> None:
    root = tmp_path / "proj"
    ep = _episode(root)
    _gen(ep / "state_plot.png", "ours")
    for name in ("action_plot.png", "plot.log", ".genmanip_vis.rrd"):
        _write(ep / name, "theirs")
    before = _hashes(tmp_path)
    plan = plan_clean(root, plots=True, cache_dir=tmp_path / "c")
    assert [i.path.name for i in plan.items] == ["state_plot.png"]
    assert {r.path.name for r in plan.refused if r.reason == NOT_PROVEN} == {
        "action_plot.png", "plot.log", ".genmanip_vis.rrd"
    }  # fmt: skip
    report = execute_clean(plan)
    after = _hashes(tmp_path)
    gone = set(before) - set(after)
    assert gone == {os.path.relpath(ep / n, tmp_path) for n in ("state_plot.png", MANIFEST)}
    assert all(after[k] == v for k, v in before.items() if k in after)
    assert report.failed == []


def test_rewritten_generated_file_is_no_longer_provably_ours(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    out = root / "plots"
    _gen(out / "state_plot.png", "gmp wrote this")
    _gen(out / "action_plot.png", "gmp wrote this too")
    # The user later saved their own figure under the same name (same size, even).
    (out / "state_plot.png").write_text("user wrote this")
    plan = plan_clean(root, plots=True, cache_dir=tmp_path / "c")
    assert [i.path.name for i in plan.items] == ["action_plot.png"]
    assert [(r.path.name, r.reason) for r in plan.refused] == [("state_plot.png", NOT_PROVEN)]
    execute_clean(plan)
    assert (out / "state_plot.png").read_text() == "user wrote this"
    # The manifest went with the last file it could prove: it lists nothing of ours any more.
    assert sorted(os.listdir(out)) == ["state_plot.png"]


def test_copied_output_directory_is_not_ours(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    src = root / "plots_a"
    for name in PLOT_FILES:
        _gen(src / name, name)
    # A copy keeps names, sizes and mtimes (copy2), manifest included; not the inodes.
    shutil.copytree(src, root / "backup", copy_function=shutil.copy2)
    before = _hashes(root / "backup")
    plan = plan_clean(root, plots=True, cache_dir=tmp_path / "c")
    assert {i.path.parent.name for i in plan.items} == {"plots_a"}
    execute_clean(plan)
    assert _hashes(root / "backup") == before
    assert not src.exists() or sorted(os.listdir(src)) == []


def test_symlink_named_like_a_cache_is_not_ours_and_its_target_untouched(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    victim = _write(tmp_path / "outside" / "victim.txt", "precious")
    (root / ".genmanip_vis.rrd").symlink_to(victim)
    plan = plan_clean(root, cache_dir=tmp_path / "c")
    assert plan.items == [] and plan.refused[0].reason == NOT_PROVEN
    execute_clean(plan)
    assert (root / ".genmanip_vis.rrd").is_symlink() and victim.read_text() == "precious"


# ------------------------------------------------------------------ temporaries


@pytest.mark.parametrize(
    "where",
    [
        "stale.tmp",
        "deep/down/x.tmp",
        "work/.x.abc.tmp",
        "work/.notes.txt.tmp",
        "work/.a.0123456789ab.tmp",  # gmp's pattern, but not in a results tree
        "client_results/bench/r1/old.tmp",  # in a results tree, but not gmp's pattern
        "client_results/bench/r1/.x.0123456789AB.tmp",  # upper-case hex: not secrets.token_hex
        "saved/eval_results/b/r/notes.tmp",
        "saved/tasks/t/.x.0123456789ab.tmp",  # server inputs: never entered
    ],
)
def test_user_tmp_files_older_than_an_hour_are_kept(cmd: Any, tmp_path: Path, where: str) -> None:
    root = tmp_path / "proj"
    _write(root / where, "user data", age=OLD)
    before = _hashes(tmp_path)
    assert cmd.clean(root, yes=True, all=True, cache_dir=tmp_path / "c") == ExitCode.NOTHING_TO_DO
    assert _hashes(tmp_path) == before


def test_atomic_tmp_name_is_the_pattern_clean_knows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tmp rule is pinned to genmanip_runtime.atomic's real naming, not to a guess."""
    from genmanip_runtime import atomic

    seen: list[str] = []
    real_replace = os.replace

    def spy(src: Any, dst: Any, *a: Any, **kw: Any) -> None:
        seen.append(os.path.basename(os.fspath(src)))
        real_replace(src, dst, *a, **kw)

    monkeypatch.setattr(atomic.os, "replace", spy)
    for name in ("result.json", "a b.txt", ".hidden", "x.tmp"):
        atomic.atomic_write_bytes(tmp_path / name, b"1")
    assert len(seen) == 4 and all(is_gmp_tmp_name(n) for n in seen)
    assert not any(is_gmp_tmp_name(n) for n in ("x.tmp", ".x.abc.tmp", ".x.0123456789ab.temp"))


def test_stale_atomic_tmp_in_a_results_tree_goes_fresh_one_stays(cmd: Any, tmp_path: Path) -> None:
    root = tmp_path / "proj"
    ep = _episode(root)
    stale = _write(ep / ".result.json.00112233aabb.tmp", "{", age=OLD)
    fresh = _write(ep / ".result.json.ffeeddccbbaa.tmp", "{")  # a writer may be using it
    assert cmd.clean(root, yes=True, cache_dir=tmp_path / "c") == ExitCode.OK
    assert not stale.exists() and fresh.exists()


# ------------------------------------------------------------------ the cache directory


def _user_cache(d: Path) -> Path:
    for sub in ("logs", "meshes", "downloads"):
        _write(d / sub / "important.txt", f"user's {sub}")
    _write(d / ".a.0123456789ab.tmp", "user's", age=OLD)
    return d


@pytest.mark.parametrize(
    "tag",
    [
        None,
        "",
        "Signature: 8a477f597d28d172789f06886806bc55\n",  # another tool's cache tag
        "# genmanip-cache: 1\n",  # gmp's line without the signature
    ],
)
def test_cache_dir_named_by_the_user_without_our_tag_is_refused(
    cmd: Any, tmp_path: Path, tag: str | None
) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    user = _user_cache(tmp_path / "home" / "work")
    if tag is not None:
        _write(user / "CACHEDIR.TAG", tag)
    before = _hashes(tmp_path)
    with pytest.raises(CacheDirNotGmpError) as ei:
        cmd.clean(root, all=True, yes=True, cache_dir=user)
    err = ei.value
    assert isinstance(err, GenmanipArtifactsError)
    assert err.exit_code == ExitCode.REFUSED and err.path == user
    assert str(user) in str(err) and err.hint
    assert _hashes(tmp_path) == before


def test_cache_tag_that_is_a_symlink_to_a_real_tag_is_refused(cmd: Any, tmp_path: Path) -> None:
    real = ensure_cache_dir(tmp_path / "gmpcache")
    user = _user_cache(tmp_path / "work")
    (user / "CACHEDIR.TAG").symlink_to(real / "CACHEDIR.TAG")
    before = _hashes(tmp_path)
    with pytest.raises(CacheDirNotGmpError):
        cmd.clean(tmp_path / "gmpcache", all=True, yes=True, cache_dir=user)
    assert _hashes(tmp_path) == before


def test_default_cache_dir_without_tag_is_kept_with_a_warning(
    cmd: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GMP_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    _user_cache(tmp_path / "xdg" / "genmanip")  # made by an older gmp, or by hand
    root = tmp_path / "proj"
    root.mkdir()
    before = _hashes(tmp_path)
    assert cmd.clean(root, all=True, yes=True) == ExitCode.REFUSED
    assert _hashes(tmp_path) == before
    assert "not provably gmp's cache directory" in capsys.readouterr().err


def test_cache_dir_gmp_created_is_emptied_and_keeps_its_tag(cmd: Any, tmp_path: Path) -> None:
    cache = ensure_cache_dir(tmp_path / "a" / "cache")
    assert ensure_cache_dir(cache) == cache  # idempotent
    _write(cache / "logs" / "gmp.log", "log")
    _write(cache / "meshes" / "m" / "x.obj", "mesh")
    _write(cache / "downloads" / "z.zip", "zip")
    _write(cache / ".a.0123456789ab.tmp", "partial download", age=OLD)
    _write(cache / "viz" / "cert.pem", "cert")
    root = tmp_path / "proj"
    root.mkdir()
    assert cmd.clean(root, all=True, yes=True, cache_dir=cache) == ExitCode.OK
    assert sorted(os.listdir(cache)) == ["CACHEDIR.TAG", "downloads", "logs", "meshes", "viz"]
    assert not any(list((cache / d).iterdir()) for d in ("logs", "meshes", "downloads"))
    assert (cache / "viz" / "cert.pem").read_text() == "cert"


def test_existing_directory_is_not_tagged_by_ensure(tmp_path: Path) -> None:
    d = tmp_path / "exists"
    d.mkdir()
    ensure_cache_dir(d)
    assert not (d / "CACHEDIR.TAG").exists()  # only a directory gmp created is gmp's


# ------------------------------------------------------------------ hostile manifests


def _hostile_manifest(kind: str, d: Path, tmp_path: Path) -> None:
    m = d / MANIFEST
    if kind == "garbage":
        _write(m, os.urandom(4096))
    elif kind == "deep":
        _write(m, "[" * 100_000 + "]" * 100_000 + "\n")
    elif kind == "wrong-types":
        _write(m, json.dumps({"v": 1, "name": "state_plot.png", "category": "plots", "by": "x",
                              "ino": "1", "size": None, "mtime_ns": 1.5}) + "\n")  # fmt: skip
    elif kind == "huge":
        with open(m, "wb") as fh:
            fh.truncate(5 << 20)
    elif kind == "symlink":
        # A symlink to a manifest that *would* prove the files: never read.
        real = (d / MANIFEST).read_bytes() if (d / MANIFEST).exists() else b""
        elsewhere = _write(tmp_path / "elsewhere" / MANIFEST, real)
        os.unlink(m)
        m.symlink_to(elsewhere)
    elif kind == "fifo":
        os.unlink(m)
        os.mkfifo(m)
    elif kind == "directory":
        os.unlink(m)
        m.mkdir()
    elif kind == "other-category":
        lines = [json.loads(x) for x in m.read_text().splitlines()]
        _write(m, "".join(json.dumps({**x, "category": "viewer-cache"}) + "\n" for x in lines))
    elif kind == "path-name":
        lines = [json.loads(x) for x in m.read_text().splitlines()]
        _write(m, "".join(json.dumps({**x, "name": "../" + x["name"]}) + "\n" for x in lines))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "kind",
    ["garbage", "deep", "wrong-types", "huge", "symlink", "fifo", "directory", "other-category",
     "path-name"],
)  # fmt: skip
def test_hostile_manifest_proves_nothing(cmd: Any, tmp_path: Path, kind: str) -> None:
    root = tmp_path / "proj"
    out = root / "plots"
    for name in ("state_plot.png", "plot.log"):
        _gen(out / name, name)
    _hostile_manifest(kind, out, tmp_path)
    before = _hashes(tmp_path)
    assert cmd.clean(root, plots=True, yes=True, cache_dir=tmp_path / "c") == ExitCode.REFUSED
    assert _hashes(tmp_path) == before


# ------------------------------------------------------------------ real writers


def test_real_plot_outputs_are_cleaned_exactly(cmd: Any, lift2_episode: Path) -> None:
    base = lift2_episode.parents[5]
    before = _hashes(base)
    r = plot_episode(lift2_episode, video=False)
    written = {os.path.relpath(p, base) for p in (r.state_plot, r.action_plot)}
    assert written <= set(_hashes(base))
    assert cmd.clean(base, plots=True, yes=True, cache_dir=base / "c") == ExitCode.OK
    assert _hashes(base) == before  # exactly the tree from before plotting


def test_real_plot_into_out_dir_then_clean(cmd: Any, lift2_episode: Path, tmp_path: Path) -> None:
    out = tmp_path / "proj" / "figures"
    _write(out / "notes.md", "my notes")
    plot_episode(lift2_episode, out=out, video=False)
    assert cmd.clean(tmp_path / "proj", plots=True, yes=True, cache_dir=tmp_path / "c") == 0
    assert sorted(os.listdir(out)) == ["notes.md"]


def test_partial_registered_before_writing(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    out = root / "plots"
    out.mkdir(parents=True)
    part = out / "merged_with_plot.mp4.part"
    assert register_partial(part, category=CATEGORY_PLOTS, by="test")
    _write(part, "half a video")
    # Fresh: a gmp plot may still be writing it.
    assert plan_clean(root, plots=True, cache_dir=tmp_path / "c").items == []
    later = time.time() + 2 * 3600
    plan = plan_clean(root, plots=True, cache_dir=tmp_path / "c", now=later)
    assert [(i.path.name, i.note) for i in plan.items] == [(part.name, "partial")]
    assert execute_clean(plan, now=later).removed and not part.exists()


def test_partial_older_than_its_record_is_not_ours(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    part = _write(root / "v" / ".genmanip_vis.rrd.7.part", "user's", age=OLD)
    register_partial(part, category=CATEGORY_VIEWER_CACHE)  # registered after it existed
    plan = plan_clean(root, cache_dir=tmp_path / "c", now=time.time() + 7200)
    assert plan.items == [] and plan.refused[0].reason == NOT_PROVEN


# ------------------------------------------------------------------ migration


def test_outputs_of_an_older_gmp_are_reported_and_kept(
    cmd: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "proj"
    for i in range(15):
        ep = _episode(root, f"{i:03d}")
        _write(ep / ".genmanip_vis.rrd", "old gmp cache")  # no manifest: before provenance
    before = _hashes(tmp_path)
    assert cmd.clean(root, yes=True, cache_dir=tmp_path / "c") == ExitCode.REFUSED
    assert _hashes(tmp_path) == before
    err = capsys.readouterr().err
    assert err.count(NOT_PROVEN) == 11  # 10 listed, then one line for the other 5
    assert "5 more file(s)" in err and "15 file(s)" in err
    assert "-name '.genmanip_vis.*' -type f -delete" in err


# ------------------------------------------------------------------ never outside the root


def test_links_to_provable_files_outside_the_root_are_not_followed(
    cmd: Any, tmp_path: Path
) -> None:
    # Outside the root: genuine gmp outputs (provable there) that the user wants to keep.
    outside = tmp_path / "outside" / "exp"
    for name in PLOT_FILES:
        _gen(outside / name, name)
    _gen(outside / ".genmanip_vis.rrd", "rrd", CATEGORY_VIEWER_CACHE)
    root = tmp_path / "proj"
    ep = _episode(root)
    (ep / "link_dir").symlink_to(outside, target_is_directory=True)
    (root / "plots_link").symlink_to(outside, target_is_directory=True)
    (root / "client_results" / "bench" / "r2").symlink_to(outside, target_is_directory=True)
    for name in PLOT_FILES:
        (ep / name).symlink_to(outside / name)
    before = _hashes(tmp_path / "outside")
    cmd.clean(root, plots=True, all=True, results=True, force=True, yes=True,
              cache_dir=tmp_path / "c")  # fmt: skip
    assert _hashes(tmp_path / "outside") == before


def test_deeply_nested_tree_is_walked_without_running_out(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    d = root
    for _ in range(300):  # deeper than the walk's limit: the rest is left alone
        d = d / "d"
    d.mkdir(parents=True)
    _gen(d / "state_plot.png")
    _gen(root / "d" / "state_plot.png")
    plan = plan_clean(root, plots=True, cache_dir=tmp_path / "c")
    assert [i.path for i in plan.items] == [root / "d" / "state_plot.png"]
