"""JPEG camera frames through gmp's client and server: they travel as their JPEG bytes and the
policy gets exactly what an in-process policy gets (undecoded frames that decode on access)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import serve_helpers
from genmanip_eval.errors import PolicyError
from genmanip_eval.inference import BatchItem, Inference
from genmanip_protocol import Observation
from genmanip_serve import PolicyServer, serve_policy
from serve_helpers import jpeg_obs, make_obs


@pytest.fixture()
def server() -> Iterator[PolicyServer]:
    with serve_policy("serve_helpers:looking") as s:
        yield s


def _batch(i: int) -> list[BatchItem]:
    return [
        BatchItem("0", "e0", jpeg_obs(i, episode="e0"), new_episode=i == 0),
        BatchItem("1", "e1", jpeg_obs(i + 1, episode="e1"), new_episode=i == 0),
        BatchItem("2", "e2", Observation(make_obs(i, episode="e2")), new_episode=i == 0),  # raw frames
    ]


def _cameras(item: BatchItem) -> list[str]:
    return sorted(k for k in item.obs.keys() if k.startswith("video."))


def test_jpeg_frames_reach_the_policy_undecoded_and_decode_as_in_process(server: PolicyServer) -> None:
    assert server.metadata()["frames"] == ["raw", "jpeg"]
    remote = Inference.create(server.url)
    try:
        assert remote.prefers_jpeg
        batch = _batch(0)
        got = remote.actions(batch)
        # the client decoded nothing: every JPEG camera is still encoded on this side
        for it in batch[:2]:
            assert all(it.obs.is_encoded(k) for k in _cameras(it))
        seen = {(w.split("@")[0], k): (enc, data, frame) for w, k, enc, data, frame in serve_helpers.SEEN}
        assert len(seen) == 3 * len(_cameras(batch[0]))
        for it in batch:
            for k in _cameras(it):
                enc, data, frame = seen[(it.worker_id, k)]
                if it.worker_id == "2":  # raw frames stay raw arrays
                    assert not enc and data is None and np.array_equal(frame, it.obs[k])
                else:  # the same JPEG bytes, decoded on the policy's first access, as in-process
                    assert enc and data == it.obs.frame_bytes(k)
                    assert np.array_equal(frame, it.obs.jpeg_frame(k).decode())
    finally:
        remote.close()
    local = Inference.create("serve_helpers:looking")
    assert local.actions(_batch(0)) == got and not local.prefers_jpeg
    # in-process, the policy saw the frames arrive encoded too
    assert all(enc for w, _k, enc, _d, _f in serve_helpers.SEEN if w != "2")


def test_frames_raw_sends_decoded_frames(server: PolicyServer) -> None:
    remote = Inference.create(server.url, {"frames": "raw"})
    try:
        assert not remote.prefers_jpeg
        got = remote.actions(_batch(1))
        assert serve_helpers.SEEN and not any(enc for _w, _k, enc, _d, _f in serve_helpers.SEEN)
    finally:
        remote.close()
    assert Inference.create("serve_helpers:looking").actions(_batch(1)) == got
    with pytest.raises(PolicyError, match="frames='png'"):
        Inference.create(server.url, {"frames": "png"})
