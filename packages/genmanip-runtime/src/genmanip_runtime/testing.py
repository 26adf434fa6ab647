"""Test support for packages built on genmanip-runtime (imported by tests, never by gmp itself).

* :func:`isolate_environment`: an environment in which gmp reads no developer config file, cache
  or credential (the config file is an empty one, the XDG directories are under a temporary
  directory, every token and endpoint variable is unset, plus the variables a caller names: a
  package above this one passes its own, e.g. ``genmanip_results.layout.RESULTS_DIR_ENV``).
* :func:`make_tls_files`: a throwaway CA and a server certificate for ``127.0.0.1``/``localhost``
  (needs ``trustme``, a test dependency), for real local HTTPS.
* :func:`silent_server`: a TCP server on 127.0.0.1 that accepts connections and never answers
  (what deadlines and interrupts are tested against).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .config import CONFIG_ENV

__all__ = ["ISOLATED_UNSET", "TLSFiles", "isolate_environment", "make_tls_files", "silent_server"]

#: Variables :func:`isolate_environment` always unsets: tokens, endpoints, the cache location.
ISOLATED_UNSET: tuple[str, ...] = (
    "GMP_TOKEN",
    "GMP_ONLINE_TOKEN",
    "GMP_ONLINE_URL",
    "USER_TOKEN",
    "LEADERBOARD_HOST",
    "LEADERBOARD_PORT",
    "GMP_LEADERBOARD_CA",
    "GMP_CACHE_DIR",
)


class _EnvPatcher(Protocol):
    """What :func:`isolate_environment` needs of pytest's ``monkeypatch``."""

    def setenv(self, name: str, value: str, prepend: str | None = None) -> None: ...

    def delenv(self, name: str, raising: bool = True) -> None: ...


def isolate_environment(
    monkeypatch: _EnvPatcher, tmp_path: Path, *, unset: Iterable[str] = ()
) -> None:
    """Point gmp's config file and XDG directories into ``tmp_path``; unset :data:`ISOLATED_UNSET`
    and ``unset``.

    ``monkeypatch`` is pytest's fixture, so everything is restored after the test.
    """
    cfg = tmp_path / "empty-config.toml"
    cfg.write_text("", encoding="utf-8")
    monkeypatch.setenv(CONFIG_ENV, str(cfg))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for var in (*ISOLATED_UNSET, *unset):
        monkeypatch.delenv(var, raising=False)


@dataclass(frozen=True)
class TLSFiles:
    """PEM files of :func:`make_tls_files`: the CA to trust, the server's chain and its key."""

    ca: Path
    cert: Path
    key: Path


def make_tls_files(directory: Path) -> TLSFiles:
    """Write a throwaway CA (``ca.pem``) and a server certificate for 127.0.0.1 and localhost
    (``server.pem`` with the chain, ``server.key``) into ``directory``."""
    import trustme

    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    files = TLSFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    ca.cert_pem.write_to_path(str(files.ca))
    cert.private_key_and_cert_chain_pem.write_to_path(str(files.cert))
    cert.private_key_pem.write_to_path(str(files.key))
    return files


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """``with silent_server() as url:``: ``http://127.0.0.1:PORT`` of a server that accepts every
    connection, reads nothing and never answers (until the block ends)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=serve, name="gmp-silent-server", daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join(2)
        for c in held:
            c.close()
        srv.close()
