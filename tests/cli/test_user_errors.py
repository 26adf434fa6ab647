"""Issue 19 §1: when the user's code or input is wrong, ``gmp`` says so, names the place, and
suggests the fix; never "internal error ... a bug in gmp" (exit 70).

Real ``gmp eval`` processes against a real testbed, with a policy module written by the test
(imported from the working directory, as a model repo's module is).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from genmanip_protocol.errors import ExitCode
from genmanip_testbed import serve_testbed

pytestmark = pytest.mark.slow

POLICY = textwrap.dedent(
    """\
    import json


    def _load(path):
        with open(path, "rb") as f:  # MARK-open
            return f.read()


    class Pol:
        def __init__(self, wiggle):
            self.wiggle = wiggle

        def get_action(self, obs):
            raise RuntimeError("boom in get_action")  # MARK-get-action


    def make(wiggle="0.0", ckpt=None):
        if ckpt is not None:
            _load(ckpt)
        return Pol(float(wiggle))  # MARK-float


    def make_json(**kw):
        return json.loads("{not json")  # MARK-json


    class Typo:
        def get_action(self, obs):
            return {"actoin": [0.0] * 16, "control_type": "joint_position"}


    def make_typo(**kw):
        return Typo()
    """
)
USER_HINT = "hint: the error is in your policy's code, not in gmp: run with -v for the traceback"


def _line(mark: str) -> int:
    return next(i for i, line in enumerate(POLICY.splitlines(), 1) if f"# {mark}" in line)


@pytest.fixture(scope="module")
def testbed() -> Iterator[str]:
    with serve_testbed(tasks="testbed/smoke") as tb:
        yield tb.url


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "mypol.py").write_text(POLICY, encoding="utf-8")
    return tmp_path


def gmp_eval(url: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GMP_TOKEN", "PYTHONPATH")}
    env.update(NO_COLOR="1", PYTHONPATH=str(cwd))
    return subprocess.run(
        [sys.executable, "-m", "genmanip", "eval", "--url", url, "--no-record", "--max-episodes", "1",
         *args],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        check=False,
    )


def _no_bug_report(p: subprocess.CompletedProcess[str]) -> None:
    assert "internal error" not in p.stderr and "bug in gmp" not in p.stderr, p.stderr


def test_factory_value_error_is_the_users(testbed: str, workdir: Path) -> None:
    p = gmp_eval(testbed, workdir, "--policy", "mypol:make", "--policy-arg", "wiggle=abc")
    assert p.returncode == ExitCode.FAILURE, p.stderr
    assert (
        "gmp: error: --policy 'mypol:make': the factory mypol:make(wiggle='abc') rejected its "
        f"arguments: ValueError: could not convert string to float: 'abc' (at mypol.py:{_line('MARK-float')})"
    ) in p.stderr
    assert USER_HINT in p.stderr
    _no_bug_report(p)


def test_factory_missing_checkpoint_names_the_users_line(testbed: str, workdir: Path) -> None:
    p = gmp_eval(testbed, workdir, "--policy", "mypol:make", "--policy-arg", "ckpt=/no/such.pt")
    assert p.returncode == ExitCode.FAILURE, p.stderr
    # The innermost frame in the user's code: open() in _load, not the factory's call of it.
    assert (
        "gmp: error: --policy 'mypol:make': the factory mypol:make(ckpt='/no/such.pt') raised "
        "FileNotFoundError: [Errno 2] No such file or directory: '/no/such.pt' "
        f"(at mypol.py:{_line('MARK-open')})"
    ) in p.stderr
    assert USER_HINT in p.stderr
    _no_bug_report(p)


def test_stdlib_frames_are_not_the_users(testbed: str, workdir: Path) -> None:
    p = gmp_eval(testbed, workdir, "--policy", "mypol:make_json")
    assert p.returncode == ExitCode.FAILURE, p.stderr
    assert "raised JSONDecodeError: Expecting property name enclosed in double quotes" in p.stderr
    assert f"(at mypol.py:{_line('MARK-json')})" in p.stderr  # not json/decoder.py
    _no_bug_report(p)


def test_policy_exception_during_an_episode(testbed: str, workdir: Path) -> None:
    p = gmp_eval(testbed, workdir, "--policy", "mypol:make")
    assert p.returncode == ExitCode.FAILURE, p.stderr
    assert (
        "gmp: error: mypol:make: get_action(obs) raised RuntimeError: boom in get_action "
        f"(at mypol.py:{_line('MARK-get-action')})"
    ) in p.stderr
    assert USER_HINT in p.stderr
    # -v shows the traceback, ending in the user's line.
    p = gmp_eval(testbed, workdir, "-v", "--policy", "mypol:make")
    assert p.returncode == ExitCode.FAILURE
    assert "Traceback (most recent call last)" in p.stderr
    assert f'mypol.py", line {_line("MARK-get-action")}, in get_action' in p.stderr


def test_factory_name_typo_did_you_mean(testbed: str, workdir: Path) -> None:
    p = gmp_eval(testbed, workdir, "--policy", "mypol:mak")
    assert p.returncode == ExitCode.USAGE, p.stderr
    assert "gmp: error: --policy 'mypol:mak': mypol has no attribute 'mak'; did you mean 'make'?" in p.stderr
    assert "hint: --policy mypol:make" in p.stderr


def test_policy_arg_name_typo_did_you_mean(testbed: str, workdir: Path) -> None:
    p = gmp_eval(testbed, workdir, "--policy", "mypol:make", "--policy-arg", "wigle=1")
    assert p.returncode == ExitCode.USAGE, p.stderr
    assert ("gmp: error: --policy 'mypol:make': the factory rejected its arguments: make() got an "
            "unexpected keyword argument 'wigle'") in p.stderr
    assert "hint: did you mean --policy-arg wiggle=...? (it takes: wiggle, ckpt)" in p.stderr


def test_action_key_typo_says_action_is_missing(testbed: str, workdir: Path) -> None:
    p = gmp_eval(testbed, workdir, "--policy", "mypol:make_typo")
    assert p.returncode == ExitCode.INVALID_INPUT, p.stderr
    assert ("action: expected a required key, got missing (is 'actoin' a typo of it?) "
            "(and 1 more: actoin)") in p.stderr
