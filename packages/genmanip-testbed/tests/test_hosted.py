"""The online-service and leaderboard emulations, over HTTP and HTTPS (trustme CA)."""

from __future__ import annotations

import io
import json
import ssl
import uuid
import zipfile
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import pytest
import trustme
from _tbhelpers import Raw, poll_reset
from genmanip_testbed import serve_testbed

pytestmark = pytest.mark.timeout(120)

ONLINE = "/api/v1/benchmark/onlineEvaluation"


def _post(url: str, obj: Any, token: str | None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = Request(url, data=json.dumps(obj).encode(), headers=headers, method="POST")
    try:
        with urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except HTTPError as e:
        return e.code, json.loads(e.read())


def test_online_service_flow() -> None:
    with serve_testbed(tasks=("testbed/smoke",), token="tok", online_ready_after=2) as tb:
        base = tb.url
        assert _post(f"{base}{ONLINE}/createTask", {"model_name": "m"}, None)[0] == 401
        assert _post(f"{base}{ONLINE}/createTask", {"model_name": "m"}, "bad")[0] == 401
        st, body = _post(f"{base}{ONLINE}/createTask", {}, "tok")
        assert st == 200 and body["code"] != 0 and "model_name" in body["msg"]
        st, body = _post(
            f"{base}{ONLINE}/createTask",
            {"model_name": "m", "benchmark_set": "testbed/nope"},
            "tok",
        )
        assert body["code"] != 0 and "benchmark_set" in body["msg"]
        st, body = _post(
            f"{base}{ONLINE}/createTask", {"model_name": "m", "model_type": "vla"}, "tok"
        )
        assert st == 200 and body["code"] == 0 and body["msg"]
        task_id = body["data"]["task_id"]
        assert _post(f"{base}{ONLINE}/ready", {"task_id": "nope"}, "tok")[1]["code"] != 0
        assert _post(f"{base}{ONLINE}/ready", {}, "tok")[1]["code"] != 0
        for left in (2, 1):
            st, body = _post(f"{base}{ONLINE}/ready", {"task_id": task_id}, "tok")
            assert body["code"] == 0 and body["data"]["ready"] is False
            assert body["data"]["queue_position"] == left
        st, body = _post(f"{base}{ONLINE}/ready", {"task_id": task_id}, "tok")
        assert body["data"]["ready"] is True
        endpoint = body["data"]["endpoint"]
        assert endpoint == f"{base}/online/{task_id}"
        # The endpoint is an evaluation server whose run id is the task id.
        raw = Raw(endpoint, "tok")
        path = "/online/" + task_id
        st, status = raw.get_json(f"{path}/status?run_id={task_id}")
        assert status["data"]["run_id"] == task_id and status["data"]["benchmark_id"] == "testbed"
        raw.pickle_post(f"{path}/reset", {"worker_ids": ["0"]})
        first = poll_reset(raw, ["0"], path=path)["0"]
        assert first["obs"]["episode_id"] == f"testbed/{task_id}/testbed/smoke/red_block_easy/000"
        assert raw.get_json("/online/unknown/status")[0] == 404
        st, body = raw.get_json(f"{path}/stop?run_id=other")
        assert body["code"] != 0
        st, _, data = raw.request("POST", f"{path}/stop?run_id={task_id}")
        body = json.loads(data)
        assert st == 200 and body["code"] == 0 and body["data"]["stopped"] is True
        assert raw.get_json(f"{path}/status")[1]["data"]["active_workers"] == []
        raw.close()
        # The main server's job is untouched.
        assert tb.core.run_id != task_id


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_and_cert_chain_pem.write_to_path(str(d / "server.pem"))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    return {"cert": d / "server.pem", "ca": d / "ca.pem"}


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _multipart(fields: dict[str, str], file_bytes: bytes | None) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = []
    for k, v in fields.items():
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        )
    if file_bytes is not None:
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="results_r.zip"\r\n'
            f"Content-Type: application/zip\r\n\r\n".encode()
            + file_bytes
            + b"\r\n"
        )
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def _upload(
    url: str, ctx: ssl.SSLContext, fields: dict[str, str], data: bytes | None
) -> tuple[int, Any]:
    body, ctype = _multipart(fields, data)
    req = Request(f"{url}/api/upload", data=body, headers={"Content-Type": ctype}, method="POST")
    try:
        with urlopen(req, timeout=30, context=ctx) as r:
            return r.status, json.loads(r.read())
    except HTTPError as e:
        return e.code, json.loads(e.read())


