"""What ``gmp demo`` records with no flags, every reader started in the same directory finds.

The installed ``gmp`` runs for real, in a subprocess, in an empty directory and without
``$GENMANIP_RESULT_DIR``: ``gmp demo`` writes ``./gmp-demo``; ``gmp leaderboard list``, ``gmp viz``
(its runs page), ``gmp plot`` and ``gmp clean`` must all see that run (one rule:
``genmanip_results.roots``). Before that rule, ``gmp leaderboard list`` said "no runs found".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from genmanip_results import layout


def _gmp_argv() -> list[str]:
    exe = Path(sys.executable).with_name("gmp")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "genmanip"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (layout.RESULTS_DIR_ENV, "FORCE_COLOR")}
    env["NO_COLOR"] = "1"
    return env


def gmp(cwd: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_gmp_argv(), *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(project directory, run directory) after a flagless-root ``gmp demo`` (a small job)."""
    cwd = tmp_path_factory.mktemp("project")
    res = gmp(cwd, "demo", "--workers", "2", "--processes", "1")
    assert res.returncode == 0, res.stderr[-2000:]
    runs = [
        p for p in (cwd / layout.DEMO_RESULTS_DIR).glob("*/*") if (p / layout.RUN_JSON).is_file()
    ]
    assert len(runs) == 1, runs
    yield cwd, runs[0]


def test_demo_default_is_the_layout_constant() -> None:
    """``gmp demo --results-dir``'s default (spelled in the stdlib-only parser, which must not
    import genmanip_results) is :data:`layout.DEMO_RESULTS_DIR`."""
    from genmanip.cli.parser import build_parser

    args = build_parser().parse_args(["demo"])
    assert args.results_dir == layout.DEMO_RESULTS_DIR


def test_leaderboard_list_finds_the_demo_run(demo: tuple[Path, Path]) -> None:
    cwd, run_dir = demo
    res = gmp(cwd, "leaderboard", "list", "--json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert [Path(r["path"]).resolve() for r in rows] == [run_dir.resolve()]
    assert rows[0]["complete"] is True and rows[0]["layout"] == "client"


def test_viz_lists_the_demo_run(demo: tuple[Path, Path]) -> None:
    pytest.importorskip("genmanip_viz")
    pytest.importorskip("rerun")
    cwd, run_dir = demo
    proc = subprocess.Popen(
        [*_gmp_argv(), "viz", "--port", "0"],
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()  # the URL is the command's stdout
        assert url.startswith("http://"), proc.stderr.read() if proc.stderr else url
        deadline = time.monotonic() + 60
        page = ""
        while time.monotonic() < deadline:
            with urllib.request.urlopen(url, timeout=10) as resp:
                page = resp.read().decode("utf-8", "replace")
            if run_dir.name in page:
                break
            time.sleep(0.5)  # the first scan may still be running
        assert run_dir.name in page
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


def test_plot_and_clean_find_the_demo_run(demo: tuple[Path, Path]) -> None:
    cwd, run_dir = demo
    episode = sorted(p.parent for p in run_dir.rglob(layout.RESULT_JSON) if p.parent != run_dir)[0]
    res = gmp(cwd, "plot", "--no-video", "--jobs", "1", str(episode.relative_to(cwd)))
    assert res.returncode == 0, res.stderr
    assert (episode / "state_plot.png").is_file() and (episode / "action_plot.png").is_file()

    # Only gmp's own stale temporaries (its atomic writes' names) inside the results tree are
    # clean's; a user's *.tmp, inside or outside, never is.
    inside, outside = run_dir / "stale.tmp", cwd / "stale.tmp"
    ours = run_dir / ".run.json.0123456789ab.tmp"
    old = time.time() - 3 * 3600
    for p in (inside, outside, ours):
        p.write_text("")
        os.utime(p, (old, old))
    res = gmp(cwd, "clean", "--dry-run", "--plots", "--cache-dir", str(cwd / "no-cache"))
    assert res.returncode == 0, res.stderr
    listed = res.stdout
    assert str((episode / "state_plot.png").relative_to(cwd)) in listed
    assert str(ours.relative_to(cwd)) in listed and "stale.tmp" not in listed
    assert inside.exists() and outside.exists() and ours.exists()  # a dry run deletes nothing


def test_ctrl_c_stops_viz_quietly(demo: tuple[Path, Path]) -> None:
    # A terminal's Ctrl-C reaches the whole process group (the viewer's builder processes too):
    # gmp viz stops with exit 130 and no traceback (issue 19: it printed a multiprocessing one).
    import signal

    cwd, run_dir = demo
    proc = subprocess.Popen(
        [*_gmp_argv(), "viz", "--port", "0"], cwd=cwd, env=_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://"), proc.stderr.read() if proc.stderr else url
        deadline = time.monotonic() + 60
        page = ""
        while time.monotonic() < deadline and run_dir.name not in page:
            with urllib.request.urlopen(url, timeout=10) as resp:
                page = resp.read().decode("utf-8", "replace")
            time.sleep(0.3)
        # an episode page starts the recording builder's processes
        ep = next(p.parent for p in run_dir.rglob(layout.RESULT_JSON))
        key = page.split('href="/run/', 1)[1].split('"', 1)[0]
        for path in (f"/run/{key}", f"/episode/{key}/{ep.relative_to(run_dir).as_posix()}"):
            try:
                urllib.request.urlopen(url.rstrip("/") + path, timeout=30).read()
            except OSError:
                pass
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
