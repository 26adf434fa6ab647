from __future__ import annotations

import struct
import time

import msgpack
import numpy as np
import pytest
from genmanip_protocol import DecodeError, EncodeError, ExitCode
from genmanip_protocol.codec import (
    MSGPACK_CONTENT_TYPE,
    JpegFrame,
    MsgpackCodec,
    Observation,
    codec_for_content_type,
    get_codec,
)
from genmanip_protocol.codec.msgpack_codec import MAGIC

CODEC = MsgpackCodec()


def _frame(
    header_obj: object,
    buffers: list[bytes] = (),
    *,
    version: int = 1,
    table: list[tuple[int, int]] | None = None,
) -> bytes:
    """Build a frame by hand (independently of the encoder) so malformed ones can be made."""
    header = (
        header_obj
        if isinstance(header_obj, bytes)
        else msgpack.packb(header_obj, use_bin_type=True)
    )
    n = len(buffers) if table is None else len(table)
    pos = 16 + 16 * n + len(header)
    offsets = []
    body = b""
    for b in buffers:
        pad = (-pos) % 64
        body += b"\0" * pad
        pos += pad
        offsets.append((pos, len(b)))
        body += b
        pos += len(b)
    tbl = table if table is not None else offsets
    prefix = struct.pack("<4sBBHII", MAGIC, version, 0, 0, n, len(header))
    return prefix + b"".join(struct.pack("<QQ", o, ln) for o, ln in tbl) + header + body


def _ref(dtype: str, shape: list[int], idx: int) -> msgpack.ExtType:
    return msgpack.ExtType(1, msgpack.packb([dtype, shape, idx]))


def test_names_and_registry() -> None:
    assert CODEC.name == "msgpack"
    assert CODEC.content_type == MSGPACK_CONTENT_TYPE == "application/x-genmanip-msgpack"
    assert isinstance(get_codec("msgpack"), MsgpackCodec)
    assert isinstance(
        codec_for_content_type("application/x-genmanip-msgpack; charset=binary"), MsgpackCodec
    )


def test_roundtrip_reply_tree() -> None:
    rgb = np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    tree = {
        "0": {
            "obs": {
                "video.left_camera_view": rgb,
                "state.joints": np.linspace(0, 1, 12, dtype=np.float32),
                "state.base": [0.0, 0.0, 0.0],
                "instruction": "pick up the cube",
                "timestep": 0,
                "reset": True,
            },
            "metric": {"*ebench/t": {"score": 0.0, "sr": 0.0}},
            "episode_result": None,
        },
        7: (1, 2.5, "x", b"\x00\xff", None, True),
    }
    out = CODEC.decode(CODEC.encode(tree))
    obs = out["0"]["obs"]
    assert isinstance(obs, Observation)
    assert np.array_equal(obs["video.left_camera_view"], rgb)
    assert obs["state.joints"].dtype == np.float32
    assert obs["state.base"] == [0.0, 0.0, 0.0]
    assert obs["instruction"] == "pick up the cube" and obs["reset"] is True
    assert out["0"]["metric"] == {"*ebench/t": {"score": 0.0, "sr": 0.0}}
    assert out[7] == [1, 2.5, "x", b"\x00\xff", None, True]  # tuples arrive as lists
    assert type(out["0"]) is dict  # only observation dicts become Observations


def test_decoded_arrays_are_readonly_zero_copy_views() -> None:
    arrs = {"a": np.arange(1000, dtype=np.float64), "b": np.ones((3, 5), dtype=np.int16)}
    data = CODEC.encode(arrs)
    out = CODEC.decode(data)
    whole = np.frombuffer(data, dtype=np.uint8)
    lo = whole.__array_interface__["data"][0]
    for k in arrs:
        arr = out[k]
        assert not arr.flags.writeable
        addr = arr.__array_interface__["data"][0]
        assert lo <= addr < lo + len(data)  # a view into the body, not a copy
        assert (addr - lo) % 64 == 0  # 64-byte aligned within the frame
        with pytest.raises(ValueError):
            arr[0] = 1


def test_bytearray_and_memoryview_inputs_give_readonly_arrays() -> None:
    data = CODEC.encode({"a": np.arange(4, dtype=np.int32)})
    for buf in (bytearray(data), memoryview(data), memoryview(bytearray(data))):
        out = CODEC.decode(buf)
        assert out["a"].tolist() == [0, 1, 2, 3]
        assert not out["a"].flags.writeable


