"""gmp main(): dispatch, lazy handler import, the single exception -> exit code mapping."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

import genmanip.cli as cli_pkg
import pytest
from genmanip.cli import _args
from genmanip.cli import main as main_mod
from genmanip.cli.parser import EXIT_CODES, build_parser
from genmanip_protocol.errors import ExitCode

HANDLERS = '''
from __future__ import annotations
from genmanip_runtime.errors import AuthError
from genmanip_protocol.errors import ValidationError, Violation


def ok(*, value, console):
    print("data:" + value)
    return 0


def returns_none(*, value, console):
    return None


def auth(*, value, console):
    raise AuthError("GET /status failed: HTTP 401", status=401, hint="set GMP_TOKEN")


def invalid(*, value, console):
    raise ValidationError(Violation("action", "16 floats", "9 values", location="a.json[1]"))


def interrupt(*, value, console):
    raise KeyboardInterrupt


def bug(*, value, console):
    return {}["missing"]


def fails(*, value, console):
    return 1


def no_value(*, console):
    return 0
'''


@pytest.fixture
def handlers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real importable handler module and a parser with one test command per handler."""
    (tmp_path / "gmp_test_handlers.py").write_text(HANDLERS)
    monkeypatch.syspath_prepend(str(tmp_path))

    def fake_build_parser() -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog="gmp")
        _args.add_global_flags(parser, in_subcommand=False)
        parser.set_defaults(handler=None, dist="genmanip", extra=None, command="gmp",
                            help_parser=None)
        sub = parser.add_subparsers(dest="cmd")
        for name in ("ok", "returns_none", "auth", "invalid", "interrupt", "bug", "fails"):
            p = _args.add_command(sub, name, handler=f"gmp_test_handlers:{name}",
                                  dist="genmanip-test", help=name)
            p.add_argument("--value", default="x")
        _args.add_command(sub, "absent", handler="genmanip_nonexistent.cli:run",
                          dist="genmanip-nonexistent", help="missing package")
        _args.add_command(sub, "absent-extra", handler="genmanip_nonexistent.cli:run",
                          dist="genmanip-viz", extra="viz", help="missing extra",
                          command="gmp viz")
        _args.add_command(sub, "noattr", handler="gmp_test_handlers:nope",
                          dist="genmanip-test", help="old package")
        # A spec declaring a dest (--value) that its handler does not accept.
        p = _args.add_command(sub, "mismatch", handler="gmp_test_handlers:no_value",
                              dist="genmanip-test", help="stale handler")
        p.add_argument("--value", default="x")
        return parser

    monkeypatch.setattr(main_mod, "build_parser", fake_build_parser)


