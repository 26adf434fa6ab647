from __future__ import annotations

import json
import random

import pytest
from genmanip_online import (
    CREATE_PATH,
    READY_PATH,
    InsecureURLError,
    OnlineAuthError,
    OnlineClient,
    OnlineDeadlineError,
    OnlineHTTPError,
    OnlineReplyError,
    OnlineServiceError,
    OnlineTimeout,
    OnlineUnreachable,
    check_url,
    stop_candidates,
)
from genmanip_protocol.errors import ExitCode, ValidationError
from genmanip_runtime.errors import InsecureTransportError

TOKEN = "s3cret-online-token-XYZ"


def client(url: str, **kw) -> OnlineClient:
    return OnlineClient(url, TOKEN, **kw)


def test_create_sends_only_set_fields_and_bearer(scripted, env):
    scripted.routes[CREATE_PATH] = env({"task_id": "t-1"})
    with client(scripted.url) as c:
        assert c.create_task(model_name="m", benchmark_set="ebench", model_type=None) == "t-1"
    req = scripted.requests[-1]
    assert req["method"] == "POST"
    assert json.loads(req["body"]) == {"model_name": "m", "benchmark_set": "ebench"}
    assert req["headers"]["Authorization"] == f"Bearer {TOKEN}"
    assert req["headers"]["Content-Type"] == "application/json"


def test_base_url_path_prefix_kept(scripted, env):
    scripted.routes["/prefix" + READY_PATH] = env({"ready": False})
    with client(scripted.url + "/prefix/") as c:
        assert c.ready("t").ready is False


def test_service_code_nonzero_is_typed_with_message(scripted, env):
    scripted.routes[CREATE_PATH] = env(None, code=4001, msg="quota exceeded for user")
    with client(scripted.url) as c, pytest.raises(OnlineServiceError) as ei:
        c.create_task(model_name="m")
    e = ei.value
    assert e.code == 4001 and e.msg == "quota exceeded for user"
    assert str(e) == "online service createTask: error code 4001: quota exceeded for user"
    assert e.exit_code == ExitCode.REMOTE_ERROR


def test_non_json_reply_is_an_error_not_silent(scripted):
    scripted.routes[READY_PATH] = (200, b"<html>gateway</html>", "text/html")
    with client(scripted.url) as c, pytest.raises(OnlineReplyError) as ei:
        c.ready("t")
    assert "not JSON" in str(ei.value) and "text/html" in str(ei.value) and "gateway" in str(ei.value)
    assert ei.value.field == "body"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({}, "data.ready"),
        ({"ready": "yes"}, "data.ready"),
        ({"ready": True}, "data.endpoint"),
        ({"ready": True, "endpoint": "ftp://x"}, "data.endpoint"),
    ],
)
def test_malformed_ready_names_the_field(scripted, data, field, env):
    scripted.routes[READY_PATH] = env(data)
    with client(scripted.url) as c, pytest.raises(OnlineReplyError) as ei:
        c.ready("t")
    assert ei.value.field == field and field in str(ei.value)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"[1, 2]", "body"),
        (b'{"msg": "no code"}', "code"),
        (b'{"code": 0, "data": [1]}', "data"),
        (b'{"code": 0, "data": {}}', "data.task_id"),
        (b'{"code": 0, "data": {"task_id": "../../etc"}}', "data.task_id"),
        (b'{"code": 0, "data": {"task_id": ""}}', "data.task_id"),
    ],
)
def test_malformed_create_names_the_field(scripted, body, field):
    scripted.routes[CREATE_PATH] = (200, body, "application/json")
    with client(scripted.url) as c, pytest.raises(OnlineReplyError) as ei:
        c.create_task()
    assert ei.value.field == field


def test_http_error_auth_and_token_redacted(scripted):
    # A service that echoes the token back must not get it into our messages.
    scripted.routes[READY_PATH] = (401, json.dumps({"msg": f"bad token {TOKEN}"}).encode(), "application/json")
    with client(scripted.url) as c, pytest.raises(OnlineAuthError) as ei:
        c.ready("t")
    assert ei.value.exit_code == ExitCode.AUTH and ei.value.status == 401
    assert TOKEN not in str(ei.value) and "***" in str(ei.value)
    scripted.routes[READY_PATH] = (502, b"upstream down", "text/plain")
    with client(scripted.url) as c, pytest.raises(OnlineHTTPError) as ei2:
        c.ready("t")
    assert str(ei2.value) == "online service ready: HTTP 502: upstream down"
    assert not isinstance(ei2.value, OnlineAuthError)


def test_timeout_and_unreachable_are_distinct(scripted, env):
    scripted.routes[READY_PATH] = env({"ready": False})
    scripted.delay[READY_PATH] = 1.0
    with client(scripted.url, timeout=0.2) as c, pytest.raises(OnlineTimeout) as ei:
        c.ready("t")
    assert "no reply within 0.2 s" in str(ei.value) and ei.value.exit_code == ExitCode.TIMEOUT
    with client("http://127.0.0.1:9", timeout=2) as c, pytest.raises(OnlineUnreachable) as ei2:
        c.ready("t")
    assert "cannot reach" in str(ei2.value) and ei2.value.exit_code == ExitCode.UNREACHABLE