def test_encode_parts_join_equals_encode_and_shares_array_memory() -> None:
    a = np.arange(100, dtype=np.uint8)
    tree = {"a": a, "b": np.zeros(3), "s": "x"}
    parts = CODEC.encode_parts(tree)
    assert b"".join(bytes(p) for p in parts) == CODEC.encode(tree)
    mv = [p for p in parts if isinstance(p, memoryview)]
    assert any(np.shares_memory(np.frombuffer(p, np.uint8), a) for p in mv)


@pytest.mark.parametrize(
    "arr",
    [
        np.array(3.5),  # 0-d
        np.zeros((0,), dtype=np.float32),
        np.zeros((2, 0, 3), dtype=np.int64),
        np.arange(6, dtype=">f8").reshape(2, 3),  # big-endian keeps its dtype
        np.arange(6, dtype="<u2"),
        np.array([True, False]),
        np.array([1 + 2j, np.nan], dtype=np.complex64),
        np.array([np.nan, np.inf, -np.inf, -0.0], dtype=np.float16),
        np.arange(24, dtype=np.int8).reshape(2, 3, 4)[:, ::2, 1:],  # non-contiguous
        np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)),
    ],
)
def test_array_roundtrip_exact(arr: np.ndarray) -> None:
    out = CODEC.decode(CODEC.encode({"x": arr}))["x"]
    assert out.dtype == arr.dtype and out.dtype.str == arr.dtype.str
    assert out.shape == arr.shape
    assert out.tobytes() == np.ascontiguousarray(arr).tobytes()


def test_numpy_scalars_become_python_scalars_complex_becomes_0d() -> None:
    out = CODEC.decode(
        CODEC.encode(
            [np.float32(1.5), np.int64(-3), np.uint8(200), np.bool_(True), np.complex128(1j)]
        )
    )
    assert out[:4] == [1.5, -3, 200, True]
    assert [type(v) for v in out[:4]] == [float, int, int, bool]
    assert isinstance(out[4], np.ndarray) and out[4].shape == () and out[4][()] == 1j


def test_int_range() -> None:
    assert CODEC.decode(CODEC.encode([-(2**63), 2**64 - 1])) == [-(2**63), 2**64 - 1]
    for bad in (2**64, -(2**63) - 1):
        with pytest.raises(EncodeError, match="64-bit"):
            CODEC.encode({"k": [bad]})


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (np.array([1, "a"], dtype=object), "dtype object"),
        (np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]), "not supported"),
        (np.zeros(2, dtype="V4"), "not supported"),
        (np.array(["ab"]), "not supported"),
        ({1, 2}, "unsupported type builtins.set"),
        (object(), "unsupported type builtins.object"),
        (1 + 2j, "unsupported type builtins.complex"),
    ],
)
def test_encode_errors_name_the_field(value: object, match: str) -> None:
    with pytest.raises(EncodeError, match=match) as ei:
        CODEC.encode({"obs": {"state.x": value}})
    assert "['obs']['state.x']" in str(ei.value)
    assert ei.value.exit_code == ExitCode.INVALID_INPUT


def test_bad_dict_keys_and_cycles_and_depth() -> None:
    with pytest.raises(EncodeError, match="dict key"):
        CODEC.encode({(1, 2): 3})
    with pytest.raises(EncodeError, match="dict key"):
        CODEC.encode({1.5: 3})
    cyc: list[object] = []
    cyc.append(cyc)
    with pytest.raises(EncodeError, match="deeper"):
        CODEC.encode(cyc)
    deep: object = 1
    for _ in range(70):
        deep = [deep]
    with pytest.raises(EncodeError, match="deeper"):
        CODEC.encode(deep)
    ok: object = 1
    for _ in range(60):
        ok = {"k": ok}
    assert CODEC.decode(CODEC.encode(ok)) == ok


def test_jpeg_frames_travel_encoded() -> None:
    rgb = np.random.default_rng(1).integers(0, 255, (16, 24, 3), dtype=np.uint8)
    frame = JpegFrame.encode(rgb)
    out = CODEC.decode(CODEC.encode({"video.cam_view": frame, "state.joints": np.zeros(2)}))
    assert isinstance(out, Observation)
    assert out.is_encoded("video.cam_view")
    assert out.frame_bytes("video.cam_view") == frame.data
    assert out["video.cam_view"].shape == (16, 24, 3)


