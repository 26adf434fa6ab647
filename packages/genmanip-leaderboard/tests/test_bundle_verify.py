"""verify_bundle on hostile zips: every defect is a typed leaderboard error that names the member
(or the manifest field), carries a named exit code (never 70), and nothing is decompressed past
what the member declares — a declared size beyond the limit is refused before reading."""

from __future__ import annotations

import hashlib
import io
import json
import struct
import time
import tracemalloc
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest
from genmanip_leaderboard import (
    BundleCorruptError,
    BundleError,
    BundleManifestError,
    BundleMemberNameError,
    BundleMismatchError,
    BundleTooLargeError,
    BundleUnsupportedError,
    BundleVerifyError,
    build_bundle,
    content_digest,
    verify_bundle,
)
from genmanip_leaderboard import bundle as bundle_mod
from genmanip_protocol.errors import ExitCode
from genmanip_results.discovery import load_run

DATA = b"hello bundle " * 40


def _manifest(files: dict[str, bytes], **extra: Any) -> bytes:
    entries = [
        {"path": n, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in files.items()
    ]
    m = {"format": "genmanip-bundle/1", "files": entries, "content_sha256": content_digest(entries)}
    m.update(extra)
    return json.dumps(m).encode()


def _zip(
    members: list[tuple[str, bytes]],
    *,
    method: int = zipfile.ZIP_STORED,
    manifest: bytes | None = None,
) -> bytearray:
    """A zip of ``members`` plus a matching manifest.json (or ``manifest``), as bytes."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names are written on purpose
        with zipfile.ZipFile(buf, "w") as zf:
            for name, data in members:
                zi = zipfile.ZipInfo(name)
                zi.compress_type = method
                zf.writestr(zi, data)
            zi = zipfile.ZipInfo("manifest.json")
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, manifest if manifest is not None else _manifest(dict(members)))
    return bytearray(buf.getvalue())


def _central(raw: bytearray, index: int = 0) -> int:
    """Offset of the ``index``-th central directory entry."""
    pos = -1
    for _ in range(index + 1):
        pos = raw.index(b"PK\x01\x02", pos + 1)
    return pos


def _data_offset(raw: bytearray, local: int) -> int:
    name_len, extra_len = struct.unpack_from("<HH", raw, local + 26)
    return local + 30 + name_len + extra_len


def _write(tmp_path: Path, raw: bytes | bytearray, name: str = "b.zip") -> Path:
    p = tmp_path / name
    p.write_bytes(bytes(raw))
    return p


def _fails(
    path: Path, cls: type[BundleVerifyError], *, member: str | None = None, field: str | None = None
) -> BundleVerifyError:
    with pytest.raises(BundleVerifyError) as ei:
        verify_bundle(path)
    err = ei.value
    assert isinstance(err, cls), f"{type(err).__name__}: {err}"
    assert isinstance(err, BundleError)
    assert isinstance(err.exit_code, ExitCode) and err.exit_code != ExitCode.INTERNAL
    assert err.member == member and err.field == field
    assert str(err).startswith(str(path))
    if member is not None:
        assert repr(member) in str(err)
    return err


def test_a_good_hand_made_bundle_verifies(tmp_path: Path) -> None:
    p = _write(tmp_path, _zip([("a.json", DATA), ("d/b.bin", b"\x00" * 10)]))
    assert verify_bundle(p)["format"] == "genmanip-bundle/1"


def test_bad_crc(tmp_path: Path) -> None:
    raw = _zip([("a.json", DATA)])
    raw[_data_offset(raw, 0) + 5] ^= 0xFF
    err = _fails(_write(tmp_path, raw), BundleCorruptError, member="a.json")
    assert "CRC" in str(err) and err.exit_code == ExitCode.INVALID_INPUT


def test_corrupt_deflate_stream(tmp_path: Path) -> None:
    raw = _zip([("a.json", DATA * 20)], method=zipfile.ZIP_DEFLATED)
    start = _data_offset(raw, 0)
    raw[start : start + 8] = b"\xff" * 8  # an invalid block header
    err = _fails(_write(tmp_path, raw), BundleCorruptError, member="a.json")
    assert "deflate" in str(err) or "CRC" in str(err)


@pytest.mark.parametrize("method", [99, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA, 0xFFFF])
def test_unknown_compression_method(tmp_path: Path, method: int) -> None:
    raw = _zip([("a.json", DATA)])
    struct.pack_into("<H", raw, 8, method)  # local header
    struct.pack_into("<H", raw, _central(raw) + 10, method)  # central directory
    err = _fails(_write(tmp_path, raw), BundleUnsupportedError, member="a.json")
    assert str(method) in str(err)


def test_encrypted_member(tmp_path: Path) -> None:
    raw = _zip([("a.json", DATA)])
    raw[6] |= 0x01
    raw[_central(raw) + 8] |= 0x01
    err = _fails(_write(tmp_path, raw), BundleUnsupportedError, member="a.json")
    assert "encrypted" in str(err)


def test_encrypted_manifest(tmp_path: Path) -> None:
    raw = _zip([("a.json", DATA)])
    raw[_central(raw, 1) + 8] |= 0x01
    _fails(_write(tmp_path, raw), BundleUnsupportedError, member="manifest.json")


@pytest.mark.parametrize("depth", [100, 200_000])
def test_deeply_nested_manifest(tmp_path: Path, depth: int) -> None:
    nested = b"[" * depth + b"]" * depth
    manifest = _manifest({"a.json": DATA})[:-1] + b', "run_manifest": ' + nested + b"}"
    raw = _zip([("a.json", DATA)], manifest=manifest)
    err = _fails(_write(tmp_path, raw), BundleManifestError, member="manifest.json")
    assert "nested deeper" in str(err)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda m: m.update(format="genmanip-bundle/9"), "format"),
        (lambda m: m.update(files={"a.json": 1}), "files"),
        (lambda m: m["files"].__setitem__(0, "a.json"), "files[0]"),
        (lambda m: m["files"][0].update(path=7), "files[0].path"),
        (lambda m: m["files"][0].update(size="520"), "files[0].size"),
        (lambda m: m["files"][0].update(size=-1), "files[0].size"),
        (lambda m: m["files"][0].update(size=True), "files[0].size"),
        (lambda m: m["files"][0].update(sha256="XYZ"), "files[0].sha256"),
        (lambda m: m["files"].append(dict(m["files"][0])), "files[1].path"),
        (lambda m: m.pop("content_sha256"), "content_sha256"),
    ],
)
def test_manifest_fields_are_named(tmp_path: Path, mutate: Any, field: str) -> None:
    m = json.loads(_manifest({"a.json": DATA}))
    mutate(m)
    raw = _zip([("a.json", DATA)], manifest=json.dumps(m).encode())
    _fails(_write(tmp_path, raw), BundleManifestError, member="manifest.json", field=field)


@pytest.mark.parametrize("manifest", [b"{not json", b"\xff\xfe\x00", b"[1, 2]", b"null"])
def test_manifest_not_a_json_object(tmp_path: Path, manifest: bytes) -> None:
    raw = _zip([("a.json", DATA)], manifest=manifest)
    _fails(_write(tmp_path, raw), BundleManifestError, member="manifest.json")


def test_duplicate_member_names(tmp_path: Path) -> None:
    raw = _zip([("a.json", DATA), ("a.json", b"evil")])
    err = _fails(_write(tmp_path, raw), BundleMemberNameError, member="a.json")
    assert "duplicate" in str(err) and err.exit_code == ExitCode.REFUSED


@pytest.mark.parametrize(
    "name", ["../evil.json", "/etc/passwd", "a/../../b", "C:/x.json", "a\\..\\b", "./a", "a//b"]
)
def test_unsafe_member_names(tmp_path: Path, name: str) -> None:
    raw = _zip([(name, DATA)])
    _fails(_write(tmp_path, raw), BundleMemberNameError, member=name)


def test_nul_in_member_name_is_not_truncated_away(tmp_path: Path) -> None:
    # zipfile cuts a stored name at its first NUL: "aX../../x" with X = NUL would read as "a".
    name = "aX../../evil.json"
    raw = _zip([(name, DATA)], manifest=_manifest({"a": DATA}))
    for pos in (raw.index(name.encode()), raw.index(name.encode(), raw.index(b"PK\x01\x02"))):
        raw[pos + 1] = 0
    err = _fails(_write(tmp_path, raw), BundleMemberNameError, member="a\x00../../evil.json")
    assert "NUL" in str(err)


def test_huge_declared_size_is_refused_before_reading(tmp_path: Path) -> None:
    raw = _zip([("a.json", DATA)], method=zipfile.ZIP_DEFLATED)
    struct.pack_into("<I", raw, _central(raw) + 24, 0xFFFFFFFE)  # ~4 GiB uncompressed
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        err = _fails(_write(tmp_path, raw), BundleTooLargeError, member="a.json")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "zip bomb" in str(err) and err.exit_code == ExitCode.REFUSED
    assert time.perf_counter() - t0 < 2 and peak < 8 << 20


def test_real_deflate_bomb_over_the_limit_is_refused_unread(tmp_path: Path) -> None:
    # 64 MiB of zeros deflate to ~64 KiB: a real (honest) high-ratio member, refused by the limit.
    bomb = b"\x00" * (64 << 20)
    raw = _zip([("bomb.bin", bomb)], method=zipfile.ZIP_DEFLATED)
    p = _write(tmp_path, raw)
    with pytest.raises(BundleTooLargeError) as ei:
        verify_bundle(p, max_bytes=1 << 20)
    assert ei.value.member == "bomb.bin" and "limit" in str(ei.value)


def test_total_declared_size_over_the_limit(tmp_path: Path) -> None:
    members = [(f"m{i}.bin", b"x" * 1000) for i in range(5)]
    p = _write(tmp_path, _zip(members))
    with pytest.raises(BundleTooLargeError, match="in all") as ei:
        verify_bundle(p, max_bytes=3000)
    assert ei.value.member is None


def test_zip64_sizes_without_zip64_data(tmp_path: Path) -> None:
    # 0xFFFFFFFF sizes (the zip64 escape) with no zip64 extra field: 4 GiB "members" that would
    # run past the central directory.
    raw = _zip([("a.json", DATA)])
    cd = _central(raw)
    struct.pack_into("<II", raw, cd + 20, 0xFFFFFFFF, 0xFFFFFFFF)
    err = _fails(_write(tmp_path, raw), BundleCorruptError, member="a.json")
    assert "overlaps" in str(err)


def test_zip64_corrupt_extra_field(tmp_path: Path) -> None:
    raw = _zip([("a.json", DATA)])
    cd = _central(raw)
    name_len, extra_len, _comment_len = struct.unpack_from("<HHH", raw, cd + 28)
    assert extra_len == 0
    # A zip64 extra field announcing 8 bytes but holding 4, with the sizes escaped.
    struct.pack_into("<II", raw, cd + 20, 0xFFFFFFFF, 0xFFFFFFFF)
    struct.pack_into("<H", raw, cd + 30, 8)
    at = cd + 46 + name_len
    raw[at:at] = struct.pack("<HHI", 0x0001, 8, 7)
    eocd = raw.rindex(b"PK\x05\x06")
    size, = struct.unpack_from("<I", raw, eocd + 12)
    struct.pack_into("<I", raw, eocd + 12, size + 8)
    _fails(_write(tmp_path, raw), BundleCorruptError)


def test_overlapping_members(tmp_path: Path) -> None:
    raw = _zip([("a.json", DATA), ("b.json", DATA)])
    first = struct.unpack_from("<I", raw, _central(raw, 0) + 42)[0]
    struct.pack_into("<I", raw, _central(raw, 1) + 42, first)  # b's entry points at a's data
    _fails(_write(tmp_path, raw), BundleCorruptError, member="a.json")


def test_truncated_and_non_zip_files(tmp_path: Path) -> None:
    raw = _zip([("a.json", DATA)])
    _fails(_write(tmp_path, raw[: len(raw) // 2], "half.zip"), BundleCorruptError)
    _fails(_write(tmp_path, b"PK\x05\x06" + b"\x00" * 10, "eocd.zip"), BundleCorruptError)
    (tmp_path / "dir.zip").mkdir()
    _fails(tmp_path / "dir.zip", BundleCorruptError)
    _fails(tmp_path / "missing.zip", BundleCorruptError)


def test_declared_size_differs_from_manifest(tmp_path: Path) -> None:
    manifest = _manifest({"a.json": DATA + b"more"})
    raw = _zip([("a.json", DATA)], manifest=manifest)
    err = _fails(_write(tmp_path, raw), BundleMismatchError, member="a.json")
    assert "does not match" in str(err)


def test_hash_mismatch_names_member_and_field(tmp_path: Path) -> None:
    manifest = _manifest({"a.json": b"X" * len(DATA)})
    raw = _zip([("a.json", DATA)], manifest=manifest)
    _fails(_write(tmp_path, raw), BundleMismatchError, member="a.json", field="sha256")


def test_content_digest_mismatch(tmp_path: Path) -> None:
    m = json.loads(_manifest({"a.json": DATA}))
    m["content_sha256"] = "0" * 64
    raw = _zip([("a.json", DATA)], manifest=json.dumps(m).encode())
    _fails(
        _write(tmp_path, raw), BundleMismatchError, member="manifest.json", field="content_sha256"
    )


def test_oversized_manifest_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle_mod, "MAX_MANIFEST_BYTES", 100)
    raw = _zip([("a.json", DATA)])
    _fails(_write(tmp_path, raw), BundleTooLargeError, member="manifest.json")


def test_no_manifest(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("a.json", DATA)
    err = _fails(_write(tmp_path, buf.getvalue()), BundleManifestError)
    assert "no manifest.json" in str(err)


def test_verify_zip_checks_any_zip_without_a_manifest(tmp_path: Path) -> None:
    """``verify_zip``: the same checks for a zip that is not a gmp bundle (what a leaderboard
    receives from another client), from a path or an open file, errors named as asked."""
    from genmanip_leaderboard import verify_zip

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("result.json", DATA)
        zf.writestr("t/000/result_info.json", b"{}")
    plain = _write(tmp_path, buf.getvalue(), "plain.zip")
    assert [i.filename for i in verify_zip(plain)] == ["result.json", "t/000/result_info.json"]
    with plain.open("rb") as fh:
        assert len(verify_zip(fh, name="upload")) == 2
    raw = _zip([("a.json", DATA)])
    raw[_data_offset(raw, 0) + 5] ^= 0xFF
    with pytest.raises(BundleCorruptError, match=r"^upload: member 'a.json': bad CRC-32"):
        verify_zip(io.BytesIO(bytes(raw)), name="upload")
    raw = _zip([("a.json", DATA)])
    raw[6] |= 0x01
    raw[_central(raw) + 8] |= 0x01
    with pytest.raises(BundleUnsupportedError, match="encrypted"):
        verify_zip(_write(tmp_path, raw))
    with pytest.raises(BundleTooLargeError, match="more than the limit 100"):
        verify_zip(plain, max_bytes=100)
    with pytest.raises(BundleCorruptError, match="not a readable zip file"):
        verify_zip(io.BytesIO(b"not a zip"))


def test_every_hostile_variant_of_a_real_bundle_is_typed(
    project: Path, server_run: Any, tmp_path: Path
) -> None:
    """A real bundle with one byte flipped at many offsets: each result is either a verified
    manifest (the byte did not matter, e.g. a timestamp) or a typed BundleVerifyError."""
    b = build_bundle(load_run(server_run(project)), tmp_path / "good.zip")
    good = bytearray(b.path.read_bytes())
    outcomes: dict[str, int] = {}
    step = max(1, len(good) // 300)
    for pos in range(0, len(good), step):
        raw = bytearray(good)
        raw[pos] ^= 0x5A
        p = _write(tmp_path, raw, "flip.zip")
        try:
            verify_bundle(p)
            outcomes["ok"] = outcomes.get("ok", 0) + 1
        except BundleVerifyError as exc:
            assert exc.exit_code in (ExitCode.INVALID_INPUT, ExitCode.REFUSED)
            outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1
    assert sum(outcomes.values()) >= 250
    assert outcomes.get("BundleCorruptError", 0) > 0 and len(outcomes) >= 3
