"""Item 7 (fast subset): fuzzed and malicious payloads against every decoder, in a child process.

The full run (>= 100,000 payloads) is ``python bench/reliability/fuzz_codecs.py``.
"""

from __future__ import annotations

import fuzz_codecs
import pytest


@pytest.mark.slow
def test_fuzz_codecs_typed_errors_bounded_memory_no_execution() -> None:
    res = fuzz_codecs.run(n=5000, seed=7, timeout=240)
    assert res["payloads"] == 5000
    assert res["failures"] == 0, res["failure_samples"]
    # every malicious pickle was refused and nothing it asked for happened
    assert res["malicious"] >= 150
    assert res["malicious_refused_unsafe"] >= res["malicious"] - 5
    assert res["sentinels_created"] == [] and res["sentinels_seen_by_parent"] == []
    assert res["rss_growth_mb"] <= fuzz_codecs.RSS_BOUND_MB
    growth = res["max_decode_rss_growth_mb"]
    assert growth is None or growth <= fuzz_codecs.DECODE_RSS_BOUND_MB, res["max_decode_rss_growth"]
    assert res["slowest_s"] < fuzz_codecs.HANG_S
    # the generators reach every decoder on both sides of validity
    for name in ("safe_loads", "LegacyCodec.decode", "MsgpackCodec.decode", "decode_jpeg"):
        assert res["outcomes"].get(f"{name}: ok", 0) > 0
        assert res["outcomes"].get(f"{name}: DecodeError", 0) > 0


def test_malicious_corpus_is_refused_by_name(tmp_path) -> None:
    """Each malicious pickle reaches find_class and is refused naming the global; no sentinel."""
    from genmanip_protocol.codec import safe_loads
    from genmanip_protocol.errors import DecodeError, UnsafePayloadError

    corpus = fuzz_codecs.malicious_pickles(tmp_path)
    unsafe = 0
    for label, payload in corpus:
        with pytest.raises(DecodeError) as ei:
            safe_loads(payload)
        if isinstance(ei.value, UnsafePayloadError):
            unsafe += 1
            assert ei.value.global_name, label
    assert unsafe >= len(corpus) - 5
    assert list(tmp_path.iterdir()) == []


def test_png_decompression_bomb_in_image_tag_is_refused_before_decoding() -> None:
    """Regression (found by this suite): a ~400 KB 'image' value declaring 12000x12000 RGB made the
    legacy decoder allocate 430 MB; it is now refused from the PNG header."""
    import base64
    import pickle

    from genmanip_protocol.codec import LegacyCodec
    from genmanip_protocol.errors import DecodeError

    bomb = fuzz_codecs._png_bomb(12000, rgb=True)
    body = pickle.dumps({"type": "image", "data": base64.b64encode(bomb).decode()})
    with pytest.raises(DecodeError, match="exceeds the limit"):
        LegacyCodec().decode(body)


# -- "Hostile input, for real": one regression per class, each in a child process ---------------

_CHILD = r"""
import json, os, resource, sys, time
sys.path.insert(0, {bench!r})
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, resource.getrlimit(resource.RLIMIT_AS)[1]))
import fuzz_codecs
from genmanip_protocol.codec import LegacyCodec, MsgpackCodec, decode_jpeg, safe_loads
from genmanip_protocol.errors import DecodeError
from genmanip_protocol.codec.msgpack_codec import MAGIC, MSGPACK_PROTOCOL_VERSION
import msgpack, struct

def frame(header, table, tail=b""):
    pre = struct.pack("<4sBBHII", MAGIC, MSGPACK_PROTOCOL_VERSION, 0, 0, len(table), len(header))
    return pre + b"".join(struct.pack("<QQ", o, ln) for o, ln in table) + header + tail

def ext(code, ref):
    return msgpack.packb(msgpack.ExtType(code, msgpack.packb(ref)))

jpeg = fuzz_codecs.valid_seeds()["jpeg"][0]
payloads = dict(fuzz_codecs.hostile_limits(frame, ext) + fuzz_codecs.hostile_images(jpeg, frame, ext))
decoders = {{"safe_loads": safe_loads, "LegacyCodec.decode": LegacyCodec().decode,
            "MsgpackCodec.decode": MsgpackCodec().decode, "decode_jpeg": decode_jpeg}}
labels = [l for l in payloads if any(m in l for m in {match!r}) and not any(x in l for x in {exclude!r})]
out = {{}}
for label in labels:
    payload = payloads[label]
    for name, fn in decoders.items():
        open("/proc/self/clear_refs", "w").write("5")
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        try:
            fuzz_codecs._consume(fn(payload))  # lazy JPEG frames decode too
            res = "ok"
        except DecodeError as exc:
            res = type(exc).__name__ + ": " + str(exc)[:160]
        except Exception as exc:
            res = "UNTYPED " + type(exc).__name__
        out[label + " / " + name] = [res, time.perf_counter() - t0,
                                     (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024]
print(json.dumps(out))
"""

