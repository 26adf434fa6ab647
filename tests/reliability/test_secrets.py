"""Item 10: tokens never appear in logs, run.json, error messages, process titles or the bundle.

One real testbed with a server token and a leaderboard token; real ``gmp`` processes with the token
given by environment variable, by config file and by ``--token`` flag, with ``-vv`` logging; a
wrong token; a hostile server that echoes the Authorization header back in its error details; a
leaderboard bundle and submission. Then every artifact the run left (stdout/stderr of every
command, every file under the results, project, cache and leaderboard directories, zip members
unpacked, ``/proc/<pid>/cmdline`` and ``comm`` of every gmp process and child sampled while it
ran) is searched for each token, raw and base64-encoded.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from genmanip_testbed import serve_testbed

pytestmark = pytest.mark.slow

GMP = [sys.executable, "-m", "genmanip"]


def _children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out += [int(x) for x in fh.read().split()]
    except OSError:
        pass
    return out


def _proc_titles(pid: int) -> list[str]:
    titles = []
    stack = [pid]
    while stack:
        p = stack.pop()
        for name in ("cmdline", "comm", "environ"):
            if name == "environ":
                continue  # the environment is private to the user (mode 0400); not a title
            try:
                titles.append(Path(f"/proc/{p}/{name}").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace"))
            except OSError:
                pass
        stack += _children(p)
    return titles


class Run:
    """Runs gmp commands as real processes, keeping every output and sampled process title."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env = env
        self.cwd = cwd
        self.outputs: list[tuple[str, str]] = []
        self.titles: list[str] = []

    def __call__(self, *argv: str, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        e = dict(self.env)
        e.update(env or {})
        proc = subprocess.Popen([*GMP, *argv], env=e, cwd=self.cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                self.titles += _proc_titles(proc.pid)
                time.sleep(0.05)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            stop.set()
            t.join()
        self.outputs.append((" ".join(argv), out + "\n" + err))
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


class _EchoHandler(BaseHTTPRequestHandler):
    """A hostile server: every reply is an error whose detail echoes the request's credentials."""

    def _reply(self) -> None:
        auth = self.headers.get("Authorization", "")
        body = json.dumps({"detail": f"denied for {auth} at {self.path}; headers={dict(self.headers)}"}).encode()
        code = 401 if self.path.endswith(("protocol", "get_worker_ids")) else 500
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Echo", auth)
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _reply

    def log_message(self, *args: object) -> None:
        pass


def _needles(*tokens: str) -> list[str]:
    out = []
    for t in tokens:
        out += [t, base64.b64encode(t.encode()).decode(), t[4:-4]]  # a truncated token leaks too
    return out


def _scan_tree(root: Path, needles: list[str]) -> list[str]:
    hits = []
    for p in root.rglob("*"):
        if not p.is_file() or p.is_symlink():
            continue
        data = p.read_bytes()
        blobs = [data]
        if zipfile.is_zipfile(p):
            with zipfile.ZipFile(p) as zf:
                blobs += [zf.read(n) for n in zf.namelist()]
        for blob in blobs:
            for n in needles:
                if n.encode() in blob:
                    hits.append(f"{p}: contains {n[:6]}...")
    return hits


def test_tokens_never_leak(tmp_path: Path) -> None:
    server_token = "srv-" + secrets.token_hex(16)
    lb_token = "lb-" + secrets.token_hex(16)
    wrong_token = "wrong-" + secrets.token_hex(16)
    cfg_token = server_token  # also delivered through the config file in one run
    project = tmp_path / "project"
    results = tmp_path / "results"
    cache = tmp_path / "cache"
    home = tmp_path / "home"
    home.mkdir()
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[eval]\ntoken = "{cfg_token}"\n[leaderboard]\ntoken = "{lb_token}"\n', encoding="utf-8")
    base_env = {k: v for k, v in os.environ.items()
                if k not in ("GMP_TOKEN", "GMP_TESTBED_TOKEN", "USER_TOKEN", "GENMANIP_RESULT_DIR")}
    base_env.update({"HOME": str(home), "XDG_CACHE_HOME": str(cache), "GMP_CONFIG": str(tmp_path / "empty.toml"),
                     "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"})
    (tmp_path / "empty.toml").write_text("", encoding="utf-8")
    run = Run(base_env, tmp_path)

    with serve_testbed(tasks="testbed/smoke", token=server_token, leaderboard_token=lb_token,
                       save_process=True, results_root=project, run_id="secret-run",
                       data_dir=tmp_path / "lb") as tb:
        # 1. token from the environment, verbose logging, recording on
        r = run("-vv", "eval", "--url", tb.url, "--policy", "expert", "--results-dir", str(results),
                "--max-episodes", "1", env={"GMP_TOKEN": server_token})
        assert r.returncode == 0, r.stderr
        # 2. token from the config file
        r = run("-vv", "eval", "--url", tb.url, "--policy", "expert", "--results-dir", str(results),
                "--max-episodes", "1", env={"GMP_CONFIG": str(cfg)})
        assert r.returncode == 0, r.stderr
        # 3. token on the command line (visible in the process list: the user's choice, and the
        #    help says so), but it must not be copied into run.json, logs or messages
        r = run("-vv", "eval", "--url", tb.url, "--policy", "expert", "--results-dir", str(results),
                "--token", server_token)
        assert r.returncode == 0, r.stderr
        flag_titles = [t for t in run.titles if server_token in t]
        run.titles = [t for t in run.titles if t not in flag_titles]
        # 4. a wrong token: a clear auth error that names neither token
        r = run("-vv", "eval", "--url", tb.url, "--policy", "expert", "--results-dir", str(results),
                env={"GMP_TOKEN": wrong_token})
        assert r.returncode == 8, r.stderr  # ExitCode.AUTH
        assert "token" in r.stderr.lower() or "auth" in r.stderr.lower()
        r = run("-vv", "status", "--url", tb.url, env={"GMP_TOKEN": wrong_token})
        assert r.returncode == 8, r.stderr
        # 5. leaderboard bundle and submission (token from the environment)
        assert tb.run_dir.name == "secret-run"
        r = run("-vv", "leaderboard", "bundle", "secret-run", "--root", str(project))
        assert r.returncode == 0, r.stderr
        r = run("-vv", "leaderboard", "submit", "--root", str(project), "--run-id", "secret-run",
                "-n", "exp", "-l", "tb", "--host", "127.0.0.1", "--port", str(tb.port),
                "--insecure-http", env={"USER_TOKEN": lb_token})
        assert r.returncode == 0, r.stderr
        r = run("-vv", "leaderboard", "submit", "--root", str(project), "--run-id", "secret-run",
                "-n", "exp2", "-l", "tb", "--host", "127.0.0.1", "--port", str(tb.port),
                "--insecure-http", "--force", env={"USER_TOKEN": wrong_token})
        assert r.returncode != 0

    # 6. a hostile server echoing the Authorization header into error details and headers
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _EchoHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        for argv in (("eval", "--url", url, "--results-dir", str(results)), ("status", "--url", url)):
            r = run("-vv", *argv, env={"GMP_TOKEN": server_token}, timeout=120)
            assert r.returncode != 0
            assert "gmp: error:" in r.stderr
    finally:
        srv.shutdown()
        srv.server_close()

    needles = _needles(server_token, lb_token, wrong_token)
    leaks = []
    for cmd, text in run.outputs:
        leaks += [f"output of `gmp {cmd[:60]}` contains {n[:6]}..." for n in needles if n in text]
    leaks += [f"process title {t[:80]!r}" for t in run.titles for n in needles if n in t]
    for root in (results, project, cache, tmp_path / "lb"):
        if root.exists():
            leaks += _scan_tree(root, needles)
    assert (results / "testbed" / "secret-run" / "run.json").exists()
    assert (list(results.rglob("*.mp4")) and list(cache.rglob("*.zip"))) or list(project.rglob("*.zip"))
    assert not leaks, "\n".join(leaks)
    # the sampler did see the processes (so "no title leaked" is not vacuous)
    assert len(run.titles) > 20 and any("genmanip" in t for t in run.titles)
