from __future__ import annotations

import base64
import collections
import io
import os
import pickle
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from genmanip_protocol import DecodeError, EncodeError, ExitCode, UnsafePayloadError
from genmanip_protocol.codec import (
    LEGACY_CONTENT_TYPE,
    JpegFrame,
    LegacyCodec,
    Observation,
    codec_for_content_type,
    get_codec,
    safe_loads,
)

CODEC = LegacyCodec()


def _tagged(arr: np.ndarray) -> dict[str, Any]:
    """A numpy_array value the way the real server writes it (built here independently)."""
    return {"type": "numpy_array", "dtype": str(arr.dtype), "shape": list(arr.shape),
            "data": base64.b64encode(arr.tobytes()).decode()}  # fmt: skip


def _server_reply(frames: dict[str, bytes]) -> bytes:
    obs = {
        "instruction": "put the peg in the hole",
        "state.joints": _tagged(np.linspace(-1, 1, 12, dtype=np.float32)),
        "state.gripper": _tagged(np.array([0.044, 0.044, 0.0, 0.0], dtype=np.float32)),
        "state.base": [0.0, 0.0, 0.0],
        "timestep": 0,
        "reset": True,
        "episode_id": "ebench/run/ebench/table_top_manip/peg_in_hole/000",
        "robot_id": "manip/lift2/R5a",
    }
    for key, data in frames.items():
        obs[key] = {"type": "jpeg_bytes", "dtype": "uint8", "shape": [32, 48, 3], "data": data}
    reply = {
        "0": {
            "obs": obs,
            "metric": {"*ebench/t": {"score": 0.0, "sr": 0.0}},
            "episode_result": None,
        }
    }
    return pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)


def _jpeg(seed: int) -> bytes:
    rgb = np.random.default_rng(seed).integers(0, 255, (32, 48, 3), dtype=np.uint8)
    return JpegFrame.encode(rgb).data


def test_names_and_registry() -> None:
    assert (
        CODEC.name == "legacy"
        and CODEC.content_type == LEGACY_CONTENT_TYPE == "application/octet-stream"
    )
    assert isinstance(get_codec("legacy"), LegacyCodec)
    assert isinstance(codec_for_content_type("application/octet-stream"), LegacyCodec)
    assert codec_for_content_type("application/json") is None


def test_decodes_a_real_server_shaped_reply() -> None:
    frames = {"video.left_camera_view": _jpeg(1), "video.right_camera_view": _jpeg(2)}
    out = CODEC.decode(_server_reply(frames))
    obs = out["0"]["obs"]
    assert isinstance(obs, Observation)
    joints = obs["state.joints"]
    assert joints.dtype == np.float32 and joints.shape == (12,) and not joints.flags.writeable
    assert np.allclose(joints, np.linspace(-1, 1, 12))
    assert obs.cameras == ["video.left_camera_view", "video.right_camera_view"]
    assert obs.is_encoded("video.left_camera_view")
    assert obs.frame_bytes("video.left_camera_view") == frames["video.left_camera_view"]
    assert obs["video.left_camera_view"].shape == (32, 48, 3)
    assert out["0"]["metric"] == {"*ebench/t": {"score": 0.0, "sr": 0.0}}


def test_reply_encoding_matches_the_real_wire_format() -> None:
    arr = np.arange(4, dtype=np.float32)
    frame = JpegFrame.encode(np.zeros((8, 8, 3), dtype=np.uint8))
    body = CODEC.encode({"0": {"obs": Observation({"state.joints": arr, "video.a_view": frame}), "t": (1, 2)},
                         "s": np.float64(0.5)})  # fmt: skip
    plain = pickle.loads(body)  # our own output: trusted
    assert plain["0"]["obs"]["state.joints"] == _tagged(arr)
    assert plain["0"]["obs"]["video.a_view"] == {
        "type": "jpeg_bytes",
        "dtype": "uint8",
        "shape": [8, 8, 3],
        "data": frame.data,
    }
    assert plain["0"]["t"] == [1, 2] and type(plain["s"]) is float
    assert body[:2] == b"\x80\x05"  # highest protocol


