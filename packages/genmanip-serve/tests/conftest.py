from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
URL_RE = re.compile(r"policy server (ws://127\.0\.0\.1:\d+)")


def pytest_configure(config: pytest.Config) -> None:
    sys.path.insert(0, str(HERE))


def _env(extra_path: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    parts = [str(HERE)] + ([extra_path] if extra_path else [])
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["NO_COLOR"] = "1"
    return env


class ServerProc:
    """A policy server in its own process (the ``gmp policy serve`` handler)."""

    def __init__(self, **kwargs: Any) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "serve_helpers", json.dumps(kwargs)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=_env(), cwd=str(HERE),
        )
        self.lines: list[str] = []
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            m = URL_RE.search(line)
            if m:
                self.url = m.group(1)
                break
        else:
            raise AssertionError(f"the policy server did not start: {''.join(self.lines)}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            _out, err = self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _out, err = self.proc.communicate()
        self.lines.append(err)
        return int(self.proc.returncode)


@pytest.fixture()
def server_proc() -> Iterator[Callable[..., ServerProc]]:
    started: list[ServerProc] = []

    def start(**kwargs: Any) -> ServerProc:
        s = ServerProc(**kwargs)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture(scope="session")
def openpi_client_path(tmp_path_factory: pytest.TempPathFactory) -> str | None:
    """Where ``openpi_client`` is importable from: None when this environment has it, else a
    directory it was installed into with ``pip install --no-deps --target`` (it declares numpy<2,
    so it is in no extra; offline, pip finds its wheel through $PIP_FIND_LINKS)."""
    if importlib.util.find_spec("openpi_client") is not None:
        return None
    target = tmp_path_factory.mktemp("openpi-client")
    pip = [sys.executable, "-m", "pip"]
    if subprocess.run([*pip, "--version"], capture_output=True, check=False).returncode != 0:
        # An environment without pip (hatch's, made by uv): a throwaway venv brings one (the
        # standard library's ensurepip), and installs into the target directory for us.
        tools = tmp_path_factory.mktemp("pip-venv")
        subprocess.run([sys.executable, "-m", "venv", str(tools)], check=True, timeout=300,
                       capture_output=True)
        pip = [str(tools / "bin" / "python"), "-m", "pip"]
    proc = subprocess.run(
        [*pip, "install", "-q", "--no-deps", "--disable-pip-version-check",
         "--target", str(target), "openpi-client==0.1.2"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, f"cannot install openpi-client==0.1.2: {proc.stderr[-2000:]}"
    return str(target)


@pytest.fixture()
def child_env() -> Callable[[str | None], dict[str, str]]:
    return _env
