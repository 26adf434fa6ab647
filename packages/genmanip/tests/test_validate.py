"""gmp validate on real files: JSON, JSON lines / steps.jsonl, msgpack, pickle (allow-list only)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import msgpack
import numpy as np
import pytest
from genmanip.cli.main import main
from genmanip.validate import validate_file, validate_object
from genmanip_protocol import get_robot
from genmanip_protocol.codec import MsgpackCodec

ROBOT = "manip/lift2/R5a"
SPEC = get_robot(ROBOT)


def action(n: int | None = None, **kw: object) -> dict[str, object]:
    a: dict[str, object] = {
        "control_type": "joint_position",
        "action": [0.0] * (SPEC.action_dim if n is None else n),
        "is_rel": False,
        "base_motion": [0.0, 0.0, 0.0],
        "base_is_rel": True,
    }
    a.update(kw)
    return a


def row(step: int, act: dict[str, object] | None = None, **kw: object) -> dict[str, object]:
    r: dict[str, object] = {
        "episode_id": "bench/run1/pick/cube/0", "worker_id": "0", "robot_id": ROBOT,
        "step": step, "obs_timestep": step, "frame": step,
        "state": {"joints": [0.0] * SPEC.joints_dim, "gripper": [0.0] * SPEC.gripper_dim,
                  "base": [0.0, 0.0, 0.0]},
        "action": act or action(), "chunk": None, "latency_ms": {"network": 1.0, "server": 2.0, "policy": 0.1},
    }
    r.update(kw)
    return r


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_malformed_action_file_is_rejected_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "actions.json"
    f.write_text(json.dumps([action(), action(9), action(control_type="torque")]))
    code = main(["validate", "--robot", ROBOT, str(f)])
    assert code == 4
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{f}[1]: action: expected {SPEC.action_dim}")
    assert "got 9 values" in lines[0]
    assert lines[1].startswith(f"{f}[2]: control_type:")
    assert "2 violations in 1 of 1 file" in err


def test_clean_files_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"0": action(), "1": action()}))  # a /step body
    chunk = tmp_path / "chunk.json"
    chunk.write_text(json.dumps({"0": [action(), action()]}))  # worker-major chunk
    steps = write_jsonl(tmp_path / "steps.jsonl", [row(0), row(1, chunk={"index": 0, "size": 2}),
                                                   row(2, state=None, latency_ms=None)])
    assert main(["validate", "--robot", ROBOT, str(a), str(chunk)]) == 0
    assert main(["validate", str(steps)]) == 0  # robot from the rows
    out, err = capsys.readouterr()
    assert out == ""
    assert "1 file clean (3 steps.jsonl rows)" in err


def test_steps_jsonl_violations_have_file_line_locations(tmp_path: Path) -> None:
    rows: list[object] = [
        row(0),
        row(1, action(5)),
        row(2, obs_timestep=9),
        row(4),  # step 3 missing: rows of two attempts mixed, or lost
        row(5, episode_id="../../etc/x"),
        row(6, chunk={"index": 2, "size": 2}),
    ]
    f = write_jsonl(tmp_path / "steps.jsonl", rows)
    with f.open("a") as fh:
        fh.write("{broken\n")
    rep = validate_file(f)
    locs = [(v.location, v.field) for v in rep.violations]
    assert (f"{f}:2.action", "action") in locs
    assert (f"{f}:3", "obs_timestep") in locs
    assert (f"{f}:4", "step") in locs
    assert any(loc == f"{f}:5" and fld == "episode_id" for loc, fld in locs)
    assert (f"{f}:6", "chunk") in locs
    assert (f"{f}:7", "line") in locs
    assert rep.records == 6


def test_pickle_goes_through_the_allow_list(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (open, (str(marker), "w"))

    evil = tmp_path / "evil.pkl"
    evil.write_bytes(pickle.dumps({"0": Evil()}))
    rep = validate_file(evil, robot=ROBOT)
    assert not marker.exists()
    assert len(rep.violations) == 1
    assert "not on the allow-list" in rep.violations[0].actual

    good = tmp_path / "step.pkl"
    good.write_bytes(pickle.dumps({"0": dict(action(), action=np.zeros(SPEC.action_dim))}))
    assert validate_file(good, robot=ROBOT).violations == []


def test_msgpack_frame_and_plain_msgpack(tmp_path: Path) -> None:
    frame = tmp_path / "a.gmpk"
    frame.write_bytes(b"".join(bytes(p) for p in MsgpackCodec().encode_parts({"0": action(9)})))
    rep = validate_file(frame, robot=ROBOT)
    assert [v.field for v in rep.violations] == ["action"]
    plain = tmp_path / "a.msgpack"
    plain.write_bytes(msgpack.packb([action()]))
    assert validate_file(plain, robot=ROBOT).violations == []
    junk = tmp_path / "junk.msgpack"
    junk.write_bytes(b"\xc1\xc1\xc1")
    assert validate_file(junk, robot=ROBOT).violations[0].field == "file"


def test_observation_and_step_reply(tmp_path: Path) -> None:
    obs = {
        "robot_id": ROBOT, "instruction": "pick", "timestep": 0, "reset": False,
        "episode_id": "b/r/t/0",
        "state.joints": [0.0] * SPEC.joints_dim, "state.gripper": [0.0] * SPEC.gripper_dim,
        "state.base": [0.0, 0.0, 0.0],
        "state.ee_pose": [[[0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]] * 2,
    }
    reply = {"0": {"obs": obs, "metric": None, "episode_result": None},
             "1": {"obs": {"reset": True, "reset_pending": True}, "metric": None,
                   "episode_result": None, "reset_pending": True}}
    assert validate_object(reply).violations == []
    bad = dict(obs, **{"state.joints": [0.0] * 3})
    rep = validate_object({"0": {"obs": bad, "metric": None, "episode_result": None}},
                          location="r.json")
    assert [v.field for v in rep.violations] == ["state.joints"]
    assert rep.violations[0].location == "r.json['0'].obs"


def _decoded_obs(**cams: object) -> dict[str, object]:
    obs: dict[str, object] = {
        "robot_id": ROBOT, "instruction": "pick", "timestep": 3, "reset": False,
        "episode_id": "b/r/t/0",
        "state.joints": np.zeros(SPEC.joints_dim, np.float32),
        "state.gripper": np.zeros(SPEC.gripper_dim, np.float32),
        "state.base": np.zeros(3, np.float32),
        "state.ee_pose": [[[0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]] * 2,
    }
    obs.update(cams)
    return obs


def test_decoded_observations_and_jpeg_frames_are_recognised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the codecs decode a reply to: Observation mappings (not dicts) whose cameras are
    still-encoded JpegFrames. Each is an observation, checked like a dict one; a frame is checked
    by its JPEG header against its declared shape (never decoded)."""
    from genmanip_protocol.codec import JpegFrame, LegacyCodec, Observation

    h, w, _ = SPEC.cameras["left_camera_view"]
    frame = JpegFrame.encode(np.full((h, w, 3), 40, np.uint8))
    obs = _decoded_obs(**{"video.left_camera_view": frame})
    reply = {"0": {"obs": obs, "metric": None, "episode_result": None}}
    # in memory: an Observation, a reply of Observations, a {worker: Observation} mapping
    for value in (Observation(obs), {"0": dict(reply["0"], obs=Observation(obs))},
                  {"0": Observation(obs), "1": Observation(obs)}):  # fmt: skip
        rep = validate_object(value)
        assert rep.violations == [] and set(rep.kinds) == {"observation"}, rep
    # files: the msgpack frame with JPEG frames and a legacy pickle, both through the codecs
    codec = MsgpackCodec()
    gmpk = tmp_path / "reply.gmpk"
    gmpk.write_bytes(codec.encode(reply))
    decoded = codec.decode(gmpk.read_bytes())
    assert isinstance(decoded["0"]["obs"], Observation)
    assert decoded["0"]["obs"].is_encoded("video.left_camera_view")
    legacy = tmp_path / "reply.pkl"
    legacy.write_bytes(LegacyCodec().encode(reply))
    for f in (gmpk, legacy):
        rep = validate_file(f)
        assert rep.violations == [] and rep.kinds == {"observation": 1}, rep
    assert main(["validate", str(gmpk), str(legacy)]) == 0
    assert "2 observations" in capsys.readouterr().err
    # a frame that is not what it declares is a finding, naming the camera
    small = JpegFrame(JpegFrame.encode(np.zeros((8, 8, 3), np.uint8)).data, (h, w, 3))
    wrong_shape = JpegFrame.encode(np.zeros((16, 16, 3), np.uint8))
    for bad, expected in ((small, "a 8x8 JPEG header"), (wrong_shape, "(16, 16, 3)")):
        f = tmp_path / "bad.gmpk"
        f.write_bytes(codec.encode({"0": {"obs": _decoded_obs(**{"video.left_camera_view": bad}),
                                          "metric": None, "episode_result": None}}))
        rep = validate_file(f)
        assert [v.field for v in rep.violations] == ["video.left_camera_view"], rep
        assert expected in rep.violations[0].actual, rep.violations[0]
        assert rep.violations[0].location == f"{f}['0'].obs"
    # (the msgpack decoder refuses a frame that is not a JPEG; one built in memory is a finding)
    not_jpeg = JpegFrame(b"%!PS-Adobe-3.0 EPSF-3.0\n" + bytes(64), (h, w, 3))
    rep = validate_object(Observation(_decoded_obs(**{"video.left_camera_view": not_jpeg})))
    assert [v.field for v in rep.violations] == ["video.left_camera_view"], rep
    assert "EPS" in rep.violations[0].actual


