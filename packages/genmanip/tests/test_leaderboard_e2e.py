"""A server-layout run written by the testbed (``save_process=True``), evaluated with ``gmp eval``,
bundled and submitted with ``gmp leaderboard`` to the testbed's leaderboard emulation."""

from __future__ import annotations

import json
import zipfile

import pytest
from genmanip.cli.main import main
from genmanip_protocol.errors import ExitCode
from genmanip_testbed import serve_testbed

pytestmark = pytest.mark.slow

AUTHOR = "e2e-author-token-778899"


def test_server_layout_run_bundle_and_submit(tmp_path, monkeypatch, capsys):
    cfg = tmp_path / "config.toml"
    cfg.write_text("", encoding="utf-8")
    monkeypatch.setenv("GMP_CONFIG", str(cfg))
    monkeypatch.setenv("USER_TOKEN", AUTHOR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for k in ("LEADERBOARD_HOST", "LEADERBOARD_PORT", "GENMANIP_RESULT_DIR", "GMP_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    project = tmp_path / "project"
    with serve_testbed(tasks="testbed/smoke", save_process=True, results_root=project, run_id="srv-run",
                       leaderboard_token=AUTHOR, data_dir=tmp_path / "lb") as tb:
        assert main(["eval", "--url", tb.url, "--policy", "expert", "--no-record"]) == 0
        run_dir = project / "saved" / "eval_results" / "testbed" / "srv-run"
        assert sorted(p.name for p in run_dir.glob("testbed/smoke/*/*/result_info.json"))
        capsys.readouterr()

        # Incomplete? No: the job is done. Bundle without and with videos.
        assert main(["leaderboard", "bundle", "srv-run", "--root", str(project)]) == 0
        path = capsys.readouterr().out.strip()
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            manifest = json.loads(zf.read("manifest.json"))
        assert not any(n.endswith(".mp4") for n in names)
        assert any(n.endswith("meta_record.pkl") for n in names)
        assert manifest["layout"] == "server" and manifest["complete"] is True
        assert manifest["counts"]["episodes_expected"] == manifest["counts"]["episodes_complete"] == 2
        assert path.startswith(str(tmp_path / "cache"))

        rc = main(["leaderboard", "submit", "--root", str(project), "--run-id", "srv-run", "-n", "exp",
                   "-l", "tb", "--host", "127.0.0.1", "--port", str(tb.port), "--insecure-http",
                   "--include-videos"])
        out = capsys.readouterr()
        assert rc == 0, out.err
        sid = json.loads(out.out)["submission_id"]
        with zipfile.ZipFile(tb.server.hosted.submissions_dir() / sid / "bundle.zip") as zf:
            assert any(n.endswith(".mp4") for n in zf.namelist())
        rc = main(["leaderboard", "submit", "--root", str(project), "--run-id", "srv-run", "-n", "exp",
                   "-l", "tb", "--host", "127.0.0.1", "--port", str(tb.port), "--insecure-http",
                   "--include-videos"])
        assert rc == ExitCode.NOTHING_TO_DO
        assert AUTHOR not in "".join(capsys.readouterr())
