"""Item 7: codec fuzzing. Generated and mutated payloads against every decoder of the wire.

Every payload goes through each decoder that could receive it: ``safe_loads`` and
``LegacyCodec.decode`` (the pickle wire), ``MsgpackCodec.decode`` (the msgpack wire),
``decode_jpeg`` (camera frames), and whatever decodes successfully is then consumed completely
(``Observation.decode_all``, every ``JpegFrame.decode``, every array summed), because lazy decoding
must fail the same typed way. Allowed outcomes: a value, or a ``DecodeError`` (its subclass
``UnsafePayloadError`` for forbidden globals). Anything else, a payload taking longer than
``--hang-s``, a peak RSS growth above ``--rss-bound-mb``, or a sentinel file created by the
malicious-pickle corpus is a failure.

Payload families: mutations of valid frames (bit flips, interesting integers written over length
fields, truncation, insertion, deletion, duplication, splicing), hand-built hostile payloads (huge
declared shapes/lengths, wrong dtypes, deep nesting, shared-reference bombs, decompression bombs,
the ``tensor`` shape string that the reference client passes to ``eval``; 10k-200k-deep tuples as
dict keys and set members, millions of empty containers and memo slots, memo bombs, empty arrays
with huge dimensions, EPS/PDF/TIFF/GIF/... in ``image`` values and JPEG frames, with a fake
Ghostscript on PATH that leaves a sentinel if it is ever run), random bytes, and a
corpus of malicious pickles (``os.system``, ``posix.system``, ``subprocess``, ``builtins.eval``/
``exec``/``open``/``getattr``/``__import__``, ``__reduce__`` chains, INST/OBJ/NEWOBJ/EXT opcodes,
object arrays, BUILD on allowed globals), each of which would create a sentinel file if executed.

The decoding runs in a child process with ``RLIMIT_AS`` at 4 GiB as a safety net for the machine;
peak RSS is read with ``resource.getrusage`` in that child.

Usage: python bench/reliability/fuzz_codecs.py [--n 100000] [--seed 1]
"""

from __future__ import annotations

import argparse
import base64
import copyreg
import json
import os
import pickle
import random
import resource
import signal
import struct
import sys
import tempfile
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rel import md_table, peak_rss_mb, run_child_json

DEFAULT_N = 100_000
RSS_BOUND_MB = 256.0
#: One decode's own peak RSS growth (the hostile payloads are up to 6 MB; before the limits, 4 MB of
#: pickle opcodes grew the process by 0.9-2 GB).
DECODE_RSS_BOUND_MB = 64.0
HANG_S = 5.0

# --------------------------------------------------------------------------------------- seeds


def _valid_objects() -> list[Any]:
    import numpy as np
    from genmanip_protocol.codec import JpegFrame

    rng = np.random.default_rng(0)
    img = rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)
    jpeg = JpegFrame.encode(img)
    obs = {
        "video.left_camera_view": img,
        "video.top_camera_view": jpeg,
        "state.joints": np.linspace(-1, 1, 12, dtype=np.float32),
        "state.gripper": np.array([0.04, 0.04], dtype=np.float64),
        "state.base": np.zeros(3, dtype=np.float32),
        "instruction": "put the peg into the hole",
        "timestep": 3,
        "reset": False,
        "episode_id": "ebench/run/task/a/000",
    }
    return [
        {"0": obs, "1": {"reset": True}},
        {"0": {"control_type": "joint_position", "action": [0.1] * 14, "is_rel": False}},
        {"metric": {"task/a": {"score": 0.5, "sr": 1.0}}, "done": [True, False]},
        [1, 2.5, "x", None, True, b"bytes", {"k": [np.int64(3), np.float32(1.5)]}],
        {"arr_i8": np.arange(10, dtype=">i8"), "b": np.array([True, False]), "c": np.ones(2, "c16")},
        obs,
    ]


def valid_seeds() -> dict[str, list[bytes]]:
    """Valid encodings per wire: msgpack frames, legacy pickles (tagged and protocol 0-5), JPEGs."""
    import numpy as np
    from genmanip_protocol.codec import LegacyCodec, MsgpackCodec, encode_jpeg

    objs = _valid_objects()
    mp, lg = MsgpackCodec(), LegacyCodec()
    seeds: dict[str, list[bytes]] = {"msgpack": [], "legacy": [], "jpeg": []}
    for o in objs:
        seeds["msgpack"].append(mp.encode(o))
        seeds["legacy"].append(lg.encode(o))
        seeds["legacy"].append(lg.encode(o, tag_arrays=False))
    # raw numpy pickles (what an old server might send): every protocol
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    for proto in range(0, 6):
        seeds["legacy"].append(pickle.dumps({"a": arr, "s": np.float64(2.0)}, protocol=proto))
    rng = np.random.default_rng(1)
    for h, w in ((8, 8), (16, 24), (33, 17)):
        seeds["jpeg"].append(encode_jpeg(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)))
    return seeds


# ----------------------------------------------------------------------------------- mutations

_INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 2**63 - 1, 2**64 - 1]