def test_missing_robot_is_reported_once_per_file(tmp_path: Path) -> None:
    f = tmp_path / "a.json"
    f.write_text(json.dumps([action(), action()]))
    rep = validate_file(f)
    assert [v.field for v in rep.violations] == ["robot_id"]
    assert "--robot" in rep.violations[0].expected


def test_kind_forcing_and_unknown_values(tmp_path: Path) -> None:
    f = tmp_path / "x.json"
    f.write_text(json.dumps({"hello": 1}))
    rep = validate_file(f, kind="steps")
    assert rep.violations[0].field == "row"
    rep = validate_file(f, robot=ROBOT)
    assert rep.violations[0].field == "value"


def test_bad_robot_and_unreadable_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--robot", "nope/robot", str(tmp_path / "x.json")]) == 2
    assert "--robot" in capsys.readouterr().err
    empty = tmp_path / "empty.json"
    empty.write_text("")
    assert main(["validate", "--robot", ROBOT, str(empty), str(tmp_path / "missing.json")]) == 4
    out = capsys.readouterr().out
    assert "empty.json: file:" in out and "missing.json: file: expected a readable file" in out


# -- hostile files: every one is a finding (exit 4), never a crash (exit 70 or a signal) -------------

_GMP = r"""
import resource, runpy, sys
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (min(2 << 30, hard) if hard > 0 else 2 << 30, hard))
sys.argv = ["gmp", *sys.argv[1:]]
code = 0
try:
    runpy.run_module("genmanip", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else 1
finally:
    sys.stderr.write("\nPEAK_RSS_KIB=%d\n" % resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(code)
"""

