"""H.264 video through an ffmpeg subprocess: write RGB frames, transcode JPEG frames, probe, read back.

Browser-playable output (libx264, yuv420p, ``+faststart``). Writers produce ``<path>.part`` and
rename it to ``<path>`` only after ffmpeg succeeded, so a crash never leaves a truncated ``.mp4``
under the final name. ffmpeg comes from the ``imageio-ffmpeg`` wheel when installed (a static
binary), else from ``PATH``; the command line is built with ffmpeg-python. Both are in the
``genmanip-results[video]`` extra and imported lazily.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any, NamedTuple

import numpy as np
from genmanip_protocol.errors import ExitCode

from .errors import GenmanipResultsError

__all__ = [
    "FfmpegError",
    "FfmpegNotFoundError",
    "VideoError",
    "VideoInfo",
    "VideoWriter",
    "ffmpeg_executable",
    "probe_video",
    "read_video_frames",
    "transcode_jpegs",
    "video_info",
]

_EXTRA_HINT = "pip install 'genmanip-results[video]'"
_STDERR_TAIL = 2000


class VideoError(GenmanipResultsError):
    """Writing, transcoding or reading a video failed."""

    exit_code = ExitCode.FAILURE


class FfmpegNotFoundError(VideoError):
    """No ffmpeg binary (or no ffmpeg-python) is available."""

    exit_code = ExitCode.NOT_INSTALLED


class FfmpegError(VideoError):
    """ffmpeg exited with an error. ``stderr`` holds the tail of its error output."""

    def __init__(
        self, message: str, *, returncode: int | None, stderr: str, hint: str | None = None
    ) -> None:
        tail = stderr.strip()
        full = f"{message}: {tail.splitlines()[-1]}" if tail else message
        super().__init__(full, hint=hint)
        self.returncode = returncode
        self.stderr = tail


_FFMPEG_EXE: dict[str, str] = {}  # {"path": ...} once found
_FFMPEG_LOOKUP = threading.Lock()


def ffmpeg_executable() -> str:
    """Path of the ffmpeg binary: imageio-ffmpeg's bundled one, else ``ffmpeg`` on PATH.

    ``GMP_FFMPEG`` overrides both. Raises :class:`FfmpegNotFoundError` naming the ``video`` extra.
    """
    env = os.environ.get("GMP_FFMPEG")
    if env:
        if not (os.path.isfile(env) and os.access(env, os.X_OK)):
            raise FfmpegNotFoundError(f"GMP_FFMPEG={env!r} is not an executable file")
        return env
    cached = _FFMPEG_EXE.get("path")
    if cached is not None:
        return cached
    # One lookup at a time: imageio-ffmpeg checks its binary by running it, and threads racing
    # to the first lookup each ran a check; a Ctrl-C of the process group during one of them
    # killed it, and that thread reported "ffmpeg not found" while the other had found it.
    with _FFMPEG_LOOKUP:
        cached = _FFMPEG_EXE.get("path")
        if cached is not None:
            return cached
        exe: str | None = None
        try:
            import imageio_ffmpeg

            exe = imageio_ffmpeg.get_ffmpeg_exe()
        except Exception:  # not installed, or its binary is missing for this platform
            exe = None
        if not exe:
            exe = shutil.which("ffmpeg")
        if not exe:
            raise FfmpegNotFoundError(
                "ffmpeg not found (neither imageio-ffmpeg nor ffmpeg on PATH)", hint=_EXTRA_HINT
            )
        _FFMPEG_EXE["path"] = exe
        return exe


def _ffmpeg_module() -> Any:
    try:
        import ffmpeg
    except ImportError:
        raise FfmpegNotFoundError("ffmpeg-python is not installed", hint=_EXTRA_HINT) from None
    if not hasattr(ffmpeg, "input"):  # a different distribution also installs a module named ffmpeg
        raise FfmpegNotFoundError(
            "the installed 'ffmpeg' module is not ffmpeg-python",
            hint="pip uninstall ffmpeg python-ffmpeg; " + _EXTRA_HINT,
        )
    return ffmpeg


def _x264_output(
    ff: Any, stream: Any, target: str, *, crf: int, preset: str, threads: int | None
) -> Any:
    # x264 + yuv420p needs even sizes: pad (never scale) by at most one pixel of black.
    stream = stream.filter("pad", "ceil(iw/2)*2", "ceil(ih/2)*2")
    # JPEG input decodes to full-range yuvj420p; convert to limited-range yuv420p, which every
    # browser and player handles (a no-op cost for rgb24 input, which needs the conversion anyway).
    stream = stream.filter("scale", out_range="tv").filter("format", "yuv420p")
    kwargs: dict[str, Any] = {
        "format": "mp4",  # the target ends in .part, so name the container explicitly
        "vcodec": "libx264",
        "pix_fmt": "yuv420p",
        "crf": crf,
        "preset": preset,
        "movflags": "+faststart",
    }
    if threads is not None:
        kwargs["threads"] = threads
    return stream.output(target, **kwargs)


def _compile(node: Any) -> list[str]:
    # Global options go first: ffmpeg treats options after the last output as trailing ("may be
    # ignored"), which is where ffmpeg-python's global_args() would put them.
    args: list[str] = node.compile(cmd=ffmpeg_executable())
    return [args[0], "-nostdin", "-hide_banner", "-loglevel", "error", "-y", *args[1:]]


def _check_params(fps: float, crf: int, preset: str) -> None:
    if not (isinstance(fps, (int, float)) and 0 < fps <= 1000):
        raise VideoError(f"fps: expected a number in (0, 1000], got {fps!r}")
    if not (isinstance(crf, int) and 0 <= crf <= 51):
        raise VideoError(f"crf: expected an int in 0..51, got {crf!r}")
    if preset not in {
        "ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow",
    }:  # fmt: skip
        raise VideoError(f"preset: unknown x264 preset {preset!r}")


def _read_tail(f: IO[bytes]) -> str:
    try:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - _STDERR_TAIL))
        return f.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return ""


class _FfmpegProcess:
    """An ffmpeg child with stdin piped and stderr in a temp file (no pipe to deadlock on)."""

    def __init__(self, args: list[str], *, nice: int | None) -> None:
        self.stderr_file = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(
                args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self.stderr_file
            )
        except OSError as exc:
            self.stderr_file.close()
            raise FfmpegNotFoundError(
                f"cannot run ffmpeg ({args[0]}): {exc}", hint=_EXTRA_HINT
            ) from None
        if nice:
            # Lower the encoder's priority so recording never competes with the policy for CPU.
            try:
                os.setpriority(
                    os.PRIO_PROCESS,
                    self.proc.pid,
                    max(0, min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice)),
                )
            except (AttributeError, OSError):
                pass

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)

    def finish(self, timeout: float | None) -> tuple[int, str]:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = self.proc.wait()
            tail = _read_tail(self.stderr_file)
            self.stderr_file.close()
            return rc if rc is not None else -9, f"{tail}\nffmpeg did not finish within {timeout}s"
        tail = _read_tail(self.stderr_file)
        self.stderr_file.close()
        return rc, tail

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait()


def _part_path(path: Path) -> Path:
    return path.with_name(path.name + ".part")


def _prepare_target(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    p = Path(path)
    if not p.parent.is_dir():
        raise VideoError(f"cannot write {p}: directory {p.parent} does not exist")
    part = _part_path(p)
    # ffmpeg -y truncates and follows whatever has that name: a leftover of a killed encoder, or
    # a symlink planted there, is removed (the link only) so the encoder writes a new file.
    _unlink(part)
    return p, part


class VideoWriter:
    """Encode ``(height, width, 3)`` uint8 RGB frames to an H.264 mp4 (yuv420p, ``+faststart``).

    Frames are piped raw (rgb24) to ffmpeg. Odd sizes are padded by one black pixel to even ones.
    The file appears under ``path`` only when :meth:`close` succeeds; until then it is
    ``<path>.part``. As a context manager, an exception inside the block aborts (the ``.part`` file
    is removed) instead of finishing. ``nice`` (e.g. 10) lowers the encoder's CPU priority.
    """

    def __init__(  # noqa: PLR0917 - the documented contract: VideoWriter(path, w, h, fps, crf, preset)
        self,
        path: str | os.PathLike[str],
        width: int,
        height: int,
        fps: float = 30,
        crf: int = 23,
        preset: str = "ultrafast",
        *,
        nice: int | None = None,
        threads: int | None = None,
        timeout: float | None = 300.0,
    ) -> None:
        for name, v in (("width", width), ("height", height)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not 0 < v <= 16384:
                raise VideoError(f"{name}: expected an int in 1..16384, got {v!r}")
        _check_params(fps, crf, preset)
        self.path, self.part = _prepare_target(path)
        self.width, self.height, self.fps = int(width), int(height), fps
        self.frames_written = 0
        self._timeout = timeout
        self._frame_shape = (self.height, self.width, 3)
        self._closed = False
        ff = _ffmpeg_module()
        stream = ff.input(
            "pipe:",
            format="rawvideo",
            pix_fmt="rgb24",
            s=f"{self.width}x{self.height}",
            framerate=fps,
        )
        args = _compile(
            _x264_output(ff, stream, str(self.part), crf=crf, preset=preset, threads=threads)
        )
        self._proc = _FfmpegProcess(args, nice=nice)

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def write(self, frame: np.ndarray) -> None:
        """Append one ``(height, width, 3)`` uint8 RGB frame (blocks while ffmpeg catches up)."""
        if self._closed:
            raise VideoError(f"write to a closed VideoWriter ({self.path})")
        if (
            not isinstance(frame, np.ndarray)
            or frame.shape != self._frame_shape
            or frame.dtype != np.uint8
        ):
            got = (
                f"{frame.shape} {frame.dtype}"
                if isinstance(frame, np.ndarray)
                else type(frame).__name__
            )
            raise VideoError(
                f"frame {self.frames_written}: expected a {self._frame_shape} uint8 array, got {got}"
            )
        data = np.ascontiguousarray(frame)
        try:
            self._proc.write(data.reshape(-1).view(np.uint8).data)
        except (BrokenPipeError, ValueError, OSError):
            self._closed = True
            rc, tail = self._proc.finish(timeout=10)
            _unlink(self.part)
            raise FfmpegError(
                f"ffmpeg stopped while writing {self.path}", returncode=rc, stderr=tail
            ) from None
        self.frames_written += 1

    def close(self) -> Path | None:
        """Finish the file and move it to ``path``; returns the path, or None if no frame was
        written (no file is created then). Raises :class:`FfmpegError` with ffmpeg's stderr tail."""
        if self._closed:
            return self.path if self.path.exists() and self.frames_written else None
        self._closed = True
        if self.frames_written == 0:
            self._proc.kill()
            self._proc.finish(timeout=10)
            _unlink(self.part)
            return None
        rc, tail = self._proc.finish(timeout=self._timeout)
        if rc != 0 or not self.part.exists():
            _unlink(self.part)
            raise FfmpegError(
                f"ffmpeg failed to encode {self.path} (exit {rc})", returncode=rc, stderr=tail
            )
        os.replace(self.part, self.path)
        return self.path

    def abort(self) -> None:
        """Stop ffmpeg and delete the partial file (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._proc.kill()
        self._proc.finish(timeout=10)
        _unlink(self.part)

    def __del__(self) -> None:  # a writer dropped without close(): never leave ffmpeg running
        # During interpreter shutdown anything may already be gone; never raise from __del__.
        with contextlib.suppress(Exception):
            if not self._closed:
                self.abort()


def _unlink(p: Path) -> None:
    try:
        p.unlink()
    except FileNotFoundError:
        pass


def transcode_jpegs(
    frames: Iterable[bytes | Any],
    path: str | os.PathLike[str],
    fps: float = 30,
    *,
    crf: int = 23,
    preset: str = "ultrafast",
    nice: int | None = None,
    threads: int | None = None,
    timeout: float | None = 300.0,
) -> int:
    """Encode a sequence of JPEG frames (``bytes`` or :class:`JpegFrame`) to an H.264 mp4.

    The JPEG bytes go straight to ffmpeg (``-f image2pipe -c:v mjpeg``), so Python never decodes
    them. Atomic like :class:`VideoWriter`. Returns the number of frames; with zero frames no file
    is created and 0 is returned.
    """
    _check_params(fps, crf, preset)
    target, part = _prepare_target(path)
    it = iter(frames)
    first = next(it, None)
    if first is None:
        return 0
    ff = _ffmpeg_module()
    stream = ff.input("pipe:", format="image2pipe", vcodec="mjpeg", framerate=fps)
    args = _compile(_x264_output(ff, stream, str(part), crf=crf, preset=preset, threads=threads))
    proc = _FfmpegProcess(args, nice=nice)
    n = 0
    try:
        for item in _chain(first, it):
            data = getattr(item, "data", item)
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise VideoError(
                    f"frame {n}: expected JPEG bytes or a JpegFrame, got {type(item).__name__}"
                )
            try:
                proc.write(data)
            except (BrokenPipeError, OSError):
                rc, tail = proc.finish(timeout=10)
                raise FfmpegError(
                    f"ffmpeg stopped while transcoding to {target}", returncode=rc, stderr=tail
                ) from None
            n += 1
    except BaseException:
        proc.kill()
        proc.finish(timeout=10)
        _unlink(part)
        raise
    rc, tail = proc.finish(timeout=timeout)
    if rc != 0 or not part.exists():
        _unlink(part)
        raise FfmpegError(
            f"ffmpeg failed to transcode JPEG frames to {target} (exit {rc})",
            returncode=rc,
            stderr=tail,
        )
    os.replace(part, target)
    return n


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


class VideoInfo(NamedTuple):
    """What :func:`video_info` reports about a file's first video stream."""

    n_frames: int
    width: int
    height: int
    codec: str
    pix_fmt: str
    fps: float


