"""Hostile input, for real: server text must never drive the terminal nor show a token.

A hostile server on 127.0.0.1 answers real ``gmp`` processes (``gmp eval``, ``gmp status``,
``gmp online create|ready|submit|stop``, ``gmp leaderboard submit|status``) with escape sequences
-- OSC 52 clipboard writes, screen clears, cursor moves, a carriage return and a newline drawing a
fake ``ok: all episodes passed`` line, bidi overrides, C1 controls, DEL, zero-width characters --
and with the client's own tokens, raw, cut at the limit of a detail, base64 (alone, as ``Bearer``
and as HTTP Basic), percent-encoded and hex, in reason phrases, JSON error fields, non-JSON bodies,
pickle globals, dtype strings, ``/status`` fields and the online and leaderboard replies.

Every byte of every command's stdout and stderr is then checked: no control or format character
but newline and tab, no escape sequence but gmp's own colour (forced on in one run), no run of 10
characters of any form of any token; and the hostile text itself is shown, escaped (so each check
is not vacuous: the server's text did reach the output).
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import subprocess
import sys
import threading
import unicodedata
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from genmanip_results.testing import make_server_run

pytestmark = pytest.mark.slow

GMP = [sys.executable, "-m", "genmanip"]

SERVER_TOKEN = "srv-" + secrets.token_hex(16)
# Characters that percent-encoding and JSON escaping change, like a base64-alphabet token.
ONLINE_TOKEN = "on+" + secrets.token_urlsafe(12) + "/x=" + secrets.token_hex(6)
LB_TOKEN = "lb-" + secrets.token_urlsafe(24)
TOKENS = (SERVER_TOKEN, ONLINE_TOKEN, LB_TOKEN)

#: What a hostile server puts in its text (str; a reason phrase gets its latin-1 subset).
ESCAPES = (
    "\x1b]52;c;cHduZWQ=\x07"  # OSC 52: write "pwned" to the clipboard
    "\x1b]0;title\x1b\\"  # OSC 0 window title, ST-terminated
    "\x1b[2J\x1b[H\x1b[1A\x1b[2K"  # clear screen, home, cursor up, erase line
    "\r\x1b[32mok:\x1b[0m all episodes passed\n"  # CR + forged line + newline
    "gmp: ok: 100% success "
    "\u202egnp.exe\u2066\u200b\ufeff"  # bidi override, isolate, zero-width, BOM
    "\x9b31m\x9d0;c1\x9c\x85"  # C1: CSI, OSC, ST, NEL
    "\x7f\x08\x00"  # DEL, backspace, NUL
)
LATIN1_ESCAPES = "".join(c for c in ESCAPES if ord(c) < 0x100)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def echoes(token: str) -> str:
    """The token in every form the scrubber is documented to catch."""
    return (
        f" raw:{token} bearer:Bearer {token} b64:{_b64(token)} b64bearer:{_b64('Bearer ' + token)}"
        f" basic:{_b64('user:' + token)} url:{urllib.parse.quote(token, safe='')}"
        f" urlbearer:{urllib.parse.quote('Bearer ' + token)} hex:{token.encode().hex()}"
        f" HEX:{token.encode().hex().upper()} json:{json.dumps({'t': token})}"
    )


def hostile(token: str) -> str:
    return ESCAPES + echoes(token) + " end"


def at_cut(token: str, cut: int, before: int = 12) -> str:
    """Text whose character ``cut`` falls inside ``token`` (``before`` of its characters first)."""
    return "A" * (cut - before) + token + "B" * 900 + hostile(token)


# -- the hostile server ------------------------------------------------------------------------

Reply = tuple[int, str, str, bytes]  # status, reason phrase, content type, body
Route = Callable[[str, str, bytes], Reply]


def _json(obj: Any, status: int = 200, reason: str = "OK") -> Reply:
    return status, reason, "application/json", json.dumps(obj).encode()


def _text(text: str, status: int = 200, reason: str = "OK", ctype: str = "text/html") -> Reply:
    return status, reason, ctype, text.encode()


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _serve(self) -> None:
        self.connection.settimeout(30)
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        path = urllib.parse.urlsplit(self.path).path
        route = self.server.route
        status, reason, ctype, data = route(self.command, path, body) if route else _json({}, 404)
        self.send_response(status, reason)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    do_GET = do_POST = _serve

    def log_message(self, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    route: Route | None = None


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture(scope="module")
def url(server: _Server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


# -- running gmp and checking its output ----------------------------------------------------------

_GMP_STYLE = re.compile(
    r"\x1b\[[0-9;]+m(?:gmp: error:|hint:|warning:|ok:|error:|debug:)\x1b\[0m"
    r"|\r\x1b\[2K"  # the console's own live-line redraw
)


def _token_needles(token: str) -> list[str]:
    """Runs of 10 characters of each form (an oracle independent of genmanip_runtime.redact)."""
    forms = [token, urllib.parse.quote(token, safe=""), json.dumps(token)[1:-1],
             token.encode().hex(), token.encode().hex().upper()]
    for prefix in ("", "Bearer ", "user:", "x"):
        enc = _b64(prefix + token)
        # Leave out the characters that also encode the prefix's bytes, and the final group.
        skip = -(-len(prefix) * 4 // 3) + 4 if prefix else 0
        core = enc[skip : len(enc) - 4]
        forms += [core, core.replace("+", "-").replace("/", "_")]
    return [f[i : i + 10] for f in forms for i in range(len(f) - 9)]


NEEDLES = {t: _token_needles(t) for t in TOKENS}


def check_output(name: str, raw: bytes, *, color: bool = False) -> str:
    text = raw.decode("utf-8")  # strict: gmp never writes invalid UTF-8
    shown = _GMP_STYLE.sub("", text) if color else text
    bad = [f"U+{ord(c):04X}" for c in shown
           if c not in "\n\t" and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")]
    assert not bad, f"{name}: control characters reached the terminal: {sorted(set(bad))}\n{text}"
    for token, needles in NEEDLES.items():
        hits = [n for n in needles if n in text]
        assert not hits, f"{name}: a form of token {token[:4]}... was printed: {hits[:3]}\n{text}"
    return text


def gmp(*argv: str, env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float = 90) -> tuple[int, str, str]:
    e = {k: v for k, v in os.environ.items()
         if k not in ("GMP_TOKEN", "GMP_ONLINE_TOKEN", "GMP_ONLINE_URL", "USER_TOKEN",
                      "LEADERBOARD_HOST", "LEADERBOARD_PORT", "FORCE_COLOR", "NO_COLOR")}
    e.update({"GMP_TOKEN": SERVER_TOKEN, "GMP_ONLINE_TOKEN": ONLINE_TOKEN, "USER_TOKEN": LB_TOKEN,
              "PYTHONUNBUFFERED": "1", "COLUMNS": "200"})
    e.update(env or {})
    p = subprocess.run([*GMP, *argv], env=e, cwd=cwd, capture_output=True, timeout=timeout,
                       stdin=subprocess.DEVNULL, check=False)
    color = bool(e.get("FORCE_COLOR"))
    out = check_output(f"gmp {' '.join(argv)[:80]} (stdout)", p.stdout, color=color)
    err = check_output(f"gmp {' '.join(argv)[:80]} (stderr)", p.stderr, color=color)
    return p.returncode, out, err


def gmp_tty(*argv: str, timeout: float = 60) -> tuple[int, str, str]:
    """Like :func:`gmp` with stderr on a pseudo-terminal: colours and live lines are on (auto)."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import tty

    master, slave = pty.openpty()
    tty.setraw(slave)  # no newline translation: the bytes are gmp's
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 400, 0, 0))
    e = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "NO_COLOR", "TERM")}
    e.update({"GMP_TOKEN": SERVER_TOKEN, "GMP_ONLINE_TOKEN": ONLINE_TOKEN, "USER_TOKEN": LB_TOKEN,
              "PYTHONUNBUFFERED": "1", "COLUMNS": "200", "TERM": "xterm-256color"})
    p = subprocess.Popen([*GMP, *argv], env=e, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=slave)
    os.close(slave)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([master], [], [], timeout)
            if not ready:
                p.kill()
                raise AssertionError(f"gmp {argv} wrote nothing for {timeout} s")
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        out = p.stdout.read() if p.stdout else b""
        code = p.wait(timeout=timeout)
    finally:
        os.close(master)
        if p.stdout:
            p.stdout.close()
    name = f"gmp {' '.join(argv)[:80]} (tty)"
    return (code, check_output(name + " stdout", out),
            check_output(name + " stderr", b"".join(chunks), color=True))