#: Peak RSS a hostile file may add to validating a clean one (the files are up to ~6 MB).
RSS_BOUND_MIB = 64.0


def _gmp_validate(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    """Run the real ``gmp validate`` in a child; (exit code, stdout+stderr, peak RSS MiB)."""
    import os
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _GMP, "validate", *args], capture_output=True, text=True,
        timeout=120, check=False, env={**os.environ, "OPENBLAS_NUM_THREADS": "1", **(env or {})},
    )
    rss = 0.0
    for line in proc.stderr.splitlines():
        if line.startswith("PEAK_RSS_KIB="):
            rss = int(line.split("=", 1)[1]) / 1024
    return proc.returncode, proc.stdout + proc.stderr, rss


@pytest.fixture(scope="module")
def clean_rss(tmp_path_factory: pytest.TempPathFactory) -> float:
    f = tmp_path_factory.mktemp("clean") / "a.json"
    f.write_text(json.dumps(action()))
    code, out, rss = _gmp_validate("--robot", ROBOT, str(f))
    assert code == 0, out
    return rss


def _deep_tuple_key(n: int) -> bytes:
    return b"\x80\x04}N" + b"\x85" * n + b"Ns."


def _hostile_files() -> list[tuple[str, bytes, str]]:
    """(file name, content, a fragment of the finding)."""
    import base64
    import struct

    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\nshowpage\n"
    deep = b"[" * 100_000 + b"]" * 100_000
    return [
        ("deep.json", deep, "nested 100000 levels"),
        ("deep.jsonl", b'{"action": ' + deep + b"}\n", "nested 100001 levels"),
        ("deep_nosuffix", deep, "nested 100000 levels"),  # sniffed as JSON, retried as lines
        ("deep_obj.json", b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "nested 100000 levels"),
        ("many.json", b"[" + b"[]," * 500_000 + b"0]", "arrays/objects exceed"),
        ("many.jsonl", b"[" + b"{}," * 500_000 + b"0]\n", "arrays/objects exceed"),
        ("key10k.pkl", _deep_tuple_key(10_000), "nested deeper than 64"),
        ("key200k.pkl", _deep_tuple_key(200_000), "nested deeper than 64"),
        ("member.pkl", b"\x80\x04\x8f(N" + b"\x85" * 200_000 + b"\x90.", "nested deeper than 64"),
        ("sets.pkl", b"\x80\x04" + b"\x8f" * 4_000_000 + b"N.", "containers"),
        ("lists.pkl", b"\x80\x04(" + b"]" * 4_000_000 + b"l.", "containers"),
        ("marks.pkl", b"\x80\x04" + b"(" * 4_000_000 + b"N.", "MARKs nested"),
        ("lists.msgpack", b"\xdd" + struct.pack(">I", 4_000_000) + b"\x90" * 4_000_000, "values"),
        ("deep.msgpack", b"\x91" * 100_000 + b"\xc0", "nested"),
        ("frame.gmpk", struct.pack("<4sBBHII", b"GMPK", 1, 0, 0, 0, 4_000_005)
         + b"\xdd" + struct.pack(">I", 4_000_000) + b"\x80" * 4_000_000, "values"),
        ("zero.pkl", pickle.dumps({"type": "numpy_array", "dtype": "float32",
                                   "shape": [0, 2**40], "data": ""}), "exceeds the limit"),
        ("zero3.pkl", pickle.dumps({"state.joints": {"type": "numpy_array", "dtype": "float32",
                                                     "shape": [2**31, 0, 2**31], "data": ""}}),
         "exceeds the limit"),
        ("eps.pkl", pickle.dumps({"type": "image", "data": base64.b64encode(eps).decode()}),
         "not a JPEG/PNG image (PostScript/EPS)"),
        ("frame.pkl", pickle.dumps({"video.x_view": {"type": "jpeg_bytes", "dtype": "uint8",
                                                     "shape": [8, 8, 3], "data": eps}}),
         "not a JPEG image"),
    ]  # fmt: skip