def test_request_encoding_turns_arrays_into_lists() -> None:
    action = {"0": {"action": np.zeros(16, dtype=np.float32), "control_type": "joint_position", "is_rel": False,
                    "base_motion": (0.0, 0.0, np.float32(1.0)), "gain": np.int64(3)}}  # fmt: skip
    plain = pickle.loads(CODEC.encode(action, tag_arrays=False))
    a = plain["0"]
    assert a["action"] == [0.0] * 16 and type(a["action"][0]) is float
    assert a["base_motion"] == (0.0, 0.0, 1.0) and type(a["base_motion"][2]) is float
    assert type(a["gain"]) is int
    # ... and the server side reads it back with the allow-list.
    assert CODEC.decode(CODEC.encode(action, tag_arrays=False))["0"]["action"] == [0.0] * 16


@pytest.mark.parametrize("bad", [np.array([1, None], dtype=object), object(), {1, object()}])
def test_encode_refuses_what_the_allow_list_could_not_read(bad: object) -> None:
    with pytest.raises(EncodeError) as ei:
        CODEC.encode({"obs": {"x": bad}})
    assert "['obs']['x']" in str(ei.value)


# -- tagged values ---------------------------------------------------------------------------------


def test_tensor_values_decode_without_torch_or_eval() -> None:
    data = np.arange(6, dtype=np.float32).tobytes()
    for shape in ("torch.Size([2, 3])", "[2, 3]", "(2, 3)", "torch.Size([2,3])"):
        t = {
            "type": "tensor",
            "dtype": "torch.float32",
            "shape": shape,
            "data": base64.b64encode(data),
            "device": "cpu",
        }
        arr = CODEC.decode(pickle.dumps({"t": t}))["t"]
        assert arr.shape == (2, 3) and arr.dtype == np.float32 and arr[1, 2] == 5
    scalar = {
        "type": "tensor",
        "dtype": "torch.int64",
        "shape": "torch.Size([])",
        "data": base64.b64encode(np.int64(7).tobytes()),
    }
    assert CODEC.decode(pickle.dumps(scalar)).shape == ()
    # bfloat16 = top 16 bits of float32: widened exactly
    f = np.array([1.5, -2.0, 3.140625], dtype=np.float32)
    bf = (f.view(np.uint32) >> 16).astype("<u2")
    t = {
        "type": "tensor",
        "dtype": "torch.bfloat16",
        "shape": "torch.Size([3])",
        "data": base64.b64encode(bf.tobytes()),
    }
    assert CODEC.decode(pickle.dumps(t)).tolist() == [1.5, -2.0, 3.140625]
    evil = {
        "type": "tensor",
        "dtype": "torch.float32",
        "shape": "__import__('os').system('x')",
        "data": "",
    }
    with pytest.raises(DecodeError, match="cannot parse"):
        CODEC.decode(pickle.dumps(evil))
    with pytest.raises(DecodeError, match="unsupported tensor dtype"):
        CODEC.decode(pickle.dumps({**t, "dtype": "torch.qint8"}))


def test_image_values_decode_with_pillow() -> None:
    import PIL.Image

    rgb = np.random.default_rng(3).integers(0, 255, (5, 7, 3), dtype=np.uint8)
    buf = io.BytesIO()
    PIL.Image.fromarray(rgb).save(buf, format="PNG")
    v = {
        "type": "image",
        "data": base64.b64encode(buf.getvalue()).decode(),
        "size": [7, 5],
        "mode": "RGB",
    }
    assert np.array_equal(CODEC.decode(pickle.dumps(v)), rgb)
    with pytest.raises(DecodeError, match="not a JPEG/PNG image"):
        CODEC.decode(pickle.dumps({**v, "data": base64.b64encode(b"not a png").decode()}))
    # a PNG signature followed by garbage reaches Pillow's PNG plugin (only), which refuses it
    with pytest.raises(DecodeError, match="invalid PNG image"):
        CODEC.decode(pickle.dumps({**v, "data": base64.b64encode(b"\x89PNG\r\n\x1a\nxx").decode()}))


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (
            {"type": "numpy_array", "dtype": "object", "shape": [1], "data": ""},
            "unknown dtype",
        ),
        (
            {
                "type": "numpy_array",
                "dtype": "float32",
                "shape": [3],
                "data": base64.b64encode(bytes(8)).decode(),
            },
            "needs 12",
        ),
        ({"type": "numpy_array", "dtype": "float32", "shape": [-1], "data": ""}, "non-negative"),
        ({"type": "numpy_array", "dtype": "float32", "data": ""}, "no 'shape' field"),
        ({"type": "numpy_array", "dtype": "float32", "shape": [1], "data": "@@@@"}, "needs 4"),
        ({"type": "numpy_array", "dtype": "float32", "shape": [1], "data": 5}, "expected base64"),
        ({"type": "numpy_array", "dtype": "nope", "shape": [1], "data": ""}, "unknown dtype"),
        ({"type": "jpeg_bytes", "dtype": "uint8", "shape": [2, 2], "data": b"x"}, r"\[H, W, 3\]"),
        (
            {"type": "jpeg_bytes", "dtype": "uint8", "shape": [2, 2, 3], "data": "str"},
            "expected JPEG bytes",
        ),
        ({"type": "jpeg_bytes", "dtype": "float32", "shape": [2, 2, 3], "data": b"x"}, "uint8"),
    ],
)
def test_malformed_tagged_values_name_the_field(value: dict[str, Any], match: str) -> None:
    with pytest.raises(DecodeError, match=match) as ei:
        CODEC.decode(pickle.dumps({"0": {"obs": {"state.joints": value}}}))
    assert "['0']['obs']['state.joints']" in str(ei.value)
    assert ei.value.exit_code == ExitCode.REMOTE_ERROR


