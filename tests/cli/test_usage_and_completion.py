"""Issue 19 §1 and §6: a mistyped command or flag gets a did-you-mean and the usage of the command
it was meant for; ``gmp --help`` points at documentation that exists; ``gmp completion bash|zsh``
completes what the parser accepts (run in real shells)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from genmanip.cli.parser import build_parser, docs_pointer
from genmanip.completion import completion_tables
from genmanip_protocol.errors import ExitCode


def gmp(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "100"}
    return subprocess.run([sys.executable, "-m", "genmanip", *args], env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)


@pytest.mark.parametrize(
    ("args", "usage", "said"),
    [
        (["evl"], "usage: gmp [-h]", "gmp: error: argument COMMAND: invalid choice: 'evl' (choose from "),
        (["eval", "--work", "3"], "usage: gmp eval [-h]",
         "gmp eval: error: unrecognized arguments: --work 3; did you mean --worker-ids?"),
        (["status", "--jsn"], "usage: gmp status [-h]",
         "gmp status: error: unrecognized arguments: --jsn; did you mean --json?"),
        (["viz", "buld"], "usage: gmp viz [-h]", "gmp viz: error: argument ACTION: invalid choice: 'buld'"),
        (["eval", "--policy-args=a=1"], "usage: gmp eval [-h]",
         "unrecognized arguments: --policy-args=a=1; did you mean --policy-arg?"),
    ],
    ids=["command", "eval-flag", "status-flag", "action", "flag-with-value"],
)
def test_typos_get_a_did_you_mean_and_the_commands_usage(args: list[str], usage: str, said: str) -> None:
    p = gmp(*args)
    assert p.returncode == ExitCode.USAGE
    assert p.stdout == ""
    assert p.stderr.startswith(usage), p.stderr
    assert said in p.stderr, p.stderr
    if args[0] == "evl":
        assert "did you mean 'eval'?" in p.stderr
    if args[0] == "viz":
        assert "did you mean 'build'?" in p.stderr
    assert f"(see '{usage.split(' [', 1)[0][len('usage: '):]} --help')" in p.stderr


def test_no_guess_when_nothing_is_close() -> None:
    p = gmp("eval", "--zzzzzz")
    assert p.returncode == ExitCode.USAGE
    assert "gmp eval: error: unrecognized arguments: --zzzzzz\n" in p.stderr


def test_help_points_at_documentation_that_exists() -> None:
    p = gmp("--help")
    assert p.returncode == 0
    assert "docs/cli.md" not in p.stdout  # a path in a source checkout the user does not have
    pointer = docs_pointer()
    assert pointer.startswith("https://") or pointer == "see the gmp(1) man page (man gmp)"
    assert f"Docs: {pointer}." in " ".join(p.stdout.split())
    assert "gmp completion bash|zsh" in p.stdout


def _bash_complete(script: Path, words: list[str]) -> list[str]:
    line = " ".join(f"'{w}'" for w in words)
    code = (f"source {script}\nCOMP_WORDS=({line})\nCOMP_CWORD={len(words) - 1}\n"
            "_gmp\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n")
    p = subprocess.run(["bash", "--norc", "--noprofile", "-c", code], capture_output=True, text=True,
                       timeout=30, check=True)
    return [w for w in p.stdout.splitlines() if w]


def _zsh_complete(script: Path, words: list[str]) -> list[str]:
    # compadd/_files/compdef stubbed: the script's own logic picks what to offer.
    line = " ".join(f"'{w}'" for w in words)
    code = ("compdef() { :; }\ncompadd() { [[ $1 == -- ]] && shift; reply+=(\"$@\"); }\n"
            "_files() { reply+=(FILES); }\n"
            f"source {script}\nwords=({line})\nCURRENT={len(words)}\nreply=()\n_gmp\n"
            "print -rl -- $reply\n")
    p = subprocess.run(["zsh", "-f", "-c", code], capture_output=True, text=True, timeout=30, check=True)
    return [w for w in p.stdout.splitlines() if w]


CASES = [
    (["gmp", "ev"], ["eval"]),
    (["gmp", "eval", "--wor"], ["--worker-ids"]),
    (["gmp", "eval", "--codec", ""], ["auto", "msgpack", "legacy"]),
    (["gmp", "-v", "viz", "b"], ["build"]),
    (["gmp", "eval", "--url", "http://x", "--no-rec"], ["--no-record"]),
    (["gmp", "completion", ""], ["bash", "zsh"]),
    (["gmp", "online", "cr"], ["create"]),
]


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_scripts_complete_what_the_parser_accepts(shell: str, tmp_path: Path) -> None:
    p = gmp("completion", shell)
    assert p.returncode == 0 and p.stderr == ""
    script = tmp_path / f"gmp.{shell}"
    script.write_text(p.stdout, encoding="utf-8")
    tables = completion_tables(build_parser())
    assert "completion" in tables.subs["gmp"] and "visualize" not in tables.subs["gmp"]  # hidden
    assert set(tables.flags["gmp eval"]) >= {"--url", "--policy", "--policy-arg", "--no-record"}
    assert shutil.which(shell), f"{shell} is needed by this test (python tools/ensure_chromium.py installs it)"
    complete = _bash_complete if shell == "bash" else _zsh_complete
    offered = {w for table in (tables.subs, tables.flags, tables.choices) for ws in table.values() for w in ws}
    for words, want in CASES:
        got = [w for w in complete(script, words) if w.startswith(words[-1])]
        # What must be offered is; anything else offered is something the parser accepts there.
        assert set(want) <= set(got) and set(got) <= offered, (words, got)
    # Flags of the command typed, not of another one: --watch is status's, not eval's.
    assert "--watch" not in complete(script, ["gmp", "eval", "--wat"])
    assert "--watch" in complete(script, ["gmp", "status", "--wat"])


def test_completion_of_an_unknown_shell_is_a_usage_error() -> None:
    p = gmp("completion", "fish")
    assert p.returncode == ExitCode.USAGE
    assert "gmp completion: error: argument shell: invalid choice: 'fish'" in p.stderr
