"""gmp clean: exact-remainder tests on trees full of traps (the handler, through ``cmd``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from genmanip_artifacts import execute_clean, plan_clean
from genmanip_artifacts.clean import NOT_PROVEN
from genmanip_artifacts.errors import ArtifactsUsageError
from genmanip_protocol.errors import ExitCode
from genmanip_results.provenance import (
    CATEGORY_PLOTS,
    CATEGORY_VIEWER_CACHE,
    ensure_cache_dir,
    write_generated,
)

OLD = 3 * 3600.0  # seconds: older than the 1 h tmp rule and the 300 s lock rule


def _write(p: Path, data: str = "x", *, age: float = 0.0) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(data)
    if age:
        t = time.time() - age
        os.utime(p, (t, t))
    return p


def _gen(p: Path, data: str, category: str = CATEGORY_VIEWER_CACHE) -> Path:
    """A generated file made the way gmp makes it: written atomically and registered in its
    directory's provenance manifest (the call plot.py and the viz recording builder make)."""
    p.parent.mkdir(parents=True, exist_ok=True)
    return write_generated(p, data.encode(), category=category, by="test")


MANIFEST = ".gmp-generated.jsonl"


def _age_tree(root: Path, age: float) -> None:
    t = time.time() - age
    for dirpath, dirnames, filenames in os.walk(root):
        for n in filenames + dirnames:
            os.utime(os.path.join(dirpath, n), (t, t), follow_symlinks=False)
    os.utime(root, (t, t))


def _server_run(
    base: Path, name: str, *, submitted: bool, live: bool = False, readonly: bool = False
) -> Path:
    run = base / "saved" / "eval_results" / "ebench" / name
    task = run / "ebench" / "suite" / "task"
    _write(task / "000" / "result_info.json", json.dumps({"score": 1.0, "success_rate": 1}))
    _write(task / "000" / "left_camera.mp4", "video" * 100)
    _write(task / "000.lock", json.dumps({"worker_id": 0, "timestamp": 0, "pid": 1, "host": "h"}))
    _write(run / "result.json", json.dumps({"(1/1)ebench/suite/task": {"score": 1.0, "sr": 1.0}}))
    if submitted:
        _write(run / "submitted.flag", json.dumps({"submission_id": "s1"}))
    if readonly:
        (task / "000" / "left_camera.mp4").chmod(0o444)
    _age_tree(run, OLD)
    # The viewer's cache came later (gmp viz): registered, and not counted as run activity.
    _gen(task / "000" / ".genmanip_vis.rrd", "rrd")
    if live:
        # A worker is running seed 001 right now: fresh lock, no result_info.json yet.
        _write(
            task / "001.lock",
            json.dumps({"worker_id": 1, "timestamp": time.time(), "pid": 2, "host": "h"}),
        )
    return run


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    monkeypatch.delenv("GENMANIP_RESULT_DIR", raising=False)
    root = tmp_path / "proj"
    outside = tmp_path / "outside"
    cache = tmp_path / "cache"
    # Things outside the root that symlinks point to: must survive everything.
    _write(outside / "victim.txt", "precious")
    _write(outside / "dir" / ".genmanip_vis.rrd", "not ours")
    _write(outside / "dir" / "old.tmp", "old", age=OLD)
    _write(outside / "dir" / "state_plot.png", "png")
    # Protected inputs of the server.
    _write(root / "saved" / "tasks" / "t" / "000" / "meta_info.pkl", "task")
    _write(root / "saved" / "tasks" / "t" / "000" / ".genmanip_vis.rrd", "rrd")
    _write(root / "saved" / "tasks" / "t" / "stale.tmp", "old", age=OLD)
    _write(root / "saved" / "demonstrations" / "d" / "stale.tmp", "old", age=OLD)
    # Server logs (not this project's): kept.
    _write(root / "logs" / "run1" / "server.log", "log")
    # Server runs.
    _server_run(root, "run_sub", submitted=True)
    _server_run(root, "run_unsub", submitted=False)
    _server_run(root, "run_live", submitted=True, live=True)
    _server_run(root, "run_ro", submitted=True, readonly=True)
    # A client run with plots and viewer caches.
    crun = root / "client_results" / "bench" / "r1"
    _write(crun / "run.json", json.dumps({"run_id": "r1", "benchmark": "bench"}))
    ep = crun / "bench" / "t" / "000"
    for name in ("steps.jsonl", "left_camera.mp4"):
        _write(ep / name, "{}")
    _write(ep / "result.json", json.dumps({"score": 1.0, "sr": 1.0}))
    for name in ("state_plot.png", "action_plot.png", "merged_with_plot.mp4"):
        _gen(ep / name, "plot" * 50, CATEGORY_PLOTS)
    # The reference client's overlay video: named like a plot, never gmp's.
    _write(ep / "merged_with_plot_0a1b2c3d.mp4", "plot" * 50)
    _gen(ep / "plot.log", "# genmanip-artifacts plot log\noutput: state_plot.png\n", CATEGORY_PLOTS)
    _gen(ep / ".genmanip_vis.rrd", "rrd" * 100)
    # A user's old .tmp inside a results tree, and a temporary left by gmp's atomic write.
    _write(ep / "old.tmp", "in results", age=OLD)
    _write(ep / ".result.json.0123456789ab.tmp", "{", age=OLD)
    ro = _gen(crun / "bench" / "t" / "001" / ".genmanip_vis.rrd", "read-only cache")
    _write(crun / "bench" / "t" / "001" / "result.json", json.dumps({"score": 0.0, "sr": 0.0}))
    ro.chmod(0o444)
    # Traps: symlinks out of the root, one of them named like a generated artifact.
    (ep / "link_out").symlink_to(outside / "dir", target_is_directory=True)
    (root / "trap_dir").symlink_to(outside / "dir", target_is_directory=True)
    (root / ".genmanip_vis.rrd").symlink_to(outside / "victim.txt")
    (root / "old_link.tmp").symlink_to(outside / "victim.txt")
    # Temporaries outside the results trees: the user's, even one named like gmp's.
    _write(root / "stale.tmp", "old", age=OLD)
    _write(root / "work" / ".x.abc.tmp", "old", age=OLD)
    _write(root / "work" / ".x.0123456789ab.tmp", "old", age=OLD)
    _write(root / "fresh.tmp", "new")
    # A user's own file that merely has a plot's name (no provenance record): kept.
    _write(root / "notes" / "action_plot.png", "mine")
    # A user folder that looks like an episode with plots (result.json, plot names, even a
    # plot.log with our first line): nothing of it is gmp's.
    _write(root / "mine" / "result.json", json.dumps({"score": 1.0}))
    for name in ("state_plot.png", "action_plot.png", "merged_with_plot.mp4", ".genmanip_vis.rrd"):
        _write(root / "mine" / name, "user data")
    _write(root / "mine" / "plot.log", "# genmanip-artifacts plot log\n")
    # A `gmp plot --out` directory (its outputs registered by the writer).
    _gen(root / "plots_out" / "state_plot.png", "png", CATEGORY_PLOTS)
    _gen(root / "plots_out" / "plot.log", "# genmanip-artifacts plot log\n", CATEGORY_PLOTS)
    # This project's cache, created (and tagged) by gmp.
    ensure_cache_dir(cache)
    _write(cache / "meshes" / "a.obj", "mesh" * 10)
    _write(cache / "meshes" / "sub" / "b.obj", "mesh")
    _write(cache / "logs" / "gmp.log", "log")
    _write(cache / "downloads" / "bundle.zip", "zip" * 1000)
    _write(cache / "viz" / "cert.pem", "cert")
    return {"root": root, "outside": outside, "cache": cache, "base": tmp_path}


