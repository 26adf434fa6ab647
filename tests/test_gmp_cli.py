"""Smoke tests of the real `gmp` command in a subprocess (whole workspace on sys.path)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def gmp(*args: str, env: dict[str, str] | None = None, python_flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    full_env.pop("FORCE_COLOR", None)
    return subprocess.run(
        [sys.executable, *python_flags, "-m", "genmanip", *args],
        capture_output=True, text=True, env=full_env, stdin=subprocess.DEVNULL, timeout=120,
        check=False,
    )


def _imported_modules(importtime_stderr: str) -> set[str]:
    mods = set()
    for line in importtime_stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+\d+ \|\s*(\S+)", line)
        if m:
            mods.add(m.group(1))
    return mods


def test_help_imports_no_numpy_and_no_handler_package() -> None:
    res = gmp("--help", python_flags=("-X", "importtime"))
    assert res.returncode == 0
    assert res.stdout.startswith("usage: gmp")
    mods = _imported_modules(res.stderr)
    assert "genmanip.cli.parser" in mods  # the parse really happened in this process
    heavy = {m for m in mods if m.split(".")[0] in {
        "numpy", "msgpack", "matplotlib", "rerun", "starlette", "uvicorn", "PIL", "simplejpeg",
        "genmanip_protocol", "genmanip_eval", "genmanip_testbed", "genmanip_viz",
        "genmanip_artifacts", "genmanip_online", "genmanip_leaderboard", "genmanip_runtime",
        "genmanip_results"}}
    assert heavy == set()


def test_subcommand_help_is_also_light() -> None:
    res = gmp("eval", "--help", python_flags=("-X", "importtime"))
    assert res.returncode == 0 and "--worker-ids" in res.stdout
    assert not any(m.split(".")[0] == "numpy" for m in _imported_modules(res.stderr))


def test_version_lists_every_workspace_package() -> None:
    res = gmp("--version")
    assert res.returncode == 0 and res.stderr == ""
    names = {line.split()[0] for line in res.stdout.splitlines()}
    on_disk = {p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists()}
    assert on_disk <= names
    assert "python" in names


def test_unknown_command_is_usage_error() -> None:
    res = gmp("frobnicate")
    assert res.returncode == 2
    assert res.stdout == ""
    assert "usage: gmp" in res.stderr and "invalid choice: 'frobnicate'" in res.stderr


def test_no_arguments_prints_help_and_exits_0() -> None:
    res = gmp()
    assert res.returncode == 0
    assert res.stdout.startswith("usage: gmp") and res.stderr == ""


def test_validate_end_to_end_with_no_color(tmp_path: Path) -> None:
    f = tmp_path / "a.json"
    f.write_text('{"control_type": "joint_position", "action": [0.0, 0.0]}')
    res = gmp("validate", "--robot", "manip/lift2/R5a", str(f), env={"NO_COLOR": "1"})
    assert res.returncode == 4
    assert res.stdout.startswith(f"{f}: action: expected 16")
    assert "\x1b[" not in res.stderr and "error:" in res.stderr


def test_keyboard_interrupt_exit_code_130(tmp_path: Path) -> None:
    # A real SIGINT to a real gmp process blocked reading a FIFO (validate waits for data).
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [sys.executable, "-m", "genmanip", "validate", "--robot", "manip/lift2/R5a", str(fifo)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    writer = None
    deadline = time.monotonic() + 60
    try:
        # Opening the write end without blocking succeeds only once gmp has opened the read
        # end, i.e. it is past parsing and imports and about to block in read().
        while writer is None:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "gmp never opened the FIFO"
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                time.sleep(0.05)
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if writer is not None:
            os.close(writer)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