def mutate(data: bytes, rnd: random.Random, others: list[bytes]) -> bytes:
    b = bytearray(data)
    for _ in range(rnd.choice((1, 1, 1, 2, 3, 8))):
        op = rnd.randrange(9)
        n = len(b)
        if n == 0:
            b = bytearray(rnd.randbytes(rnd.randrange(1, 64)))
            continue
        if op == 0:  # bit flips
            for _ in range(rnd.randrange(1, 9)):
                i = rnd.randrange(n)
                b[i] ^= 1 << rnd.randrange(8)
        elif op == 1:  # interesting byte
            b[rnd.randrange(n)] = rnd.choice((0, 1, 0x7F, 0x80, 0xFE, 0xFF))
        elif op == 2:  # interesting integer over a (length?) field
            width, fmt = rnd.choice(((2, "<H"), (4, "<I"), (8, "<Q"), (4, ">I"), (8, ">Q")))
            if n >= width:
                v = rnd.choice(_INTERESTING) & ((1 << (8 * width)) - 1)
                i = rnd.randrange(n - width + 1)
                b[i : i + width] = struct.pack(fmt, v)
        elif op == 3:  # truncate
            b = b[: rnd.randrange(n)]
        elif op == 4:  # insert random bytes
            i = rnd.randrange(n + 1)
            b[i:i] = rnd.randbytes(rnd.randrange(1, 32))
        elif op == 5:  # delete a range
            i = rnd.randrange(n)
            del b[i : i + rnd.randrange(1, 64)]
        elif op == 6:  # duplicate a range
            i = rnd.randrange(n)
            j = min(n, i + rnd.randrange(1, 256))
            b[j:j] = b[i:j] * rnd.randrange(1, 4)
        elif op == 7:  # splice with another seed
            o = rnd.choice(others)
            b = b[: rnd.randrange(n)] + o[rnd.randrange(len(o)) :]
        else:  # overwrite a range with random bytes
            i = rnd.randrange(n)
            b[i : i + rnd.randrange(1, 16)] = rnd.randbytes(rnd.randrange(1, 16))
    return bytes(b)


# ------------------------------------------------------------------------------- hostile build


def _p(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=4)


def _tagged(dtype: Any, shape: Any, data: Any, tag: str = "numpy_array") -> dict[str, Any]:
    return {"type": tag, "dtype": dtype, "shape": shape, "data": data}


def _png_bomb(side: int, rgb: bool = False) -> bytes:
    """A valid PNG of side x side zero pixels: a few hundred KB that decode to side**2 (x3) bytes."""
    raw_row = b"\x00" + bytes(side * (3 if rgb else 1))
    comp = zlib.compressobj(9)
    idat = b"".join(comp.compress(raw_row) for _ in range(side)) + comp.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2 if rgb else 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _jpeg_huge_header(jpeg: bytes, h: int, w: int) -> bytes:
    """Rewrite a JPEG's SOF0 frame size (declares h x w pixels, data stays tiny)."""
    b = bytearray(jpeg)
    i = b.find(b"\xff\xc0")
    if i < 0:
        i = b.find(b"\xff\xc2")
    b[i + 5 : i + 9] = struct.pack(">HH", h, w)
    return bytes(b)