def _snapshot(base: Path) -> set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(base):
        for n in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, n), base))
    return out


def _run(cmd: Any, tree: dict[str, Path], **flags: bool) -> int:
    return cmd.clean(tree["root"], cache_dir=tree["cache"], **flags)


def _gone(before: set[str], after: set[str]) -> set[str]:
    return before - after


EP = "proj/client_results/bench/r1/bench/t/000"
_SRV_EP = "saved/eval_results/ebench/{}/ebench/suite/task/000"
DEFAULT_GONE = {
    # registered viewer caches; a server episode's manifest goes with its only entry
    *(f"{_SRV_EP.format(r)}/{n}" for r in ("run_sub", "run_unsub", "run_live", "run_ro")
      for n in (".genmanip_vis.rrd", MANIFEST)),
    "client_results/bench/r1/bench/t/000/.genmanip_vis.rrd",
    # the temporary of gmp's atomic write, inside the results tree
    "client_results/bench/r1/bench/t/000/.result.json.0123456789ab.tmp",
}
CACHE_GONE = {
    "cache/meshes/a.obj",
    "cache/meshes/sub",
    "cache/meshes/sub/b.obj",
    "cache/logs/gmp.log",
}
PLOTS_GONE = {
    f"{EP}/{n}"
    for n in ("state_plot.png", "action_plot.png", "merged_with_plot.mp4", "plot.log", MANIFEST)
} | {f"proj/plots_out/{n}" for n in ("state_plot.png", "plot.log", MANIFEST)}


def _proj(paths: set[str]) -> set[str]:
    return {f"proj/{p}" for p in paths}