def test_unknown_type_key_dicts_are_left_alone() -> None:
    d = {"type": "something_else", "data": 1}
    assert CODEC.decode(pickle.dumps({"x": d})) == {"x": d}


def test_shared_references_and_cycles_survive() -> None:
    shared = {
        "type": "numpy_array",
        "dtype": "int8",
        "shape": [2],
        "data": base64.b64encode(b"\x01\x02").decode(),
    }
    cyc: list[Any] = [1]
    cyc.append(cyc)
    out = CODEC.decode(pickle.dumps({"a": shared, "b": shared, "c": cyc}))
    assert out["a"] is out["b"] and out["a"].tolist() == [1, 2]
    assert out["c"][1] is out["c"]


# -- the allow-list --------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))
def test_allow_list_reads_numpy_and_builtin_containers(protocol: int) -> None:
    obj = {
        "f": np.arange(6, dtype=np.float32).reshape(2, 3),
        "be": np.arange(3, dtype=">i8"),
        "0d": np.array(2.5),
        "empty": np.zeros((0, 4)),
        "bool": np.array([True, False]),
        "c": np.array([1 + 1j], dtype=np.complex64),
        "u": np.array(["ab", "c"]),
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        "scalars": [np.float32(1.5), np.int64(3), np.bool_(True), np.complex128(2j)],
        "dtype": np.dtype("float32"),
        "set": {1, 2}, "fs": frozenset({3}), "cx": 1 + 2j, "ba": bytearray(b"ab"), "b": b"\x00\xff", "e": b"",
        "od": collections.OrderedDict(a=1), "t": (1, (2, 3)), 5: None,
    }  # fmt: skip
    body = pickle.dumps(obj, protocol=protocol)
    out = safe_loads(body)
    # The oracle is plain pickle on our own (trusted) bytes. (Unlike numpy's own unpickler at
    # protocols < 5, the allow-list keeps big-endian dtypes big-endian.)
    expected = pickle.loads(body)
    for k, v in expected.items():
        if isinstance(v, np.ndarray):
            assert out[k].dtype == obj[k].dtype and np.array_equal(out[k], v), k
            assert (
                out[k].flags.f_contiguous == obj[k].flags.f_contiguous
                and not out[k].flags.writeable
            )
        else:
            assert out[k] == v == obj[k], k
    assert type(out["od"]) is collections.OrderedDict


def test_numpy1_pickles_are_accepted() -> None:
    # numpy 1.x names numpy.core.multiarray; protocol 2 spells globals as text, so rewrite them.
    body = pickle.dumps({"a": np.arange(3, dtype=np.int16), "s": np.float64(1.0)}, protocol=2)
    assert b"numpy._core.multiarray" in body
    old = body.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    out = safe_loads(old)
    assert out["a"].tolist() == [0, 1, 2] and out["s"] == 1.0


class _Reduce:
    def __init__(self, func: Any, args: tuple[Any, ...]) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.func, self.args)


