"""Property tests: every supported value survives both codecs exactly."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from genmanip_protocol.codec import JpegFrame, LegacyCodec, MsgpackCodec, Observation
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

CODECS = [MsgpackCodec(), LegacyCodec()]

_dtypes = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(endianness="?"),
    hnp.unsigned_integer_dtypes(endianness="?"),
    hnp.floating_dtypes(endianness="?", sizes=(16, 32, 64)),
    hnp.complex_number_dtypes(endianness="?"),
)
arrays = _dtypes.flatmap(
    lambda dt: hnp.arrays(
        dt,
        hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4),
        elements=hnp.from_dtype(dt, allow_nan=True, allow_infinity=True)
        if dt.kind in "fc"
        else None,
    )
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.binary(max_size=20),
)
keys = st.one_of(st.text(max_size=10), st.integers(min_value=-(2**63), max_value=2**63 - 1))


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.dictionaries(keys, children, max_size=4),
        # observation-like dicts become Observations on decode
        st.dictionaries(
            st.sampled_from(["state.joints", "video.cam_view", "instruction", "timestep"]),
            children,
            max_size=3,
        ),
    )


trees = st.recursive(st.one_of(scalars, arrays), _containers, max_leaves=12)


def _same(a: Any, b: Any, path: str = "") -> None:
    """Exact equality: arrays by dtype, shape and bytes (so NaN payloads and -0.0 count)."""
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), path
        assert not b.flags.writeable, path
        assert b.shape == a.shape, path
        # protocol-independent: values and dtype (byte order included) survive
        assert b.dtype == a.dtype, (path, a.dtype, b.dtype)
        assert b.tobytes() == np.ascontiguousarray(a).tobytes(), path
    elif isinstance(a, Mapping):
        assert isinstance(b, Mapping), path
        if any(isinstance(k, str) and k.startswith(("video.", "state.")) for k in a):
            assert isinstance(b, Observation), path
        assert list(b.keys()) == list(a.keys()), path
        for k in a:
            _same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(b) is list, path  # tuples arrive as lists
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and a != a:
        assert isinstance(b, float) and b != b, path
    else:
        assert type(b) is type(a) and b == a, (path, a, b)


@pytest.mark.slow  # hypothesis array generation: a few seconds per codec
@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
@settings(
    max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(tree=trees)
def test_roundtrip(codec: Any, tree: Any) -> None:
    _same(tree, codec.decode(codec.encode(tree)))


@settings(max_examples=50, deadline=None, database=None)
@given(tree=trees)
def test_msgpack_parts_equal_encode(tree: Any) -> None:
    codec = MsgpackCodec()
    assert b"".join(bytes(p) for p in codec.encode_parts(tree)) == codec.encode(tree)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
@settings(max_examples=60, deadline=None, database=None)
@given(arr=arrays)
def test_array_dtype_and_byte_order_survive(codec: Any, arr: np.ndarray) -> None:
    out = codec.decode(codec.encode({"state.x": arr}))["state.x"]
    assert out.dtype.str == arr.dtype.str
    assert np.array_equal(out, arr, equal_nan=arr.dtype.kind in "fc")


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
@settings(max_examples=25, deadline=None, database=None)
@given(
    h=st.integers(1, 40),
    w=st.integers(1, 40),
    quality=st.integers(10, 95),
    seed=st.integers(0, 2**32 - 1),
)
def test_jpeg_frames_survive_both_codecs_undecoded(
    codec: Any, h: int, w: int, quality: int, seed: int
) -> None:
    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    frame = JpegFrame.encode(rgb, quality=quality)
    out = codec.decode(codec.encode({"obs": {"video.cam_view": frame, "state.t": [seed]}}))["obs"]
    assert isinstance(out, Observation) and out.is_encoded("video.cam_view")
    assert out.frame_bytes("video.cam_view") == frame.data
    assert out["video.cam_view"].shape == (h, w, 3)
    assert np.array_equal(out["video.cam_view"], frame.decode())
