"""Uploads to the testbed's leaderboard emulation over verified HTTPS (and failure modes)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from genmanip_leaderboard import (
    FLAG_NAME,
    IncompleteRunError,
    InsecureLeaderboardURL,
    LeaderboardAuthError,
    LeaderboardClient,
    UploadInterruptedError,
    UploadRejectedError,
    read_flag,
    submit_run,
    verify_bundle,
)
from genmanip_protocol.errors import ExitCode
from genmanip_results.discovery import load_run
from genmanip_runtime.errors import InsecureTransportError
from genmanip_testbed import serve_testbed

TOKEN = "author-token-for-tests-9876"


@pytest.fixture(scope="module")
def board(tls_files, tmp_path_factory):
    data = tmp_path_factory.mktemp("lbdata")
    with serve_testbed(tasks="testbed/smoke", job=False, token="eval-token", leaderboard_token=TOKEN,
                       data_dir=data, ssl_certfile=tls_files.cert, ssl_keyfile=tls_files.key,
                       max_upload_bytes=2_000_000) as tb:
        yield tb


def _client(tb, tls_files, token=TOKEN) -> LeaderboardClient:
    port = urlsplit(tb.url).port
    return LeaderboardClient("127.0.0.1", port, token, ca_file=tls_files.ca)


def _stored(tb) -> list[Path]:
    d = tb.server.hosted.submissions_dir()
    return sorted(d.glob("*/bundle.zip")) if d.exists() else []


def test_submit_uploads_verified_bundle_and_marks_run(board, tls_files, project, server_run):
    run_dir = server_run(project, run_id="happy")
    before = len(_stored(board))
    progress: list[int] = []
    with _client(board, tls_files) as c:
        out = submit_run(load_run(run_dir), c, submission_name="my model", leaderboard_name="ebench-v1",
                         progress=lambda b: progress.append)
        assert out.status == "submitted" and out.submission_id
        stored = _stored(board)
        assert len(stored) == before + 1
        sub_dir = next(p.parent for p in stored if p.parent.name == out.submission_id)
        record = json.loads((sub_dir / "submission.json").read_text())
        assert record["submission_name"] == "my model" and record["leaderboard_name"] == "ebench-v1"
        assert record["submission_infos"] == {"submission_name": "my model", "leaderboard_name": "ebench-v1"}
        assert record["filename"] == "results_happy.zip"
        # The leaderboard holds exactly the bundle we hashed, and it verifies.
        assert hashlib.sha256((sub_dir / "bundle.zip").read_bytes()).hexdigest() == out.bundle_sha256
        assert verify_bundle(sub_dir / "bundle.zip")["content_sha256"] == out.content_sha256
        status = c.status(out.submission_id)
        assert status["submission_id"] == out.submission_id
    assert progress and progress[-1] == progress[-1] and progress == sorted(progress)
    flag = read_flag(run_dir)
    assert flag["submission_id"] == out.submission_id
    assert flag["bundle_sha256"] == out.bundle_sha256 and flag["content_sha256"] == out.content_sha256
    assert flag["submission_name"] == "my model" and flag["leaderboard_name"] == "ebench-v1"
    assert flag["submitted_at"] and flag["history"] == []
    assert TOKEN not in (run_dir / FLAG_NAME).read_text()
    # The temporary bundle is gone and nothing was written into the results tree but the flag.
    assert not list(project.rglob("*.zip"))


def test_second_submit_of_unchanged_run_does_nothing_unless_forced(board, tls_files, project, server_run):
    run_dir = server_run(project, run_id="twice")
    with _client(board, tls_files) as c:
        first = submit_run(load_run(run_dir), c, submission_name="s", leaderboard_name="lb")
        n = len(_stored(board))
        again = submit_run(load_run(run_dir), c, submission_name="s", leaderboard_name="lb")
        assert again.status == "unchanged" and again.submission_id == first.submission_id
        assert len(_stored(board)) == n
        forced = submit_run(load_run(run_dir), c, submission_name="s", leaderboard_name="lb", force=True)
        assert forced.status == "submitted" and forced.submission_id != first.submission_id
        assert len(_stored(board)) == n + 1
        assert read_flag(run_dir)["history"][0]["submission_id"] == first.submission_id
        # A changed run is uploaded again without --force.
        (run_dir / "testbed/reach/red_easy/000/meta_record.pkl").write_bytes(b"\x80\x05K\x01.")
        changed = submit_run(load_run(run_dir), c, submission_name="s", leaderboard_name="lb")
        assert changed.status == "submitted"


def test_bad_token_rejected_and_no_flag(board, tls_files, project, server_run):
    run_dir = server_run(project, run_id="badtoken")
    with _client(board, tls_files, token="not-the-token") as c, pytest.raises(LeaderboardAuthError) as ei:
        submit_run(load_run(run_dir), c, submission_name="s", leaderboard_name="lb")
    assert ei.value.exit_code == ExitCode.AUTH and "invalid author_token" in str(ei.value)
    assert not (run_dir / FLAG_NAME).exists()


def test_oversize_upload_rejected_and_no_flag(board, tls_files, project, server_run):
    run_dir = server_run(project, run_id="big")
    (run_dir / "big.json").write_bytes(os.urandom(3_000_000))
    with _client(board, tls_files) as c, pytest.raises(UploadRejectedError) as ei:
        submit_run(load_run(run_dir), c, submission_name="s", leaderboard_name="lb")
    assert ei.value.status == 413 and "too large" in str(ei.value)
    assert ei.value.exit_code == ExitCode.REMOTE_ERROR
    assert not (run_dir / FLAG_NAME).exists()


def test_incomplete_run_never_uploaded(board, tls_files, project, server_run):
    run_dir = server_run(project, run_id="partial", tasks={"testbed/a/x": 2}, done={"testbed/a/x": [0]})
    n = len(_stored(board))
    with _client(board, tls_files) as c, pytest.raises(IncompleteRunError, match="testbed/a/x/001"):
        submit_run(load_run(run_dir), c, submission_name="s", leaderboard_name="lb")
    assert len(_stored(board)) == n and not (run_dir / FLAG_NAME).exists()


def test_certificate_verification_cannot_be_skipped(board, project, server_run):
    run_dir = server_run(project, run_id="noca")
    port = urlsplit(board.url).port
    with LeaderboardClient("127.0.0.1", port, TOKEN) as c, pytest.raises(UploadInterruptedError) as ei:
        submit_run(load_run(run_dir), c, submission_name="s", leaderboard_name="lb")
    assert "certificate" in str(ei.value).lower() and "--ca-cert" in (ei.value.hint or "")
    assert not (run_dir / FLAG_NAME).exists()


def test_plain_http_only_for_loopback():
    with pytest.raises(InsecureLeaderboardURL) as ei:
        LeaderboardClient("leaderboard.example.org", 443, TOKEN, insecure_http=True)
    assert isinstance(ei.value, InsecureTransportError) and ei.value.exit_code == ExitCode.REFUSED
    assert TOKEN not in str(ei.value) and "leaderboard.example.org" in str(ei.value)
    LeaderboardClient("127.0.0.1", 8000, TOKEN, insecure_http=True).close()


def test_status_of_unknown_submission(board, tls_files):
    with _client(board, tls_files) as c, pytest.raises(UploadRejectedError) as ei:
        c.status("doesnotexist")
    assert ei.value.status == 404 and "unknown submission id" in str(ei.value)


@pytest.fixture
def dropping_server():
    """A server that reads the request headers and ~64 KiB of the body, then resets the connection."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.05)
    seen: list[int] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(10)
            got = 0
            try:
                while got < 64 * 1024:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    got += len(chunk)
            finally:
                seen.append(got)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], seen
    stop.set()
    t.join(5)
    srv.close()


def test_interrupted_upload_leaves_no_flag(dropping_server, project, server_run):
    port, seen = dropping_server
    run_dir = server_run(project, run_id="dropped")
    for i in range(3):  # stored (not deflated) in the zip: 4.5 MB that must all be sent
        (run_dir / f"blob{i}.npz").write_bytes(os.urandom(1_500_000))
    with LeaderboardClient("127.0.0.1", port, TOKEN, insecure_http=True) as c, \
            pytest.raises(UploadInterruptedError) as ei:
        submit_run(load_run(run_dir), c, submission_name="s", leaderboard_name="lb")
    assert seen and seen[0] >= 1
    assert "interrupted" in str(ei.value) and ei.value.exit_code == ExitCode.UNREACHABLE
    assert "failed after" in str(ei.value)  # the connection died in the middle of the body
    assert TOKEN not in str(ei.value)
    assert not (run_dir / FLAG_NAME).exists()