_STREAM_RE = re.compile(
    r"Stream #\d+:\d+[^:]*: Video: (?P<codec>\w+)[^,]*, (?P<pix>\w+)(?:\([^)]*\))?,[^\n]*?(?P<w>\d+)x(?P<h>\d+)"
)
_FPS_RE = re.compile(r"(?P<fps>[\d.]+) fps")


@contextlib.contextmanager
def _ffmpeg_input(
    path: Path, within: str | os.PathLike[str] | None
) -> Iterator[tuple[str, tuple[int, ...]]]:
    """``(input, descriptors to pass)`` for an ffmpeg reading ``path``.

    Without ``within``: the name. With it: the file opened by
    :func:`genmanip_results.paths.open_within` (a regular file inside ``within`` with every link
    resolved) and given to ffmpeg as that descriptor (``/dev/fd/N``), so that a symlink swapped in
    after the check cannot redirect what ffmpeg reads.
    """
    if within is None:
        yield str(path), ()
        return
    from .paths import open_within

    try:
        fh = open_within(path, within, field="video")
    except FileNotFoundError:
        raise VideoError(f"no such video file: {path}") from None
    except OSError as exc:
        raise VideoError(f"cannot open video {path}: {exc.strerror or exc}") from exc
    with fh:
        if os.name != "posix":  # no descriptor passing: the name, checked just now
            yield str(path), ()
            return
        fd = fh.fileno()
        yield f"/dev/fd/{fd}", (fd,)


