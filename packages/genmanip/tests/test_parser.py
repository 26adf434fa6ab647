"""The stdlib-only parser: every command, hidden underscore aliases, handler specs, help text."""

from __future__ import annotations

import argparse
import pkgutil
import re

import genmanip
import genmanip.cli.specs as specs_pkg
import pytest
from genmanip.cli import _args
from genmanip.cli.parser import SPEC_MODULES, build_parser

COMMANDS = [
    ["eval"], ["submit", "c.yaml"], ["status"], ["demo"], ["testbed", "serve"],
    ["validate", "f.json"], ["plot", "ep"], ["clean"], ["viz"], ["viz", "build", "run"],
    ["online", "create"], ["online", "ready", "--task-id", "1"], ["online", "submit"],
    ["online", "stop", "--task-id", "1"], ["online", "run"], ["leaderboard", "list"],
    ["leaderboard", "bundle", "run"],
    ["leaderboard", "submit", "--run-id", "r", "-n", "s", "-l", "lb"],
    ["leaderboard", "status", "42"],
]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_spec_modules_cover_the_specs_package() -> None:
    found = {m.name for m in pkgutil.iter_modules(specs_pkg.__path__)}
    assert set(SPEC_MODULES) == found


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_every_command_names_a_lazy_handler(argv: list[str]) -> None:
    ns = build_parser().parse_args(argv)
    assert re.fullmatch(r"[a-z_][a-z_.]*:[a-z_]+", ns.handler), ns.handler
    assert ns.dist.startswith("genmanip")
    assert ns.command.startswith("gmp ")


def test_viz_alone_serves_and_build_builds() -> None:
    p = build_parser()
    assert p.parse_args(["viz"]).handler == "genmanip_viz.cli:serve"
    assert p.parse_args(["viz", "--port", "1"]).port == 1
    ns = p.parse_args(["viz", "build", "r", "--jobs", "2"])
    assert (ns.handler, ns.run_dir, ns.jobs, ns.command) == ("genmanip_viz.cli:build", "r", 2, "gmp viz build")
    assert p.parse_args(["visualize"]).handler == "genmanip_viz.cli:serve"


ALIASES = [
    # (command, hyphenated flag args, reference spelling args, dest)
    (["eval"], ["--worker-ids", "0,1"], ["--worker_ids", "0,1"], "worker_ids"),
    (["eval"], ["--run-id", "r"], ["--run_id", "r"], "run_id"),
    (["eval"], ["--arm-type", "franka"], ["--arm_type", "franka"], "arm_type"),
    (["eval"], ["--gripper-type", "robotiq"], ["--gripper_type", "robotiq"], "gripper_type"),
    (["eval"], ["--control-type", "ee_pose"], ["--control_type", "ee_pose"], "control_type"),
    (["eval"], ["--chunk-size", "4"], ["--chunk_size", "4"], "chunk_size"),
    (["eval"], ["--results-dir", "d"], ["--results_dir", "d"], "results_dir"),
    (["eval"], ["--robot", "franka"], ["--robot_id", "franka"], "robot"),
    (["eval"], ["--no-record"], ["--no_save_process"], "record"),
    (["eval"], ["--plot-on-episode-end"], ["--plot_on_episode_end"], "plot_on_episode_end"),
    (["submit", "c"], ["--run-id", "r"], ["--run_id", "r"], "run_id"),
    (["status"], ["--run-id", "r"], ["--run_id", "r"], "run_id"),
    (["clean"], ["--root", "x"], ["--project_root", "x"], "root"),
    (["clean"], ["--dry-run"], ["--dry_run"], "dry_run"),
    (["viz"], ["--root", "x"], ["--project_root", "x"], "root"),
    (["online", "create"], ["--base-url", "u"], ["--base_url", "u"], "base_url"),
    (["online", "create"], ["--model-name", "m"], ["--model_name", "m"], "model_name"),
    (["online", "submit"], ["--print-endpoint"], ["--print_endpoint"], "print_endpoint"),
    (["online", "run"], ["--worker-ids", "3"], ["--worker_ids", "3"], "worker_ids"),
    (["leaderboard", "list"], ["--root", "x"], ["--project-root", "x"], "root"),
    (["leaderboard", "status", "1"], ["--token", "t"], ["--user_token", "t"], "token"),
    (["leaderboard", "bundle", "r"], ["--include-videos"], ["--include_videos"], "include_videos"),
    (["testbed", "serve"], ["--no-save-process"], ["--no_save_process"], "save_process"),
]


@pytest.mark.parametrize(("cmd", "new", "old", "dest"), ALIASES,
                         ids=[f"{' '.join(c[:2])} {o[0]}" for c, _, o, _ in ALIASES])
def test_reference_spellings_parse_to_the_same_dest(
    cmd: list[str], new: list[str], old: list[str], dest: str
) -> None:
    p = build_parser()
    a, b = vars(p.parse_args(cmd + new)), vars(p.parse_args(cmd + old))
    default = vars(p.parse_args(cmd))
    assert a[dest] != default[dest], f"{dest} did not change from its default"
    assert a == b


def test_save_process_aliases_switch_recording() -> None:
    p = build_parser()
    assert p.parse_args(["eval"]).record is True
    assert p.parse_args(["eval", "--no_save_process"]).record is False
    assert p.parse_args(["eval", "--no_save_process", "--save_process"]).record is True


def test_required_flag_satisfied_by_alias() -> None:
    ns = build_parser().parse_args(["leaderboard", "submit", "--run_id", "r", "--submission_name", "s",
                                    "--leaderboard_name", "l"])
    assert (ns.run_id, ns.submission_name, ns.leaderboard_name) == ("r", "s", "l")


def _all_help(parser: argparse.ArgumentParser) -> str:
    text = parser.format_help()
    for sub in _subparsers(parser).values():
        text += _all_help(sub)
    return text


def test_help_shows_hyphenated_flags_only() -> None:
    text = _all_help(build_parser())
    assert "--worker-ids" in text and "--run-id" in text and "--dry-run" in text
    underscored = re.findall(r"--[a-z]+_[a-z_]+", text)
    assert underscored == [], underscored


def test_flags_are_not_abbreviated() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["eval", "--work", "0"])


def test_global_flags_before_and_after_the_command() -> None:
    p = build_parser()
    assert p.parse_args(["-vv", "eval"]).verbose == 2
    assert p.parse_args(["eval", "-v"]).verbose == 1
    assert p.parse_args(["-q", "status"]).quiet is True
    assert p.parse_args(["status", "-q"]).quiet is True
    assert p.parse_args(["-q", "status"]).verbose == 0


def test_defaults_are_safe() -> None:
    p = build_parser()
    # None: the handler uses [eval] url from the config file, else 127.0.0.1:8087 (the reference
    # client defaulted to 0.0.0.0); tests/cli/test_config_keys.py runs it.
    assert p.parse_args(["eval"]).host is None
    assert p.parse_args(["testbed", "serve"]).host == "127.0.0.1"
    assert p.parse_args(["viz"]).host == "127.0.0.1"
    assert p.parse_args(["online", "submit"]).deadline > 0  # never "wait forever"
    assert p.parse_args(["online", "submit"]).timeout == 30.0


def test_add_flag_requires_a_dest_source() -> None:
    parser = argparse.ArgumentParser()
    with pytest.raises(ValueError, match="dest"):
        _args.add_flag(parser, "-x")


def test_public_names() -> None:
    assert genmanip.__all__ == ["__version__"]
    assert genmanip.__version__ == "0.1.0"