def _evil_payloads(sentinel: Path) -> list[tuple[str, bytes]]:
    cmd = f"touch {sentinel}"
    import builtins
    import posix

    payloads = [
        ("os.system", pickle.dumps(_Reduce(os.system, (cmd,)))),
        ("posix.system", pickle.dumps(_Reduce(posix.system, (cmd,)))),
        ("subprocess.Popen", pickle.dumps(_Reduce(subprocess.Popen, (["touch", str(sentinel)],)))),
        (
            "builtins.eval",
            pickle.dumps(_Reduce(builtins.eval, (f"__import__('os').system({cmd!r})",))),
        ),
        (
            "builtins.exec",
            pickle.dumps(_Reduce(builtins.exec, (f"import os; os.system({cmd!r})",))),
        ),
        # nested inside an innocent-looking reply, at every protocol
        *[
            (
                f"nested-p{p}",
                pickle.dumps({"0": {"obs": {"x": [_Reduce(os.system, (cmd,))]}}}, protocol=p),
            )
            for p in range(0, pickle.HIGHEST_PROTOCOL + 1)
        ],
        # __reduce__ chain: getattr(__import__('os'), 'system')(cmd)
        (
            "getattr-chain",
            b"cbuiltins\ngetattr\n(cbuiltins\n__import__\n(S'os'\ntRS'system'\ntR(S'"
            + cmd.encode()
            + b"'\ntR.",
        ),
        ("protocol-0 text", b"cos\nsystem\n(S'" + cmd.encode() + b"'\ntR."),
        ("copyreg", b"ccopyreg\n_reconstructor\n(cos\nsystem\nc__builtin__\nobject\nNtR."),
        ("numpy gadget", b"cnumpy.testing._private.utils\nrunstring\n(S'import os'\n(dtR."),
        ("numpy.load", b"cnumpy\nload\n(S'/etc/passwd'\ntR."),
        ("persistent id", b"P" + cmd.encode() + b"\n."),
        ("persistent binary", b"\x80\x02X\x03\x00\x00\x00abcQ."),
        ("ndarray called", pickle.dumps(_Reduce(np.ndarray, ((10**12,), "f8")))),
        ("object array", pickle.dumps(np.array([1, "a", None], dtype=object))),
        ("structured-with-object", pickle.dumps(np.zeros(1, dtype=[("a", "O"), ("b", "<f4")]))),
        ("structured", pickle.dumps(np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")]))),
        ("object scalar via scalar()", pickle.dumps(np.zeros(1, dtype=[("a", "<i4")])[0])),
        ("_reconstruct(other class)", pickle.dumps(np.zeros(2).view(np.recarray))),
    ]
    return payloads


def test_malicious_pickles_are_refused_and_execute_nothing(tmp_path: Path) -> None:
    sentinel = tmp_path / "pwned"
    for name, payload in _evil_payloads(sentinel):
        for decode in (safe_loads, CODEC.decode):
            with pytest.raises(UnsafePayloadError) as ei:
                decode(payload)
            assert ei.value.exit_code == ExitCode.REMOTE_ERROR, name
            assert isinstance(ei.value, DecodeError)
        assert not sentinel.exists(), name
    # control: the same machinery *does* execute with plain pickle, so the test would catch a leak
    pickle.loads(_evil_payloads(sentinel)[0][1])
    assert sentinel.exists()


def test_crafted_numpy_state_never_reaches_numpy() -> None:
    # dtype state with flags 63 ("holds object references") would make numpy read raw bytes as
    # PyObject pointers; a huge itemsize would allocate. Both are refused by the validating proxy.
    dtype_hdr = b"cnumpy\ndtype\n(S'f8'\nI00\nI01\ntR(I3\nS'<'\nNNN"
    with pytest.raises(UnsafePayloadError, match="flags"):
        safe_loads(dtype_hdr + b"I-1\nI-1\nI63\ntb.")
    with pytest.raises(DecodeError, match="itemsize"):
        safe_loads(dtype_hdr + b"I1000000\nI-1\nI0\ntb.")
    good = safe_loads(dtype_hdr + b"I-1\nI-1\nI0\ntb.")
    assert good == np.dtype("<f8")
    # array state whose data is shorter than its shape says
    arr = pickle.dumps(np.arange(4, dtype=np.int32), protocol=2)
    short = arr.replace(b"K\x01K\x04\x85", b"K\x01M\x00\x10\x85")  # shape (4,) -> (4096,)
    assert short != arr
    with pytest.raises(DecodeError, match="needs"):
        safe_loads(short)


def test_memo_index_cannot_allocate() -> None:
    # LONG_BINPUT 0x7fffffff: CPython's C unpickler would size its memo array to 2**32 entries.
    t0 = time.perf_counter()
    assert safe_loads(b"\x80\x04K\x01r\xff\xff\xff\x7f0j\xff\xff\xff\x7f.") == 1  # put, pop, get
    assert safe_loads(b"\x80\x04K\x07r\xff\xff\xff\x7f.") == 7
    assert time.perf_counter() - t0 < 1.0


def test_payload_cannot_tamper_with_the_allow_list() -> None:
    # BUILD with slot state on an allow-listed global would setattr into the validator classes.
    for target in (
        b"cnumpy\ndtype\n",
        b"cnumpy\nndarray\n",
        b"ccollections\nOrderedDict\n",
        b"cbuiltins\nset\n",
    ):
        with pytest.raises(DecodeError):
            safe_loads(target + b"(N}S'__call__'\ncbuiltins\nfrozenset\nstb.")
        with pytest.raises(DecodeError):
            safe_loads(target + b".")  # a bare global as a value
    # ... and numpy values built during the load cannot be BUILD-targeted either
    scalar = pickle.dumps(np.float32(1.5), protocol=2)
    assert scalar.endswith(b"R.") or scalar.endswith(b".")
    with pytest.raises(DecodeError, match="BUILD"):
        safe_loads(scalar[:-1] + b"(I1\nI2\ntb.")
    assert safe_loads(pickle.dumps({"a": np.arange(3)}))["a"].tolist() == [0, 1, 2]


def test_allocation_gadgets_are_refused() -> None:
    for payload in (
        b"c__builtin__\nbytearray\n(I1000000000000\ntR.",
        b"cbuiltins\nbytes\n(I1000000000000\ntR.",
        b"c__builtin__\ncomplex\n(S'1'\ntR.",
        b"c_codecs\nencode\n(S'x'\nS'zlib'\ntR.",
    ):
        with pytest.raises(DecodeError):
            safe_loads(payload)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x80",
        b"\x80\x05\x95",
        b"garbage",
        b"\x80\x05K\x01",
        pickle.dumps({"a": 1})[:-3],
        b"\x80\x05h\xff.",
        b"(l" * 10,
    ],
)
def test_garbage_is_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError) as ei:
        safe_loads(data)
    assert ei.value.codec == "legacy"


