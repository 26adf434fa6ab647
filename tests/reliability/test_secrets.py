"""Item 10: tokens never appear in logs, run.json, error messages, process titles or the bundle.

One real testbed with a server token and a leaderboard token; real ``gmp`` processes with the token
given by environment variable, by config file and by ``--token`` flag, with ``-vv`` logging; a
wrong token; a hostile server that echoes the Authorization header back in its error details; a
leaderboard bundle and submission. Then every artifact the run left (stdout/stderr of every
command, every file under the results, project, cache and leaderboard directories, zip members
unpacked, ``/proc/<pid>/cmdline`` and ``comm`` of every gmp process and child sampled while it
ran) is searched for each token, raw and base64-encoded.

A second test has a hostile server echo the tokens back in every form the scrubber is documented
to catch (raw, cut at the client's limit, base64 alone / as ``Bearer`` / as HTTP Basic,
URL-encoded, hex) in reason phrases, JSON details, non-JSON bodies, pickle globals and dtype
strings, with the token delivered by environment, config file, ``token_file`` and flag; no run of
10 characters of any form may appear in any output. (A token split across two messages, and other
encodings, are out of scope: see ``genmanip_runtime.redact``.)
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
import urllib.parse
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from genmanip_results.layout import FRAME_STORE_SUFFIX
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
        #    (the job is complete by now: --run-id makes this a deliberate resume of the finished
        #    run, exit 0; without it gmp eval says there is nothing to evaluate, exit 10)
        r = run("-vv", "eval", "--url", tb.url, "--policy", "expert", "--results-dir", str(results),
                "--run-id", "secret-run", "--token", server_token)
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
    # (the scan covered real recordings: frame stores, and the bundle that was built)
    recorded = list(results.rglob("*" + FRAME_STORE_SUFFIX)) or list(results.rglob("*.mp4"))
    assert (recorded and list(cache.rglob("*.zip"))) or list(project.rglob("*.zip"))
    assert not leaks, "\n".join(leaks)
    # the sampler did see the processes (so "no title leaked" is not vacuous)
    assert len(run.titles) > 20 and any("genmanip" in t for t in run.titles)


class _FormsEchoHandler(BaseHTTPRequestHandler):
    """A hostile server that echoes the credentials it receives in every form and every place:
    the reason phrase, a JSON detail cut by the client's limit inside the token, a non-JSON 200
    body, a pickle global's name, a dtype string. ``server.mode`` picks the place."""

    server: _FormsServer

    def _reply(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        auth = self.headers.get("Authorization", "")
        tok = auth.removeprefix("Bearer ").strip() or self.server.lb_token
        forms = (f"{auth} {tok} {base64.b64encode(auth.encode()).decode()} "
                 f"{base64.b64encode(f'u:{tok}'.encode()).decode()} {urllib.parse.quote(tok, safe='')} "
                 f"{tok.encode().hex()} {tok[::-1][:3]}")
        mode, path = self.server.mode, self.path.split("?")[0]
        status, reason, ctype, data = 500, "Internal Server Error", "application/json", b""
        if mode == "reason":
            reason = f"Denied {tok} {base64.b64encode(auth.encode()).decode()}"
            data = json.dumps({"detail": "no"}).encode()
        elif mode == "cut":
            data = json.dumps({"detail": "x" * 396 + tok + "y" * 800 + forms}).encode()
        elif mode == "text200":
            status, ctype, data = 200, "text/plain", ("z" * 75 + tok + " " + forms).encode()
        elif mode in ("pickle", "dtype") and path == "/protocol":
            status, data = 404, b'{"detail": "Not Found"}'
        elif mode in ("pickle", "dtype") and path in ("/kill", "/status"):
            status, data = 200, b'{"data": {"success": true}}'
        elif mode == "pickle":
            name = (tok + " " + forms).encode()
            module = b"m" * 190
            status, ctype = 200, "application/octet-stream"
            data = (b"\x80\x04\x8d" + len(module).to_bytes(8, "little") + module + b"\x8d"
                    + len(name).to_bytes(8, "little") + name + b"\x93)R.")
        elif mode == "dtype":
            import pickle

            arr = {"type": "numpy_array", "dtype": "<f4" + "q" * 170 + tok + forms, "shape": [1],
                   "data": "AAAAAA=="}
            status, ctype = 200, "application/octet-stream"
            data = pickle.dumps({"0": {"obs": {"j": arr}}}, protocol=4)
        elif mode == "lb":
            status = 401 if path == "/api/upload" else 200
            data = json.dumps({"error": forms, "echo": self.server.lb_token}).encode()
        del body
        self.send_response(status, reason)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _reply

    def log_message(self, *args: object) -> None:
        pass


class _FormsServer(ThreadingHTTPServer):
    daemon_threads = True
    mode = "reason"
    lb_token = ""


def _form_needles(token: str) -> list[str]:
    """Runs of 10 characters of the token's raw, base64 (alone, Bearer, Basic), URL and hex forms."""
    forms = [token, urllib.parse.quote(token, safe=""), token.encode().hex()]
    for prefix in ("", "Bearer ", "u:"):
        enc = base64.b64encode((prefix + token).encode()).decode()
        skip = -(-len(prefix) * 4 // 3) + 4 if prefix else 0
        forms.append(enc[skip : len(enc) - 4])
    return [f[i : i + 10] for f in forms for i in range(len(f) - 9)]


def test_echoed_token_forms_never_reach_the_output(tmp_path: Path) -> None:
    """Tokens delivered by environment, config file, token_file and flag; the server echoes them
    back raw, cut, base64, URL-encoded and hex, in reason phrases, details, non-JSON bodies, pickle
    globals and dtype strings, to `gmp eval`, `gmp status` and `gmp leaderboard submit/status`."""
    env_token = "env-" + secrets.token_urlsafe(18)
    cfg_token = "cfg-" + secrets.token_hex(14)
    file_token = "file+" + secrets.token_urlsafe(15) + "/="
    flag_token = "flag-" + secrets.token_hex(14)
    lb_token = "lbx-" + secrets.token_urlsafe(20)
    (tmp_path / "tok").write_text(file_token + "\n", encoding="utf-8")
    (tmp_path / "tok").chmod(0o600)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[eval]\ntoken = "{cfg_token}"\n', encoding="utf-8")
    cfg.chmod(0o600)
    cfg_file = tmp_path / "config-file.toml"
    cfg_file.write_text(f'[eval]\ntoken_file = "{tmp_path / "tok"}"\n', encoding="utf-8")
    (tmp_path / "empty.toml").write_text("", encoding="utf-8")
    base_env = {k: v for k, v in os.environ.items()
                if k not in ("GMP_TOKEN", "USER_TOKEN", "GENMANIP_RESULT_DIR", "FORCE_COLOR")}
    base_env.update({"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache"),
                     "GMP_CONFIG": str(tmp_path / "empty.toml"), "NO_COLOR": "1"})
    run = Run(base_env, tmp_path)
    deliveries: list[tuple[tuple[str, ...], dict[str, str]]] = [
        ((), {"GMP_TOKEN": env_token}),
        ((), {"GMP_CONFIG": str(cfg)}),
        ((), {"GMP_CONFIG": str(cfg_file)}),
        (("--token", flag_token), {}),
    ]
    from genmanip_results.testing import make_server_run

    project = tmp_path / "project"
    make_server_run(project, run_id="formsrun", videos=False)
    srv = _FormsServer(("127.0.0.1", 0), _FormsEchoHandler)
    srv.lb_token = lb_token
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    shown = 0
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        for mode in ("reason", "cut", "text200", "pickle", "dtype"):
            srv.mode = mode
            for extra, env in deliveries:
                for argv in (("eval", "--url", url, "--no-record", "--max-recoveries", "0", *extra),
                             ("status", "--url", url, *extra)):
                    r = run("-vv", *argv, env=env, timeout=90)
                    assert r.returncode != 0 and "gmp: error:" in r.stderr, (mode, argv, r.stderr)
                    shown += "***" in r.stderr
        srv.mode = "lb"
        lb = ("--host", "127.0.0.1", "--port", str(srv.server_address[1]), "--insecure-http")
        r = run("-vv", "leaderboard", "submit", "--root", str(project), "--run-id", "formsrun",
                "-n", "s", "-l", "b", *lb, env={"USER_TOKEN": lb_token})
        assert r.returncode != 0 and "***" in r.stderr, r.stderr
        r = run("-vv", "leaderboard", "status", "sub1", *lb, env={"USER_TOKEN": lb_token})
        assert r.returncode == 0 and "***" in r.stdout, r.stdout + r.stderr
    finally:
        srv.shutdown()
        srv.server_close()
    assert shown >= 30  # the echoes did reach the output, scrubbed (the checks are not vacuous)
    leaks = []
    for tok in (env_token, cfg_token, file_token, flag_token, lb_token):
        needles = _form_needles(tok)
        for cmd, text in run.outputs:
            hits = [n for n in needles if n in text]
            if hits:
                leaks.append(f"`gmp {cmd[:70]}` printed {tok[:4]}... as {hits[0]!r}")
    assert not leaks, "\n".join(leaks[:20])