def hostile_payloads(jpeg: bytes) -> list[tuple[str, bytes]]:
    """Hand-built hostile payloads for both wires (label, body)."""
    import msgpack
    from genmanip_protocol.codec.msgpack_codec import MAGIC, MSGPACK_PROTOCOL_VERSION

    out: list[tuple[str, bytes]] = []
    b64 = base64.b64encode(bytes(16)).decode()
    huge = [2**40, 2**40]
    # --- legacy tagged trees
    for dt in ("object", "O", "V8", "<U10", "S4", "M8[s]", "m8", "float128x", "f" * 40, 3, None,
               "[('a','<i4')]", "(2,)i4"):
        out.append((f"tagged dtype {dt!r}", _p(_tagged(dt, [4], b64))))
    for shape in (huge, [-1], [2**64], [1.5], ["3"], [True], list(range(40)), "bad", None,
                  [0, 2**62, 2**62], [0, 2**63], [0, -1], [2**31] * 32, [0] * 33):
        out.append((f"tagged shape {str(shape)[:30]}", _p(_tagged("<f4", shape, b64))))
    out.append(("tagged data not base64", _p(_tagged("<f4", [4], "!!!!not base64$$$"))))
    out.append(("tagged data non-ascii", _p(_tagged("<f4", [4], "ééé"))))
    out.append(("tagged data int", _p(_tagged("<f4", [4], 12345))))
    out.append(("tagged missing fields", _p({"type": "numpy_array"})))
    out.append(("tagged jpeg huge shape", _p(_tagged("uint8", [*huge, 3], jpeg, "jpeg_bytes"))))
    out.append(("tagged jpeg wrong shape", _p(_tagged("uint8", [8, 8, 3], jpeg, "jpeg_bytes"))))
    out.append(("tagged jpeg str data", _p(_tagged("uint8", [8, 8, 3], "abc", "jpeg_bytes"))))
    out.append(("tagged jpeg bomb header", _p(_tagged("uint8", [65000, 65000, 3],
                                                       _jpeg_huge_header(jpeg, 65000, 65000),
                                                       "jpeg_bytes"))))
    for shape in ("__import__('os').system('touch SENTINEL')", "torch.Size([2**40, 2**40])",
                  "torch.Size([" + ",".join(["1"] * 40) + "])", "[" * 300, "torch.Size([99999999999999999999])",
                  "(1e9,)", "()"):
        out.append((f"tensor shape {shape[:30]}", _p(_tagged("torch.float32", shape, b64, "tensor"))))
    for dt in ("torch.bfloat16", "torch.complex32", "torch.qint8", "torch.float32"):
        out.append((f"tensor dtype {dt}", _p(_tagged(dt, [3], base64.b64encode(bytes(7)).decode(), "tensor"))))
    out.append(("image png bomb 20000^2", _p({"type": "image", "data": base64.b64encode(_png_bomb(20000)).decode()})))
    out.append(("image png bomb 12000^2 RGB (under PIL's own limit)",
                _p({"type": "image", "data": base64.b64encode(_png_bomb(12000, rgb=True)).decode()})))
    out.append(("image garbage", _p({"type": "image", "data": base64.b64encode(b"GIF89a" + bytes(30)).decode()})))
    # --- deep nesting and reference bombs (pickle)
    deep = b"\x80\x04" + b"]" * 100_000 + b"."  # EMPTY_LIST x 1e5 without appends: shallow, long
    out.append(("pickle 1e5 empty lists on stack", deep))
    nest = b"\x80\x04" + b"(" * 50_000 + b"l" * 50_000 + b"."  # MARK...LIST: 50k-deep list
    out.append(("pickle 50k-deep lists", nest))
    d: Any = []
    for _ in range(70):
        d = [d]
    out.append(("pickle 70-deep list (over MAX_DEPTH)", pickle.dumps(d)))
    lol: Any = ["x"] * 10
    for _ in range(40):
        lol = [lol] * 10
    out.append(("pickle billion laughs 10^40", pickle.dumps(lol)))
    rec: list[Any] = []
    rec.append(rec)
    out.append(("pickle self-referencing list", pickle.dumps(rec)))
    out.append(("pickle LONG_BINPUT 0x7fffffff", b"\x80\x04N" + b"r\xff\xff\xff\x7f" + b"."))
    out.append(("pickle LONG_BINGET missing", b"\x80\x04j\xff\xff\xff\x7f."))
    out.append(("pickle BINBYTES8 2^62", b"\x80\x05\x8e" + struct.pack("<Q", 2**62) + b"abc."))
    out.append(("pickle BYTEARRAY8 2^62", b"\x80\x05\x96" + struct.pack("<Q", 2**62) + b"abc."))
    out.append(("pickle BINUNICODE8 2^62", b"\x80\x04\x8d" + struct.pack("<Q", 2**62) + b"abc."))
    out.append(("pickle FRAME 2^62", b"\x80\x04\x95" + struct.pack("<Q", 2**62) + b"N."))
    out.append(("pickle LONG4 2^31", b"\x80\x04\x8b" + struct.pack("<i", 2**31 - 1) + b"ab."))
    out.append(("pickle LONG 10^6 digits", b"L" + b"9" * 1_000_000 + b"L\n."))
    out.append(("pickle INT huge text", b"I" + b"9" * 100_000 + b"\n."))
    out.append(("pickle empty", b""))
    out.append(("pickle STOP only", b"."))
    out.append(("pickle proto 9", b"\x80\x09N."))
    out.append(("pickle dict unhashable key", b"\x80\x04}](K\x01K\x02e\x94K\x03s."))
    out.append(("pickle set of bytearray", b"\x80\x05\x8f(\x96\x01\x00\x00\x00\x00\x00\x00\x00a\x90."))
    # numpy arrays with bad state / huge shapes through the allowed globals
    import numpy as np

    good = pickle.dumps(np.arange(4, dtype=np.int32), protocol=2)
    out.append(("numpy reconstruct huge shape", good.replace(b"K\x04\x85", b"J\xff\xff\xff\x7f\x85")))
    out.append(("numpy object dtype array", pickle.dumps(np.array([1, "x", None], dtype=object), protocol=2)))
    out.append(("numpy structured dtype", pickle.dumps(np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]), protocol=2)))
    out.append(("numpy scalar object", pickle.dumps(np.array([None], dtype=object)[0:1], protocol=4)))
    out.append(("numpy frombuffer proto5 huge",
                pickle.dumps(np.zeros((4, 4), np.float64), protocol=5).replace(b"K\x04K\x04", b"J\xff\xff\xff\x7fK\x04")))
    # --- msgpack frames
    def frame(header: bytes, table: list[tuple[int, int]], tail: bytes = b"") -> bytes:
        pre = struct.pack("<4sBBHII", MAGIC, MSGPACK_PROTOCOL_VERSION, 0, 0, len(table), len(header))
        return pre + b"".join(struct.pack("<QQ", o, ln) for o, ln in table) + header + tail

    def ext(code: int, ref: Any) -> bytes:
        return msgpack.packb(msgpack.ExtType(code, msgpack.packb(ref)))

    out.append(("msgpack 2^20 buffers", frame(b"\xc0", [])[:8] + struct.pack("<II", 2**20, 1) + b"\xc0"))
    out.append(("msgpack buffer past end", frame(ext(1, ["<f4", [4], 0]), [(2**62, 16)])))
    out.append(("msgpack buffer overflow sum", frame(ext(1, ["<f4", [4], 0]), [(40, 2**64 - 1)])))
    hdr = ext(1, ["<f4", [2**40, 2**40], 0])
    out.append(("msgpack huge shape", frame(hdr, [(16 + 16 + len(hdr), 16)], bytes(16))))
    hdr = ext(1, ["<f4", [0, 2**63], 0])
    out.append(("msgpack zero huge shape", frame(hdr, [(16 + 16 + len(hdr), 0)])))
    for dt in ("|O", "|V8", "<U2", "S1", "M8[s]", "f" * 9, 5):
        hdr = ext(1, [dt, [1], 0])
        out.append((f"msgpack dtype {dt!r}", frame(hdr, [(32 + len(hdr), 8)], bytes(8))))
    hdr = ext(1, ["<f4", [1], 5])
    out.append(("msgpack buffer index out of range", frame(hdr, [(32 + len(hdr), 4)], bytes(4))))
    out.append(("msgpack unknown ext", frame(ext(9, [1]), [])))
    out.append(("msgpack jpeg bad ref", frame(ext(2, "x"), [])))
    out.append(("msgpack jpeg bomb", frame(ext(2, [[65000, 65000, 3], _jpeg_huge_header(jpeg, 65000, 65000)]), [])))
    out.append(("msgpack jpeg shape mismatch", frame(ext(2, [[9, 9, 3], jpeg]), [])))
    out.append(("msgpack 100k-deep arrays", frame(b"\x91" * 100_000 + b"\xc0", [])))
    out.append(("msgpack map32 2^32-1 entries", frame(b"\xdf\xff\xff\xff\xff", [])))
    out.append(("msgpack array32 2^32-1", frame(b"\xdd\xff\xff\xff\xff", [])))
    out.append(("msgpack bin32 2^32-1", frame(b"\xc6\xff\xff\xff\xff", [])))
    out.append(("msgpack map with list key", frame(msgpack.packb({1: 2})[:1] + b"\x91\x01\x02", [])))
    out.append(("msgpack header length past end", frame(b"\xc0", [])[:12] + struct.pack("<I", 2**28) + b"\xc0"))
    out.append(("msgpack wrong version", b"GMPK\x07" + bytes(11)))
    out.append(("msgpack trailing data", frame(b"\xc0\xc0", [])))
    out += hostile_limits(frame, ext)
    out += hostile_images(jpeg, frame, ext)
    return out