def _is_store(path: Path) -> bool:
    """A JPEG frame store (``<camera>.jpegs``, :mod:`genmanip_results.frames`), not a video file."""
    from .layout import FRAME_STORE_SUFFIX

    return path.name.endswith(FRAME_STORE_SUFFIX)


def video_info(
    path: str | os.PathLike[str],
    *,
    timeout: float = 120.0,
    within: str | os.PathLike[str] | None = None,
) -> VideoInfo:
    """Frame count, size, codec name, pixel format and frame rate of ``path``'s first video stream.

    Frames are counted by remuxing to the null muxer (no decoding), so it is fast for long files.
    A JPEG frame store (``<camera>.jpegs``) is read by :func:`genmanip_results.frames.store_info`
    (codec ``mjpeg``): every reader takes a camera's store or its video alike.
    ``within``: a results root; the file is read only when it opens inside it
    (:func:`genmanip_results.paths.open_within`: ``UnsafePathError`` otherwise), and ffmpeg reads
    the opened file, never the name.
    """
    p = Path(path)
    if _is_store(p):
        from .frames import store_info

        return store_info(p, within=within)
    if within is None and not p.is_file():
        raise VideoError(f"no such video file: {p}")
    with _ffmpeg_input(p, within) as (src, fds):
        args = [
            ffmpeg_executable(), "-nostdin", "-hide_banner", "-i", src, "-map", "0:v:0", "-c",
            "copy", "-f", "null", "-progress", "pipe:1", "-nostats", "-",
        ]  # fmt: skip
        try:
            res = subprocess.run(
                args, capture_output=True, timeout=timeout, check=False, pass_fds=fds
            )
        except subprocess.TimeoutExpired:
            raise VideoError(f"probing {p} took longer than {timeout}s") from None
    err = res.stderr.decode("utf-8", "replace")
    if res.returncode != 0:
        raise FfmpegError(
            f"ffmpeg cannot read {p}", returncode=res.returncode, stderr=err[-_STDERR_TAIL:]
        )
    m = _STREAM_RE.search(err)
    if m is None:
        raise VideoError(f"{p} has no video stream")
    frames = [
        int(x) for x in re.findall(r"^frame=(\d+)", res.stdout.decode("ascii", "replace"), re.M)
    ]
    fps_m = _FPS_RE.search(err[m.start() :].split("\n", 1)[0])
    return VideoInfo(
        n_frames=frames[-1] if frames else 0,
        width=int(m.group("w")),
        height=int(m.group("h")),
        codec=m.group("codec"),
        pix_fmt=m.group("pix"),
        fps=float(fps_m.group("fps")) if fps_m else 0.0,
    )