def test_observation_encodes_without_decoding_frames() -> None:
    rgb = np.zeros((8, 8, 3), dtype=np.uint8)
    obs = Observation({"video.a_view": JpegFrame.encode(rgb), "state.joints": np.zeros(3)})
    out = CODEC.decode(CODEC.encode({"obs": obs}))["obs"]
    assert obs.is_encoded("video.a_view") and out.is_encoded("video.a_view")


# -- malformed frames ------------------------------------------------------------------------------


def test_valid_handmade_frame_decodes() -> None:
    buf = np.arange(6, dtype="<i4").tobytes()
    out = CODEC.decode(_frame({"a": _ref("<i4", [2, 3], 0)}, [buf]))
    assert out["a"].tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "truncated"),
        (b"GMPK", "truncated"),
        (b"XXXX" + bytes(12), "magic"),
        (_frame({"a": 1}, version=2), "version 2"),
        (_frame({"a": 1})[:-1], "truncated|malformed"),
        (_frame({"a": _ref("<i4", [3], 0)}, [bytes(8)]), "needs 12 bytes"),
        (_frame({"a": _ref("<i4", [1], 1)}, [bytes(4)]), "out of range"),
        (_frame({"a": _ref("|O", [1], 0)}, [bytes(8)]), "bad dtype"),
        (_frame({"a": _ref("|V8", [1], 0)}, [bytes(8)]), "bad dtype"),
        (
            _frame({"a": _ref("|a8", [1], 0)}, [bytes(8)]),
            "bad dtype",
        ),  # deprecated alias: no warning
        (_frame({"a": _ref("<M8", [1], 0)}, [bytes(8)]), "bad dtype"),
        (_frame({"a": _ref("<U2", [1], 0)}, [bytes(8)]), "not allowed"),
        (_frame({"a": _ref("[('a','<i4')]", [1], 0)}, [bytes(4)]), "bad dtype|unknown dtype"),
        (_frame({"a": _ref("<i4", [-1], 0)}, [bytes(4)]), "bad shape"),
        (_frame({"a": _ref("<i4", [1.0], 0)}, [bytes(4)]), "bad shape"),
        (_frame({"a": _ref("<i4", [1], True)}, [bytes(4)]), "out of range"),
        (_frame({"a": msgpack.ExtType(9, b"")}), "unknown ext type 9"),
        (_frame({"a": msgpack.ExtType(1, b"\xc1")}), "malformed array reference"),
        (_frame({"a": msgpack.ExtType(2, msgpack.packb([[2, 2, 3], "notbytes"]))}), "JPEG"),
        (_frame({"a": 1}, table=[(0, 4)]), "outside the frame"),
        (_frame({"a": 1}, table=[(10**6, 4)]), "outside the frame"),
        (_frame({1.5: 1}), "map key"),
        (_frame({b"k": 1}), "map key"),
    ],
)
def test_malformed_frames_raise_decode_error(data: bytes, match: str) -> None:
    with pytest.raises(DecodeError, match=match) as ei:
        CODEC.decode(data)
    assert ei.value.codec == "msgpack"


def test_huge_declared_shape_does_not_allocate() -> None:
    t0 = time.perf_counter()
    for shape in ([2**40, 2**40], [2**31] * 8, [2**63 - 1, 2**63 - 1, 2**63 - 1]):
        with pytest.raises(DecodeError, match="exceeds the limit"):
            CODEC.decode(_frame({"a": _ref("<f8", shape, 0)}, [bytes(64)]))
    assert time.perf_counter() - t0 < 1.0


def test_deep_header_nesting_is_decode_error_not_recursion() -> None:
    for depth in (65, 500, 5000, 100000):
        header = b"\x91" * depth + b"\x01"  # [[[...[1]...]]] written by hand: packers refuse it
        with pytest.raises(DecodeError, match="deep"):
            CODEC.decode(_frame(header))


def test_size_limit_and_wrong_input_type() -> None:
    small = MsgpackCodec(max_size=100)
    with pytest.raises(DecodeError, match="exceeds"):
        small.decode(CODEC.encode({"a": np.zeros(100)}))
    with pytest.raises(DecodeError, match="expected bytes"):
        CODEC.decode("text")  # type: ignore[arg-type]
    with pytest.raises(DecodeError, match="contiguous"):
        CODEC.decode(memoryview(np.arange(40, dtype=np.int32))[::2])
    # any contiguous buffer works, e.g. a uint8 numpy array over the body
    body = CODEC.encode({"a": np.arange(3)})
    assert CODEC.decode(np.frombuffer(body, np.uint8))["a"].tolist() == [0, 1, 2]
