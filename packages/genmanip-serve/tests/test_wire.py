from __future__ import annotations

import msgpack
import numpy as np
import pytest
from genmanip_protocol.codec import JpegFrame
from genmanip_protocol.codec.limits import MAX_CONTAINERS, MAX_DEPTH
from genmanip_serve import WireError, decode_message, encode_message
from genmanip_serve.wire import max_jpeg_bytes


def _openpi_array(arr: np.ndarray) -> dict[bytes, object]:
    # openpi's msgpack-numpy form, spelled out (bin keys)
    return {b"__ndarray__": True, b"data": arr.tobytes(), b"dtype": arr.dtype.str, b"shape": list(arr.shape)}


def test_round_trip_keeps_dtypes_shapes_and_values() -> None:
    msg = {
        "video.x": np.arange(24, dtype=np.uint8).reshape(2, 4, 3),
        "state.joints": np.linspace(0, 1, 7),
        "b": np.array([True, False]),
        "i": np.int32(-4),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "nested": {"l": [1, 2.5, None, "s"], "t": (1, 2)},
        "col": np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)),
    }
    out = decode_message(encode_message(msg))
    for k in ("video.x", "state.joints", "b", "empty", "col"):
        assert out[k].dtype == np.asarray(msg[k]).dtype and np.array_equal(out[k], msg[k]), k
    assert out["i"] == np.int32(-4) and out["i"].dtype == np.int32
    assert out["nested"] == {"l": [1, 2.5, None, "s"], "t": [1, 2]}
    assert not out["video.x"].flags.writeable  # a view of the message, not a copy


def test_decodes_the_openpi_form_with_bin_keys() -> None:
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    raw = msgpack.packb({"observation/state": _openpi_array(arr), "prompt": "go"}, use_bin_type=True)
    out = decode_message(raw)
    assert np.array_equal(out["observation/state"], arr) and out["prompt"] == "go"


@pytest.mark.parametrize("dtype", ["|O", "|V8", "<c16", "<U3", "<M8[s]"])
def test_refused_dtypes_name_the_field(dtype: str) -> None:
    raw = msgpack.packb({"video.cam": {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": dtype,
                                       b"shape": [1]}}, use_bin_type=True)
    with pytest.raises(WireError) as ei:
        decode_message(raw)
    assert ei.value.field == "video.cam" and "refused" in str(ei.value)


@pytest.mark.parametrize("value", [np.array([object()], dtype=object), np.array([1j])])
def test_encoding_refuses_object_and_complex(value: np.ndarray) -> None:
    with pytest.raises(WireError) as ei:
        encode_message({"state.x": value})
    assert ei.value.field == "state.x"


def test_bad_frames() -> None:
    with pytest.raises(WireError, match="malformed msgpack"):
        decode_message(b"\xc1\x00garbage")
    with pytest.raises(WireError, match="expected a msgpack map"):
        decode_message(msgpack.packb([1, 2]))
    with pytest.raises(WireError, match="text frame"):
        decode_message("hello")
    wrong = _openpi_array(np.zeros(4, dtype=np.float32))
    wrong[b"shape"] = [5]
    with pytest.raises(WireError) as ei:
        decode_message(msgpack.packb({"a": {"b": wrong}}, use_bin_type=True))
    assert ei.value.field == "a.b" and "data bytes" in str(ei.value)
    huge = {b"__ndarray__": True, b"data": b"", b"dtype": "<f4", b"shape": [1 << 40, 0, 1 << 40]}
    with pytest.raises(WireError, match=r"MAX_ARRAY_ELEMENTS|elements"):
        decode_message(msgpack.packb({"x": huge}, use_bin_type=True))


