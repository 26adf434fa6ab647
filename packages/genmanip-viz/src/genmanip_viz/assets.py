"""The Rerun web viewer (HTML + JS + Wasm), taken from the installed rerun-sdk and cached once.

rerun-sdk embeds its web viewer in the native extension and only exposes it through its own small HTTP
server. The first time it is needed we start that server in a child process on a free loopback port,
download the handful of files, patch ``index.html`` (below), store a gzip copy of the ~40 MB Wasm next
to the original, and stop the child. Later runs read the cache directory, keyed by the rerun-sdk
version (a cached ``index.html`` without the current patch is patched again in place).

The viewer works offline and never reaches out: the patch strips the external font links (no CDN)
and, first thing on the page, makes the viewer's own ``fetch`` answer every request to another
origin locally (``503``, nothing sent) instead of letting the browser try it. The viewer calls
rerun.io's telemetry and GitHub's release API from the page; the Content-Security-Policy blocked
those calls, but each blocked call put three errors in the browser console (five calls per episode
page, ``Failed to fetch``), which hid real errors and alarmed users. The viewer reads a failed call
as "offline" and logs it at debug level only; the CSP stays as the second wall.
"""

from __future__ import annotations

import gzip
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from genmanip_results.provenance import ensure_cache_dir

from .errors import ViewerAssetsError, VizDependencyError

__all__ = [
    "VIEWER_FILES",
    "cache_root",
    "ensure_cache_root",
    "ensure_viewer_assets",
    "rerun_version",
]

#: Files of the web viewer that are fetched and served (``index.html`` is patched).
VIEWER_FILES = ("index.html", "re_viewer.js", "re_viewer_bg.wasm", "favicon.ico")

_EXTERNAL_LINK = re.compile(r"<link\b[^>]*https?://[^>]*>\s*", re.IGNORECASE | re.DOTALL)
_HEAD = re.compile(r"<head\b[^>]*>", re.IGNORECASE)
#: Marks an ``index.html`` that carries the current :data:`_OFFLINE_FETCH` (bump when it changes).
_PATCH_MARK = "<!-- gmp viz: offline fetch v1 -->"
#: First script of the viewer page: its requests to other origins get a local answer (see the
#: module docstring). Same-origin, ``data:`` and ``blob:`` requests go through unchanged.
_OFFLINE_FETCH = (
    _PATCH_MARK
    + """<script>
(function () {
  "use strict";
  var realFetch = window.fetch.bind(window);
  window.fetch = function (input, init) {
    var url = null;
    try {
      url = new URL(input instanceof Request ? input.url : String(input), window.location.href);
    } catch (e) {
      return realFetch(input, init);
    }
    var web = url.protocol === "http:" || url.protocol === "https:";
    if (!web || url.origin === window.location.origin) return realFetch(input, init);
    console.debug("gmp viz: the viewer stays offline; not contacting " + url.origin);
    return Promise.resolve(new Response(null, { status: 503, statusText: "offline (gmp viz)" }));
  };
})();
</script>
"""
)
_SERVE_SNIPPET = (
    "import sys, time, rerun as rr\n"
    "rr.serve_web_viewer(web_port=int(sys.argv[1]), open_browser=False)\n"
    "time.sleep(float(sys.argv[2]))\n"
)


def cache_root() -> Path:
    """The user cache directory of genmanip-viz (``$GMP_CACHE_DIR`` or ``$XDG_CACHE_HOME/genmanip``)."""
    env = os.environ.get("GMP_CACHE_DIR")
    if env:
        return Path(env).expanduser() / "viz"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "genmanip" / "viz"


def ensure_cache_root(cache_dir: Path | None = None) -> Path:
    """Create and return ``cache_dir`` (a directory the caller chose), or by default
    :func:`cache_root` inside gmp's cache directory, which is created through
    :func:`genmanip_results.provenance.ensure_cache_dir`: tagged as gmp's when this creates it, so
    that ``gmp clean`` can prove it is gmp's."""
    if cache_dir is not None:
        root = Path(cache_dir)
        root.mkdir(parents=True, exist_ok=True)
        return root
    root = cache_root()
    ensure_cache_dir(root.parent)
    root.mkdir(exist_ok=True)
    return root


def rerun_version() -> str:
    """The installed rerun-sdk version (raises :class:`VizDependencyError` when it is missing)."""
    from importlib import metadata

    try:
        return metadata.version("rerun-sdk")
    except metadata.PackageNotFoundError as exc:
        raise VizDependencyError(
            "the Rerun web viewer needs rerun-sdk 0.41", hint="pip install 'genmanip-viz'"
        ) from exc


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fetch(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback URL built here
        return bytes(resp.read())


def _patch_index(html: str) -> str:
    """The viewer page as served: no external links, the offline ``fetch`` first (idempotent)."""
    # Drop the Google Fonts links: offline use, no third-party requests from the viewer page.
    html = _EXTERNAL_LINK.sub("", html)
    if _PATCH_MARK in html:
        return html
    head = _HEAD.search(html)
    # Before every script of the page, so the viewer only ever sees the patched fetch.
    at = head.end() if head is not None else 0
    return html[:at] + "\n" + _OFFLINE_FETCH + html[at:]


def _ensure_patched(index: Path) -> None:
    """Patch a cached ``index.html`` made before the current patch (atomically, in place)."""
    html = index.read_text(encoding="utf-8")
    patched = _patch_index(html)
    if patched != html:
        from genmanip_runtime.atomic import atomic_write_text

        atomic_write_text(index, patched)


def _extract(dest: Path, timeout: float) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE_SNIPPET, str(port), str(timeout + 5)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "RERUN_ANALYTICS": "0"},
    )
    try:
        base = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + timeout
        index = b""
        while True:
            try:
                index = _fetch(base + "index.html", timeout=5)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace")
                    raise ViewerAssetsError(
                        "could not start rerun-sdk's web viewer server to extract the viewer files"
                        + (f": {err.strip()[-500:]}" if err.strip() else ""),
                        hint="check that rerun-sdk 0.41 is installed and importable",
                    ) from None
                time.sleep(0.1)
        tmp = dest.with_name(dest.name + f".tmp-{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "index.html").write_text(_patch_index(index.decode("utf-8")), encoding="utf-8")
        for name in VIEWER_FILES[1:]:
            (tmp / name).write_bytes(_fetch(base + name, timeout=60))
        wasm = (tmp / "re_viewer_bg.wasm").read_bytes()
        (tmp / "re_viewer_bg.wasm.gz").write_bytes(gzip.compress(wasm, compresslevel=6, mtime=0))
        try:
            tmp.rename(dest)
        except OSError:
            # Another process extracted concurrently; keep theirs.
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
            if not (dest / "index.html").is_file():
                raise
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


def ensure_viewer_assets(*, cache_dir: Path | None = None, timeout: float = 60.0) -> Path:
    """Return a directory holding :data:`VIEWER_FILES` (+ ``re_viewer_bg.wasm.gz``), extracting once.

    ``cache_dir`` defaults to :func:`cache_root`. Raises :class:`ViewerAssetsError` when rerun-sdk's
    viewer server cannot be started or does not deliver the files within ``timeout`` seconds.
    """
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    dest = root / f"rerun-web-{rerun_version()}"
    if all((dest / n).is_file() for n in (*VIEWER_FILES, "re_viewer_bg.wasm.gz")):
        _ensure_patched(dest / "index.html")
        return dest
    ensure_cache_root(cache_dir)
    if dest.exists():
        import shutil

        shutil.rmtree(dest)
    _extract(dest, timeout)
    return dest