def _visible(text: str) -> bool:
    """The hostile text was shown, escaped or scrubbed (so the checks were not vacuous)."""
    return any(m in text for m in ("\\x1b", "\\u202e", "\\x9b", "***"))


# -- the pickles a legacy-wire server can send -----------------------------------------------------

def _pickle_global(module: str, name: str) -> bytes:
    """A protocol-4 pickle whose first opcode asks for the global ``module.name``."""
    def s(x: str) -> bytes:
        b = x.encode("utf-8", "surrogatepass")
        return b"\x8d" + len(b).to_bytes(8, "little") + b  # BINUNICODE8

    return b"\x80\x04" + s(module) + s(name) + b"\x93" + b")R."


def _pickle_dtype(spec: str) -> bytes:
    import pickle

    arr = {"type": "numpy_array", "dtype": spec, "shape": [1], "data": _b64("\0\0\0\0")}
    return pickle.dumps({"0": {"obs": {"joint": arr}, "reward": 0.0, "done": False}}, protocol=4)


# -- gmp eval and gmp status -------------------------------------------------------------------

def _eval_route(protocol: Reply | None, post: Callable[[str], Reply] | None = None,
                status: Reply | None = None) -> Route:
    def route(method: str, path: str, body: bytes) -> Reply:
        if path == "/status":
            return status or _json({"detail": hostile(SERVER_TOKEN)}, 500, "Error " + LATIN1_ESCAPES)
        if path == "/protocol":
            return protocol or _json({"detail": "Not Found"}, 404, "Not Found")
        if path == "/kill":
            return _json({"data": {"success": True}})
        if post is not None and method == "POST":
            return post(path)
        return _json({"detail": hostile(SERVER_TOKEN)}, 500)
    return route


