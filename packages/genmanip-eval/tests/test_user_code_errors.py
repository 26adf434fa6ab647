"""The user's code fails: ``PolicyCodeError`` names the call, the exception and the user's
``file:line`` (:func:`genmanip_eval.policy.user_frame`), with the ``-v`` hint; exit FAILURE."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from genmanip_eval.errors import PolicyCodeError, PolicyError
from genmanip_eval.inference import BatchItem, Inference
from genmanip_eval.policy import USER_CODE_HINT, PolicyHandle, load_policy_factory, user_frame
from genmanip_protocol.errors import ExitCode

SOURCE = textwrap.dedent(
    """\
    import json


    def helper(text):
        return json.loads(text)  # MARK-helper


    class P:
        def get_action(self, obs):
            return helper("{bad")  # MARK-get-action

        def get_action_chunk(self, obs):
            raise KeyError("state.joints")  # MARK-chunk


    class B:
        def get_actions(self, batch):
            raise RuntimeError("cuda out of memory")  # MARK-batched


    def make(scale="1"):
        return P() if float(scale) else None  # MARK-float


    def make_batched():
        return B()
    """
)


def _line(mark: str) -> int:
    return next(i for i, line in enumerate(SOURCE.splitlines(), 1) if f"# {mark}" in line)


@pytest.fixture
def usermod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    (tmp_path / "user_policy_19.py").write_text(SOURCE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)  # paths under the working directory are shown relative
    sys.modules.pop("user_policy_19", None)
    yield importlib.import_module("user_policy_19")
    sys.modules.pop("user_policy_19", None)


def test_the_innermost_user_frame_skips_the_stdlib(usermod: Any) -> None:
    with pytest.raises(ValueError) as ei:
        usermod.P().get_action({})
    # json.loads raised inside the stdlib: the user's frame is the helper's call of it.
    assert user_frame(ei.value) == f"user_policy_19.py:{_line('MARK-helper')}"
    assert user_frame(ei.value, module="user_policy_19") == f"user_policy_19.py:{_line('MARK-helper')}"


def test_gmp_frames_are_not_the_users() -> None:
    import inspect

    line = inspect.currentframe().f_lineno + 2  # type: ignore[union-attr]
    with pytest.raises(PolicyError) as ei:
        load_policy_factory("json:nope")  # raised in genmanip_eval.policy, called from here
    where = user_frame(ei.value)
    assert where is not None and where.endswith(f"test_user_code_errors.py:{line}"), where
    # Without this test's frame only gmp's remain: no user frame at all.
    tb = ei.value.__traceback__
    assert tb is not None and tb.tb_next is not None
    assert user_frame(ei.value.with_traceback(tb.tb_next)) is None


def test_per_worker_policy_exception(usermod: Any) -> None:
    h = PolicyHandle(usermod.P(), name="user_policy_19:make")
    with pytest.raises(PolicyCodeError) as ei:
        h.action({})
    e = ei.value
    assert str(e) == (
        "user_policy_19:make: get_action(obs) raised JSONDecodeError: Expecting property name "
        f"enclosed in double quotes: line 1 column 2 (char 1) (at user_policy_19.py:{_line('MARK-helper')})"
    )
    assert e.where == f"user_policy_19.py:{_line('MARK-helper')}"
    assert e.hint == USER_CODE_HINT == ("the error is in your policy's code, not in gmp: run with -v "
                                        "for the traceback")
    assert e.exit_code == ExitCode.FAILURE and isinstance(e, PolicyError)
    with pytest.raises(PolicyCodeError) as ei:
        h.chunk({})
    assert str(ei.value) == (f"user_policy_19:make: get_action_chunk(obs) raised KeyError: 'state.joints' "
                             f"(at user_policy_19.py:{_line('MARK-chunk')})")


def test_inference_wraps_batched_and_per_worker_calls(usermod: Any) -> None:
    inf = Inference.create("user_policy_19:make_batched")
    with pytest.raises(PolicyCodeError) as ei:
        inf.actions([BatchItem("0", "e", {}, True)])
    assert str(ei.value) == ("user_policy_19:make_batched: get_actions(batch) raised RuntimeError: cuda out of "
                             f"memory (at user_policy_19.py:{_line('MARK-batched')})")
    assert ei.value.exit_code == ExitCode.FAILURE and ei.value.hint == USER_CODE_HINT
    inf = Inference.create("user_policy_19:make")
    with pytest.raises(PolicyCodeError) as ei:
        inf.actions([BatchItem("0", "e", {}, True)])
    assert ei.value.where == f"user_policy_19.py:{_line('MARK-helper')}"


def test_factory_failures(usermod: Any) -> None:
    with pytest.raises(PolicyCodeError) as ei:
        PolicyHandle.create("user_policy_19:make", {"scale": "abc"})
    assert str(ei.value) == (
        "--policy 'user_policy_19:make': the factory user_policy_19:make(scale='abc') rejected its "
        f"arguments: ValueError: could not convert string to float: 'abc' (at user_policy_19.py:{_line('MARK-float')})"
    )
    assert ei.value.exit_code == ExitCode.FAILURE
    # A signature mismatch is a usage error with a did-you-mean, not the user's code failing.
    with pytest.raises(PolicyError) as ei2:
        PolicyHandle.create("user_policy_19:make", {"scal": "1"})
    assert not isinstance(ei2.value, PolicyCodeError) and ei2.value.exit_code == ExitCode.USAGE
    assert ei2.value.hint == "did you mean --policy-arg scale=...? (it takes: scale)"


def test_factory_name_typo(usermod: Any) -> None:
    with pytest.raises(PolicyError) as ei:
        load_policy_factory("user_policy_19:mak")
    assert str(ei.value) == "--policy 'user_policy_19:mak': user_policy_19 has no attribute 'mak'; did you mean 'make'?"
    assert ei.value.hint == "--policy user_policy_19:make" and ei.value.exit_code == ExitCode.USAGE