def probe_video(
    path: str | os.PathLike[str], *, within: str | os.PathLike[str] | None = None
) -> tuple[int, int, int]:
    """``(n_frames, width, height)`` of ``path``'s first video stream (``within``: as for
    :func:`video_info`)."""
    info = video_info(path, within=within)
    return info.n_frames, info.width, info.height


def read_video_frames(
    path: str | os.PathLike[str],
    *,
    size: tuple[int, int] | None = None,
    within: str | os.PathLike[str] | None = None,
) -> Iterator[np.ndarray]:
    """Yield the frames of ``path`` as ``(H, W, 3)`` uint8 RGB arrays, decoded by ffmpeg.

    ``path`` may be a video or a JPEG frame store (``<camera>.jpegs``: decoded frame by frame by
    :func:`genmanip_results.frames.decode_store_frames`).

    ``size=(width, height)`` has ffmpeg scale the frames while decoding (area filter): far cheaper
    than resizing in Python and less data through the pipe. Stopping the iteration early
    (``break``, ``close()``) stops ffmpeg. ``within``: a results root, as for :func:`video_info`
    (the file is opened inside it and ffmpeg decodes the opened file).
    """
    if _is_store(Path(path)):
        from .frames import decode_store_frames

        yield from decode_store_frames(path, size=size, within=within)
        return
    info = video_info(path, within=within)
    width, height = (info.width, info.height) if size is None else (int(size[0]), int(size[1]))
    if width <= 0 or height <= 0:
        raise VideoError(f"size: expected positive (width, height), got {size!r}")
    scale = [] if size is None else ["-vf", f"scale={width}:{height}:flags=area"]
    with _ffmpeg_input(Path(path), within) as (src, fds):
        args = [
            ffmpeg_executable(), "-nostdin", "-loglevel", "error", "-i", src, "-map", "0:v:0",
            *scale, "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1",
        ]  # fmt: skip
        yield from _decode_frames(args, fds, path=path, size=(width, height))


def _decode_frames(
    args: list[str], fds: tuple[int, ...], *, path: str | os.PathLike[str], size: tuple[int, int]
) -> Iterator[np.ndarray]:
    """The frames ffmpeg (``args``, reading the descriptors ``fds``) writes to its stdout."""
    width, height = size
    frame_bytes = width * height * 3
    with tempfile.TemporaryFile() as errf:
        proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errf, pass_fds=fds
        )
        assert proc.stdout is not None
        finished = False
        try:
            while True:
                buf = proc.stdout.read(frame_bytes)
                if not buf:
                    break
                if len(buf) != frame_bytes:
                    raise VideoError(f"{path}: truncated frame ({len(buf)} of {frame_bytes} bytes)")
                yield np.frombuffer(buf, dtype=np.uint8).reshape(height, width, 3)
            finished = True
        finally:
            if not finished and proc.poll() is None:
                proc.kill()
            proc.stdout.close()
            rc = proc.wait()
        if rc != 0:
            raise FfmpegError(
                f"ffmpeg failed to decode {path}", returncode=rc, stderr=_read_tail(errf)
            )
