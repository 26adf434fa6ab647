"""Hostile payload builders and a child-process runner for the decoder-limit tests.

Every builder writes its payload byte by byte (no pickler or packer would produce these), so the
tests do not depend on the encoders. :func:`run_child` decodes one payload in a fresh interpreter
under ``RLIMIT_AS`` and reports the outcome, the peak RSS growth and the time: a regression that
crashes (a C stack overflow is SIGSEGV) or balloons shows up as a failed assertion, not as a dead
test run.
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "FORMATS",
    "HOSTILE_IMAGES",
    "frame",
    "run_child",
]

HERE = Path(__file__).resolve().parent

# -- pickle -------------------------------------------------------------------------------------

P4 = b"\x80\x04"


def _binget(i: int) -> bytes:
    return b"j" + struct.pack("<I", i)  # LONG_BINGET


def _binput(i: int) -> bytes:
    return b"r" + struct.pack("<I", i)  # LONG_BINPUT


def deep_tuple_key(n: int) -> bytes:
    """{((((None,),),)...): None}: hashing the key recurses n levels in C."""
    return P4 + b"}N" + b"\x85" * n + b"Ns."


def deep_tuple_set_member(n: int) -> bytes:
    """A set holding an n-deep tuple (ADDITEMS hashes it)."""
    return P4 + b"\x8f(N" + b"\x85" * n + b"\x90."


def deep_tuple_frozenset_member(n: int) -> bytes:
    """frozenset({n-deep tuple}) through the FROZENSET opcode."""
    return P4 + b"(N" + b"\x85" * n + b"\x91."


def deep_tuple_of_list_key(n: int) -> bytes:
    """A tuple chain with a list at the bottom as a dict key: hashing recurses before it fails."""
    return P4 + b"}]" + b"\x85" * n + b"Ns."


def deep_frozenset_reduce(n: int) -> bytes:
    """frozenset([frozenset([...])]) n deep through builtins.frozenset calls and the memo."""
    out = [P4, b"\x8c\x08builtins\x8c\x09frozenset\x93", _binput(0), b"N", _binput(1), b"0"]
    for i in range(1, n + 1):
        out += [_binget(0), b"]", _binget(i), b"a\x85R", _binput(i + 1), b"0"]
    out += [_binget(n + 1), b"."]
    return b"".join(out)


def deep_marks(n: int) -> bytes:
    """n MARKs then n TUPLEs: an n-deep tuple through the metastack."""
    return P4 + b"(" * n + b"t" * n + b"."


def deep_list_chain(n: int) -> bytes:
    """[[[...]]] n deep, each list appended into the previous one through the memo."""
    out = [P4, b"]", _binput(0)]
    for i in range(n):
        out += [_binget(i), b"]", _binput(i + 1), b"a0"]
    out += [_binget(0), b"."]
    return b"".join(out)


def repeated(op: str, n: int) -> bytes:
    """A small opcode repeated n times, then None as the result (the stack keeps them all)."""
    return P4 + bytes.fromhex(op) * n + b"N."


def empties_in_list(op: str, n: int) -> bytes:
    """[op, op, ...]: n containers collected by one LIST."""
    return P4 + b"(" + bytes.fromhex(op) * n + b"l."


def dup_refs(n: int) -> bytes:
    """A list of n references to one None (APPENDS of n DUPs)."""
    return P4 + b"](N" + b"2" * n + b"e."


def memo_bomb(kind: str, size: int, copies: int) -> bytes:
    """One memoized object of ``size`` (bytes, str or list) copied ``copies`` times by an
    allow-listed call: bytearray(x), bytes(x), _codecs.encode(x, 'latin1'), set(x)."""
    if kind == "bytearray":
        big = b"\x8e" + struct.pack("<Q", size) + bytes(size)
        call = b"\x8c\x08builtins\x8c\x09bytearray\x93"
        args = _binget(0) + b"\x85"
    elif kind == "bytes":
        big = b"\x96" + struct.pack("<Q", size) + bytes(size)  # BYTEARRAY8: bytes(bytearray)
        call = b"\x8c\x08builtins\x8c\x05bytes\x93"
        args = _binget(0) + b"\x85"
    elif kind == "codecs":
        big = b"\x8d" + struct.pack("<Q", size) + b"a" * size
        call = b"\x8c\x07_codecs\x8c\x06encode\x93"
        args = _binget(0) + b"\x8c\x06latin1\x86"
    elif kind == "set":
        big = b"](" + b"".join(b"J" + struct.pack("<i", i) for i in range(size)) + b"e"
        call = b"\x8c\x08builtins\x8c\x03set\x93"
        args = _binget(0) + b"\x85"
    else:
        raise ValueError(kind)
    body = [P4, big, _binput(0), b"0", call, _binput(1), b"0", b"("]
    body += [_binget(1) + args + b"R"] * copies
    body += [b"l."]
    return b"".join(body)


def numpy_pickle(shape: list[int], protocol: int) -> bytes:
    """A real numpy pickle of a (0, 7, 9) float32 array with its shape tuple replaced."""
    import numpy as np

    data = pickle.dumps(np.zeros((0, 7, 9), dtype=np.float32), protocol=protocol)
    if data[2:3] == b"\x95":  # drop the FRAME (its length would no longer match); optional
        data = data[:2] + data[11:]
    old = b"K\x00K\x07K\x09\x87"
    assert old in data, data
    enc = b"".join(
        b"K" + bytes([d]) if d < 256 else b"\x8a\x08" + struct.pack("<q", d) for d in shape
    )
    op = {1: b"\x85", 2: b"\x86", 3: b"\x87"}[len(shape)]
    return data.replace(old, enc + op)


def tagged(tag: str, **fields: Any) -> bytes:
    """A legacy reply holding one tagged value under ``"v"``."""
    if "data_b64" in fields:
        fields["data"] = base64.b64encode(fields.pop("data_b64")).decode()
    return pickle.dumps({"v": {"type": tag, **fields}}, protocol=4)


# -- msgpack ------------------------------------------------------------------------------------


def frame(header: bytes, buffers: list[bytes] = ()) -> bytes:  # type: ignore[assignment]
    """A genmanip msgpack frame around a hand-written header (buffers appended, 64-aligned)."""
    n = len(buffers)
    pos = 16 + 16 * n + len(header)
    table, body = [], b""
    for b in buffers:
        pad = (-pos) % 64
        body += bytes(pad)
        pos += pad
        table.append((pos, len(b)))
        body += b
        pos += len(b)
    pre = struct.pack("<4sBBHII", b"GMPK", 1, 0, 0, n, len(header))
    return pre + b"".join(struct.pack("<QQ", o, ln) for o, ln in table) + header + body


def mp_array32(item: str, n: int) -> bytes:
    """A msgpack array32 of n copies of one small encoded item (0x90 = [], 0x80 = {})."""
    return b"\xdd" + struct.pack(">I", n) + bytes.fromhex(item) * n


def mp_map32_empty_values(n: int) -> bytes:
    """A map32 of n int keys, each to an empty list."""
    return (
        b"\xdf"
        + struct.pack(">I", n)
        + b"".join(b"\xce" + struct.pack(">I", i) + b"\x90" for i in range(n))
    )


def mp_frame_of(kind: str, *args: Any) -> bytes:
    """A frame whose header is one of the builders above."""
    return frame(globals()[kind](*args))


def mp_deep(n: int) -> bytes:
    return b"\x91" * n + b"\xc0"


def mp_array_ref(shape: list[int], nbytes: int = 0) -> bytes:
    import msgpack

    ref = msgpack.ExtType(1, msgpack.packb(["<f4", shape, 0]))
    return frame(msgpack.packb({"a": ref}), [bytes(nbytes)])


def mp_jpeg_ref(data: bytes, shape: list[int]) -> bytes:
    import msgpack

    return frame(msgpack.packb({"video.x_view": msgpack.ExtType(2, msgpack.packb([shape, data]))}))


# -- images -------------------------------------------------------------------------------------

EPS = (
    b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\n"
    b"newpath 0 0 moveto 8 8 lineto stroke showpage\n%%EOF\n"
)


def _pillow(fmt: str, **kw: Any) -> bytes:
    import numpy as np
    import PIL.Image

    buf = io.BytesIO()
    img = PIL.Image.fromarray(np.full((8, 8, 3), 200, dtype=np.uint8))
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _hostile_images() -> dict[str, bytes]:
    out = {
        "EPS": EPS,
        "PostScript": b"%!PS-Adobe-3.0\n/Times findfont 12 scalefont setfont showpage\n",
        "DOS EPS binary": b"\xc5\xd0\xd3\xc6"
        + struct.pack("<IIIIII", 30, len(EPS), 0, 0, 0, 0)
        + b"\xff\xff"
        + EPS,
        "PDF": b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n",
        "SVG": b'<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"><rect/></svg>',
        "XML SVG": b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"/>',
        "PSD": b"8BPS\x00\x01" + bytes(6) + struct.pack(">HIIHH", 3, 8, 8, 8, 3) + bytes(64),
        "PNG with EPS inside": b"\x89PNG\r\n\x1a\n" + EPS,
        "JPEG magic then EPS": b"\xff\xd8\xff" + EPS,
        "JPEG SOI then EPS": b"\xff\xd8" + EPS,
        "empty": b"",
    }
    for fmt in ("TIFF", "GIF", "BMP", "ICO", "WEBP", "PCX", "TGA", "PPM"):
        try:
            out[fmt] = _pillow(fmt)
        except Exception:  # a Pillow build without that codec: the other formats still run
            continue
    return out


#: Name -> bytes of images in formats no decoder here may hand to a library.
HOSTILE_IMAGES = _hostile_images()
#: The formats a JPEG frame must never be (all of the above).
FORMATS = sorted(HOSTILE_IMAGES)


def png(h: int = 5, w: int = 7) -> bytes:
    import numpy as np
    import PIL.Image

    buf = io.BytesIO()
    PIL.Image.fromarray(np.zeros((h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def build(spec: list[Any]) -> bytes:
    """Build a payload from a JSON-able spec ``[builder_name, *args]``."""
    name, *args = spec
    return bytes(globals()[name](*args))


# -- the child ----------------------------------------------------------------------------------

_CHILD = r"""
import json, os, resource, sys, time
sys.path.insert(0, {here!r})
import _hostile
limit = {rlimit}
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
if hard != resource.RLIM_INFINITY:
    limit = min(limit, hard)
resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
from genmanip_protocol.codec import LegacyCodec, MsgpackCodec, decode_jpeg, safe_loads
from genmanip_protocol.codec.limits import check_json_limits
from genmanip_protocol.errors import DecodeError, DecodeLimitError
decoders = {{
    "legacy": LegacyCodec().decode, "safe_loads": safe_loads, "msgpack": MsgpackCodec().decode,
    "msgpack_plain": MsgpackCodec().decode_plain, "jpeg": decode_jpeg, "json": check_json_limits,
}}
decode = decoders[{decoder!r}]
# warm up the decoder and the allocator so the baseline includes the libraries' own state
for warm in (LegacyCodec().encode({{"a": [1, 2, (3,)]}}),):
    LegacyCodec().decode(warm)
payload = _hostile.build({spec!r})
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
out = {{"limit": None}}
try:
    decode(payload)
    out["outcome"] = "ok"
except DecodeLimitError as exc:
    out.update(outcome="DecodeLimitError", limit=exc.limit, message=str(exc)[:300])
except DecodeError as exc:
    out.update(outcome=type(exc).__name__, message=str(exc)[:300])
except BaseException as exc:
    out.update(outcome="untyped " + type(exc).__name__, message=str(exc)[:300])
out["seconds"] = time.perf_counter() - t0
out["rss_growth_mib"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
out["payload_bytes"] = len(payload)
print(json.dumps(out))
"""


def run_child(
    spec: list[Any], decoder: str, *, rlimit: int = 2 << 30, timeout: float = 120
) -> dict[str, Any]:
    """Decode ``build(spec)`` with ``decoder`` in a fresh interpreter under ``RLIMIT_AS``.

    Returns the child's report plus ``returncode`` (a negative one is the signal that killed it).
    """
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    code = _CHILD.format(here=str(HERE), rlimit=rlimit, decoder=decoder, spec=spec)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    report: dict[str, Any] = json.loads(lines[-1]) if proc.returncode == 0 and lines else {}
    report["returncode"] = proc.returncode
    report["stderr"] = proc.stderr[-2000:]
    return report
