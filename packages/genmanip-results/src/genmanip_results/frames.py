"""An episode's camera frames in every state: the one reader of JPEG frame stores and videos.

Recording stores what arrives (docs/eval.md, "Recording"): the server's JPEG frames, untouched,
in a length-prefixed file (a big-endian u32 byte count, then the JPEG bytes, per frame). The
same format serves two roles:

* the **spool** ``<episode>/.frames/<camera>.jpegs``, appended to while the episode runs (a kill
  may leave a torn last record, which every reader ignores);
* the **frame store** ``<episode>/<camera>.jpegs``, the spool moved into the episode directory
  (fsync + rename, no copy) once the episode is complete: the episode's finished frames.

A browser-playable H.264 ``<camera>.mp4`` is made from the store when something needs one
(:func:`ensure_video`: under the episode's ``.video.lock``, written as ``<camera>.mp4.part`` and
renamed, so a video is never half-made under its final name), or by the recorder itself in the
``inline`` mode. A camera's :class:`CameraStream` says which of these exist
(:attr:`CameraStream.state`); :func:`episode_streams` lists them for an episode.

Readers index a store by walking its length prefixes (a seek per frame, no data read: ~1 ms for
2,400 frames) and then read frame ``i`` with one seek (:class:`FrameStore`). Files are opened with
:func:`genmanip_results.paths.open_within` when a results root is given (``within``): a store
swapped for a symlink to an outside file is refused.
"""

from __future__ import annotations

import contextlib
import os
import struct
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import numpy as np

from .layout import (
    FRAME_SPOOL_SUFFIX,
    FRAME_STORE_SUFFIX,
    FRAMES_DIR,
    VIDEO_LOCK,
    VIDEO_PART_SUFFIX,
    VIDEO_SUFFIX,
)
from .paths import open_within, safe_file
from .video import VideoError, VideoInfo

__all__ = [
    "JPEG_MAGIC",
    "CameraStream",
    "FrameStore",
    "FrameStoreError",
    "decode_store_frames",
    "ensure_video",
    "episode_streams",
    "finish_spool",
    "iter_store",
    "store_info",
    "transcode_episode",
]

_LEN = struct.Struct(">I")
#: Every JPEG starts with SOI (FF D8); a record that does not is not a frame.
JPEG_MAGIC = b"\xff\xd8"
#: A frame larger than this is refused (a damaged length prefix, not a camera frame).
MAX_FRAME_BYTES = 64 * 1024 * 1024


class FrameStoreError(VideoError):
    """A frame store (or spool) is damaged or cannot be read."""


@dataclass(frozen=True)
class CameraStream:
    """What an episode directory holds for one camera.

    ``state`` is the most finished of: ``"spooled"`` (only the spool: recording, or a run that was
    killed), ``"frames"`` (the finished store), ``"video"`` (an mp4, e.g. the server layout or the
    inline mode), ``"frames+video"`` (both); ``making_video`` is true while a ``.mp4.part`` exists
    (a video being made, or a leftover of a killed one, removed by the next :func:`ensure_video`).
    """

    camera: str
    store: Path | None = None
    spool: Path | None = None
    video: Path | None = None
    part: Path | None = None

    @property
    def state(self) -> str:
        """``"spooled"``, ``"frames"``, ``"video"`` or ``"frames+video"``."""
        if self.store is not None and self.video is not None:
            return "frames+video"
        if self.store is not None:
            return "frames"
        if self.video is not None:
            return "video"
        return "spooled"

    @property
    def making_video(self) -> bool:
        """A ``<camera>.mp4.part`` is there (being made, or left by a killed encoder)."""
        return self.part is not None

    @property
    def source(self) -> Path:
        """The file to read frames from: the store when there is one (exact, cheap), else the
        video, else the spool."""
        src = self.store or self.video or self.spool
        assert src is not None
        return src