def test_handler_runs_and_prints_data_on_stdout(handlers: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_mod.main(["ok", "--value", "7"]) == 0
    out, err = capsys.readouterr()
    assert out == "data:7\n" and err == ""
    assert main_mod.main(["returns_none"]) == 0
    assert main_mod.main(["fails"]) == 1


def test_handler_gets_its_dests_and_a_console_as_keywords(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from genmanip_runtime.console import Console

    calls: list[dict[str, Any]] = []

    def spy(**kwargs: Any) -> int:
        calls.append(kwargs)
        return 0

    monkeypatch.setattr(main_mod, "resolve_handler", lambda *a, **k: spy)
    # A sub-action gets its own dests only: not its group's flags (viz's --root, --port, ...),
    # not the routing keys, not the global flags (those are in the console).
    assert main_mod.main(["-q", "viz", "--root", "r", "build", "run", "-j", "3"]) == 0
    kwargs = calls.pop()
    assert set(kwargs) == {"run_dir", "jobs", "console"}
    assert (kwargs["run_dir"], kwargs["jobs"]) == ("run", 3)
    console = kwargs["console"]
    assert isinstance(console, Console) and console.quiet and console.verbose == 0
    assert main_mod.main(["validate", "f.json", "-vv"]) == 0
    kwargs = calls.pop()
    assert set(kwargs) == {"files", "robot", "kind", "console"}
    assert not kwargs["console"].quiet and kwargs["console"].verbose == 2


def test_a_dest_the_handler_does_not_accept_fails_loudly(
    handlers: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main_mod.main(["mismatch"]) == ExitCode.INTERNAL
    err = capsys.readouterr().err
    assert "internal error in 'gmp mismatch': TypeError" in err and "'value'" in err


def test_genmanip_error_maps_to_its_exit_code_with_hint(handlers: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_mod.main(["auth"]) == ExitCode.AUTH == 8
    err = capsys.readouterr().err
    assert err == "gmp: error: GET /status failed: HTTP 401\nhint: set GMP_TOKEN\n"
    assert main_mod.main(["invalid"]) == ExitCode.INVALID_INPUT
    assert "a.json[1]: action: expected 16 floats, got 9 values" in capsys.readouterr().err


def test_keyboard_interrupt_is_130(handlers: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_mod.main(["interrupt"]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_an_error_after_a_signal_is_the_signal_not_a_bug(
    handlers: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # numpy turns a Ctrl-C during its import into an ImportError: that is the Ctrl-C.
    def handler(**kwargs: Any) -> None:
        try:
            cli_pkg._on_sigint(signal.SIGINT, None)
        except KeyboardInterrupt:
            raise ImportError("PyCapsule_Import could not import module 'datetime'") from None

    monkeypatch.setattr(main_mod, "resolve_handler", lambda *a, **k: handler)
    monkeypatch.setattr(cli_pkg, "_received", [])
    assert main_mod.main(["ok"]) == ExitCode.INTERRUPTED
    err = capsys.readouterr().err
    assert "gmp: interrupted" in err and "internal error" not in err


def test_sigterm_is_143(handlers: None, capsys: pytest.CaptureFixture[str],
                        monkeypatch: pytest.MonkeyPatch) -> None:
    def handler(**kwargs: Any) -> None:
        cli_pkg._on_sigterm(signal.SIGTERM, None)

    monkeypatch.setattr(main_mod, "resolve_handler", lambda *a, **k: handler)
    monkeypatch.setattr(cli_pkg, "_received", [])
    assert main_mod.main(["ok"]) == ExitCode.TERMINATED == 143
    assert "gmp: terminated" in capsys.readouterr().err


def test_unexpected_exception_is_internal_traceback_only_with_v(
    handlers: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main_mod.main(["bug"]) == ExitCode.INTERNAL == 70
    err = capsys.readouterr().err
    assert "internal error in 'gmp bug': KeyError: 'missing'" in err
    assert "Traceback" not in err and "-v" in err
    assert main_mod.main(["-v", "bug"]) == 70
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert main_mod.main(["bug", "-v"]) == 70  # -v after the subcommand works too
    assert "Traceback" in capsys.readouterr().err


def test_missing_package_names_dist_and_extra(handlers: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_mod.main(["absent"]) == ExitCode.NOT_INSTALLED == 3
    assert capsys.readouterr().err == (
        "gmp: error: 'gmp absent' needs the genmanip-nonexistent package: "
        "pip install genmanip-nonexistent\n"
    )
    assert main_mod.main(["absent-extra"]) == 3
    assert "'gmp viz' needs the genmanip-viz package: pip install 'genmanip[viz]'" in capsys.readouterr().err
    assert main_mod.main(["noattr"]) == 3
    assert "has no 'nope'" in capsys.readouterr().err


def test_missing_third_party_dependency_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gmp_needs_dep.py").write_text("import definitely_not_installed_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(main_mod.HandlerNotInstalled) as ei:
        main_mod.resolve_handler("gmp_needs_dep:run", command="gmp x", dist="genmanip-x")
    assert "'definitely_not_installed_xyz'" in ei.value.message
    assert "pip install genmanip-x" in ei.value.message


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_mod.main(["no-such-command"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert main_mod.main(["eval", "--chunk-size", "many"]) == 2
    assert "--chunk-size" in capsys.readouterr().err


def test_no_command_prints_help_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_mod.main([]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("usage: gmp") and err == ""
    assert main_mod.main(["online"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: gmp online") and "create" in out and "stop" in out


def test_version_lists_packages_and_python(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_mod.main(["--version"]) == 0
    out = capsys.readouterr().out
    assert "genmanip" in out
    assert out.splitlines()[-1].startswith("python")


def test_exit_code_table_matches_enum() -> None:
    assert [c for c, _ in EXIT_CODES] == sorted(int(c) for c in ExitCode)
    assert main_mod._USAGE == ExitCode.USAGE
    assert main_mod._NOT_INSTALLED == ExitCode.NOT_INSTALLED
    assert main_mod._INTERNAL == ExitCode.INTERNAL
    assert cli_pkg._INTERRUPTED == ExitCode.INTERRUPTED
    assert cli_pkg._TERMINATED == ExitCode.TERMINATED
    epilog = build_parser().epilog or ""
    for code in ExitCode:
        assert f"{int(code)} " in epilog


def test_no_color_plain_error_line(handlers: None, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    main_mod.main(["auth"])
    assert "\x1b[" in capsys.readouterr().err
    monkeypatch.setenv("NO_COLOR", "1")
    main_mod.main(["auth"])
    assert "\x1b[" not in capsys.readouterr().err


def test_logging_levels() -> None:
    import logging

    main_mod.configure_logging(0, False)
    assert logging.getLogger().level == logging.WARNING
    main_mod.configure_logging(1, False)
    assert logging.getLogger().level == logging.INFO
    main_mod.configure_logging(2, False)
    assert logging.getLogger().level == logging.DEBUG
    main_mod.configure_logging(2, True)
    assert logging.getLogger().level == logging.ERROR
    gmp_handlers = [h for h in logging.getLogger().handlers if getattr(h, "_gmp_handler", False)]
    assert len(gmp_handlers) == 1  # reconfiguring does not stack handlers
    main_mod.configure_logging(0, False)


def test_the_log_handler_follows_sys_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() run in-process leaves its handler installed: a record logged after that call's
    stderr was closed (a thread still running) goes to the current stderr, not to the closed one."""
    import io
    import logging

    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    main_mod.configure_logging(0, False)
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("genmanip.test").warning("after the call")
    assert second.getvalue() == "gmp: warning: after the call\n"
    explicit = io.StringIO()
    main_mod.configure_logging(0, False, stream=explicit)
    logging.getLogger("genmanip.test").warning("to the stream given")
    assert explicit.getvalue().endswith("to the stream given\n") and "given" not in second.getvalue()
    main_mod.configure_logging(0, False)


def test_handler_spec_must_name_a_function() -> None:
    with pytest.raises(ValueError, match=r"package\.module:function"):
        main_mod.resolve_handler("genmanip.validate")


