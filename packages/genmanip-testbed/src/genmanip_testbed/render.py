"""Cheap numpy rendering of the testbed scene for every camera of a robot.

Three camera kinds: a top-down orthographic view (``top_camera_view``, ``obs_camera_view``), an
oblique front view (``overlook_camera_view``, ``obs_camera_2_view``) and a wrist view that follows an
end effector (``left_camera_view``, ``right_camera_view``, ``realsense_view``).

Static parts (table, grid, distractor blocks) are drawn once per episode; each frame copies the
background and draws only what moves. Frames are cached by a quantised state key, so a state that
repeats (a policy holding still, a chunk re-rendering) costs nothing; the cache also keeps the JPEG
encoding of a frame once computed.

The top view's camera model is public (the expert uses it): rows map world x from ``TOP_X_MAX``
(row 0) down to ``TOP_X_MAX - H * res``, columns map y from ``+W/2 * res`` (col 0) to the right, with
``res = TOP_X_SPAN / H`` metres per pixel.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "COLOURS",
    "TOP_X_MAX",
    "TOP_X_SPAN",
    "FrameCache",
    "Renderer",
    "SceneView",
    "camera_kind",
    "top_pixel_to_world",
]

TOP_X_MAX = 1.0
TOP_X_SPAN = 1.2

#: Block colours (RGB). ``*_alt`` are the similar-looking distractors of the hard split.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 38, 38),
    "blue": (38, 78, 215),
    "green": (40, 175, 60),
    "yellow": (228, 205, 40),
    "red_alt": (225, 90, 45),
    "blue_alt": (80, 58, 200),
    "green_alt": (100, 195, 45),
    "yellow_alt": (232, 165, 40),
}

_TABLE = np.array([176, 148, 112], dtype=np.uint8)
_FLOOR = np.array([70, 74, 82], dtype=np.uint8)
_ARM = np.array([120, 124, 130], dtype=np.uint8)
_BODY = np.array([45, 45, 52], dtype=np.uint8)
_BLOCK_HALF = 0.02
#: Distractor blocks are smaller than the target (3 cm instead of 4 cm).
_DISTRACTOR_HALF = 0.015


def camera_kind(camera: str) -> str:
    """``"top"``, ``"front"`` or ``"wrist0"``/``"wrist1"`` for a camera key without ``video.``."""
    if camera in ("overlook_camera_view", "obs_camera_2_view"):
        return "front"
    if camera in ("left_camera_view", "realsense_view"):
        return "wrist0"
    if camera == "right_camera_view":
        return "wrist1"
    return "top"


def top_pixel_to_world(row: float, col: float, shape: tuple[int, int]) -> tuple[float, float]:
    """Top-view pixel (row, col) -> world (x, y) in metres, for an image of ``shape`` (H, W)."""
    h, w = shape[:2]
    res = TOP_X_SPAN / h
    return TOP_X_MAX - (row + 0.5) * res, (w / 2 - (col + 0.5)) * res


@dataclass
class SceneView:
    """Everything a frame depends on (world frame, metres; gripper openness in [0, 1])."""

    base: np.ndarray  # (3,) x, y, yaw rad
    mounts_world: np.ndarray  # (n_arms, 3)
    ee_world: np.ndarray  # (n_arms, 3)
    openness: np.ndarray  # (n_arms,)
    target: np.ndarray  # (3,)
    target_rgb: tuple[int, int, int]

    def key(self, kind: str = "top") -> bytes:
        """A cache key of what a camera of ``kind`` shows: a wrist view depends on its own arm
        and the target only, so it stays cached while the other arm moves."""
        if kind.startswith("wrist"):
            arm = min(int(kind[-1]), self.ee_world.shape[0] - 1)
            parts = [self.ee_world[arm], self.openness[arm : arm + 1], self.target]
        else:
            parts = [self.base, self.ee_world.ravel(), self.openness, self.target]
        return np.round(
            np.concatenate([np.asarray(p, dtype=np.float64).ravel() for p in parts]), 5
        ).tobytes()


_PLAIN: dict[tuple[tuple[int, ...], bytes], np.ndarray] = {}
_PLAIN_LOCK = threading.Lock()


def _plain(shape: tuple[int, int, int], rgb: np.ndarray) -> np.ndarray:
    """A read-only image of one colour. Copying it is several times faster than filling a
    3-channel image by broadcasting (numpy's inner loop over 3 bytes is slow)."""
    key = (tuple(shape), bytes(rgb))
    with _PLAIN_LOCK:
        img = _PLAIN.get(key)
        if img is None:
            img = np.empty(shape, dtype=np.uint8)
            img.reshape(-1, 3)[:] = rgb
            img.flags.writeable = False
            _PLAIN[key] = img
        return img


_FRONT: dict[tuple[int, ...], np.ndarray] = {}


def _front_base(shape: tuple[int, int, int]) -> np.ndarray:
    """The front view's static scene (a vertical gradient wall, then the table plane), read-only,
    built once per shape: every episode's background starts as a copy of it (a reset of the
    testbed must stay cheap, or concurrent resets hold the other workers' steps)."""
    key = tuple(shape)
    with _PLAIN_LOCK:
        img = _FRONT.get(key)
        if img is None:
            h, w = shape[:2]
            img = np.empty(shape, dtype=np.uint8)
            grad = np.linspace(200, 120, h, dtype=np.float32)[:, None]
            img[:] = np.stack([grad * 0.8, grad * 0.85, grad], axis=-1).astype(np.uint8)
            top_row, _ = Renderer._front_px(np.array([TOP_X_MAX, 0.0, 0.0]), shape)
            bottom_row, _ = Renderer._front_px(np.array([-0.2, 0.0, 0.0]), shape)
            _fill(img, top_row, bottom_row, 0, w, _TABLE)
            img.flags.writeable = False
            _FRONT[key] = img
        return img


def _fill(img: np.ndarray, r0: float, r1: float, c0: float, c1: float, rgb: Any) -> None:  # noqa: PLR0917
    h, w = img.shape[:2]
    a, b = max(int(r0), 0), min(int(r1), h)
    c, d = max(int(c0), 0), min(int(c1), w)
    if a < b and c < d:
        img[a:b, c:d] = rgb


def _segment(
    img: np.ndarray, p0: tuple[float, float], p1: tuple[float, float], thick: float, rgb: Any
) -> None:
    n = int(max(abs(p1[0] - p0[0]), abs(p1[1] - p0[1])) / max(thick * 0.9, 1.0)) + 2
    half = thick / 2
    for t in np.linspace(0.0, 1.0, n):
        r = p0[0] + (p1[0] - p0[0]) * t
        c = p0[1] + (p1[1] - p0[1]) * t
        _fill(img, r - half, r + half, c - half, c + half, rgb)


class FrameCache:
    """A small LRU of rendered frames and their JPEG encodings, keyed by state key and camera.

    Thread-safe. ``enabled=False`` turns it into a pass-through (for the benchmark).
    """

    def __init__(self, capacity: int = 32, *, enabled: bool = True) -> None:
        self.capacity = capacity
        self.enabled = enabled
        self._frames: OrderedDict[tuple[bytes, str], np.ndarray] = OrderedDict()
        self._jpeg: dict[int, tuple[np.ndarray, Any]] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: bytes, camera: str) -> np.ndarray | None:
        if not self.enabled:
            return None
        with self._lock:
            arr = self._frames.get((key, camera))
            if arr is not None:
                self._frames.move_to_end((key, camera))
                self.hits += 1
            else:
                self.misses += 1
            return arr

    def put(self, key: bytes, camera: str, arr: np.ndarray) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._frames[(key, camera)] = arr
            while len(self._frames) > self.capacity:
                _, old = self._frames.popitem(last=False)
                self._jpeg.pop(id(old), None)

    def clear(self) -> None:
        """Drop every cached frame."""
        with self._lock:
            self._frames.clear()
            self._jpeg.clear()

    def jpeg(self, arr: np.ndarray) -> Any | None:
        """The cached encoding of a frame this cache handed out, or None."""
        if not self.enabled:
            return None
        with self._lock:
            hit = self._jpeg.get(id(arr))
            # Identity check: ids are only reused after the array died, and we keep it alive.
            return hit[1] if hit is not None and hit[0] is arr else None

    def put_jpeg(self, arr: np.ndarray, encoded: Any) -> None:
        if not self.enabled:
            return
        with self._lock:
            if any(v is arr for v in self._frames.values()):
                self._jpeg[id(arr)] = (arr, encoded)