def episode_streams(episode_dir: str | os.PathLike[str]) -> dict[str, CameraStream]:
    """The cameras of ``episode_dir`` (sorted by name) and what exists for each.

    Only names gmp writes are recognised: ``<camera>.jpegs``, ``<camera>.mp4`` (not hidden),
    ``<camera>.mp4.part`` and ``.frames/<camera>.jpegs``. Plot outputs (``merged_with_plot.mp4``)
    are not cameras and are left out.
    """
    d = Path(episode_dir)
    found: dict[str, dict[str, Path]] = {}

    def add(cam: str, kind: str, path: Path) -> None:
        found.setdefault(cam, {})[kind] = path

    try:
        names = sorted(os.listdir(d))
    except OSError:
        return {}
    for name in names:
        if name.startswith("."):
            continue
        if name.endswith(FRAME_STORE_SUFFIX):
            add(name[: -len(FRAME_STORE_SUFFIX)], "store", d / name)
        elif name.endswith(VIDEO_PART_SUFFIX):
            add(name[: -len(VIDEO_PART_SUFFIX)], "part", d / name)
        elif name.endswith(VIDEO_SUFFIX) and not name.startswith("merged_with_plot"):
            add(name[: -len(VIDEO_SUFFIX)], "video", d / name)
    spool_dir = d / FRAMES_DIR
    if spool_dir.is_dir() and not spool_dir.is_symlink():
        for name in sorted(os.listdir(spool_dir)):
            if name.endswith(FRAME_SPOOL_SUFFIX) and not name.startswith("."):
                add(name[: -len(FRAME_SPOOL_SUFFIX)], "spool", spool_dir / name)
    out: dict[str, CameraStream] = {}
    for cam in sorted(found):
        f = found[cam]
        if not cam or ("store" not in f and "video" not in f and "spool" not in f):
            continue  # a lone .part: nothing to read
        out[cam] = CameraStream(
            cam, store=f.get("store"), spool=f.get("spool"), video=f.get("video"), part=f.get("part")
        )
    return out


def _open(path: Path, within: str | os.PathLike[str] | None) -> IO[bytes]:
    try:
        if within is None:
            return open(path, "rb")  # (closed by the caller)
        return open_within(path, within, field="frames")
    except FileNotFoundError:
        raise FrameStoreError(f"no such frame store: {path}") from None
    except OSError as exc:
        if isinstance(exc, VideoError):
            raise
        raise FrameStoreError(f"cannot open frame store {path}: {exc.strerror or exc}") from exc


def _index(fh: IO[bytes], path: Path) -> tuple[list[tuple[int, int]], bool]:
    """``[(offset, length)]`` of every whole record, and whether the file ends on a record."""
    fh.seek(0, os.SEEK_END)
    size = fh.tell()
    fh.seek(0)
    out: list[tuple[int, int]] = []
    pos = 0
    while pos < size:
        head = fh.read(_LEN.size)
        if len(head) < _LEN.size:
            return out, False
        (n,) = _LEN.unpack(head)
        if n == 0 or n > MAX_FRAME_BYTES:
            raise FrameStoreError(f"{path.name}: frame {len(out)}: bad length {n} at byte {pos}")
        start = pos + _LEN.size
        if start + n > size:
            return out, False
        out.append((start, n))
        pos = start + n
        fh.seek(pos)
    return out, True


class FrameStore:
    """Random access to the JPEG frames of a store or spool: ``len()``, ``[i]``, iteration.

    ``complete`` is False when the file ends inside a record (a spool cut by a kill: the torn
    record is not a frame). Use as a context manager (or call :meth:`close`).
    """

    def __init__(
        self, path: str | os.PathLike[str], *, within: str | os.PathLike[str] | None = None
    ) -> None:
        self.path = Path(path)
        self._fh = _open(self.path, within)
        self._lock = threading.Lock()
        try:
            self._records, self.complete = _index(self._fh, self.path)
        except BaseException:
            self._fh.close()
            raise

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, i: int) -> bytes:
        """The JPEG bytes of frame ``i`` (negative indices count from the end)."""
        off, n = self._records[i]
        with self._lock:
            self._fh.seek(off)
            data = self._fh.read(n)
        if len(data) != n or not data.startswith(JPEG_MAGIC):
            raise FrameStoreError(f"{self.path.name}: frame {i} is not a JPEG")
        return data

    def __iter__(self) -> Iterator[bytes]:
        for i in range(len(self._records)):
            yield self[i]

    def close(self) -> None:
        """Close the file (idempotent)."""
        self._fh.close()

    def __enter__(self) -> FrameStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def iter_store(
    path: str | os.PathLike[str], *, within: str | os.PathLike[str] | None = None
) -> Iterator[bytes]:
    """Yield the JPEG bytes of every whole frame of a store or spool, in order."""
    with FrameStore(path, within=within) as store:
        yield from store


