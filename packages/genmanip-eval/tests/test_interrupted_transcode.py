"""Ctrl-C while ``--transcode inline`` makes an episode's videos: a stop, not a recording failure.

The evaluation runs in its own process (and process group, as a terminal's foreground job) against
the testbed in this one. When the recorder's ffmpeg for the chosen episode exists (found among the
process's children in ``/proc``), it is frozen (SIGSTOP) so it cannot finish first, the whole
group gets SIGINT (what Ctrl-C does: ffmpeg is hit too and exits 255), and ffmpeg is let go.
The run must say once how many episodes' videos are left to the resume, never "recording failed",
and end as interrupted (130); the resume makes the videos.

The process runs ``gmp eval``'s path in genmanip-eval (``evaluate``) behind the exit-code mapping of
``gmp``'s dispatcher (``genmanip.cli``: KeyboardInterrupt -> ``gmp: interrupted``, 130; a
``GenmanipError`` -> ``gmp: error: ...``, its exit code), which is not a dependency of this package.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from genmanip_testbed import serve_testbed

pytestmark = pytest.mark.slow

TOKEN = "tb-token-Interrupt-9f3"
RUN = "cut1"

_GMP_EVAL = r"""
import json, logging, signal, sys
# Ctrl-C as in a terminal's foreground job: a CI script's background job starts its children with
# SIGINT ignored, and Python then installs no KeyboardInterrupt for it.
signal.signal(signal.SIGINT, signal.default_int_handler)
from genmanip_eval import EvalConfig
from genmanip_eval.cli import eval_exit_code, evaluate
from genmanip_protocol.errors import GenmanipError
from genmanip_runtime.console import Console

for level in (logging.WARNING, logging.ERROR):
    logging.addLevelName(level, logging.getLevelName(level).lower())
logging.basicConfig(level=logging.WARNING, format="gmp: %(levelname)s: %(message)s")
cfg = EvalConfig(**json.loads(sys.argv[1]))
try:
    code = eval_exit_code(cfg, evaluate(cfg, Console(sys.stderr)))
except KeyboardInterrupt:
    sys.stderr.write("\ngmp: interrupted\n")
    code = 130
except GenmanipError as exc:
    sys.stderr.write(f"gmp: error: {exc}\n")
    code = int(exc.exit_code)
sys.exit(code)
"""


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue  # the thread ended
    return out


def _ffmpeg_for(pid: int, needle: str) -> int | None:
    """A child of ``pid`` that is an ffmpeg whose command line mentions ``needle``."""
    for child in _children(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"ffmpeg" in os.path.basename(argv[0]) and any(needle.encode() in a for a in argv):
            return child
    return None


def _freeze(pid: int) -> bool:
    """SIGSTOP ``pid`` and wait until it is stopped; False when it ended first (it had finished
    its video between being found and the signal)."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            return False
        if state in ("T", "t"):
            return True
        if state in ("Z", "X"):
            return False
        time.sleep(0.001)
    raise AssertionError(f"ffmpeg {pid} did not stop")