def test_leaderboard_over_https(tls: dict[str, Any], tmp_path: Path) -> None:
    ctx = ssl.create_default_context(cafile=str(tls["ca"]))
    fields = {
        "submission_name": "sub",
        "leaderboard_name": "ebench",
        "author_token": "author",
        "submission_infos": json.dumps({"submission_name": "sub", "leaderboard_name": "ebench"}),
    }
    good = _zip({"result.json": b"{}", "testbed/smoke/red_block_easy/000/result_info.json": b"{}"})
    with serve_testbed(
        job=False,
        leaderboard_token="author",
        ssl_certfile=tls["cert"],
        ssl_keyfile=tls["cert"],
        max_upload_bytes=64 * 1024,
        data_dir=tmp_path / "data",
    ) as tb:
        assert tb.url.startswith("https://127.0.0.1:")
        # Verification is real: the default trust store rejects the throwaway CA.
        with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
            urlopen(f"{tb.url}/docs", timeout=10, context=ssl.create_default_context())
        st, body = _upload(tb.url, ctx, fields, good)
        assert st == 200 and body["status"] == "success"
        sid = body["submission_id"]
        stored = tmp_path / "data" / "leaderboard" / sid / "bundle.zip"
        assert stored.read_bytes() == good
        with urlopen(f"{tb.url}/upload_status/{sid}", context=ctx) as r:
            status = json.loads(r.read())
        assert status["submission_id"] == sid and status["status"] == "processing"
        with urlopen(f"{tb.url}/upload_status/{sid}", context=ctx) as r:
            assert json.loads(r.read())["status"] == "completed"
        with pytest.raises(HTTPError) as ei:
            urlopen(f"{tb.url}/upload_status/nope", context=ctx)
        assert ei.value.code == 404

        assert _upload(tb.url, ctx, {**fields, "author_token": "wrong"}, good) == (
            401,
            {"error": "invalid author_token"},
        )
        st, body = _upload(tb.url, ctx, fields, _zip({"../evil.txt": b"x"}))
        assert st == 400 and "unsafe member path" in body["error"]
        st, body = _upload(tb.url, ctx, fields, _zip({"/abs.txt": b"x"}))
        assert st == 400 and "unsafe member path" in body["error"]
        st, body = _upload(tb.url, ctx, fields, b"not a zip")
        assert st == 400 and "zip" in body["error"]
        st, body = _upload(tb.url, ctx, fields, _zip({"big.bin": bytes(100 * 1024)}))
        assert st == 413 and "too large" in body["error"]
        st, body = _upload(
            tb.url, ctx, {k: v for k, v in fields.items() if k != "leaderboard_name"}, good
        )
        assert st == 400 and body["error"] == "missing field: leaderboard_name"
        st, body = _upload(tb.url, ctx, fields, None)
        assert st == 400 and "file" in body["error"]
        assert (
            len(list((tmp_path / "data" / "leaderboard").iterdir())) == 1
        )  # only the accepted one


def _patched(data: bytes, *, local: dict[int, bytes], central: dict[int, bytes]) -> bytes:
    """``data`` (a one-member zip) with bytes replaced at offsets of its local file header and
    of its central directory entry."""
    buf = bytearray(data)
    lh, cd = buf.index(b"PK\x03\x04"), buf.index(b"PK\x01\x02")
    for base, edits in ((lh, local), (cd, central)):
        for off, new in edits.items():
            buf[base + off : base + off + len(new)] = new
    return bytes(buf)


def _stored(name: str, data: bytes, **attrs: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
        for k, v in attrs.items():
            setattr(info, k, v)
        zf.writestr(info, data)
    return buf.getvalue()


def _hostile_zips() -> list[tuple[str, bytes, int, str]]:
    """(case, zip bytes, expected status, expected text in the error)."""
    one = _stored("result.json", b'{"score": 1.0}')
    crc_off = one.index(b'{"score"')
    bad_crc = one[:crc_off] + b"[" + one[crc_off + 1 :]
    two = io.BytesIO()
    with zipfile.ZipFile(two, "w") as zf:
        zf.writestr("a.json", b"{}")
        with pytest.warns(UserWarning, match="Duplicate name"):
            zf.writestr("a.json", b"[]")
    huge = (0xFFFFFFFF).to_bytes(4, "little")
    return [
        ("bad CRC-32", bad_crc, 400, "bad CRC-32"),
        ("encrypted member", _patched(one, local={6: b"\x01\x00"}, central={8: b"\x01\x00"}),
         400, "encrypted"),
        ("compression method 99", _patched(one, local={8: b"\x63\x00"}, central={10: b"\x63\x00"}),
         400, "unknown compression method 99"),
        ("declares 4 GiB", _patched(one, local={22: huge}, central={24: huge}), 413,
         "declares 4294967295 uncompressed bytes"),
        ("NUL-truncated name",  # zipfile would read it as "a"
         _stored("a#../../evil.json", b"x").replace(b"a#../", b"a\x00../"), 400,
         "unsafe member path in zip"),
        ("duplicate names", two.getvalue(), 400, "duplicate member name"),
        ("symlink member", _stored("link", b"/etc/passwd", external_attr=(0o120777 << 16)), 400,
         "symlink"),
        ("control character", _stored("a\x1b[2J.json", b"{}"), 400, "unsafe member path in zip"),
        ("truncated zip", one[: len(one) - 30], 400, "invalid zip"),
    ]  # fmt: skip


def test_leaderboard_refuses_hostile_zips_with_typed_errors(
    tls: dict[str, Any], tmp_path: Path
) -> None:
    """Every hostile zip is one 4xx with an error naming the problem, never a 500, never stored:
    the uploads are checked by the leaderboard client's own verifier (structure first, then every
    member's data)."""
    ctx = ssl.create_default_context(cafile=str(tls["ca"]))
    fields = {"submission_name": "sub", "leaderboard_name": "ebench", "author_token": "author"}
    with serve_testbed(
        job=False,
        leaderboard_token="author",
        ssl_certfile=tls["cert"],
        ssl_keyfile=tls["cert"],
        max_upload_bytes=64 * 1024,
        data_dir=tmp_path / "data",
    ) as tb:
        results = {
            case: (_upload(tb.url, ctx, fields, data), status, text)
            for case, data, status, text in _hostile_zips()
        }
        good = _upload(tb.url, ctx, fields, _zip({"result.json": b"{}"}))
    wrong = {
        case: got for case, (got, status, text) in results.items()
        if got[0] != status or text not in got[1].get("error", "")
    }  # fmt: skip
    assert wrong == {}, wrong
    assert good[0] == 200 and good[1]["status"] == "success"
    stored = list((tmp_path / "data" / "leaderboard").iterdir())
    assert len(stored) == 1  # only the good one