def _jpeg_size(data: bytes) -> tuple[int, int]:
    """``(width, height)`` from a JPEG's SOF marker (no decoding)."""
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            i += 1
            continue
        marker = data[i + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
            i += 1 if marker == 0xFF else 2
            continue
        (seg,) = struct.unpack(">H", data[i + 2 : i + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            h, w = struct.unpack(">HH", data[i + 5 : i + 9])
            return int(w), int(h)
        i += 2 + seg
    raise FrameStoreError("no JPEG frame header (SOF) found")


def store_info(
    path: str | os.PathLike[str], *, within: str | os.PathLike[str] | None = None, fps: float = 30.0
) -> VideoInfo:
    """Frame count and size of a store (from its first frame's header): a :class:`VideoInfo`
    with codec ``"mjpeg"`` (what ffmpeg calls it), so callers treat stores and videos alike."""
    with FrameStore(path, within=within) as store:
        if not len(store):
            return VideoInfo(0, 0, 0, "mjpeg", "yuvj420p", fps)
        try:
            w, h = _jpeg_size(store[0])
        except FrameStoreError as exc:
            raise FrameStoreError(f"{Path(path).name}: frame 0: {exc}") from None
        return VideoInfo(len(store), w, h, "mjpeg", "yuvj420p", fps)


def _feed(proc: subprocess.Popen[bytes], frames: Iterator[bytes], errors: list[BaseException]) -> None:
    assert proc.stdin is not None
    try:
        for data in frames:
            proc.stdin.write(data)
    except (BrokenPipeError, OSError, ValueError):
        pass  # ffmpeg stopped (the reader stopped early, or it failed: its exit code says)
    except BaseException as exc:  # a damaged store: reported by the reader
        errors.append(exc)
    finally:
        with contextlib.suppress(OSError, ValueError):
            proc.stdin.close()


def decode_store_frames(
    path: str | os.PathLike[str],
    *,
    size: tuple[int, int] | None = None,
    within: str | os.PathLike[str] | None = None,
) -> Iterator[np.ndarray]:
    """Yield a store's frames as ``(H, W, 3)`` uint8 RGB, decoded by ffmpeg frame by frame
    (``-f image2pipe -c:v mjpeg``; ``size=(width, height)`` scales while decoding, area filter).

    A frame ffmpeg cannot decode raises :class:`~genmanip_results.video.FfmpegError`; a frame whose
    size differs from the first one's is scaled to it (ffmpeg's image2pipe does so).
    """
    from .video import FfmpegError, _read_tail, ffmpeg_executable

    info = store_info(path, within=within)
    if info.n_frames == 0:
        return
    width, height = (info.width, info.height) if size is None else (int(size[0]), int(size[1]))
    if width <= 0 or height <= 0:
        raise VideoError(f"size: expected positive (width, height), got {size!r}")
    vf = ["-vf", f"scale={width}:{height}" + (":flags=area" if size is not None else "")]
    args = [
        ffmpeg_executable(), "-nostdin", "-loglevel", "error", "-xerror", "-f", "image2pipe",
        "-c:v", "mjpeg", "-i", "pipe:0", *vf, "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1",
    ]  # fmt: skip
    frame_bytes = width * height * 3
    store = FrameStore(path, within=within)
    errors: list[BaseException] = []
    with tempfile.TemporaryFile() as errf, store:
        proc = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errf
        )
        feeder = threading.Thread(target=_feed, args=(proc, iter(store), errors), daemon=True)
        feeder.start()
        assert proc.stdout is not None
        finished = False
        n = 0
        try:
            while True:
                buf = proc.stdout.read(frame_bytes)
                if not buf:
                    break
                if len(buf) != frame_bytes:
                    raise VideoError(f"{path}: truncated frame ({len(buf)} of {frame_bytes} bytes)")
                n += 1
                yield np.frombuffer(buf, dtype=np.uint8).reshape(height, width, 3)
            finished = True
        finally:
            if not finished and proc.poll() is None:
                proc.kill()
            proc.stdout.close()
            rc = proc.wait()
            feeder.join(10)
        if errors:
            raise FrameStoreError(f"{path}: {errors[0]}") from errors[0]
        if rc != 0:
            raise FfmpegError(
                f"ffmpeg failed to decode {path}", returncode=rc, stderr=_read_tail(errf)
            )
        if n != info.n_frames:
            raise FrameStoreError(f"{path}: ffmpeg decoded {n} of {info.n_frames} frames")


def finish_spool(spool: str | os.PathLike[str], store: str | os.PathLike[str]) -> int:
    """Make the spool ``spool`` the finished store ``store``: cut a torn last record, fsync, rename
    (atomic: the store appears whole or not at all). Returns the frame count. Idempotent for a
    recovery that finds the spool already moved (``spool`` missing, ``store`` there)."""
    src, dst = Path(spool), Path(store)
    if not src.exists() and dst.is_file():
        with FrameStore(dst) as st:
            return len(st)
    with open(src, "r+b") as fh:
        records, whole = _index(fh, src)
        if not whole:
            end = records[-1][0] + records[-1][1] if records else 0
            fh.truncate(end)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(src, dst)
    return len(records)


def _ident(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def ensure_video(
    episode_dir: str | os.PathLike[str],
    camera: str,
    *,
    within: str | os.PathLike[str] | None = None,
    fps: float = 30,
    nice: int | None = None,
    threads: int | None = None,
    timeout: float | None = 600.0,
    lock_timeout: float | None = 600.0,
) -> Path:
    """The H.264 ``<camera>.mp4`` of an episode, made from its frame store when missing.

    Made under the episode's ``.video.lock`` (two viewers, or a viewer and ``gmp transcode``, make
    it once; the file goes when the lock is released), as ``<camera>.mp4.part`` (registered as a partial first, so ``gmp clean`` can prove
    a leftover gmp's) renamed into place when ffmpeg succeeded, then registered as a
    ``videos``-category file (remakeable from the store). A store replaced meanwhile (a re-run of
    the episode) discards the new video. ``camera`` becomes a file name only through
    :func:`genmanip_results.paths.safe_file`.

    Raises:
        FrameStoreError: neither the mp4 nor a frame store exists, or the store is damaged.
        VideoError: ffmpeg failed; ``LockTimeout`` when another maker holds the lock too long.
    """
    from genmanip_runtime.atomic import FileLock

    from .provenance import CATEGORY_VIDEOS, register_generated, register_partial
    from .video import transcode_jpegs

    d = Path(episode_dir)
    video = safe_file(d, camera, suffix=VIDEO_SUFFIX, field="camera")
    store = safe_file(d, camera, suffix=FRAME_STORE_SUFFIX, field="camera")
    if video.is_file() and not video.is_symlink():
        return video
    if not store.is_file():
        raise FrameStoreError(f"{d}: camera {camera!r} has neither {video.name} nor {store.name}")
    # (removed as it is released: only this function locks it, always through FileLock)
    with FileLock(d / VIDEO_LOCK, timeout=lock_timeout, remove=True):
        if video.is_file() and not video.is_symlink():
            return video  # made by whoever held the lock before us
        before = _ident(store)
        part = video.with_name(video.name[: -len(VIDEO_SUFFIX)] + VIDEO_PART_SUFFIX)
        register_partial(part, category=CATEGORY_VIDEOS, by="genmanip-results")
        with FrameStore(store, within=within) as frames:
            n = transcode_jpegs(iter(frames), video, fps=fps, nice=nice, threads=threads, timeout=timeout)
        if n == 0:
            raise FrameStoreError(f"{store}: no frames to make {video.name} from")
        if _ident(store) != before:
            video.unlink(missing_ok=True)
            raise FrameStoreError(f"{store.name} changed while {video.name} was made (a re-run?)")
        register_generated(video, category=CATEGORY_VIDEOS, by="genmanip-results")
        return video


def transcode_episode(
    episode_dir: str | os.PathLike[str],
    *,
    within: str | os.PathLike[str] | None = None,
    fps: float = 30,
    nice: int | None = None,
    threads: int | None = None,
    drop_frames: bool = False,
) -> list[Path]:
    """Make every camera's mp4 of a finished episode (:func:`ensure_video`); returns the videos.

    ``drop_frames``: then delete each frame store whose video holds as many frames as the store
    (checked with ffmpeg), leaving the episode as the ``inline`` mode writes it. Only stores are
    touched: a camera still spooled (episode not finished) is skipped.
    """
    from .video import video_info

    out: list[Path] = []
    for cam, s in episode_streams(episode_dir).items():
        if s.store is None and s.video is None:
            continue
        mp4 = ensure_video(episode_dir, cam, within=within, fps=fps, nice=nice, threads=threads)
        out.append(mp4)
        if drop_frames and s.store is not None:
            with FrameStore(s.store, within=within) as st:
                want = len(st)
            if video_info(mp4, within=within).n_frames == want:
                s.store.unlink(missing_ok=True)
            else:
                raise FrameStoreError(f"{mp4}: frame count differs from {s.store.name}; store kept")
    return out


def source_info(path: str | os.PathLike[str], **kw: Any) -> VideoInfo:
    """:func:`store_info` for a store, :func:`genmanip_results.video.video_info` otherwise."""
    from .video import video_info

    if str(path).endswith(FRAME_STORE_SUFFIX):
        return store_info(path, within=kw.get("within"))
    return video_info(path, within=kw.get("within"))