def test_dry_run_by_default_when_not_a_terminal(
    cmd: Any, tree: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    before = _snapshot(tree["base"])
    assert _run(cmd, tree) == ExitCode.OK
    assert _snapshot(tree["base"]) == before
    out = capsys.readouterr()
    assert "viewer-cache: 5 item(s)" in out.out
    assert "mesh-cache: 2 item(s)" in out.out
    assert "would delete:" in out.out
    assert "--yes" in out.err
    # Explicit --dry-run wins over --yes.
    assert _run(cmd, tree, dry_run=True, yes=True) == ExitCode.OK
    assert _snapshot(tree["base"]) == before


def test_default_clean_removes_only_generated_files(
    cmd: Any, tree: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    before = _snapshot(tree["base"])
    # The read-only viewer cache is kept and reported (a warning, not a refusal of the command).
    assert _run(cmd, tree, yes=True) == ExitCode.OK
    gone = _gone(before, _snapshot(tree["base"]))
    assert gone == _proj(DEFAULT_GONE) | CACHE_GONE
    assert (tree["outside"] / "victim.txt").read_text() == "precious"
    err = capsys.readouterr().err
    assert "write-protected" in err and "freed" in err
    # Second run: only the write-protected file is left, so everything that matched was kept.
    assert _run(cmd, tree, yes=True) == ExitCode.REFUSED


def test_plots_flag(cmd: Any, tree: dict[str, Path]) -> None:
    before = _snapshot(tree["base"])
    _run(cmd, tree, yes=True, plots=True)
    gone = _gone(before, _snapshot(tree["base"]))
    assert gone == _proj(DEFAULT_GONE) | CACHE_GONE | PLOTS_GONE
    assert (tree["root"] / "notes" / "action_plot.png").exists()
    assert (tree["outside"] / "dir" / "state_plot.png").exists()
    assert (tree["root"] / "mine" / "state_plot.png").read_text() == "user data"
    assert (tree["root"] / EP.removeprefix("proj/") / "merged_with_plot_0a1b2c3d.mp4").exists()


def test_results_only_submitted_and_not_live(
    cmd: Any, tree: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    before = _snapshot(tree["base"])
    assert _run(cmd, tree, yes=True, results=True) == ExitCode.REFUSED
    gone = _gone(before, _snapshot(tree["base"]))
    run_sub = {p for p in before if p.startswith("proj/saved/eval_results/ebench/run_sub")}
    assert gone == _proj(DEFAULT_GONE) | CACHE_GONE | run_sub
    err = capsys.readouterr().err
    assert "run_unsub: not submitted" in err
    assert "run_live: live run: fresh lock ebench/suite/task/001.lock" in err
    assert "run_ro: contains write-protected left_camera.mp4" in err


def test_force_never_deletes_a_live_run(cmd: Any, tree: dict[str, Path]) -> None:
    before = _snapshot(tree["base"])
    assert _run(cmd, tree, yes=True, results=True, force=True) == ExitCode.REFUSED
    after = _snapshot(tree["base"])
    assert not any(p.startswith("proj/saved/eval_results/ebench/run_unsub") for p in after)
    assert not any(p.startswith("proj/saved/eval_results/ebench/run_sub") for p in after)
    live = {p for p in before if p.startswith("proj/saved/eval_results/ebench/run_live")}
    # The live run keeps everything except its viewer cache (and that cache's manifest).
    assert live - after == {
        f"proj/{_SRV_EP.format('run_live')}/{n}" for n in (".genmanip_vis.rrd", MANIFEST)
    }
    assert (tree["root"] / "saved/eval_results/ebench/run_live/ebench/suite/task/001.lock").exists()
    assert (tree["root"] / "saved/eval_results/ebench/run_ro").exists()
    assert (tree["root"] / "saved/tasks/t/000/meta_info.pkl").exists()


def test_all_adds_download_cache(cmd: Any, tree: dict[str, Path]) -> None:
    before = _snapshot(tree["base"])
    _run(cmd, tree, yes=True, all=True)
    gone = _gone(before, _snapshot(tree["base"]))
    assert gone == _proj(DEFAULT_GONE) | CACHE_GONE | PLOTS_GONE | {"cache/downloads/bundle.zip"}
    assert (tree["cache"] / "viz" / "cert.pem").exists()


def test_nothing_to_do(cmd: Any, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert cmd.clean(tmp_path / "empty", cache_dir=tmp_path / "c", yes=True) == ExitCode.NOTHING_TO_DO


def test_missing_root_is_a_usage_error(cmd: Any, tmp_path: Path) -> None:
    with pytest.raises(ArtifactsUsageError, match="nope: not a directory") as ei:
        cmd.clean(tmp_path / "nope")
    assert ei.value.exit_code == ExitCode.USAGE


def test_symlinked_cache_subdir_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "r"
    root.mkdir()
    cache = ensure_cache_dir(tmp_path / "cache")
    _write(tmp_path / "elsewhere" / "keep.bin", "k")
    (cache / "meshes").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    plan = plan_clean(root, cache_dir=cache)
    assert plan.items == []
    assert [r.reason for r in plan.refused] == ["a symlink or not a directory; not followed"]
    assert (tmp_path / "elsewhere" / "keep.bin").exists()


def test_dir_swapped_for_symlink_after_planning_is_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "r"
    root.mkdir()
    cache = ensure_cache_dir(tmp_path / "cache")
    _write(cache / "meshes" / "pack" / "m.obj", "m")
    _write(tmp_path / "elsewhere" / "keep.bin", "k")
    plan = plan_clean(root, cache_dir=cache)
    assert [i.path.name for i in plan.items] == ["pack"]
    # Attack between listing and deleting: the directory becomes a link to something precious.
    import shutil

    shutil.rmtree(cache / "meshes" / "pack")
    (cache / "meshes" / "pack").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    report = execute_clean(plan)
    assert report.removed == []
    assert "changed since it was listed" in report.failed[0][1]
    assert (tmp_path / "elsewhere" / "keep.bin").exists()


def test_run_that_becomes_live_after_planning_is_kept(tree: dict[str, Path]) -> None:
    plan = plan_clean(tree["root"], results=True, cache_dir=tree["cache"])
    run = tree["root"] / "saved/eval_results/ebench/run_sub"
    assert any(i.path == run for i in plan.items)
    _write(
        run / "ebench/suite/task/002.lock", json.dumps({"worker_id": 3, "timestamp": time.time()})
    )
    report = execute_clean(plan)
    assert run.exists() and (run / "ebench/suite/task/002.lock").exists()
    assert any(r.path == run and "live" in r.reason for r in report.refused)


def test_recently_written_run_counts_as_live(tree: dict[str, Path]) -> None:
    run = tree["root"] / "saved/eval_results/ebench/run_sub"
    _write(run / "ebench/suite/task/000/result_info.json", json.dumps({"score": 1.0}))
    plan = plan_clean(tree["root"], results=True, cache_dir=tree["cache"])
    assert not any(i.path == run for i in plan.items)
    assert any(r.path == run and "written" in r.reason for r in plan.refused)


def test_sizes_are_reported(tree: dict[str, Path]) -> None:
    plan = plan_clean(tree["root"], cache_dir=tree["cache"], all_caches=True)
    by = {i.path.name: i for i in plan.items}
    assert by["bundle.zip"].size == 3000
    assert by["a.obj"].size == 40
    assert by[".genmanip_vis.rrd"].size in (3, 300)
    # A symlink named like a viewer cache was never written by gmp: listed as kept, not deleted.
    assert not any(i.path == tree["root"] / ".genmanip_vis.rrd" for i in plan.items)
    link = next(r for r in plan.refused if r.path == tree["root"] / ".genmanip_vis.rrd")
    assert link.reason == NOT_PROVEN
    assert plan.total_bytes == sum(i.size for i in plan.items)


# The clean handler in a child process, called like gmp calls it: keyword arguments (JSON in
# argv[1]) and a console on stderr.
_CLEAN = """\
import json, sys
from genmanip_artifacts.cli import clean
from genmanip_runtime.console import Console
sys.exit(clean(**json.loads(sys.argv[1]), console=Console()))
"""


def _clean_on_a_terminal(cmd: Any, root: Path, cache: Path, answer: bytes) -> tuple[int, str]:
    """Run ``gmp clean --root ROOT --cache-dir CACHE`` as a subprocess whose stdin/stderr are a
    real pseudo-terminal."""
    import pty
    import select
    import subprocess
    import sys

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLEAN, json.dumps(cmd.clean_kwargs(root, cache_dir=cache))],
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=slave,
        env={**os.environ, "NO_COLOR": "1"},
    )
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 60
    while b"[y/N]" not in seen and time.monotonic() < deadline:
        if select.select([master], [], [], 0.5)[0]:
            seen += os.read(master, 4096)
    os.write(master, answer)
    rc = proc.wait(timeout=60)
    while select.select([master], [], [], 0.2)[0]:
        try:
            seen += os.read(master, 4096)
        except OSError:
            break
    os.close(master)
    return rc, seen.decode(errors="replace")


@pytest.mark.parametrize(
    ("answer", "expected_rc", "deleted"),
    [(b"n\n", ExitCode.REFUSED, False), (b"y\n", ExitCode.OK, True)],
)
def test_prompt_on_a_terminal(
    cmd: Any, tmp_path: Path, answer: bytes, expected_rc: int, deleted: bool
) -> None:
    root = tmp_path / "r"
    cache = tmp_path / "c"
    target = _gen(root / "client_results" / "b" / "r" / ".genmanip_vis.rrd", "rrd")
    rc, talk = _clean_on_a_terminal(cmd, root, cache, answer)
    assert "delete 1 item(s), 3 B? [y/N]" in talk
    assert rc == expected_rc
    assert target.exists() is not deleted
