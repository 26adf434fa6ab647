from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from cryptography import x509
from genmanip_results.testing import write_client_run
from genmanip_runtime.console import Console
from genmanip_viz import cli
from genmanip_viz.errors import NoRunError
from genmanip_viz.recording import RRD_NAME, SIDECAR_NAME
from genmanip_viz.server import VizServer
from genmanip_viz.tls import ensure_certificate


@pytest.mark.slow
def test_build_prebuilds_every_complete_episode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_client_run(
        tmp_path, "b", "r", tasks={"t/a": [1.0, 0.0], "t/b": [float("nan")]}, steps=6
    )
    rc = cli.build(run_dir=str(run), jobs=2, console=Console())
    assert rc == 0
    assert (run / "t/a/0" / RRD_NAME).is_file() and (run / "t/a/1" / RRD_NAME).is_file()
    assert not (run / "t/b/0" / RRD_NAME).exists()  # incomplete: not built
    out, err = capsys.readouterr()
    assert out.strip() == str(run.resolve())
    assert "2 recordings built, 0 up to date, 0 failed" in err
    rc = cli.build(run_dir=str(run), jobs=None, console=Console())
    assert rc == 0 and "0 recordings built, 2 up to date" in capsys.readouterr().err


def test_build_reports_failures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_client_run(tmp_path, "b", "r", tasks={"t/a": [1.0, 1.0]}, steps=4)
    (run / "t/a/1/left_camera.mp4").write_bytes(b"garbage")
    rc = cli.build(run_dir=str(run), jobs=1, console=Console())
    assert rc == 1
    err = capsys.readouterr().err
    assert "1 recordings built" in err and "1 failed" in err and "b/r/t/a/1" in err
    assert not (run / "t/a/1" / SIDECAR_NAME).exists()


def test_build_rejects_non_run_dir(tmp_path: Path) -> None:
    with pytest.raises(NoRunError) as ei:
        cli.build(run_dir=str(tmp_path), jobs=1, console=Console())
    assert "RUN_DIR" in str(ei.value)


def test_certificate_covers_names_and_is_reused(tmp_path: Path) -> None:
    cert, key = ensure_certificate("192.168.7.9", cache_dir=tmp_path)
    c = x509.load_pem_x509_certificate(cert.read_bytes())
    san = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = {str(i) for i in san.get_values_for_type(x509.IPAddress)}
    assert {"127.0.0.1", "192.168.7.9"} <= ips
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert c.not_valid_after_utc > dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=300)
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    assert ensure_certificate("192.168.7.9", cache_dir=tmp_path) == (cert, key)
    before = cert.read_bytes()
    ensure_certificate("10.1.2.3", cache_dir=tmp_path)  # new name -> new certificate
    assert cert.read_bytes() != before
    assert ipaddress.ip_address("10.1.2.3") in x509.load_pem_x509_certificate(
        cert.read_bytes()
    ).extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.IPAddress
    )


@pytest.mark.slow
def test_https_with_token_verifies_against_the_generated_cert(
    tmp_path: Path, viz_cache: Path, tree: Path
) -> None:
    with VizServer(
        tree, https=True, token="tok-123", cache_dir=viz_cache, warm=False, tls_dir=tmp_path
    ) as s:
        assert s.url.startswith("https://localhost:") and s.url.endswith("/?access_token=tok-123")
        cert = str(s.cert[0])  # type: ignore[index]
        base = f"https://localhost:{s.port}"
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(base + "/", timeout=30)  # verification stays on: unknown CA
        assert requests.get(base + "/", timeout=30, verify=cert).status_code == 401
        r = requests.get(base + "/?access_token=tok-123", timeout=30, verify=cert)
        assert r.status_code == 200 and "Runs" in r.text
        assert "Secure" in r.history[0].headers["set-cookie"]
        assert r.headers["strict-transport-security"].startswith("max-age=")


@pytest.mark.slow
def test_serve_command_prints_url_and_hint(tree: Path, viz_cache: Path, tmp_path: Path) -> None:
    """``gmp viz`` end to end in a child process: URL on stdout, hints on stderr, Ctrl-C stops it."""
    env = {**os.environ, "GMP_CACHE_DIR": str(viz_cache.parent / "serve-cache"), "NO_COLOR": "1"}
    code = (
        "import sys; from genmanip_runtime.console import Console; from genmanip_viz.cli import serve; "
        f"sys.exit(serve(root={str(tree)!r}, port=0, host='127.0.0.1', https=None, open=False, "
        "console=Console()))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert re.fullmatch(r"http://localhost:\d+/", url), url
        deadline = time.monotonic() + 30
        while True:
            try:
                r = requests.get(url, timeout=10)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert r.status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert "ssh -L" in err and "serving results under" in err


def test_missing_rerun_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib.util

    from genmanip_viz.errors import VizDependencyError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "rerun" else real(name, *a)
    )
    with pytest.raises(VizDependencyError) as ei:
        cli.serve(
            root=str(tmp_path), port=0, host="127.0.0.1", https=None, open=False, console=Console()
        )
    assert ei.value.hint is not None and "rerun-sdk==0.41" in ei.value.hint
    assert int(ei.value.exit_code) == 3
