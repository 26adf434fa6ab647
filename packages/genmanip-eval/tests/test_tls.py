"""An https:// server signed by a private CA: verified with `ca_file`, refused without it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from genmanip_eval import EvalConfig, run_workers
from genmanip_runtime.errors import TransportError
from genmanip_testbed import serve_testbed


@pytest.fixture()
def tls_testbed(tmp_path: Path) -> Iterator[tuple[object, Path]]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    with serve_testbed(
        tasks=("testbed/smoke",),
        num_steps=4,
        results_root=tmp_path / "server",
        ssl_certfile=str(cert_file),
        ssl_keyfile=str(key_file),
    ) as tb:
        yield tb, ca_file


def test_private_ca_verified_with_ca_file(tls_testbed: tuple[object, Path], tmp_path: Path) -> None:
    tb, ca_file = tls_testbed
    url = tb.url.replace("http://", "https://")  # type: ignore[attr-defined]
    summary = run_workers(
        EvalConfig(url=url, ca_file=str(ca_file), record=False, results_dir=str(tmp_path / "c"))
    )
    assert summary.complete and len(summary.episodes) == 2


def test_unknown_ca_is_refused(tls_testbed: tuple[object, Path], tmp_path: Path) -> None:
    tb, _ = tls_testbed
    url = tb.url.replace("http://", "https://")  # type: ignore[attr-defined]
    with pytest.raises(TransportError, match=r"(?i)certificate"):
        run_workers(EvalConfig(url=url, record=False, results_dir=str(tmp_path / "c")))
