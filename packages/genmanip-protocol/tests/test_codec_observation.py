from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from typing import Any

import genmanip_protocol.codec.observation as observation_mod
import numpy as np
import pytest
from genmanip_protocol import DecodeError
from genmanip_protocol.codec import JpegFrame, LegacyCodec, MsgpackCodec, Observation

CAMS = ["video.left_camera_view", "video.overlook_camera_view", "video.right_camera_view"]


def _rgb(seed: int, shape: tuple[int, int, int] = (24, 32, 3)) -> np.ndarray:
    # smooth content so JPEG stays close to the source
    y, x = np.mgrid[0 : shape[0], 0 : shape[1]]
    base = x * 2 + y * 2 + seed * 20  # <= 168: no wrap-around edges
    return np.stack([base, 255 - base, base // 2], axis=-1).astype(np.uint8)


def _frames() -> dict[str, JpegFrame]:
    return {cam: JpegFrame.encode(_rgb(i)) for i, cam in enumerate(CAMS)}


@pytest.fixture
def decode_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts real JPEG decodes (and the thread each ran on) by wrapping the decoder."""
    calls: list[str] = []
    real: Callable[[Any], np.ndarray] = observation_mod.decode_jpeg

    def counting(data: Any) -> np.ndarray:
        calls.append(threading.current_thread().name)
        return real(data)

    monkeypatch.setattr(observation_mod, "decode_jpeg", counting)
    return calls


@pytest.mark.parametrize("codec", [LegacyCodec(), MsgpackCodec()], ids=lambda c: c.name)
def test_lazy_decode_from_a_reply(codec: Any, decode_calls: list[str]) -> None:
    frames = _frames()
    reply = {"0": {"obs": {**frames, "state.joints": np.zeros(12, np.float32)}, "metric": None}}
    obs = codec.decode(codec.encode(reply))["0"]["obs"]
    assert isinstance(obs, Observation)
    assert decode_calls == []  # decoding the reply decoded no frame
    assert obs.cameras == CAMS and len(obs) == 4 and "video.left_camera_view" in obs
    assert list(obs.keys()) == [*CAMS, "state.joints"]
    repr(obs)
    assert decode_calls == []
    left = obs["video.left_camera_view"]
    assert len(decode_calls) == 1  # one camera read, one decode
    assert left.shape == (24, 32, 3) and left.dtype == np.uint8
    assert np.abs(left.astype(int) - _rgb(0)).mean() < 4
    assert obs["video.left_camera_view"] is left and len(decode_calls) == 1  # cached
    assert not obs.is_encoded("video.left_camera_view") and obs.is_encoded(
        "video.right_camera_view"
    )
    # recording still gets the original JPEG bytes of the decoded camera
    assert obs.frame_bytes("video.left_camera_view") == frames["video.left_camera_view"].data
    obs.decode_all()
    assert len(decode_calls) == 3
    assert all(not obs.is_encoded(c) for c in CAMS)
    dict(obs.items())
    assert len(decode_calls) == 3


def test_decode_all_runs_on_the_thread_pool(decode_calls: list[str]) -> None:
    obs = Observation(_frames())
    obs.decode_all()
    assert len(decode_calls) == 3
    # the caller decodes one frame itself, the pool the others
    assert sorted(n.startswith("gmp-jpeg") for n in decode_calls) == [False, True, True]
    assert threading.current_thread().name in decode_calls


def test_iteration_values_items_decode_all_keys_do_not(decode_calls: list[str]) -> None:
    obs = Observation(_frames())
    assert sorted(obs.keys()) == sorted(CAMS) and decode_calls == []
    assert all(isinstance(v, np.ndarray) for v in obs.values())
    assert len(decode_calls) == 3
    obs2 = Observation(_frames())
    keys = list(iter(obs2))
    assert keys == CAMS and len(decode_calls) == 6 and not any(obs2.is_encoded(k) for k in CAMS)
    obs3 = Observation(_frames())
    assert all(isinstance(v, np.ndarray) for _, v in obs3.items())


def test_frame_bytes_for_raw_and_replaced_frames() -> None:
    frames = _frames()
    raw = _rgb(9)
    obs = Observation({**frames, "video.raw_view": raw, "state.joints": np.zeros(2)})
    assert obs.frame_bytes("video.raw_view") is None and not obs.is_encoded("video.raw_view")
    assert obs.jpeg_frame("video.left_camera_view") is frames["video.left_camera_view"]
    obs["video.left_camera_view"]
    obs["video.left_camera_view"] = raw  # replaced: the old JPEG no longer describes it
    assert obs.frame_bytes("video.left_camera_view") is None
    del obs["video.right_camera_view"]
    assert "video.right_camera_view" not in obs
    with pytest.raises(KeyError):
        obs.frame_bytes("video.right_camera_view")
    with pytest.raises(KeyError):
        obs.is_encoded("missing")


def test_to_dict_copy_equality_and_pickle() -> None:
    frames = _frames()
    obs = Observation({**frames, "state.joints": np.arange(3.0), "instruction": "x"})
    raw = obs.to_dict(decode=False)
    assert raw["video.left_camera_view"] is frames["video.left_camera_view"] and obs.is_encoded(
        CAMS[0]
    )
    cp = obs.copy()
    cp["instruction"] = "y"
    assert obs["instruction"] == "x"
    assert cp.is_encoded(CAMS[1])
    full = obs.to_dict()
    assert all(isinstance(full[c], np.ndarray) for c in CAMS)
    assert obs == full and full == obs.to_dict()
    assert obs != {**full, "instruction": "z"}
    assert pickle.loads(pickle.dumps(cp)) == cp
    # the public constructor copies; keyword arguments work like dict()
    src = {"state.a": 1}
    o = Observation(src, timestep=3)
    o["state.a"] = 2
    assert src == {"state.a": 1} and o["timestep"] == 3 and o.get("missing", 5) == 5


def test_corrupt_frames_raise_decode_error() -> None:
    good = JpegFrame.encode(_rgb(0))
    obs = Observation({
        "video.bad_view": JpegFrame(b"\xff\xd8 definitely not a jpeg", (24, 32, 3)),
        "video.lie_view": JpegFrame(good.data, (48, 32, 3)),  # declared shape does not match
        "video.ok_view": good,
    })  # fmt: skip
    with pytest.raises(DecodeError, match="not a JPEG image"):  # FF D8 but no third FF
        obs["video.bad_view"]
    with pytest.raises(DecodeError, match="declared"):
        obs["video.lie_view"]
    with pytest.raises(DecodeError):
        obs.decode_all()
    assert not obs.is_encoded("video.ok_view")  # the good frame decoded anyway
    assert obs.is_encoded("video.bad_view")


def test_jpeg_frame_value_semantics() -> None:
    f = JpegFrame.encode(_rgb(1))
    assert f == JpegFrame(bytearray(f.data), [24, 32, 3]) and hash(f) == hash(
        JpegFrame(f.data, (24, 32, 3))
    )
    assert f.nbytes == len(f.data) and "24, 32, 3" in repr(f)
    with pytest.raises(AttributeError):
        f.data = b""  # type: ignore[misc]
    with pytest.raises(ValueError):
        JpegFrame(b"x", (2, 2))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        JpegFrame(b"x", (2, 2, 4))
    with pytest.raises(TypeError):
        JpegFrame("x", (2, 2, 3))  # type: ignore[arg-type]
    assert pickle.loads(pickle.dumps(f)) == f


def test_observation_creation_is_cheap() -> None:
    # 10k observations over 4 still-encoded frames: no work happens at creation
    frames = _frames()
    import time

    t0 = time.perf_counter()
    for _ in range(10_000):
        Observation._wrap(dict(frames))
    assert time.perf_counter() - t0 < 0.5