# Payloads of the "Hostile input, for real" classes: C recursion on deep hashables (SIGSEGV before),
# millions of tiny containers and memo bombs (1.4-2 GB before), empty arrays with huge dimensions
# (hang/MemoryError/ValueError before), foreign image formats (Ghostscript ran before).


def _binget(i: int) -> bytes:
    return b"j" + struct.pack("<I", i)


def _binput(i: int) -> bytes:
    return b"r" + struct.pack("<I", i)


def _numpy_pickle(shape: list[int], protocol: int) -> bytes:
    import numpy as np

    data = pickle.dumps(np.zeros((0, 7, 9), dtype=np.float32), protocol=protocol)
    if data[2:3] == b"\x95":  # drop the FRAME: its length would no longer match
        data = data[:2] + data[11:]
    enc = b"".join(b"K" + bytes([d]) if d < 256 else b"\x8a\x08" + struct.pack("<q", d) for d in shape)
    return data.replace(b"K\x00K\x07K\x09\x87", enc + {1: b"\x85", 2: b"\x86", 3: b"\x87"}[len(shape)])


def _memo_bomb(kind: str, size: int, copies: int) -> bytes:
    big, call, args = {
        "bytearray": (b"\x8e" + struct.pack("<Q", size) + bytes(size),
                      b"\x8c\x08builtins\x8c\x09bytearray\x93", b"\x85"),
        "bytes": (b"\x96" + struct.pack("<Q", size) + bytes(size),
                  b"\x8c\x08builtins\x8c\x05bytes\x93", b"\x85"),
        "codecs": (b"\x8d" + struct.pack("<Q", size) + b"a" * size,
                   b"\x8c\x07_codecs\x8c\x06encode\x93", b"\x8c\x06latin1\x86"),
        "set": (b"](" + b"".join(b"J" + struct.pack("<i", i) for i in range(size)) + b"e",
                b"\x8c\x08builtins\x8c\x03set\x93", b"\x85"),
    }[kind]
    body = [b"\x80\x04", big, _binput(0), b"0", call, _binput(1), b"0("]
    body += [_binget(1) + _binget(0) + args + b"R"] * copies
    return b"".join(body) + b"l."


