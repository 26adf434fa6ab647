"""Episode recording off the hot path: ``steps.jsonl``, per-camera frames, results, live view.

Frames are stored as they arrive: ``transcode="deferred"`` (the default) makes each camera's spool
its finished frame store ``<camera>.jpegs`` (fsync + rename; the H.264 mp4 is made on demand by
:func:`genmanip_results.frames.ensure_video` or ``gmp transcode``); ``transcode="inline"`` runs
x264 after each episode as before. What follows calls the finishing step "transcoding" for both.

Layout (docs/architecture.md, client layout)::

    <root>/<benchmark>/<run_id>/run.json
    <root>/<benchmark>/<run_id>/<task_name>/episode_result.json      merged under a file lock
    <root>/<episode_id>/steps.jsonl, <camera>.jpegs | <camera>.mp4, result.json, INCOMPLETE

The step loop only classifies and enqueues (cheap); a writer thread appends rows and JPEG frames
(length-prefixed, bytes as received: nothing is decoded to be recorded) and a transcoder thread
turns each finished episode's frames into ``<camera>.mp4`` with ffmpeg at low priority, then writes
``result.json`` last (atomically) and removes ``INCOMPLETE``. The queue is bounded (back-pressure,
bounded memory); a failure of either thread is raised in the step loop at the next call and never
blocks it forever.

Nothing the server hands out once is lost to a crash: when the server ends an episode the writer
catches up and leaves ``.awaiting_result.<pid>.json`` (all but the result is on disk); a received
result is saved at once as ``.pending_result.<pid>.json``. The next recorder on the run finishes
such episodes (``recover``, ``adopt_result``) or, when that cannot be done exactly, keeps them
``INCOMPLETE`` with the reason.

Names from the wire never become paths unchecked: the episode id goes through the wire rule
(:func:`genmanip_protocol.schema.safe_relative_path`) and every directory is checked to resolve
inside the results root (``SafePaths.safe_dir``); a camera name (``video.<camera>_view``) becomes a file
name only through :func:`genmanip_results.paths.safe_file`, where the path is built
(``SafePaths.camera_file``: the frame spool, the mp4, the recovery notes' camera lists). A camera name that
fails it refuses the episode's recording with a :class:`RecordingError` naming the field, and
nothing is written outside the results root. Files created next to files gmp may not own
(``steps.jsonl``, the spool) are created with ``O_EXCL | O_NOFOLLOW``
(:func:`genmanip_results.paths.create_exclusive`), and an existing directory that holds files gmp
did not write is never taken over as an episode directory.

The rooms (one owner per concern; the modules are internal, the public names are ``__all__``)::

    recorder.py    Recorder: the step loop's side (the public class): classifies, enqueues, saves
                   a received result at once; builds and stops the threads
    writer.py      Writer: the writer thread ("gmp-recorder"), its bounded queue, the open files
    transcoder.py  Transcoder: the transcoder thread ("gmp-transcoder"), ffmpeg, result.json last
    recovery.py    Recovery: the recovery notes: saving this recorder's, finishing a dead one's
    threads.py     the typed queue items, the one failure slot, the threads' body
    episode.py     Episode: one episode being recorded (the step loop's bookkeeping)
    runs.py        Runs: the run directories written and their run.json; finish_segment
    files.py       the frame-file format, camera names, SafePaths (names from the wire -> paths)

Every module logs to ``genmanip_eval.recording``.
"""

from __future__ import annotations

from genmanip_results.layout import RESULTS_DIR_ENV
from genmanip_results.roots import resolve_results_root

from .files import RAW_JPEG_QUALITY, camera_name, iter_frame_file
from .recorder import TRANSCODE_MODES, Recorder
from .runs import finish_segment

__all__ = [
    "RAW_JPEG_QUALITY",
    "RESULTS_DIR_ENV",
    "TRANSCODE_MODES",
    "Recorder",
    "camera_name",
    "finish_segment",
    "iter_frame_file",
    "resolve_results_root",
]
