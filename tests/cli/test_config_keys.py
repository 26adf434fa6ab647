"""Every key docs/configuration.md (and the per-package docs) document is honoured: one case per key.

Each case writes a config file holding only that key (plus what the command cannot run without,
given by flag), runs the real ``gmp`` command against a real testbed, and pins the exit code and
what shows the key was read. ``test_every_documented_key_has_a_case`` keeps the table and the docs
in step: a key added to the docs without a case here fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from genmanip_protocol.errors import ExitCode
from genmanip_runtime.testing import TLSFiles
from genmanip_testbed import serve_testbed

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EVAL_TOKEN = "cfg-eval-token-0123456789"
ONLINE_TOKEN = "cfg-online-token-0123456789"
BOARD_TOKEN = "cfg-board-token-0123456789"
TESTBED_TOKEN = "cfg-testbed-token-0123456789"
_ENV_UNSET = ("GMP_TOKEN", "GMP_ONLINE_TOKEN", "GMP_ONLINE_URL", "USER_TOKEN", "LEADERBOARD_HOST",
              "LEADERBOARD_PORT", "GMP_LEADERBOARD_CA", "GMP_TESTBED_TOKEN", "GENMANIP_RESULT_DIR")


def gmp(*args: str, config: Path, cwd: Path, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in _ENV_UNSET}
    env.update(NO_COLOR="1", GMP_CONFIG=str(config))
    p = subprocess.run([sys.executable, "-m", "genmanip", *args], env=env, cwd=cwd, capture_output=True,
                       text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    for secret in (EVAL_TOKEN, ONLINE_TOKEN, BOARD_TOKEN, TESTBED_TOKEN):
        assert secret not in p.stdout + p.stderr
    return p


@pytest.fixture(scope="module")
def servers(tls_files: TLSFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """An eval testbed without auth, one with a token (+ the online service), a TLS leaderboard."""
    with serve_testbed(tasks="testbed/smoke", run_id="cfg-open") as open_tb, \
            serve_testbed(tasks="testbed/smoke", run_id="cfg-auth", token=EVAL_TOKEN,
                          online_token=ONLINE_TOKEN, job=True) as auth_tb, \
            serve_testbed(tasks="testbed/smoke", job=False, token="x-eval", leaderboard_token=BOARD_TOKEN,
                          data_dir=tmp_path_factory.mktemp("lb"), ssl_certfile=tls_files.cert,
                          ssl_keyfile=tls_files.key) as board:
        yield {"open": open_tb, "auth": auth_tb, "board": board, "tls": tls_files}


@dataclass(frozen=True)
class Case:
    """One documented key: the config text, the command, and the check of its result."""

    key: str
    config: Callable[[dict[str, Any], Path], str]
    args: Callable[[dict[str, Any], Path], list[str]]
    check: Callable[[subprocess.CompletedProcess[str], dict[str, Any]], None]


def _secret_file(tmp: Path, name: str, value: str) -> Path:
    p = tmp / name
    p.write_text(value + "\n", encoding="utf-8")
    p.chmod(0o600)
    return p


def _status_ok(run_id: str) -> Callable[[subprocess.CompletedProcess[str], dict[str, Any]], None]:
    def check(p: subprocess.CompletedProcess[str], s: dict[str, Any]) -> None:
        assert p.returncode == ExitCode.OK, p.stderr
        assert re.search(rf"run id:\s+{run_id}", p.stdout), p.stdout

    return check


def _online_ok(p: subprocess.CompletedProcess[str], s: dict[str, Any]) -> None:
    assert p.returncode == ExitCode.OK, p.stderr
    assert p.stdout.strip() and "\n" not in p.stdout.strip()  # the task id


def _board_reached(p: subprocess.CompletedProcess[str], s: dict[str, Any]) -> None:
    # An unknown submission id: the leaderboard itself answered (so host, port and CA were used).
    assert p.returncode == ExitCode.REMOTE_ERROR, p.stderr
    assert "cannot connect" not in p.stderr and "certificate" not in p.stderr.lower(), p.stderr


def _board_submitted(p: subprocess.CompletedProcess[str], s: dict[str, Any]) -> None:
    assert p.returncode == ExitCode.OK, p.stderr
    assert json.loads(p.stdout)["status"] == "submitted"


def _board(s: dict[str, Any], extra: str = "") -> str:
    return (f'[leaderboard]\nhost = "127.0.0.1"\nport = {s["board"].port}\n'
            f'ca_cert = "{s["tls"].ca}"\n{extra}')


CASES = [
    Case("eval.url",
         lambda s, tmp: f'[eval]\nurl = "{s["open"].url}"\n',
         lambda s, tmp: ["status"],
         _status_ok("cfg-open")),
    Case("eval.token",
         lambda s, tmp: f'[eval]\nurl = "{s["auth"].url}"\ntoken = "{EVAL_TOKEN}"\n',
         lambda s, tmp: ["status"],
         _status_ok("cfg-auth")),
    Case("eval.token_file",
         lambda s, tmp: f'[eval]\ntoken_file = "{_secret_file(tmp, "eval.tok", EVAL_TOKEN)}"\n',
         lambda s, tmp: ["status", "--url", s["auth"].url],
         _status_ok("cfg-auth")),
    Case("online.base_url",
         lambda s, tmp: f'[online]\nbase_url = "{s["auth"].url}"\ntoken = "{ONLINE_TOKEN}"\n',
         lambda s, tmp: ["online", "create", "--model-name", "m", "--benchmark-set", "testbed/smoke"],
         _online_ok),
    Case("online.token",
         lambda s, tmp: f'[online]\ntoken = "{ONLINE_TOKEN}"\n',
         lambda s, tmp: ["online", "create", "--base-url", s["auth"].url, "--model-name", "m",
                         "--benchmark-set", "testbed/smoke"],
         _online_ok),
    Case("online.token_file",
         lambda s, tmp: f'[online]\ntoken_file = "{_secret_file(tmp, "online.tok", ONLINE_TOKEN)}"\n',
         lambda s, tmp: ["online", "create", "--base-url", s["auth"].url, "--model-name", "m",
                         "--benchmark-set", "testbed/smoke"],
         _online_ok),
    Case("leaderboard.host", lambda s, tmp: _board(s), lambda s, tmp: ["leaderboard", "status", "nope"],
         _board_reached),
    Case("leaderboard.port", lambda s, tmp: _board(s), lambda s, tmp: ["leaderboard", "status", "nope"],
         _board_reached),
    Case("leaderboard.ca_cert", lambda s, tmp: _board(s), lambda s, tmp: ["leaderboard", "status", "nope"],
         _board_reached),
    Case("leaderboard.token",
         lambda s, tmp: _board(s, f'token = "{BOARD_TOKEN}"\n'),
         lambda s, tmp: ["leaderboard", "submit", "--run-id", "cfgrun", "-n", "s", "-l", "b"],
         _board_submitted),
    Case("leaderboard.token_file",
         lambda s, tmp: _board(s, f'token_file = "{_secret_file(tmp, "lb.tok", BOARD_TOKEN)}"\n'),
         lambda s, tmp: ["leaderboard", "submit", "--run-id", "cfgrun", "-n", "s", "-l", "b"],
         _board_submitted),
]


@pytest.mark.parametrize("case", CASES, ids=[c.key for c in CASES])
def test_config_key_is_honoured(case: Case, servers: dict[str, Any], tmp_path: Path,
                                server_run: Callable[..., Path]) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(case.config(servers, tmp_path), encoding="utf-8")
    cfg.chmod(0o600)
    project = tmp_path / "project"
    project.mkdir()
    server_run(project, run_id="cfgrun")
    case.check(gmp(*case.args(servers, tmp_path), config=cfg, cwd=project), servers)


def test_eval_url_loses_to_the_flags(servers: dict[str, Any], tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text('[eval]\nurl = "http://127.0.0.1:9"\n', encoding="utf-8")
    p = gmp("status", "--url", servers["open"].url, config=cfg, cwd=tmp_path)
    _status_ok("cfg-open")(p, servers)
    host, port = servers["open"].url.rsplit("/", 1)[1].split(":")
    p = gmp("status", "--host", host, "--port", port, config=cfg, cwd=tmp_path)
    _status_ok("cfg-open")(p, servers)
    # No flag: the config's URL (port 9: nothing listens there) is the one used, and said to be
    # unreachable after a few seconds of retries (it took 30 s of silence).
    t0 = time.monotonic()
    p = gmp("status", config=cfg, cwd=tmp_path)
    assert p.returncode == ExitCode.UNREACHABLE and "http://127.0.0.1:9" in p.stderr, p.stderr
    assert time.monotonic() - t0 < 20


def test_eval_url_of_the_wrong_type_is_a_config_error(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text("[eval]\nurl = 8087\n", encoding="utf-8")
    p = gmp("status", config=cfg, cwd=tmp_path)
    assert p.returncode == ExitCode.USAGE
    assert f"config file {cfg}: [eval] url must be a URL string, got 8087" in p.stderr


def test_testbed_token_key(tmp_path: Path) -> None:
    """``[testbed] token``: ``gmp testbed serve`` requires it on every route but /docs."""
    import urllib.error
    import urllib.request

    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[testbed]\ntoken = "{TESTBED_TOKEN}"\n', encoding="utf-8")
    cfg.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k not in _ENV_UNSET}
    env.update(NO_COLOR="1", GMP_CONFIG=str(cfg))
    proc = subprocess.Popen([sys.executable, "-m", "genmanip", "testbed", "serve", "--port", "0",
                             "--tasks", "testbed/smoke"], env=env, cwd=tmp_path, text=True,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        assert proc.stderr is not None
        line = ""
        deadline = time.monotonic() + 60
        while "testbed serving" not in line and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "gmp testbed serve exited"
        m = re.search(r"testbed serving (http://\S+).*auth on", line)
        assert m, line
        url = m.group(1)
        with pytest.raises(urllib.error.HTTPError) as ei:
            urllib.request.urlopen(f"{url}/status", timeout=10)
        assert ei.value.code == 401
        req = urllib.request.Request(f"{url}/status", headers={"Authorization": f"Bearer {TESTBED_TOKEN}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


_KEY = re.compile(r"^\s*([a-z_]+)\s*=", re.MULTILINE)


def _documented_keys() -> set[str]:
    """``section.key`` of every key the docs name: the TOML examples of docs/configuration.md and
    the ``[section] key`` mentions anywhere in docs/."""
    keys: set[str] = set()
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    for block in re.findall(r"```toml\n(.*?)```", text, re.DOTALL):
        section = None
        for line in block.splitlines():
            m = re.match(r"\s*\[([a-z.]+)\]", line)
            if m:
                section = m.group(1)
                continue
            k = _KEY.match(line)
            if section and k:
                keys.add(f"{section}.{k.group(1)}")
            # "token_file = ...   # or: token = ..." documents both
            for alt in re.findall(r"or:\s*([a-z_]+)\s*=", line):
                if section:
                    keys.add(f"{section}.{alt}")
    for doc in (ROOT / "docs").glob("*.md"):
        for section, key in re.findall(r"`?\[(eval|online|leaderboard|testbed)\]`? `?([a-z_]+)`?",
                                       doc.read_text(encoding="utf-8")):
            if key not in ("in", "the", "table", "under", "section"):
                keys.add(f"{section}.{key}")
    return keys


def test_every_documented_key_has_a_case() -> None:
    covered = {c.key for c in CASES} | {"testbed.token"}
    assert _documented_keys() - covered == set()