def hostile_limits(frame: Any, ext: Any) -> list[tuple[str, bytes]]:
    """Depth, count, copy and shape bombs for both wires (label, body)."""
    out: list[tuple[str, bytes]] = []
    p4 = b"\x80\x04"
    for n in (10_000, 100_000, 200_000):
        out.append((f"pickle {n}-deep tuple as dict key", p4 + b"}N" + b"\x85" * n + b"Ns."))
        out.append((f"pickle {n}-deep tuple as set member", p4 + b"\x8f(N" + b"\x85" * n + b"\x90."))
        out.append((f"pickle {n}-deep tuple in a frozenset", p4 + b"(N" + b"\x85" * n + b"\x91."))
        out.append((f"pickle {n}-deep tuple over a list as key", p4 + b"}]" + b"\x85" * n + b"Ns."))
        out.append((f"pickle {n} MARKs + TUPLEs", p4 + b"(" * n + b"t" * n + b"."))
    chain = [p4, b"\x8c\x08builtins\x8c\x09frozenset\x93", _binput(0), b"N", _binput(1), b"0"]
    for i in range(1, 20_001):
        chain += [_binget(0), b"]", _binget(i), b"a\x85R", _binput(i + 1), b"0"]
    out.append(("pickle 20k-deep frozenset(frozenset(...)) as key",
                b"".join([*chain, b"}", _binget(20_001), b"Ns."])))
    lists = [p4, b"]", _binput(0)]
    for i in range(100_000):
        lists += [_binget(i), b"]", _binput(i + 1), b"a0"]
    out.append(("pickle 100k-deep list chain through the memo", b"".join([*lists, _binget(0), b"."])))
    for op, what in ((b"]", "EMPTY_LIST"), (b"}", "EMPTY_DICT"), (b"\x8f", "EMPTY_SET"), (b"(", "MARK"),
                     (b"N\x85", "TUPLE1"), (b"(\x91", "MARK+FROZENSET"), (b"(l", "MARK+LIST"),
                     (b"N\x94", "MEMOIZE")):  # fmt: skip
        n = 4_000_000 // len(op)
        out.append((f"pickle {n} x {what}", p4 + op * n + b"N."))
    out.append(("pickle 4M empty lists in one LIST", p4 + b"(" + b"]" * 4_000_000 + b"l."))
    out.append(("pickle 4M DUPs appended", p4 + b"](N" + b"2" * 4_000_000 + b"e."))
    for kind, size in (("bytearray", 1 << 20), ("bytes", 1 << 20), ("codecs", 1 << 20), ("set", 100_000)):
        out.append((f"pickle memo bomb: 2000 x {kind}(<memo 0> of {size})", _memo_bomb(kind, size, 2000)))
    # msgpack floods: a header of n empty arrays/maps, deep nesting, tiny strings
    for item, what in ((b"\x90", "fixarray 0x90"), (b"\x80", "fixmap 0x80"), (b"\xa2ab", "fixstr 'ab'")):
        n = 4_000_000 // len(item)
        out.append((f"msgpack {n} x {what}", frame(b"\xdd" + struct.pack(">I", n) + item * n, [])))
    out.append(("msgpack 600k empty arrays (under the value cap)",
                frame(b"\xdd" + struct.pack(">I", 600_000) + b"\x90" * 600_000, [])))
    out.append(("msgpack map32 of 1M empty arrays", frame(
        b"\xdf" + struct.pack(">I", 1_000_000)
        + b"".join(b"\xce" + struct.pack(">I", i) + b"\x90" for i in range(1_000_000)), [])))
    out.append(("msgpack 200k-deep arrays", frame(b"\x91" * 200_000 + b"\xc0", [])))
    # arrays without data but with huge dimensions
    b64 = ""
    for shape in ([0, 2**40], [2**31, 0, 2**31], [2**20, 0], [0, 2**62, 2**62], [2**17, 0, 5]):
        out.append((f"tagged empty array {shape}", _p(_tagged("float32", shape, b64))))
        tshape = "torch.Size([" + ", ".join(map(str, shape)) + "])"
        out.append((f"tensor empty {tshape}", _p(_tagged("torch.float32", tshape, b64, "tensor"))))
        hdr = ext(1, ["<f4", shape, 0])
        out.append((f"msgpack empty array {shape}", frame(hdr, [(32 + len(hdr), 0)])))
        for proto in (2, 5):
            out.append((f"numpy pickle p{proto} empty {shape}", _numpy_pickle(shape, proto)))
    for shape in ([65536, 1, 3], [2**31, 2**31, 3]):
        out.append((f"tagged jpeg shape {shape}", _p(_tagged("uint8", shape, b"\xff\xd8\xff\xe0", "jpeg_bytes"))))
    return out


_EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\nnewpath 0 0 moveto 8 8 lineto stroke showpage\n"