class Renderer:
    """Renders every camera of one episode.

    Args:
        cameras: camera key (without ``video.``) -> ``(H, W, 3)``.
        distractors: static blocks ``[(world_xyz, rgb), ...]``.
        cache: shared :class:`FrameCache`.
        salt: bytes that make cache keys unique to this episode (its static scene).
    """

    def __init__(
        self,
        cameras: dict[str, tuple[int, int, int]],
        distractors: list[tuple[np.ndarray, tuple[int, int, int]]],
        cache: FrameCache,
        salt: bytes,
    ) -> None:
        self.cameras = dict(cameras)
        self.distractors = distractors
        self.cache = cache
        self.salt = salt
        self._bg: dict[tuple[str, tuple[int, int, int]], np.ndarray] = {}
        self._lock = threading.Lock()
        self.rendered = 0

    # --- static backgrounds -------------------------------------------------------------------------
    def _top_bg(self, shape: tuple[int, int, int]) -> np.ndarray:
        h, w = shape[:2]
        res = TOP_X_SPAN / h
        img = _plain(shape, _TABLE).copy()  # flat regions keep JPEG encoding cheap
        # Table edge near the robot (x < 0): floor.
        _fill(img, (TOP_X_MAX - 0.0) / res, h, 0, w, _FLOOR)
        for pos, rgb in self.distractors:
            r, c = self._top_px(pos, shape)
            half = _DISTRACTOR_HALF / res
            _fill(img, r - half, r + half, c - half, c + half, rgb)
        return np.asarray(img)

    @staticmethod
    def _top_px(p: np.ndarray, shape: tuple[int, ...]) -> tuple[float, float]:
        h, w = shape[:2]
        res = TOP_X_SPAN / h
        return (TOP_X_MAX - p[0]) / res, w / 2 - p[1] / res

    @staticmethod
    def _front_px(p: np.ndarray, shape: tuple[int, ...]) -> tuple[float, float]:
        h, w = shape[:2]
        s = w / 2.4
        return h * 0.92 - p[0] * s * 0.35 - p[2] * s, w / 2 - p[1] * s

    def _front_bg(self, shape: tuple[int, int, int]) -> np.ndarray:
        w = shape[1]
        img = _front_base(shape).copy()
        for pos, rgb in self.distractors:
            r, c = self._front_px(pos, shape)
            half = _DISTRACTOR_HALF * w / 2.4
            _fill(img, r - half, r + half, c - half, c + half, rgb)
        return np.asarray(img)

    def _background(self, kind: str, shape: tuple[int, int, int]) -> np.ndarray:
        with self._lock:
            bg = self._bg.get((kind, shape))
            if bg is None:
                bg = self._top_bg(shape) if kind == "top" else self._front_bg(shape)
                self._bg[(kind, shape)] = bg
            return bg

    # --- per frame ------------------------------------------------------------------------------------
    def render(self, view: SceneView, cameras: list[str] | None = None) -> dict[str, np.ndarray]:
        """Render the named cameras (default: all) for ``view``; arrays are read-only (H, W, 3) uint8."""
        keys: dict[str, bytes] = {}
        out: dict[str, np.ndarray] = {}
        for cam in cameras if cameras is not None else list(self.cameras):
            kind = camera_kind(cam)
            key = keys.get(kind)
            if key is None:
                key = keys[kind] = self.salt + view.key(kind)
            arr = self.cache.get(key, cam)
            if arr is None:
                arr = self._draw(cam, view)
                arr.flags.writeable = False
                self.cache.put(key, cam, arr)
                self.rendered += 1
            out[cam] = arr
        return out

    def _draw(self, cam: str, view: SceneView) -> np.ndarray:
        shape = self.cameras[cam]
        kind = camera_kind(cam)
        if kind == "top":
            return self._draw_top(shape, view)
        if kind == "front":
            return self._draw_front(shape, view)
        arm = 1 if kind == "wrist1" and view.ee_world.shape[0] > 1 else 0
        return self._draw_wrist(shape, view, arm)

    def _draw_top(self, shape: tuple[int, int, int], v: SceneView) -> np.ndarray:
        img = self._background("top", shape).copy()
        res = TOP_X_SPAN / shape[0]
        half = _BLOCK_HALF / res
        r, c = self._top_px(v.target, shape)
        _fill(img, r - half, r + half, c - half, c + half, v.target_rgb)
        br, bc = self._top_px(v.base, shape)
        _fill(img, br - 0.08 / res, br + 0.08 / res, bc - 0.35 / res, bc + 0.35 / res, _BODY)
        for i in range(v.ee_world.shape[0]):
            m = self._top_px(v.mounts_world[i], shape)
            e = self._top_px(v.ee_world[i], shape)
            _segment(img, m, e, 0.03 / res, _ARM)
            # Higher grippers look bigger; the colour shows how open they are.
            g = (0.025 + 0.06 * max(float(v.ee_world[i][2]), 0.0)) / res
            shade = int(40 + 200 * float(v.openness[i]))
            _fill(img, e[0] - g, e[0] + g, e[1] - g, e[1] + g, (shade, shade, shade))
        return np.asarray(img)

    def _draw_front(self, shape: tuple[int, int, int], v: SceneView) -> np.ndarray:
        img = self._background("front", shape).copy()
        s = shape[1] / 2.4
        half = _BLOCK_HALF * s
        r, c = self._front_px(v.target, shape)
        _fill(img, r - half, r + half, c - half, c + half, v.target_rgb)
        for i in range(v.ee_world.shape[0]):
            m = self._front_px(v.mounts_world[i] + np.array([0, 0, 0.35]), shape)
            e = self._front_px(v.ee_world[i] + np.array([0, 0, 0.02]), shape)
            _segment(img, m, e, 0.035 * s, _ARM)
            gap = (0.01 + 0.03 * float(v.openness[i])) * s
            _fill(img, e[0], e[0] + 0.05 * s, e[1] - gap - 0.01 * s, e[1] - gap, _BODY)
            _fill(img, e[0], e[0] + 0.05 * s, e[1] + gap, e[1] + gap + 0.01 * s, _BODY)
        return np.asarray(img)

    def _draw_wrist(self, shape: tuple[int, int, int], v: SceneView, arm: int) -> np.ndarray:
        # The table is flat and everything on it is an axis-aligned block, so the wrist view is
        # drawn directly (a fill and a few rectangles) instead of resampling a texture.
        h, w = shape[:2]
        ee = v.ee_world[arm]
        hw = 0.06 + 0.5 * max(float(ee[2]), 0.0)  # half the field width at table level, m
        res = 2 * hw / w
        img = _plain(shape, _TABLE).copy()
        floor_row = h / 2 - (0.0 - ee[0]) / res  # rows below x = 0 show the floor
        _fill(img, floor_row, h, 0, w, _FLOOR)
        for pos, rgb in self.distractors:
            dr = h / 2 - (pos[0] - ee[0]) / res
            dc = w / 2 - (pos[1] - ee[1]) / res
            dh = _DISTRACTOR_HALF / res
            _fill(img, dr - dh, dr + dh, dc - dh, dc + dh, rgb)
        half = _BLOCK_HALF / res
        tr = h / 2 - (v.target[0] - ee[0]) / res
        tc = w / 2 - (v.target[1] - ee[1]) / res
        _fill(img, tr - half, tr + half, tc - half, tc + half, v.target_rgb)
        # Gripper fingers at the bottom of the view; their gap shows the opening.
        gap = w * (0.04 + 0.18 * float(v.openness[arm]))
        fw = w * 0.06
        _fill(img, h * 0.7, h, w / 2 - gap - fw, w / 2 - gap, _BODY)
        _fill(img, h * 0.7, h, w / 2 + gap, w / 2 + gap + fw, _BODY)
        return np.asarray(img)
