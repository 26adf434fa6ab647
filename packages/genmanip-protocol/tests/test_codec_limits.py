"""Hostile input for every decoder: depth, element count, copied bytes and array shapes.

Each hostile payload is decoded in a child process (``_hostile.run_child``) under ``RLIMIT_AS``:
the C stack overflow these tests guard against is a SIGSEGV, and the memory blow-ups would take the
test run down with them. Every case must end in a typed :class:`DecodeLimitError` naming its
limit, within :data:`RSS_BOUND_MIB` of peak RSS growth and :data:`TIME_BOUND_S` seconds.
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from genmanip_protocol.codec import LegacyCodec, MsgpackCodec, safe_loads
from genmanip_protocol.codec.limits import (
    MAX_CONTAINERS,
    MAX_DEPTH,
    MAX_ELEMENTS,
    MAX_EMPTY_ARRAY_ROWS,
    check_array_shape,
    check_json_limits,
)
from genmanip_protocol.errors import DecodeError, DecodeLimitError

sys.path.insert(0, str(Path(__file__).parent))

import _hostile as H

#: Peak RSS growth a hostile payload may cause over the child's warm baseline (the payload's own
#: bytes included: the largest here are 4-6 MB).
RSS_BOUND_MIB = 64.0
#: Seconds one hostile payload may take (the slowest are 4 MB of pure-Python pickle opcodes).
TIME_BOUND_S = 5.0


def _assert_refused(report: dict[str, Any], limit: str | None) -> None:
    assert report["returncode"] == 0, (report["returncode"], report["stderr"])  # no signal
    if limit is None:
        assert report["outcome"] in ("DecodeError", "DecodeLimitError"), report
    else:
        assert report["outcome"] == "DecodeLimitError", report
        assert report["limit"] == limit, report
    assert report["rss_growth_mib"] <= RSS_BOUND_MIB, report
    assert report["seconds"] < TIME_BOUND_S, report


# -- class: C recursion on deep hashables (segfault, exit 139, before) ---------------------------


@pytest.mark.parametrize("n", [10_000, 100_000, 200_000])
@pytest.mark.parametrize(
    "builder",
    ["deep_tuple_key", "deep_tuple_set_member", "deep_tuple_frozenset_member",
     "deep_tuple_of_list_key"],
)  # fmt: skip
def test_deep_tuple_as_key_or_member_is_refused_not_a_crash(builder: str, n: int) -> None:
    for decoder in ("safe_loads", "legacy"):
        _assert_refused(H.run_child([builder, n], decoder), "MAX_DEPTH")


@pytest.mark.parametrize("n", [10_000, 100_000])
def test_deep_frozensets_and_marks_are_refused(n: int) -> None:
    _assert_refused(H.run_child(["deep_frozenset_reduce", n], "legacy"), "MAX_DEPTH")
    _assert_refused(H.run_child(["deep_marks", n], "legacy"), "MAX_DEPTH")


def test_deep_list_chain_is_refused_after_loading() -> None:
    # Lists are unhashable: nothing recurses in C while they load; the tree walk refuses them.
    _assert_refused(H.run_child(["deep_list_chain", 200_000], "legacy"), "MAX_DEPTH")


def test_nesting_at_the_limit_still_decodes() -> None:
    t: Any = None
    for _ in range(MAX_DEPTH - 2):
        t = (t,)
    assert safe_loads(pickle.dumps({t: [t]}, protocol=4))  # a 63-deep tuple key is fine
    for proto in (0, 2, 5):
        with pytest.raises(DecodeLimitError) as ei:
            t2: Any = None
            for _ in range(MAX_DEPTH + 1):
                t2 = (t2,)
            safe_loads(pickle.dumps({t2: 1}, protocol=proto))
        assert ei.value.limit == "MAX_DEPTH" and ei.value.bound == MAX_DEPTH


# -- class: millions of small containers (1.4-1.9 GB, before) ------------------------------------


@pytest.mark.parametrize(
    ("spec", "limit"),
    [
        (["repeated", "5d", 4_000_000], "MAX_CONTAINERS"),  # EMPTY_LIST
        (["repeated", "7d", 4_000_000], "MAX_CONTAINERS"),  # EMPTY_DICT
        (["repeated", "8f", 4_000_000], "MAX_CONTAINERS"),  # EMPTY_SET (232 bytes each)
        (["repeated", "28", 4_000_000], "MAX_DEPTH"),  # MARK: a list on the metastack each
        (["repeated", "4e85", 2_000_000], "MAX_CONTAINERS"),  # None + TUPLE1
        (["repeated", "2891", 2_000_000], "MAX_CONTAINERS"),  # MARK + FROZENSET
        (["repeated", "286c", 2_000_000], "MAX_CONTAINERS"),  # MARK + LIST
        (["repeated", "4e94", 2_000_000], "MAX_CONTAINERS"),  # None + MEMOIZE: memo slots
        (["empties_in_list", "5d", 4_000_000], "MAX_CONTAINERS"),
        (["empties_in_list", "7d", 4_000_000], "MAX_CONTAINERS"),
        (["dup_refs", 4_000_000], "MAX_ELEMENTS"),
    ],
)
def test_container_floods_in_pickle_are_bounded(spec: list[Any], limit: str) -> None:
    _assert_refused(H.run_child(spec, "legacy"), limit)


@pytest.mark.parametrize(
    ("spec", "limit"),
    [
        (["mp_frame_of", "mp_array32", "90", 4_000_000], "MAX_ELEMENTS"),  # fixarray 0x90
        (["mp_frame_of", "mp_array32", "80", 4_000_000], "MAX_ELEMENTS"),  # fixmap 0x80
        (["mp_frame_of", "mp_array32", "90", 600_000], "MAX_CONTAINERS"),  # under the value cap
        (["mp_frame_of", "mp_array32", "a26162", 1_500_000], "MAX_ELEMENTS"),  # 2-char strings
        (["mp_frame_of", "mp_map32_empty_values", 1_000_000], "MAX_ELEMENTS"),
        (["mp_frame_of", "mp_deep", 200_000], "MAX_DEPTH"),
        (["mp_frame_of", "mp_deep", 1_000], "MAX_DEPTH"),  # small: msgpack's own stack, then ours
    ],
)
def test_container_floods_in_msgpack_are_bounded(spec: list[Any], limit: str) -> None:
    _assert_refused(H.run_child(spec, "msgpack"), limit)


@pytest.mark.parametrize(
    ("spec", "limit"),
    [
        (["mp_array32", "90", 4_000_000], "MAX_ELEMENTS"),
        (["mp_array32", "90", 600_000], "MAX_CONTAINERS"),
        (["mp_deep", 100_000], "MAX_DEPTH"),
    ],
)
def test_plain_msgpack_documents_are_bounded_too(spec: list[Any], limit: str) -> None:
    _assert_refused(H.run_child(spec, "msgpack_plain"), limit)


# -- memo bombs: one memoized object copied thousands of times (2 GB from 1 MB, before) -----------


@pytest.mark.parametrize(
    ("kind", "size", "copies", "limit"),
    [
        ("bytearray", 1 << 20, 2000, "MAX_COPY_SLACK"),
        ("bytes", 1 << 20, 2000, "MAX_COPY_SLACK"),
        ("codecs", 1 << 20, 2000, "MAX_COPY_SLACK"),
        ("set", 100_000, 2000, "MAX_ELEMENTS"),
    ],
)
def test_memo_bombs_are_refused_before_copying(
    kind: str, size: int, copies: int, limit: str
) -> None:
    _assert_refused(H.run_child(["memo_bomb", kind, size, copies], "legacy"), limit)


def test_one_copy_of_each_data_string_is_still_fine() -> None:
    arr = np.arange(300_000, dtype=np.float64)  # protocol 2 copies the data once (_codecs.encode)
    for proto in (0, 2, 5):
        out = safe_loads(pickle.dumps({"a": arr, "b": bytearray(b"x" * 100_000)}, protocol=proto))
        assert np.array_equal(out["a"], arr) and len(out["b"]) == 100_000


def test_legitimate_large_trees_decode() -> None:
    """meta_record.pkl of a 3000-step episode and a 30-step chunk for 64 workers as lists."""
    meta = {
        "joint_positions": [np.zeros(14) for _ in range(3000)],
        "model_output": [{"arm_action": np.zeros(14), "base_motion": [0.0, 0.0, 0.0]}
                         for _ in range(3000)],
        "instruction": "x",
    }  # fmt: skip
    for proto in (2, 4, 5):
        assert len(safe_loads(pickle.dumps(meta, protocol=proto))["model_output"]) == 3000
    chunk = [{str(w): {"action": [0.0] * 16, "control_type": "joint_position"} for w in range(64)}
             for _ in range(30)]  # fmt: skip
    assert LegacyCodec().decode(LegacyCodec().encode(chunk, tag_arrays=False)) == chunk
    assert MsgpackCodec().decode(MsgpackCodec().encode(chunk)) == chunk
    big = list(range(MAX_ELEMENTS - 10))
    assert len(safe_loads(pickle.dumps(big, protocol=4))) == MAX_ELEMENTS - 10


def test_each_limit_is_a_decode_error_naming_itself() -> None:
    with pytest.raises(DecodeLimitError) as ei:
        safe_loads(H.repeated("5d", MAX_CONTAINERS + 1))
    assert isinstance(ei.value, DecodeError) and ei.value.codec == "legacy"
    assert ei.value.limit == "MAX_CONTAINERS" and str(MAX_CONTAINERS) in str(ei.value)
    with pytest.raises(DecodeLimitError, match="values"):
        safe_loads(H.dup_refs(MAX_ELEMENTS + 1))


def test_reduce_cannot_splat_a_long_list_into_a_call() -> None:
    body = b"\x80\x04\x8c\x08builtins\x8c\x03set\x93(" + b"N" * 100 + b"lR."
    with pytest.raises(DecodeError, match="REDUCE arguments"):
        safe_loads(body)


# -- arrays: zero dimensions next to huge ones (hang / MemoryError / ValueError, before) -----------

HUGE_EMPTY = [[0, 2**40], [2**31, 0, 2**31], [2**20, 0], [0, 2**62, 2**62], [2**17, 0, 5]]


@pytest.mark.parametrize("shape", HUGE_EMPTY)
def test_empty_arrays_with_huge_dimensions_are_refused_everywhere(shape: list[int]) -> None:
    legacy = LegacyCodec()
    with pytest.raises(DecodeLimitError) as ei:
        legacy.decode(H.tagged("numpy_array", dtype="float32", shape=shape, data_b64=b""))
    assert ei.value.limit.startswith("MAX_") and "['v']" in str(ei.value)
    torch_shape = "torch.Size([" + ", ".join(map(str, shape)) + "])"
    with pytest.raises(DecodeLimitError):
        legacy.decode(H.tagged("tensor", dtype="torch.float32", shape=torch_shape, data_b64=b""))
    with pytest.raises(DecodeLimitError):
        MsgpackCodec().decode(H.mp_array_ref(shape))
    if len(shape) <= 3:
        for proto in (2, 4, 5):
            with pytest.raises(DecodeLimitError):
                safe_loads(H.numpy_pickle(shape, proto))


def test_reasonable_empty_arrays_still_decode() -> None:
    for shape in ([0], [0, 7], [0, 480, 640, 3], [MAX_EMPTY_ARRAY_ROWS, 0], [3, 0, 2**20]):
        arr = LegacyCodec().decode(
            H.tagged("numpy_array", dtype="float32", shape=shape, data_b64=b"")
        )["v"]
        assert arr.shape == tuple(shape) and arr.size == 0
        assert MsgpackCodec().decode(H.mp_array_ref(shape))["a"].shape == tuple(shape)
    assert safe_loads(H.numpy_pickle([0, 7, 9], 5)).shape == (0, 7, 9)


def test_check_array_shape_bounds() -> None:
    assert check_array_shape([720, 1280, 3], 1, what="x", codec="t") == 720 * 1280 * 3
    for shape, limit in (([2**29], "MAX_ARRAY_ELEMENTS"), ([2**15, 2**14], "MAX_ARRAY_ELEMENTS"),
                         ([2**27 + 1], "MAX_ARRAY_BYTES"), ([1] * 33, "MAX_NDIM"),
                         ([2**16 + 1, 0], "MAX_EMPTY_ARRAY_ROWS")):  # fmt: skip
        with pytest.raises(DecodeLimitError) as ei:
            check_array_shape(shape, 16, what="x", codec="t")
        assert ei.value.limit == limit, shape


def test_jpeg_frame_shapes_are_bounded() -> None:
    jpeg = b"\xff\xd8\xff\xe0" + bytes(20)
    for shape in ([65536, 1, 3], [2**31, 2**31, 3], [40000, 40000, 3]):
        with pytest.raises(DecodeLimitError):
            LegacyCodec().decode(H.tagged("jpeg_bytes", dtype="uint8", shape=shape, data=jpeg))
        with pytest.raises(DecodeLimitError):
            MsgpackCodec().decode(H.mp_jpeg_ref(jpeg, shape))


# -- JSON text (gmp validate) ---------------------------------------------------------------------


def test_json_depth_and_counts_are_measured_before_parsing() -> None:
    with pytest.raises(DecodeLimitError, match="nested 100000 levels") as ei:
        check_json_limits(b"[" * 100_000 + b"]" * 100_000)
    assert ei.value.codec == "json" and ei.value.limit == "MAX_DEPTH"
    with pytest.raises(DecodeLimitError) as ei:
        check_json_limits(b"[" + b"[]," * (MAX_CONTAINERS + 1) + b"0]")
    assert ei.value.limit == "MAX_CONTAINERS"
    with pytest.raises(DecodeLimitError) as ei:
        check_json_limits(b"[" + b"0," * MAX_ELEMENTS + b"0]")
    assert ei.value.limit == "MAX_ELEMENTS"
    with pytest.raises(DecodeLimitError):
        check_json_limits(b'{"a": ' * 70 + b"1" + b"}" * 70)


def test_json_brackets_inside_strings_do_not_count() -> None:
    deep_text = json.dumps({"s": "[" * 10_000 + '\\"{' * 1000, "t": ["]]]", "\\\\"]}).encode()
    check_json_limits(deep_text)  # no error: the brackets are string content
    nested = json.dumps([[["x"]]] * 40).encode()
    check_json_limits(nested)
    ok = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    check_json_limits(ok)
    assert json.loads(ok)  # what the limit lets through, json.loads parses
    with pytest.raises(DecodeLimitError):
        check_json_limits(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))


def test_msgpack_buffer_table_is_bounded_on_both_sides() -> None:
    from genmanip_protocol.errors import EncodeError

    arrays = [np.zeros(1, np.uint8)] * ((1 << 16) + 1)
    with pytest.raises(EncodeError, match="arrays in one frame"):
        MsgpackCodec().encode(arrays)
    ok = MsgpackCodec().decode(MsgpackCodec().encode(arrays[: 1 << 16]))
    assert len(ok) == 1 << 16
    import struct

    with pytest.raises(DecodeError, match="over the limits"):
        MsgpackCodec().decode(struct.pack("<4sBBHII", b"GMPK", 1, 0, 0, (1 << 16) + 1, 1) + b"\xc0")