def foreign_images() -> list[tuple[str, bytes]]:
    """Images in formats no decoder may hand to a library (Pillow's EPS plugin runs Ghostscript)."""
    import io

    out = [
        ("EPS", _EPS),
        ("PostScript", b"%!PS-Adobe-3.0\nshowpage\n"),
        ("DOS EPS", b"\xc5\xd0\xd3\xc6" + struct.pack("<IIIIII", 30, len(_EPS), 0, 0, 0, 0) + b"\xff\xff" + _EPS),
        ("PDF", b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\n%%EOF\n"),
        ("SVG", b'<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"/>'),
        ("PSD", b"8BPS\x00\x01" + bytes(6) + struct.pack(">HIIHH", 3, 8, 8, 8, 3) + bytes(64)),
        ("PNG with EPS inside", b"\x89PNG\r\n\x1a\n" + _EPS),
        ("JPEG magic then EPS", b"\xff\xd8\xff" + _EPS),
    ]
    try:
        import numpy as np
        import PIL.Image

        img = PIL.Image.fromarray(np.full((8, 8, 3), 200, dtype=np.uint8))
        for fmt in ("TIFF", "GIF", "BMP", "ICO", "WEBP", "PCX", "TGA"):
            buf = io.BytesIO()
            try:
                img.save(buf, format=fmt)
            except Exception:  # a Pillow build without that encoder: skip that format
                continue
            out.append((fmt, buf.getvalue()))
    except ImportError:
        pass
    return out


def hostile_images(jpeg: bytes, frame: Any, ext: Any) -> list[tuple[str, bytes]]:
    """Each foreign format as an ``image`` value, a ``jpeg_bytes`` frame and a msgpack JPEG ext."""
    out: list[tuple[str, bytes]] = []
    for name, data in foreign_images():
        out.append((f"image tag {name}", _p({"type": "image", "data": base64.b64encode(data).decode()})))
        out.append((f"jpeg_bytes tag {name}", _p({"video.x_view": _tagged("uint8", [8, 8, 3], data, "jpeg_bytes")})))
        out.append((f"msgpack jpeg {name}", frame(ext(2, [[8, 8, 3], data]), [])))
        out.append((f"raw {name}", data))  # straight into decode_jpeg (every payload is)
    return out


# -------------------------------------------------------------------------- malicious pickles


class _Reduce:
    def __init__(self, fn: Any, args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> Any:
        return (self.fn, self.args)


def _glob(module: str, name: str, proto: int = 2) -> bytes:
    """A GLOBAL opcode (protocol < 4) or STACK_GLOBAL (>= 4) referencing module.name."""
    if proto >= 4:
        m, n = module.encode(), name.encode()
        return b"\x8c" + bytes([len(m)]) + m + b"\x94\x8c" + bytes([len(n)]) + n + b"\x94\x93"
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def malicious_pickles(sentinel_dir: Path) -> list[tuple[str, bytes]]:
    """Pickles that create a file in sentinel_dir if anything in them is executed."""
    import builtins
    import subprocess

    out: list[tuple[str, bytes]] = []
    k = 0

    def s() -> str:
        nonlocal k
        k += 1
        return str(sentinel_dir / f"sentinel_{k}")

    sh = "touch {}".format
    for proto in (0, 2, 4, 5):
        out.append((f"os.system p{proto}", pickle.dumps(_Reduce(os.system, (sh(s()),)), protocol=proto)))
        out.append((f"subprocess.Popen p{proto}", pickle.dumps(_Reduce(subprocess.Popen, (["touch", s()],)), protocol=proto)))
        out.append((f"subprocess.call p{proto}", pickle.dumps(_Reduce(subprocess.call, (["touch", s()],)), protocol=proto)))
        out.append((f"builtins.eval p{proto}", pickle.dumps(_Reduce(builtins.eval, (f"open({s()!r},'w')",)), protocol=proto)))
        out.append((f"builtins.exec p{proto}", pickle.dumps(_Reduce(builtins.exec, (f"open({s()!r},'w')",)), protocol=proto)))
        out.append((f"builtins.open p{proto}", pickle.dumps(_Reduce(builtins.open, (s(), "w")), protocol=proto)))
        out.append((f"os.mkdir p{proto}", pickle.dumps(_Reduce(os.mkdir, (s(),)), protocol=proto)))
        # a reduce chain: getattr(__import__('os'), 'system')('touch ...')
        inner = _Reduce(builtins.__import__, ("os",))
        out.append((f"__import__ p{proto}", pickle.dumps(inner, protocol=proto)))
        # nested inside an otherwise valid reply
        out.append((f"nested in reply p{proto}", pickle.dumps({"0": {"obs": [1, _Reduce(os.system, (sh(s()),))]}}, protocol=proto)))
    # raw opcode chains that pickle.dumps cannot produce from a class
    for module, name in (("posix", "system"), ("os", "system"), ("nt", "system"), ("builtins", "eval"),
                         ("__builtin__", "eval"), ("subprocess", "getoutput"), ("os", "popen"),
                         ("pty", "spawn"), ("commands", "getoutput"), ("numpy.testing._private.utils", "runstring"),
                         ("numpy", "load"), ("pickle", "loads"), ("_pickle", "loads"), ("io", "open"),
                         ("shutil", "rmtree"), ("runpy", "_run_code"), ("code", "InteractiveInterpreter"),
                         ("timeit", "timeit"), ("ctypes", "CDLL"), ("importlib", "import_module"),
                         ("operator", "methodcaller"), ("functools", "partial"), ("copyreg", "_reconstructor"),
                         ("numpy", "ndarray.__reduce_ex__"), ("builtins", "getattr"), ("builtins", "__import__")):
        cmd = sh(s())
        arg = ("S" + repr(cmd) + "\n").encode()
        for proto in (0, 2, 4):
            if proto == 0:
                body = _glob(module, name, 0) + b"(" + arg + b"tR."
                inst = b"(" + arg + b"i" + module.encode() + b"\n" + name.encode() + b"\n."
                out.append((f"INST {module}.{name}", inst))
            else:
                body = bytes([0x80, proto]) + _glob(module, name, proto) + b"\x8c" + bytes([len(cmd)]) + cmd.encode() + b"\x85R."
            out.append((f"GLOBAL {module}.{name} p{proto}", body))
        # OBJ and NEWOBJ with the forbidden class
        out.append((f"OBJ {module}.{name}", b"\x80\x02(" + _glob(module, name) + b"\x8c" + bytes([len(cmd)]) + cmd.encode() + b"o."))
        out.append((f"NEWOBJ {module}.{name}", b"\x80\x02" + _glob(module, name) + b")\x81."))
    # getattr chain through an allowed global: numpy.dtype.__class__.__init__.__globals__ ...
    out.append(("BUILD on allowed global", b"\x80\x02" + _glob("numpy", "dtype") + b"}X\x08\x00\x00\x00__call__" + _glob("os", "system") + b"s" + b"b."))
    out.append(("setstate dict on allowed global", b"\x80\x02" + _glob("builtins", "set") + b"(X\x03\x00\x00\x00abcX\x01\x00\x00\x00bdb."))
    out.append(("reduce allowed global with forbidden arg", b"\x80\x02" + _glob("numpy.core.multiarray", "_reconstruct") + b"(" + _glob("os", "system") + b"K\x00\x85C\x01btR."))
    # EXT opcodes through the copyreg extension registry
    # (the child registers code 0x7FFF00 -> os.system in copyreg while it decodes this corpus)
    out.append(("EXT4 os.system", b"\x80\x02\x84\x00\xff\x7f\x00" + b"X" + struct.pack("<I", 9) + b"touch /x\x85R."))
    out.append(("EXT1 unknown code", b"\x80\x02\x82\x01N\x85R."))
    out.append(("persistent id", b"\x80\x02X\x03\x00\x00\x00abcQ."))
    out.append(("persistent id p0", b"Pabc\n."))
    return out


# ------------------------------------------------------------------------------------- driver


class _Hang(BaseException):
    pass


def _vm(field: str) -> float | None:
    """VmRSS/VmHWM of this process in MiB (Linux), or None."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS, so one decode's own peak can be
    read afterwards; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _consume(value: Any, depth: int = 0) -> None:
    """Touch everything a decoded value holds (lazy JPEG decodes included)."""
    import numpy as np
    from genmanip_protocol.codec import JpegFrame, Observation

    if depth > 200:
        return
    if isinstance(value, Observation):
        value.decode_all()
        for v in value.values():
            _consume(v, depth + 1)
    elif isinstance(value, dict):
        for k, v in value.items():
            _consume(k, depth + 1)
            _consume(v, depth + 1)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for v in value:
            _consume(v, depth + 1)
    elif isinstance(value, JpegFrame):
        value.decode()
    elif isinstance(value, np.ndarray):
        if value.dtype.kind in "biufc":
            value.sum()


def child(n: int, seed: int, hang_s: float, sentinel_dir: Path, findings_path: Path | None) -> dict[str, Any]:
    from genmanip_protocol.codec import LegacyCodec, MsgpackCodec, decode_jpeg, safe_loads
    from genmanip_protocol.errors import DecodeError, UnsafePayloadError

    # A fake Ghostscript first on PATH: if any decoder hands data to it (Pillow's EPS plugin runs
    # `gs --version`, then gs on the data), it leaves a sentinel file.
    fake_bin = sentinel_dir.parent / "fakebin"
    fake_bin.mkdir(exist_ok=True)
    for exe in ("gs", "gswin32c", "gswin64c"):
        script = fake_bin / exe
        script.write_text(f"#!/bin/sh\ntouch {sentinel_dir / 'ghostscript_ran'}\nexit 0\n")
        script.chmod(0o755)
    os.environ["PATH"] = f"{fake_bin}{os.pathsep}{os.environ.get('PATH', '')}"

    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = 4 << 30
    if hard == resource.RLIM_INFINITY or hard > limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))

    seeds = valid_seeds()
    all_seeds = [s for v in seeds.values() for s in v]
    hostile = hostile_payloads(seeds["jpeg"][0])
    malicious = malicious_pickles(sentinel_dir)
    mp, lg = MsgpackCodec(), LegacyCodec()
    decoders: dict[str, Any] = {
        "safe_loads": safe_loads,
        "LegacyCodec.decode": lg.decode,
        "MsgpackCodec.decode": mp.decode,
        "decode_jpeg": decode_jpeg,
    }

    # Warm up every decoder on valid input so the RSS baseline includes the libraries' own state.
    for s in seeds["msgpack"]:
        _consume(mp.decode(s))
    for s in seeds["legacy"]:
        _consume(lg.decode(s))
    for s in seeds["jpeg"]:
        decode_jpeg(s)
    baseline = peak_rss_mb()
    per_payload = _reset_peak()
    if per_payload:  # measure from the RSS now, not from the peak the payload construction left
        baseline = _vm("VmRSS") or baseline
    worst_rss = (0.0, "")
    highest = baseline

    def on_alarm(signum: int, frame: Any) -> None:
        raise _Hang()

    signal.signal(signal.SIGALRM, on_alarm)
    rnd = random.Random(seed)
    outcomes: Counter[str] = Counter()
    families: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    unsafe_refused = 0
    malicious_total = 0
    slowest = (0.0, "")
    t_start = time.monotonic()

    def run_one(label: str, payload: bytes, names: tuple[str, ...]) -> None:
        nonlocal slowest, worst_rss, highest
        for name in names:
            fn = decoders[name]
            before = _vm("VmRSS") if per_payload and _reset_peak() else None
            t0 = time.perf_counter()
            signal.setitimer(signal.ITIMER_REAL, hang_s)
            try:
                try:
                    _consume(fn(payload))
                    outcome = "ok"
                except UnsafePayloadError:
                    outcome = "UnsafePayloadError"
                except DecodeError as exc:
                    outcome = "DecodeError"
                    if "needs more memory" in str(exc):
                        failures.append({"label": label, "decoder": name, "error": f"MemoryError: {exc}"[:300],
                                         "payload_head": payload[:80].hex()})
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except _Hang:
                outcome = "HANG"
                failures.append({"label": label, "decoder": name, "error": f"no result within {hang_s} s",
                                 "payload_head": payload[:80].hex()})
            except Exception as exc:  # the finding: an untyped error escaped a decoder
                outcome = type(exc).__name__
                failures.append({"label": label, "decoder": name, "error": f"{type(exc).__name__}: {exc}"[:300],
                                 "payload_head": payload[:80].hex(), "size": len(payload)})
            dt = time.perf_counter() - t0
            if dt > slowest[0]:
                slowest = (dt, f"{label} / {name}")
            peak = _vm("VmHWM") if before is not None else None
            if peak is not None and before is not None:
                highest = max(highest, peak)
                if peak - before > worst_rss[0]:
                    worst_rss = (peak - before, f"{label} / {name}")
            outcomes[f"{name}: {outcome}"] += 1

    count = 0
    # 1. the fixed corpora (always, in full)
    for label, payload in hostile:
        run_one(label, payload, tuple(decoders))
        families["hostile"] += 1
        count += 1
    # An extension code registered the way a library might: EXT opcodes must still be refused.
    copyreg.add_extension("os", "system", 0x7FFF00)
    try:
        for label, payload in malicious:
            keys = ("safe_loads: ok", "LegacyCodec.decode: ok",
                    "safe_loads: UnsafePayloadError", "LegacyCodec.decode: UnsafePayloadError")
            before = [outcomes[k] for k in keys]
            run_one(label, payload, ("safe_loads", "LegacyCodec.decode"))
            delta = [outcomes[k] - b for k, b in zip(keys, before, strict=True)]
            malicious_total += 1
            unsafe_refused += delta[2] == 1 and delta[3] == 1
            if delta[0] or delta[1]:  # a malicious pickle must never decode to a value
                failures.append({"label": label, "decoder": "safe_loads", "error": "malicious pickle decoded"})
            families["malicious"] += 1
            count += 1
    finally:
        copyreg.remove_extension("os", "system", 0x7FFF00)
    # 2. generated payloads up to n
    wires = ("msgpack", "legacy", "jpeg")
    while count < n:
        r = rnd.random()
        if r < 0.85:
            wire = rnd.choice(wires)
            base = rnd.choice(seeds[wire])
            payload = mutate(base, rnd, all_seeds)
            fam = f"mutated {wire}"
        elif r < 0.95:
            label, base = rnd.choice(hostile + malicious)
            payload = mutate(base, rnd, all_seeds)
            fam = "mutated hostile/malicious"
        else:
            payload = rnd.randbytes(rnd.randrange(0, 512))
            if rnd.random() < 0.5:  # make it past the magic/proto checks
                payload = rnd.choice((b"GMPK\x01\x00\x00\x00", b"\x80\x04", b"\x80\x05", b"\xff\xd8\xff\xe0")) + payload
            fam = "random bytes"
        # every decoder sees every payload: the wire does not tell the truth about itself
        run_one(fam, payload, tuple(decoders))
        families[fam] += 1
        count += 1
    elapsed = time.monotonic() - t_start
    sentinels = sorted(p.name for p in sentinel_dir.iterdir())
    if findings_path is not None:
        findings_path.write_text(json.dumps(failures[:200], indent=1))
    return {
        "payloads": count,
        "decoder_calls": sum(outcomes.values()),
        "families": dict(families),
        "outcomes": dict(sorted(outcomes.items())),
        "failures": len(failures),
        "failure_samples": failures[:10],
        "malicious": malicious_total,
        "malicious_refused_unsafe": unsafe_refused,
        "sentinels_created": sentinels,
        "baseline_rss_mb": round(baseline, 1),
        "peak_rss_mb": round(highest if per_payload else peak_rss_mb(), 1),
        "rss_growth_mb": round((highest if per_payload else peak_rss_mb()) - baseline, 1),
        # one decode's own peak over the RSS it started from (VmHWM reset before each decode)
        "max_decode_rss_growth_mb": round(worst_rss[0], 1) if per_payload else None,
        "max_decode_rss_growth": worst_rss[1],
        "slowest_s": round(slowest[0], 3),
        "slowest": slowest[1],
        "seconds": round(elapsed, 1),
    }


def run(n: int = DEFAULT_N, seed: int = 1, timeout: float = 3600.0) -> dict[str, Any]:
    """Fuzz in a child process; return its summary dict."""
    with tempfile.TemporaryDirectory(prefix="gmp-fuzz-") as tmp:
        sentinel_dir = Path(tmp) / "sentinels"
        sentinel_dir.mkdir()
        res = run_child_json(Path(__file__), ["--n", str(n), "--seed", str(seed), "--sentinel-dir",
                                              str(sentinel_dir)], timeout=timeout)
        # checked again from outside: the child could lie only if it were compromised
        res["sentinels_seen_by_parent"] = sorted(p.name for p in sentinel_dir.iterdir())
        return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=DEFAULT_N)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hang-s", type=float, default=HANG_S)
    ap.add_argument("--rss-bound-mb", type=float, default=RSS_BOUND_MB)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sentinel-dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--findings", type=Path, help="write failing payload samples here (JSON)")
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.n, a.seed, a.hang_s, a.sentinel_dir, a.findings)))
        return 0
    res = run(a.n, a.seed)
    ok = (not res["failures"] and not res["sentinels_seen_by_parent"]
          and res["rss_growth_mb"] <= a.rss_bound_mb
          and (res["max_decode_rss_growth_mb"] or 0) <= DECODE_RSS_BOUND_MB)
    print(f"### Codec fuzzing: {res['payloads']} payloads, {res['decoder_calls']} decoder calls, "
          f"seed {a.seed}, {res['seconds']} s\n")
    print(md_table(["payload family", "count"], [[k, v] for k, v in sorted(res["families"].items())]))
    print()
    print(md_table(["decoder: outcome", "calls"], [[k, v] for k, v in res["outcomes"].items()]))
    print()
    print(md_table(["figure", "value"], [
        ["untyped exceptions / hangs", res["failures"]],
        ["malicious pickles refused as UnsafePayloadError", f"{res['malicious_refused_unsafe']} / {res['malicious']}"],
        ["sentinel files created", len(res["sentinels_seen_by_parent"])],
        ["peak RSS growth over warm baseline (MiB)", f"{res['rss_growth_mb']} (bound {a.rss_bound_mb})"],
        ["largest peak RSS growth of one decode (MiB)",
         f"{res['max_decode_rss_growth_mb']} ({res['max_decode_rss_growth']}; bound {DECODE_RSS_BOUND_MB})"],
        ["baseline / peak RSS (MiB)", f"{res['baseline_rss_mb']} / {res['peak_rss_mb']}"],
        ["slowest single decode (s)", f"{res['slowest_s']} ({res['slowest']})"],
        ["verdict", "PASS" if ok else "FAIL"],
    ]))
    if res["failure_samples"]:
        print("\nfailure samples:\n" + json.dumps(res["failure_samples"], indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