def test_ready_parses_queue_and_eta(scripted, env):
    scripted.routes[READY_PATH] = env({"ready": False, "queue_position": 3, "eta_s": 42.5,
                                            "status": "queued"})
    with client(scripted.url) as c:
        st = c.ready("t")
    assert (st.ready, st.queue_position, st.eta_s, st.status, st.endpoint) == (False, 3, 42.5, "queued", None)


def test_wait_ready_backs_off_with_jitter_until_ready(scripted, env):
    not_ready = env({"ready": False, "queue_position": 1})
    scripted.routes[READY_PATH] = [not_ready, (503, b"busy", "text/plain"), not_ready,
                                   env({"ready": True, "endpoint": "http://127.0.0.1:1/online/t/"})]
    events = []
    slept = []
    with client(scripted.url) as c:
        st = c.wait_ready("t", deadline=30, interval=0.02, on_poll=events.append,
                          sleep=slept.append, rng=random.Random(1))
    assert st.ready and st.endpoint == "http://127.0.0.1:1/online/t"
    assert [e.polls for e in events] == [1, 2, 3, 4]
    assert isinstance(events[1].error, OnlineHTTPError) and events[1].status is None
    assert events[0].status.queue_position == 1
    assert len(slept) == 3
    # growing delays (factor 1.5) within +-20% jitter, never identical to the plain schedule
    for i, d in enumerate(slept):
        base = 0.02 * 1.5**i
        assert 0.8 * base <= d <= 1.2 * base
    assert slept != [0.02, 0.03, 0.045]


def test_wait_ready_hits_the_deadline(scripted, env):
    scripted.routes[READY_PATH] = env({"ready": False})
    with client(scripted.url) as c, pytest.raises(OnlineDeadlineError) as ei:
        c.wait_ready("task-9", deadline=1.0, interval=0.05)
    e = ei.value
    assert e.exit_code == ExitCode.TIMEOUT and e.task_id == "task-9" and e.polls >= 3
    assert "task-9" in str(e) and "1 s deadline" in str(e)
    assert "gmp online submit --task-id task-9" in (e.hint or "")


def test_wait_ready_raises_service_errors_at_once(scripted, env):
    scripted.routes[READY_PATH] = env(None, code=404, msg="unknown task")
    with client(scripted.url) as c, pytest.raises(OnlineServiceError):
        c.wait_ready("nope", deadline=10, interval=0.01)
    assert scripted.count(READY_PATH) == 1


def test_wait_ready_rejects_unbounded_values(scripted):
    with client(scripted.url) as c:
        for bad in (0, -1, float("nan")):
            with pytest.raises(ValidationError, match="--deadline"):
                c.wait_ready("t", deadline=bad)
    with pytest.raises(ValidationError, match="--timeout"):
        client(scripted.url, timeout=0)


def test_stop_falls_back_after_404(scripted, env):
    scripted.routes["/prefix/stop"] = env({"stopped": True})
    with client(scripted.url) as c:
        res = c.stop("t-5", scripted.url + "/prefix/api/predict/abc", user_id="u1")
    assert res.url == scripted.url + "/prefix/stop"
    assert res.reply["data"] == {"stopped": True}
    tried = [(r["path"], r["query"]) for r in scripted.requests]
    assert tried == [("/prefix/api/predict/abc/stop", "run_id=t-5&user_id=u1"),
                     ("/prefix/stop", "run_id=t-5&user_id=u1")]


def test_stop_error_envelope_and_all_404(scripted, env):
    scripted.routes["/ep/stop"] = env(None, code=7, msg="not running")
    with client(scripted.url) as c, pytest.raises(OnlineServiceError, match="not running"):
        c.stop("t", scripted.url + "/ep")
    with client(scripted.url) as c, pytest.raises(OnlineHTTPError) as ei:
        c.stop("t", scripted.url + "/missing")
    assert ei.value.status == 404


def test_plain_http_to_remote_host_refused():
    with pytest.raises(InsecureURLError) as ei:
        OnlineClient("http://eval.example.com", TOKEN)
    assert ei.value.exit_code == ExitCode.REFUSED and "--insecure-http" in (ei.value.hint or "")
    assert isinstance(ei.value, InsecureTransportError)
    OnlineClient("http://eval.example.com", TOKEN, insecure_http=True).close()
    OnlineClient("https://eval.example.com", TOKEN).close()
    OnlineClient("http://localhost:1", TOKEN).close()
    OnlineClient("http://[::1]:1", TOKEN).close()


def test_stop_to_plain_http_remote_endpoint_refused(scripted):
    with client(scripted.url) as c, pytest.raises(InsecureURLError):
        c.stop("t", "http://10.1.2.3:8087")


@pytest.mark.parametrize("url", ["ftp://x", "x.example.com", "https://user:pw@x.example.com", "http://"])
def test_bad_urls(url):
    with pytest.raises(ValidationError) as ei:
        check_url(url)
    assert "pw" not in str(ei.value)


def test_stop_candidates():
    assert stop_candidates("https://h/a/b") == ["https://h/a/b/stop"]
    assert stop_candidates("https://h/a/stop/") == ["https://h/a/stop"]
    assert stop_candidates("https://h:9/x/api/predict/abc?q=1") == [
        "https://h:9/x/api/predict/abc/stop", "https://h:9/x/stop"]
    assert stop_candidates("https://h/api/predict/") == ["https://h/api/predict/stop", "https://h/stop"]


def test_repr_hides_token():
    c = OnlineClient("https://x.example.com", TOKEN)
    assert TOKEN not in repr(c)