def _eval(cfg: dict[str, object]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _GMP_EVAL, json.dumps(cfg)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.fixture
def testbed(tmp_path: Path) -> Iterator[object]:
    # 40 steps: episode 001 is far from its end (it has just begun) while 000's videos are made,
    # so the Ctrl-C never lands on 001's last step (a stop there can leave it unfinishable, by
    # design: the recorder cannot know its last step was recorded).
    with serve_testbed(tasks=("testbed/smoke",), num_steps=40, results_root=tmp_path / "server",
                       run_id=RUN, token=TOKEN) as tb:
        yield tb


def _episode_dirs(results: Path) -> dict[str, Path]:
    task = results / "testbed" / RUN / "testbed" / "smoke" / "red_block_easy"
    return {seed: task / seed for seed in ("000", "001")}


@pytest.mark.parametrize(
    ("seed", "resume_runs", "group"),
    # 000: the job still has an episode to run, which the resume runs after making 000's videos;
    # 001: the last episode, so the job is complete and the resume only finishes the recordings.
    # group=False: the signal reaches ffmpeg alone (what is left of a Ctrl-C whose interrupt
    # CPython dropped in a finalizer): the recorder stops the run as the Ctrl-C would have.
    [("000", True, True), ("001", False, True), ("000", True, False)],
    ids=["mid-job", "last-episode", "ffmpeg-only"],
)
def test_ctrl_c_during_an_inline_transcode_leaves_the_videos_to_the_resume(
    testbed: object, tmp_path: Path, seed: str, resume_runs: bool, group: bool
) -> None:
    results = tmp_path / "results"
    cfg: dict[str, object] = {"url": testbed.url, "token": TOKEN, "worker_ids": ["0"],  # type: ignore[attr-defined]
                              "policy": "zero", "results_dir": str(results), "transcode": "inline"}
    proc = _eval(cfg)
    frozen: int | None = None
    try:
        deadline = time.monotonic() + 120
        while frozen is None:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no ffmpeg for episode " + seed
            found = _ffmpeg_for(proc.pid, f"/red_block_easy/{seed}/")
            # Frozen, it cannot finish before the Ctrl-C reaches it (one that finished just
            # now is passed over: the episode's next camera has its own ffmpeg).
            frozen = found if found is not None and _freeze(found) else None
        if group:
            os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: the whole foreground group
        else:
            os.kill(frozen, signal.SIGINT)
        os.kill(frozen, signal.SIGCONT)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    # (a Ctrl-C that lands in a finalizer is reported and dropped by CPython itself: the stop then
    # comes from the recorder, which saw its ffmpeg end by the signal; that report is not gmp's)
    err = re.sub(r"Exception ignored in: .*?\nKeyboardInterrupt: ?\n", "", err, flags=re.S)
    assert "recording failed" not in err and "Traceback" not in err, err
    said = re.findall(r"^gmp: warning: interrupted; (\d+) (episode's|episodes') videos will be made on "
                      r"resume$", err, re.M)
    assert len(said) == 1, err  # once
    # as many as are left on disk: the chosen one, and the other when it ended at the same moment
    left = sorted(d.name for d in _episode_dirs(results).values()
                  if list(d.glob(".pending_result.*.json")) and not (d / "result.json").exists())
    assert seed in left and int(said[0][0]) == len(left), (left, err)
    assert said[0][1] == ("episode's" if len(left) == 1 else "episodes'")
    assert err.rstrip().endswith("gmp: interrupted"), err
    resume = next(line for line in err.splitlines() if "To resume: gmp eval" in line)
    assert f"--run-id {RUN}" in resume and TOKEN not in err and "--token" not in resume
    cut = _episode_dirs(results)[seed]
    # Left for the resume, not passed off as done (a camera encoded before the stop may be there).
    assert not (cut / "result.json").exists() and (cut / "INCOMPLETE").exists()
    assert len(list(cut.glob("*.mp4"))) < 4 and list(cut.glob(".pending_result.*.json"))

    first_err = err
    again = _eval({**cfg, "run_id": RUN})
    _out, err = again.communicate(timeout=180)
    assert again.returncode == 0, err
    assert "recording failed" not in err and "interrupted" not in err, err
    if not resume_runs:
        assert "finished the recordings of 1 episode(s)" in err, err
    for d in _episode_dirs(results).values():
        assert (d / "result.json").is_file(), (sorted(str(f.relative_to(d)) for f in d.rglob("*")), first_err, err)
        result = json.loads((d / "result.json").read_text())
        assert result["seed"] == d.name
        videos = sorted(p.name for p in d.glob("*.mp4"))
        assert videos == ["left_camera.mp4", "overlook_camera.mp4", "right_camera.mp4", "top_camera.mp4"], d
        assert not (d / "INCOMPLETE").exists() and not (d / ".frames").exists()