REASON = f"Oops {LATIN1_ESCAPES} {SERVER_TOKEN} {_b64('Bearer ' + SERVER_TOKEN)}"

EVAL_CASES: dict[str, Route] = {
    "reason phrase and JSON detail": _eval_route(
        _json({"detail": hostile(SERVER_TOKEN)}, 500, REASON)),
    "detail cut inside the token": _eval_route(
        _json({"detail": at_cut(SERVER_TOKEN, 400)}, 500, "Internal Server Error")),
    "JSON error fields (401)": _eval_route(
        _json({"detail": {"error": hostile(SERVER_TOKEN), "msg": [ESCAPES, SERVER_TOKEN[:20]]}}, 401,
              "Unauthorized")),
    "non-JSON 200 body": _eval_route(
        _text("X" * 68 + SERVER_TOKEN + hostile(SERVER_TOKEN))),  # the 80-byte snippet cuts the token
    "pickle global": _eval_route(None, lambda path: (
        200, "OK", "application/octet-stream",
        # "module.name" is cut at 200 characters: 12 of the token's survive the cut
        _pickle_global(ESCAPES[:60] + "m" * 127, SERVER_TOKEN + hostile(SERVER_TOKEN)))),
    "dtype string": _eval_route(None, lambda path: (
        200, "OK", "application/octet-stream",
        # "dtype: unknown dtype '<f4qqq..." is cut at 200 characters, 12 into the token
        _pickle_dtype("<f4" + "q" * 163 + SERVER_TOKEN + ESCAPES + echoes(SERVER_TOKEN)))),
}


@pytest.mark.parametrize("case", list(EVAL_CASES))
def test_gmp_eval_against_a_hostile_server(case: str, server: _Server, url: str, tmp_path: Path) -> None:
    server.route = EVAL_CASES[case]
    code, _out, err = gmp("-vv", "eval", "--url", url, "--no-record", "--max-episodes", "1",
                         "--max-recoveries", "0", "--results-dir", str(tmp_path / "r"), cwd=tmp_path)
    assert code != 0 and "gmp: error:" in err, err
    assert _visible(err), err
    # one error line: no forged line after it
    assert not any(line.startswith(("ok:", "gmp: ok")) for line in err.splitlines()), err


@pytest.mark.parametrize("case", ["reason phrase and JSON detail", "pickle global"])
def test_gmp_eval_worker_processes_against_a_hostile_server(case: str, server: _Server, url: str,
                                                            tmp_path: Path) -> None:
    """Errors (and warnings) of spawned worker processes reach the terminal made safe too."""
    server.route = EVAL_CASES[case]
    code, _out, err = gmp("-vv", "eval", "--url", url, "--no-record", "--max-recoveries", "0",
                          "--processes", "2", "--worker-ids", "0,1",
                          "--results-dir", str(tmp_path / "r"), cwd=tmp_path)
    assert code != 0 and "worker process" in err and _visible(err), err