def test_deep_nesting_is_decode_error() -> None:
    # [[[...]]] 100k levels deep, written as opcodes (pickle.dumps itself would hit RecursionError)
    n = 100_000
    deep = b"\x80\x04" + b"](" * n + b"]" + b"e" * n + b"."
    with pytest.raises(DecodeError, match="deeper than 64"):
        safe_loads(deep)
    nested: Any = 1
    for _ in range(200):
        nested = [nested]
    with pytest.raises(DecodeError, match="deeper than 64"):
        safe_loads(pickle.dumps(nested))


def test_size_limit() -> None:
    with pytest.raises(DecodeError, match="exceeds"):
        LegacyCodec(max_size=10).decode(pickle.dumps(list(range(100))))


def test_shared_reference_bombs_are_refused() -> None:
    # 60 levels of [x, x]: a few hundred bytes, 2**60 leaves for anyone walking it naively
    level: Any = [1.0]
    for _ in range(60):
        level = [level, level]
    body = pickle.dumps(level)
    assert len(body) < 2000
    with pytest.raises(DecodeError, match="expands"):
        safe_loads(body)
    # modest sharing (the same list used by every step) is fine
    base = [0.0, 0.0, 0.0]
    steps = [{"base_motion": base, "i": i} for i in range(1000)]
    out = safe_loads(pickle.dumps(steps))
    assert out[0]["base_motion"] is out[999]["base_motion"]


def test_numpy_scalars_in_replies_become_python_scalars() -> None:
    # a server that forgets .item() still gives the client JSON-serialisable observations
    reply = {
        "0": {
            "obs": {
                "timestep": np.int64(3),
                "state.base": [np.float32(0.5)],
                "reset": np.bool_(True),
            }
        }
    }
    obs = CODEC.decode(pickle.dumps(reply))["0"]["obs"]
    assert obs["timestep"] == 3 and type(obs["timestep"]) is int
    assert type(obs["state.base"][0]) is float and obs["reset"] is True
    assert type(CODEC.decode(pickle.dumps(np.float64(2.5)))) is float


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_untagged_numpy_replies_decode_too(protocol: int) -> None:
    # a server (or a saved file) that pickles arrays directly instead of tagging them
    rgb = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    reply = {"0": {"obs": {"state.joints": np.arange(3.0), "video.a_view": rgb, "timestep": 1}}}
    obs = CODEC.decode(pickle.dumps(reply, protocol=protocol))["0"]["obs"]
    assert isinstance(obs, Observation) and not obs.is_encoded("video.a_view")
    assert np.array_equal(obs["video.a_view"], rgb) and obs.frame_bytes("video.a_view") is None
    assert not obs["state.joints"].flags.writeable
