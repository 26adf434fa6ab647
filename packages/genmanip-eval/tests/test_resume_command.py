"""The resume command ``gmp eval`` prints after a stop, and ``run.json``'s command line: one owner
(``runner.safe_argv``) decides what of a command line is a secret."""

from __future__ import annotations

import shlex

import pytest
from genmanip_eval import EvalConfig
from genmanip_eval.cli import resume_command
from genmanip_eval.runner import safe_argv

SECRET = "tok-XYZ-never-printed"
OTHER = "second-SECRET-value"


def _argv(*args: str) -> list[str]:
    return ["/usr/bin/gmp", *args]


@pytest.mark.parametrize(
    "given",
    [
        ("--token", SECRET),
        (f"--token={SECRET}",),
        ("--token", SECRET, f"--token={OTHER}"),
    ],
)
def test_the_resume_command_leaves_the_token_out_and_keeps_everything_else(given: tuple[str, ...]) -> None:
    argv = _argv("-v", "eval", "--url", "http://gpu:8087", *given, "--worker-ids", "0,1",
                 "--policy", "mypkg.pol:make", "--policy-arg", "ckpt=last pt", "--run-id", "old",
                 "--transcode", "inline")
    cmd = resume_command(EvalConfig(url="http://gpu:8087"), "r 1", argv)
    assert SECRET not in cmd and OTHER not in cmd and "--token" not in cmd and "***" not in cmd
    assert shlex.split(cmd) == ["gmp", "-v", "eval", "--url", "http://gpu:8087", "--worker-ids", "0,1",
                                "--policy", "mypkg.pol:make", "--policy-arg", "ckpt=last pt",
                                "--transcode", "inline", "--run-id", "r 1"]


def test_the_resume_command_replaces_an_equals_run_id() -> None:
    cmd = resume_command(EvalConfig(), "new", _argv("eval", "--run_id=old", "--token", SECRET))
    assert shlex.split(cmd) == ["gmp", "eval", "--run-id", "new"]


def test_called_as_a_library_the_resume_command_names_the_essential_flags() -> None:
    cfg = EvalConfig(url="http://h:1", worker_ids=["0", "2"], policy="expert", policy_args={"seed": "3"},
                     token=SECRET)
    cmd = resume_command(cfg, "r", ["python", "-c", "--token", SECRET])
    assert SECRET not in cmd
    assert shlex.split(cmd) == ["gmp", "eval", "--url", "http://h:1", "--worker-ids", "0,2", "--policy",
                                "expert", "--policy-arg", "seed=3", "--run-id", "r"]


def test_run_json_masks_the_token_value_but_shows_one_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = _argv("eval", "--token", SECRET, f"--token={OTHER}", "--url", "u")
    assert safe_argv(argv) == ["/usr/bin/gmp", "eval", "--token", "***", "--token=***", "--url", "u"]
    monkeypatch.setattr("sys.argv", argv)
    assert EvalConfig().manifest()["argv"] == safe_argv(argv)
