"""The online client against the testbed's emulation of the online service, over real HTTP(S)."""

from __future__ import annotations

import pytest
from genmanip_online import (
    OnlineAuthError,
    OnlineClient,
    OnlineDeadlineError,
    OnlineServiceError,
    OnlineUnreachable,
)
from genmanip_protocol.errors import ExitCode
from genmanip_testbed import serve_testbed

TOKEN = "online-T0ken-for-tests-123"


@pytest.fixture(scope="module")
def https_testbed(tls_files):
    with serve_testbed(tasks="testbed/smoke", token=TOKEN, job=False,
                       ssl_certfile=tls_files.cert, ssl_keyfile=tls_files.key) as tb:
        yield tb


def test_create_wait_stop_over_verified_https(https_testbed, tls_files):
    url = https_testbed.url
    assert url.startswith("https://")
    events = []
    with OnlineClient(url, TOKEN, ca_file=str(tls_files.ca)) as c:
        tid = c.create_task(model_name="unit-model", benchmark_set="testbed/smoke")
        st = c.wait_ready(tid, deadline=30, interval=0.01, on_poll=events.append)
        assert st.ready and st.endpoint == f"{url}/online/{tid}"
        # The emulation queues a task for two polls and says where it is in the queue.
        assert [e.status.ready for e in events] == [False, False, True]
        assert events[0].status.queue_position == 2 and events[0].status.eta_s == 10
        assert events[0].status.status == "queued"
        res = c.stop(tid, st.endpoint)
    assert res.url == f"{url}/online/{tid}/stop"
    assert res.reply["data"]["stopped"] is True


def test_certificate_verification_is_real(https_testbed):
    with OnlineClient(https_testbed.url, TOKEN) as c, pytest.raises(OnlineUnreachable) as ei:
        c.create_task(model_name="m")
    assert "certificate" in str(ei.value).lower()
    assert ei.value.exit_code == ExitCode.UNREACHABLE


def test_bad_token_and_unknown_task(https_testbed, tls_files):
    with OnlineClient(https_testbed.url, "wrong-token", ca_file=str(tls_files.ca)) as c, \
            pytest.raises(OnlineAuthError) as ei:
        c.create_task(model_name="m")
    assert ei.value.status == 401 and ei.value.exit_code == ExitCode.AUTH
    with OnlineClient(https_testbed.url, TOKEN, ca_file=str(tls_files.ca)) as c:
        with pytest.raises(OnlineServiceError) as ei2:
            c.ready("no-such-task")
        assert ei2.value.code == 40004 and "unknown task_id" in ei2.value.msg
        with pytest.raises(OnlineServiceError, match="missing field: model_name"):
            c.create_task()


def test_never_ready_task_hits_the_deadline(tls_files):
    with serve_testbed(tasks="testbed/smoke", token=TOKEN, job=False, online_ready_after=10**6) as tb, \
            OnlineClient(tb.url, TOKEN) as c:
        tid = c.create_task(model_name="m")
        with pytest.raises(OnlineDeadlineError) as ei:
            c.wait_ready(tid, deadline=1.5, interval=0.05)
    assert ei.value.polls >= 3 and ei.value.task_id == tid