def test_gmp_eval_error_keeps_gmp_colour_when_forced(server: _Server, url: str, tmp_path: Path) -> None:
    server.route = EVAL_CASES["reason phrase and JSON detail"]
    code, _, err = gmp("eval", "--url", url, "--no-record", "--results-dir", str(tmp_path / "r"),
                       env={"FORCE_COLOR": "1"}, cwd=tmp_path)
    assert code != 0
    assert "\x1b[31;1mgmp: error:\x1b[0m " in err  # gmp's own style survives, the server's does not
    assert _visible(err)


STATUS_DATA = {
    "status": "running" + ESCAPES,
    "benchmark_id": "bench\u202e" + SERVER_TOKEN,
    "run_id": "run\x1b[2J" + _b64("Bearer " + SERVER_TOKEN),
    "total_episodes": 4,
    "completed_episodes": 1,
    "in_progress_episodes": 1,
    "active_workers": ["0\r\x1b[32mok: all episodes passed", SERVER_TOKEN.encode().hex()],
    "mean_scores": {"task\x1b]52;c;eA==\x07" + SERVER_TOKEN[:12]: 0.5, "t2\u2066": 1.0},
}


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_gmp_status_fields_from_a_hostile_server(as_json: bool, server: _Server, url: str) -> None:
    server.route = _eval_route(None, status=_json({"data": STATUS_DATA}))
    code, out, err = gmp("-vv", "status", "--url", url, *(["--json"] if as_json else []))
    if code != 0:  # a status the client refuses is an error, shown escaped
        assert "gmp: error:" in err and _visible(err), err
        return
    assert out.strip()
    if as_json:
        assert json.loads(out)["data" if "data" in json.loads(out) else "status"]
    else:
        assert _visible(out), out
        assert len([ln for ln in out.splitlines() if ln.startswith("workers:")]) == 1


def test_gmp_status_non_json_reply(server: _Server, url: str) -> None:
    # text/plain: an HTML page is never quoted (it is named, "an HTML page titled ..."), so the
    # escaping is checked on a text body.
    server.route = _eval_route(
        None, status=_text("Y" * 68 + SERVER_TOKEN + hostile(SERVER_TOKEN), ctype="text/plain")
    )
    code, _, err = gmp("-vv", "status", "--url", url)
    assert code != 0 and "gmp: error:" in err and _visible(err), err


# -- gmp online ------------------------------------------------------------------------------------

def _online(create: Reply | None = None, ready: Reply | None = None, stop: Reply | None = None) -> Route:
    def route(method: str, path: str, body: bytes) -> Reply:
        if path.endswith("/createTask"):
            return create or _json({"code": 0, "data": {"task_id": "t1"}})
        if path.endswith("/ready"):
            return ready or _json({"code": 0, "data": {"ready": False}})
        if path.endswith("/stop"):
            return stop or _json({"code": 0})
        return _json({"msg": hostile(ONLINE_TOKEN)}, 404, "Not Found " + LATIN1_ESCAPES)
    return route


ONLINE_CASES: dict[str, tuple[Route, tuple[str, ...]]] = {
    "create: HTTP 500 msg": (
        _online(create=_json({"msg": hostile(ONLINE_TOKEN)}, 500, "Boom " + LATIN1_ESCAPES)),
        ("create",)),
    "create: code != 0": (
        _online(create=_json({"code": "E\x1b[2J" + ONLINE_TOKEN, "msg": hostile(ONLINE_TOKEN)})),
        ("create",)),
    "create: unsafe task id": (
        _online(create=_json({"code": 0, "data": {"task_id": "t\u202e\x9b1" + ONLINE_TOKEN}})),
        ("create",)),
    "create: non-JSON body": (
        _online(create=_text("Z" * 288 + ONLINE_TOKEN + hostile(ONLINE_TOKEN))), ("create",)),
    "ready: hostile status fields": (
        _online(ready=_json({"code": 0, "data": {"ready": False, "status": hostile(ONLINE_TOKEN),
                                                  "queue_position": 3, "note": ESCAPES}})),
        ("ready", "--task-id", "t1")),
    "submit: polls fail with hostile text": (
        _online(ready=_json({"msg": hostile(ONLINE_TOKEN)}, 500, "Busy " + LATIN1_ESCAPES)),
        ("submit", "--task-id", "t1", "--interval", "0.2", "--deadline", "1.5")),
    "stop: non-JSON 200": (
        _online(stop=_text(hostile(ONLINE_TOKEN))), ("stop", "--task-id", "t1", "--endpoint", "{url}/ep")),
}