#: Which decoder reads which payload family (the others must merely fail typed).
_WIRE = {"pickle": ("safe_loads", "LegacyCodec.decode"), "numpy pickle": ("safe_loads", "LegacyCodec.decode"),
         "tagged": ("LegacyCodec.decode",), "tensor": ("LegacyCodec.decode",),
         "image tag": ("LegacyCodec.decode",), "jpeg_bytes tag": ("LegacyCodec.decode",),
         "msgpack": ("MsgpackCodec.decode",), "raw": ("decode_jpeg",)}  # fmt: skip


def _decode_in_child(
    match: list[str], exclude: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> dict[str, list]:
    import json
    import os
    import subprocess
    import sys

    code = _CHILD.format(
        bench=str(fuzz_codecs.Path(fuzz_codecs.__file__).parent), match=match, exclude=exclude
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1", **(env or {})},
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])  # -11 = the old SIGSEGV
    result: dict[str, list] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _check(results: dict[str, list], must: str) -> None:
    """The payload's own decoder refuses it with ``must`` in the outcome; every decoder fails
    typed, fast and small."""
    for key, (outcome, seconds, rss_mib) in results.items():
        label, decoder = key.rsplit(" / ", 1)
        family = max((f for f in _WIRE if label.startswith(f)), key=len)
        assert not outcome.startswith("UNTYPED"), (key, outcome)
        if decoder in _WIRE[family]:
            assert must in outcome, (key, outcome)
        assert seconds < fuzz_codecs.HANG_S, (key, seconds)
        assert rss_mib <= fuzz_codecs.DECODE_RSS_BOUND_MB, (key, rss_mib)


def test_deep_hashables_are_refused_not_a_segfault() -> None:
    """Before: a 200k-deep tuple as a dict key or set member killed the client (exit 139)."""
    results = _decode_in_child(["-deep tuple", "MARKs + TUPLEs", "frozenset(frozenset"])
    assert len(results) == 4 * 16
    _check(results, "DecodeLimitError")


def test_container_floods_and_memo_bombs_stay_small() -> None:
    """Before: 4 MB of EMPTY_SET opcodes grew the client by 0.9 GB, a 1 MB memo bomb by 2 GB."""
    results = _decode_in_child(
        [" x EMPTY", " x MARK", " x TUPLE1", " x MEMOIZE", "4M ", "memo bomb", "msgpack 1", "msgpack 2",
         "msgpack 4", "msgpack 6", "msgpack map32 of 1M", "list chain"],
        exclude=("empty array",),
    )
    assert len(results) >= 4 * 18
    _check(results, "DecodeLimitError")


def test_empty_arrays_with_huge_dimensions_are_refused() -> None:
    """Before: (2**31, 0, 2**31) escaped as ValueError; (0, 2**40) decoded and hung consumers."""
    results = _decode_in_child(["empty array", "tensor empty", "numpy pickle", "tagged jpeg shape"])
    assert len(results) >= 4 * 27
    _check(results, "DecodeLimitError")


def test_foreign_image_formats_never_reach_a_library(tmp_path) -> None:
    """Before: an EPS in an `image` value made Pillow run Ghostscript. A fake gs on PATH proves
    nothing runs it now, for every format in every place an image can arrive."""
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sentinel = tmp_path / "gs-ran"
    for exe in ("gs", "gswin32c", "gswin64c"):
        (bin_dir / exe).write_text(f"#!/bin/sh\ntouch {sentinel}\nexit 0\n")
        (bin_dir / exe).chmod(0o755)
    names = [name for name, _ in fuzz_codecs.foreign_images()]
    assert {"EPS", "PDF", "TIFF", "GIF", "BMP", "SVG", "ICO", "PSD"} <= set(names)
    results = _decode_in_child(
        [f"{where} {name}" for name in names for where in ("image tag", "jpeg_bytes tag", "msgpack jpeg", "raw")],
        env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
    )
    assert len(results) == 4 * 4 * len(names)
    foreign = {k: v for k, v in results.items() if "magic" not in k and "PNG with" not in k}
    _check(foreign, "not a JPEG")  # refused from the magic bytes, before any library
    # PNG/JPEG magic + EPS passes the gate and reaches only that format's decoder, which refuses it
    _check({k: v for k, v in results.items() if k not in foreign}, "Error")
    assert not sentinel.exists()


def test_image_bytes_are_opened_in_one_place_only() -> None:
    """Every image decode goes through genmanip_protocol.codec.images (magic bytes first, then
    Pillow restricted to that format) or codec.jpeg (after the same gate): no other module
    decodes image data."""
    import re

    root = fuzz_codecs.Path(fuzz_codecs.__file__).resolve().parents[2] / "packages"
    allowed = {"images.py": r"Image\.open\(", "jpeg.py": r"simplejpeg\.decode_jpeg(_header)?\("}
    offenders = []
    for path in sorted(root.glob("*/src/**/*.py")):
        text = path.read_text(encoding="utf-8")
        for pattern in (r"Image\.open\(", r"simplejpeg\.decode_jpeg(_header)?\(", r"imageio[\w.]*\.imread",
                        r"cv2\.imdecode", r"cv2\.imread", r"ImageFile\.Parser"):
            for m in re.finditer(pattern, text):
                mine = "genmanip_protocol/codec/" in path.as_posix() and path.name in allowed
                if not (mine and re.fullmatch(allowed[path.name], m.group(0))):
                    offenders.append(f"{path.relative_to(root)}: {m.group(0)}")
    assert offenders == []