def test_hostile_files_are_findings_in_process(tmp_path: Path) -> None:
    for name, content, fragment in _hostile_files():
        f = tmp_path / name
        f.write_bytes(content)
        rep = validate_file(f, robot=ROBOT)
        assert rep.violations, name
        v = rep.violations[0]
        assert v.field in ("file", "line") and fragment in v.actual, (name, str(v))


def test_hostile_files_through_the_real_command(tmp_path: Path, clean_rss: float) -> None:
    """Exit 4 (INVALID_INPUT) for every file, never 70 (a bug) or a signal (139 = SIGSEGV, the
    deep tuple key before), with bounded memory; a fake Ghostscript on PATH never runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sentinel = tmp_path / "gs-ran"
    gs = bin_dir / "gs"
    gs.write_text(f"#!/bin/sh\necho \"$@\" >> {sentinel}\nexit 0\n")
    gs.chmod(0o755)
    import os

    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    for name, content, fragment in _hostile_files():
        f = tmp_path / name
        f.write_bytes(content)
        code, out, rss = _gmp_validate("--robot", ROBOT, str(f), env=env)
        assert code == 4, (name, code, out[-1500:])
        assert fragment in out and "internal error" not in out, (name, out[-1500:])
        assert rss - clean_rss <= RSS_BOUND_MIB, (name, rss, clean_rss)
    assert not sentinel.exists()
