"""Episode end and finalization: an ended episode's score, recorded frames and result files.

Owns the two pools of this work and the count of finalizes in flight:

* the record pool (2 threads) JPEG-encodes the frames a ``save_process`` worker records, off the
  request path (:meth:`Finalizer.record`);
* the finalize pool (1 thread) writes an ended episode's files into its seed directory (facts
  §12.1): the camera videos and ``meta_record.pkl`` (``save_process`` only), then
  ``result_info.json`` last (its existence means the episode is done), then removes the seed's
  lock if it is still this worker's.

Lock discipline: the in-flight count is guarded by the job lock handed in; :meth:`Finalizer.wait`
waits on a condition of that same lock, so ``/status`` reads the count and the ledger's scores in
one consistent view. :meth:`Finalizer.end` takes the job lock (after the caller's worker lock) to
record the score and count the finalize in one step.
"""

from __future__ import annotations

import logging
import pickle
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from genmanip_results.layout import META_RECORD, RESULT_INFO, VIDEO_SUFFIX

from .config import CoreConfig
from .ledger import SeedLedger, lock_path, unlink_own_lock
from .render import FrameCache
from .stats import Stats
from .worker import SeedKey, Worker, now_str
from .world import Episode

__all__ = ["Finalizer"]

log = logging.getLogger("genmanip_testbed.core")


class Finalizer:
    """Ends episodes: records the score in the ledger and writes the files in the background."""

    def __init__(
        self,
        *,
        cfg: CoreConfig,
        stats: Stats,
        cache: FrameCache,
        ledger: SeedLedger,
        lock: threading.RLock,
    ) -> None:
        self._cfg = cfg
        self._stats = stats
        self._cache = cache
        self._ledger = ledger
        self._lock = lock
        self._cv = threading.Condition(lock)
        self._in_flight = 0
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="testbed-finalize")
        # Recording JPEG-encodes frames off the request path; finalize waits for them in order.
        self._record_pool = ThreadPoolExecutor(2, thread_name_prefix="testbed-record")

    @property
    def in_flight(self) -> int:
        """Finalizes not yet written (read it under the job lock for a view consistent with it)."""
        return self._in_flight

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every episode finalize (result files) is written."""
        with self._cv:
            return self._cv.wait_for(lambda: self._in_flight == 0, timeout)

    # ============================================================================ recording ====
    def _encode_frame(self, arr: np.ndarray) -> bytes:
        from genmanip_protocol.codec import JpegFrame

        jf = self._cache.jpeg(arr)
        if not isinstance(jf, JpegFrame):
            jf = JpegFrame.encode(arr, quality=85)
            self._cache.put_jpeg(arr, jf)
        return jf.data

    def record(self, w: Worker, obs: dict[str, Any]) -> None:
        """Queue the encoding of ``obs``'s camera frames into ``w``'s recording."""
        for key, val in obs.items():
            if key.startswith("video.") and isinstance(val, np.ndarray):
                w.frames.setdefault(key, []).append(
                    self._record_pool.submit(self._encode_frame, val)
                )

    # ========================================================================== episode end ====
    def end(self, w: Worker, ep: Episode, key: SeedKey) -> dict[str, Any]:
        """End ``w``'s episode ``ep`` on seed ``key``: score it, detach it, queue its finalize.

        The caller holds ``w.lock``. Returns the ``episode_result`` (facts §6).
        """
        score = ep.score
        sr = 1.0 if ep.success else 0.0
        result = {
            "episode_id": ep.episode_id,
            "task_name": key[0],
            "seed": key[1],
            "score": score,
            "sr": sr,
        }
        # One hold: /status must never see the score without its finalize counted (it would say
        # "complete" before result.json can be written).
        with self._lock:
            self._ledger.record_score(key, score, sr)
            self._in_flight += 1
        self._stats.add("episodes_finished")
        frames, started = w.frames, w.started
        w.frames = {}
        w.episode = None
        w.claim = None
        self._pool.submit(self._finalize, ep, key, w.wid, self._ledger.run_dir, frames, started)
        return result

    def _finalize(  # noqa: PLR0917 - a pool job: positional by nature
        self,
        ep: Episode,
        key: SeedKey,
        wid: Any,
        run_dir: Path,
        frames: dict[str, list[Future[bytes]]],
        started: str,
    ) -> None:
        from genmanip_runtime.atomic import atomic_write_bytes, atomic_write_json

        seed_dir = run_dir / key[0] / key[1]
        try:
            seed_dir.mkdir(parents=True, exist_ok=True)
            if self._cfg.save_process:
                from genmanip_results.video import transcode_jpegs

                for cam_key, futures in frames.items():
                    jpegs = [f.result() for f in futures]
                    name = cam_key[len("video.") :]
                    name = name[: -len("_view")] if name.endswith("_view") else name
                    if jpegs:
                        video = seed_dir / f"{name}{VIDEO_SUFFIX}"
                        transcode_jpegs(jpegs, video, fps=self._cfg.video_fps)
                meta = {
                    "joint_positions": ep.record_joints,
                    "gripper_positions": ep.record_gripper,
                    "base_positions": ep.record_base,
                    "instruction": ep.instruction,
                    "model_output": ep.record_outputs,
                    "robot_id": ep.robot.robot_id,
                }
                atomic_write_bytes(
                    seed_dir / META_RECORD,
                    pickle.dumps(meta, protocol=pickle.HIGHEST_PROTOCOL),
                )
            info: dict[str, Any] = {
                "score": float(ep.score),
                "success_rate": 1 if ep.success else 0,
                "log_info": {
                    "episode_start_time": started or now_str(),
                    "episode_end_time": now_str(),
                    "metric_score": ep.metric_score,
                },
            }
            if ep.termination_reason is not None:
                info["termination_reason"] = ep.termination_reason
            # Written last: its existence means the episode is done.
            atomic_write_json(seed_dir / RESULT_INFO, info)
            # The run dir given at the episode's end, not the ledger's current one; and the
            # ledger's record of its own lock inodes is left alone, as before.
            unlink_own_lock(lock_path(run_dir, key), wid)
        except Exception:
            log.exception("finalize of %s failed", ep.episode_id)
        finally:
            with self._cv:
                self._in_flight -= 1
                self._cv.notify_all()

    def shutdown(self) -> None:
        """Stop the pools: queued finalizes still run; queued frame encodings are dropped."""
        self._pool.shutdown(wait=True)
        self._record_pool.shutdown(wait=True, cancel_futures=True)