def test_decode_is_bounded() -> None:
    deep: object = 1
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(WireError, match="deeper"):
        decode_message(msgpack.packb({"x": deep}))
    # a bomb of empty containers stops at the container bound, not at the end of the payload
    bomb = b"\xdd" + (MAX_CONTAINERS + 10).to_bytes(4, "big") + b"\x90" * (MAX_CONTAINERS + 10)
    with pytest.raises(WireError, match=r"MAX_CONTAINERS|maps/arrays"):
        decode_message(b"\x81\xa1x" + bomb)


# ------------------------------------------------------------------------- JPEG frames (gmp's form)


def _frame(h: int = 48, w: int = 64) -> JpegFrame:
    grad = np.add.outer(np.arange(h), np.arange(w)) % 256
    return JpegFrame.encode(np.repeat(grad[:, :, None], 3, axis=2).astype(np.uint8))


def _tagged(data: bytes, shape: list[int]) -> dict[bytes, object]:
    return {b"__jpeg__": True, b"data": data, b"shape": shape}


def test_jpeg_frames_travel_as_their_bytes_and_arrive_undecoded() -> None:
    frame = _frame()
    raw = encode_message({"video.top_camera_view": frame, "state.joints": np.zeros(3)}, jpeg=True)
    assert len(raw) < frame.nbytes + 200  # the JPEG bytes, not the 9 KB of pixels
    out = decode_message(raw, jpeg=True)
    got = out["video.top_camera_view"]
    assert type(got) is JpegFrame and got == frame  # same bytes, same shape, not decoded
    # without jpeg=True a JpegFrame travels decoded (as openpi clients send frames)
    plain = decode_message(encode_message({"video.top_camera_view": frame}))
    assert np.array_equal(plain["video.top_camera_view"], frame.decode())


def test_jpeg_frames_are_refused_where_not_accepted() -> None:
    frame = _frame()
    tagged = _tagged(frame.data, list(frame.shape))
    cases = [
        ({"video.cam": tagged}, False, "video.cam"),  # the receiver takes no JPEG
        ({"state.joints": tagged}, True, "state.joints"),  # not a camera
        ({"obs": {"video.cam": tagged}}, True, "obs.video.cam"),  # not a top-level key
        ({"video.cam": [tagged]}, True, "video.cam[0]"),
    ]
    for msg, jpeg, field in cases:
        with pytest.raises(WireError, match="accepted only as a camera frame") as ei:
            decode_message(msgpack.packb(msg, use_bin_type=True), jpeg=jpeg)
        assert ei.value.field == field
    with pytest.raises(WireError, match="expected a msgpack map of fields"):
        decode_message(msgpack.packb(_openpi_array(np.zeros(2)), use_bin_type=True))


@pytest.mark.parametrize(
    ("data", "shape", "match"),
    [
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 64, [48, 64, 3], "not a JPEG image"),
        (b"%!PS-Adobe-3.0 EPSF-3.0\n", [48, 64, 3], r"PostScript/EPS"),
        (b"\xff\xd8\xff" + b"\0" * (2 * 3 * 4 * 4 + 65536), [4, 4, 3], "bytes of JPEG for a 4x4"),
        (b"\xff\xd8\xff", [48, 64], r"\[H, W, 3\]"),
        (b"\xff\xd8\xff", [48, 64, 4], r"\[H, W, 3\]"),
        (b"\xff\xd8\xff", [0, 64, 3], r"\[H, W, 3\]"),
        (b"\xff\xd8\xff", [4096, 4096, 3], "MAX_JPEG_PIXELS"),
        ("text", [48, 64, 3], "must be bytes"),
    ],
)
def test_bad_jpeg_frames_are_refused_before_any_decoder(data: object, shape: list[int], match: str) -> None:
    raw = msgpack.packb({"video.cam": {b"__jpeg__": True, b"data": data, b"shape": shape}},
                        use_bin_type=True)
    with pytest.raises(WireError, match=match) as ei:
        decode_message(raw, jpeg=True)
    assert ei.value.field == "video.cam"
    assert max_jpeg_bytes(4, 4) == 2 * 3 * 16 + 65536