@pytest.mark.parametrize("case", list(ONLINE_CASES))
def test_gmp_online_against_a_hostile_service(case: str, server: _Server, url: str) -> None:
    route, argv = ONLINE_CASES[case]
    server.route = route
    argv = tuple(a.replace("{url}", url) for a in argv)
    code, out, err = gmp("-vv", "online", *argv, "--base-url", url, timeout=60)
    assert _visible(out + err), out + err
    if code == 0:
        assert out.strip() and json.loads(out.strip().splitlines()[-1]) is not None
    else:
        assert "gmp: error:" in err, err


def test_gmp_online_live_line_on_a_terminal(server: _Server, url: str) -> None:
    """On a terminal the wait loop draws the service's queue status in its live line."""
    server.route = _online(ready=_json({"code": 0, "data": {
        "ready": False, "status": hostile(ONLINE_TOKEN), "queue_position": 2}}))
    code, _out, err = gmp_tty("online", "submit", "--task-id", "t1", "--interval", "0.2",
                             "--deadline", "1.5", "--base-url", url)
    assert code != 0
    assert "\r\x1b[2K" in err and "\x1b[31;1mgmp: error:\x1b[0m" in err  # gmp's own codes
    assert "poll 2  \\x1b]52;c;cHduZWQ=\\x07" in err  # the status, escaped, in the live line


def test_gmp_eval_error_on_a_terminal(server: _Server, url: str, tmp_path: Path) -> None:
    server.route = EVAL_CASES["reason phrase and JSON detail"]
    code, _, err = gmp_tty("eval", "--url", url, "--no-record", "--results-dir", str(tmp_path / "r"))
    assert code != 0 and "\x1b[31;1mgmp: error:\x1b[0m" in err and _visible(err)


# -- gmp leaderboard -------------------------------------------------------------------------------

def _board(upload: Reply | None = None, status: Reply | None = None) -> Route:
    def route(method: str, path: str, body: bytes) -> Reply:
        if path == "/api/upload":
            return upload or _json({"status": "success", "submission_id": "s1"})
        if path.startswith("/upload_status/"):
            return status or _json({"state": "done"})
        return _json({"error": hostile(LB_TOKEN)}, 404)
    return route


LB_CASES: dict[str, tuple[Route, str]] = {
    "submit: 401 echoing the author token": (
        _board(upload=_json({"error": hostile(LB_TOKEN)}, 401, "Denied " + LATIN1_ESCAPES)), "submit"),
    "submit: 500 with the token at the snippet cut": (
        _board(upload=_text("W" * 288 + LB_TOKEN + hostile(LB_TOKEN), 500, "Error")), "submit"),
    "submit: non-JSON 200": (_board(upload=_text(hostile(LB_TOKEN))), "submit"),
    "submit: hostile status field": (_board(upload=_json({"status": hostile(LB_TOKEN)})), "submit"),
    "submit: hostile submission id": (
        _board(upload=_json({"status": "success", "submission_id": "s\x1b[2J\u202e" + LB_TOKEN})), "submit"),
    "status: hostile JSON": (
        _board(status=_json({"state": hostile(LB_TOKEN), "token": LB_TOKEN})), "status"),
    "status: non-JSON 200": (_board(status=_text(hostile(LB_TOKEN))), "status"),
    "status: 404 with hostile error": (
        _board(status=_json({"error": hostile(LB_TOKEN)}, 404, "Gone " + LATIN1_ESCAPES)), "status"),
}


@pytest.mark.parametrize("case", list(LB_CASES))
def test_gmp_leaderboard_against_a_hostile_service(case: str, server: _Server, url: str,
                                                    tmp_path: Path) -> None:
    route, action = LB_CASES[case]
    server.route = route
    port = str(server.server_address[1])
    where = ("--host", "127.0.0.1", "--port", port, "--insecure-http")
    if action == "submit":
        project = tmp_path / "project"
        make_server_run(project, run_id="lbrun", videos=False)
        argv: tuple[str, ...] = ("submit", "--root", str(project), "--run-id", "lbrun", "-n", "sub",
                                 "-l", "board", *where)
    else:
        argv = ("status", "s1", *where)
    code, out, err = gmp("-vv", "leaderboard", *argv, cwd=tmp_path,
                         env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert _visible(out + err), out + err
    if code != 0:
        assert "gmp: error:" in err, err
