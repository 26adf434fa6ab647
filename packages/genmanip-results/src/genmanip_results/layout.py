"""The names of the results trees, in one place: every file and directory gmp writes or reads.

No other module of any gmp package spells these names: writers (eval's recorder, the testbed's
server emulation) and readers (discovery, artifacts, viz, leaderboard, clean) import them from
here, so a rename is one edit and a reader can never drift from its writer.

Which directories are results roots is :mod:`genmanip_results.roots`. Two layouts
(docs/architecture.md, "On-disk layouts"):

* **server layout** (the real GenManip server's; the testbed writes it too)::

      <root>/saved/eval_results/<benchmark>/<run_id>/{result.json | progress.json}
          <task_name>/<seed>.lock
          <task_name>/<seed>/result_info.json      (its existence = episode done)
          <task_name>/<seed>/<camera>.mp4, meta_record.pkl

* **client layout** (``gmp eval``'s recording)::

      <results_root>/<benchmark>/<run_id>/run.json (+ .run.json.lock)
          .live/<worker_id>/                      live-view files (eval writes, viz reads)
          <task_name>/episode_result.json (a reference client's tree: + episode_result.lock)
          <task_name>/<seed>/steps.jsonl, <camera>.jpegs and/or <camera>.mp4, result.json,
                             INCOMPLETE, .video.lock and <camera>.mp4.part (while a video is made),
                             .frames/<camera>.jpegs, .awaiting_result.<pid>.json,
                             .pending_result.<pid>.json
          <task_name>/<seed>/state_plot.png, action_plot.png, merged_with_plot.mp4, plot.log
                             (``gmp plot``'s outputs, either layout)
"""

from __future__ import annotations

__all__ = [
    "AWAITING_NOTE_GLOB",
    "AWAITING_NOTE_PREFIX",
    "CLIENT_RESULTS_DIR",
    "DEMO_RESULTS_DIR",
    "EPISODE_RESULT",
    "EPISODE_RESULT_LOCK",
    "EPISODE_RRD",
    "EVAL_RESULTS_DIR",
    "FRAMES_DIR",
    "FRAME_SPOOL_SUFFIX",
    "INCOMPLETE",
    "LIVE_DIR",
    "LIVE_FRAME_SUFFIX",
    "LIVE_STATE",
    "LOCK_SUFFIX",
    "META_RECORD",
    "NOTE_SUFFIX",
    "PENDING_NOTE_GLOB",
    "PENDING_NOTE_PREFIX",
    "PROGRESS_JSON",
    "RESULTS_DIR_ENV",
    "RESULT_INFO",
    "RESULT_JSON",
    "RRD_SUFFIX",
    "RUN_JSON",
    "RUN_JSON_LOCK",
    "SAVED_DIR",
    "SERVER_INPUT_DIRS",
    "STEPS_JSONL",
    "SUBMITTED_FLAG",
    "VIDEO_SUFFIX",
    "VIEWER_CACHE_PREFIX",
    "awaiting_note_name",
    "note_pid",
    "pending_note_name",
]

# --- where results trees live ---------------------------------------------------------------
#: Environment variable naming the client results root (the reference client's name).
RESULTS_DIR_ENV = "GENMANIP_RESULT_DIR"
#: The client results root when neither ``--results-dir`` nor ``$GENMANIP_RESULT_DIR`` is set.
CLIENT_RESULTS_DIR = "client_results"
#: ``gmp demo``'s results root when ``--results-dir`` is not given (client layout, below the cwd).
DEMO_RESULTS_DIR = "gmp-demo"
#: The server layout's results live in ``<root>/saved/eval_results``.
SAVED_DIR = "saved"
EVAL_RESULTS_DIR = "eval_results"
#: The server's inputs next to its results (``saved/tasks``, ``saved/demonstrations``): never
#: results, never touched by gmp.
SERVER_INPUT_DIRS = ("tasks", "demonstrations")

# --- run directory ------------------------------------------------------------------------------
#: The client layout's run manifest.
RUN_JSON = "run.json"
#: The run's one lock (several ``gmp eval`` processes share one run): ``run.json``, every
#: ``episode_result.json``, an attempt taking an episode directory are changed under it.
RUN_JSON_LOCK = ".run.json.lock"
#: The server layout's final (``result.json``) and running (``progress.json``) metric files.
RESULT_JSON = "result.json"
PROGRESS_JSON = "progress.json"
#: Written by ``gmp leaderboard submit`` once the upload is confirmed (both layouts).
SUBMITTED_FLAG = "submitted.flag"
#: Live-view files of a running ``gmp eval`` (``<run_dir>/.live/<worker_id>/``).
LIVE_DIR = ".live"

# --- task directory -----------------------------------------------------------------------------
#: ``{"<seed>": {"score": float, "sr": float}}``, merged under :data:`RUN_JSON_LOCK`.
EPISODE_RESULT = "episode_result.json"
#: The reference client's lock of ``episode_result.json`` (gmp no longer writes it; a tree the
#: reference client or an older gmp wrote may hold one).
EPISODE_RESULT_LOCK = "episode_result.lock"
#: Server layout: ``<task_name>/<seed>.lock`` claims an episode.
LOCK_SUFFIX = ".lock"

# --- episode directory --------------------------------------------------------------------------
#: Client layout: one JSON line per executed action.
STEPS_JSONL = "steps.jsonl"
#: Client layout: present while an episode is recorded or after it was aborted.
INCOMPLETE = "INCOMPLETE"
#: Server layout: the episode's result; its existence means the episode is done.
RESULT_INFO = "result_info.json"
#: Server layout: the episode's pickled record (read only through the allow-list unpickler).
META_RECORD = "meta_record.pkl"
#: Every camera video is ``<camera>.mp4``.
VIDEO_SUFFIX = ".mp4"
#: An episode's Rerun recording, when the server wrote one: ``episode.rrd`` (else any ``*.rrd``).
EPISODE_RRD = "episode.rrd"
RRD_SUFFIX = ".rrd"
#: The JPEG frame spool of an episode being recorded: ``.frames/<camera>.jpegs``.
FRAMES_DIR = ".frames"
FRAME_SPOOL_SUFFIX = ".jpegs"
#: The finished frame store of a camera: ``<camera>.jpegs`` next to ``steps.jsonl``; the JPEG
#: frames as received, in the spool's format (big-endian u32 length + JPEG bytes per frame), moved
#: out of ``.frames/`` once the episode is complete. Read it with :mod:`genmanip_results.frames`.
FRAME_STORE_SUFFIX = ".jpegs"
#: The lock an episode's H.264 videos are made under (:func:`genmanip_results.frames.ensure_video`;
#: hidden, empty, present only while a video is being made: ``FileLock(remove=True)``).
VIDEO_LOCK = ".video.lock"
#: A video being made is ``<camera>.mp4.part`` until it is renamed into place.
VIDEO_PART_SUFFIX = ".mp4.part"
#: Recovery notes (docs/architecture.md): ``.awaiting_result.<pid>.json`` (everything but the
#: result) and ``.pending_result.<pid>.json`` (the result too; videos outstanding).
AWAITING_NOTE_PREFIX = ".awaiting_result."
PENDING_NOTE_PREFIX = ".pending_result."
NOTE_SUFFIX = ".json"
AWAITING_NOTE_GLOB = f"{AWAITING_NOTE_PREFIX}*{NOTE_SUFFIX}"
PENDING_NOTE_GLOB = f"{PENDING_NOTE_PREFIX}*{NOTE_SUFFIX}"

# --- live view (``<run_dir>/.live/<worker_id>/``; the contract is genmanip_results.live) ------
#: A worker's live state (JSON object).
LIVE_STATE = "live.json"
#: A worker's newest frame of a camera: ``<camera>.jpg``.
LIVE_FRAME_SUFFIX = ".jpg"

# --- generated next to an episode's files (``gmp clean`` may remove them) --------------------
#: Every results-browser cache (``gmp viz``'s ``.genmanip_vis.rrd`` and its sidecar) starts so.
VIEWER_CACHE_PREFIX = ".genmanip_vis."
#: ``gmp plot``'s outputs (genmanip-artifacts writes them, into the episode directory unless told
#: otherwise; ``gmp viz`` links the ones an episode has; ``gmp clean --plots`` removes them):
#: the state and action plots, the cameras over a synchronized plot panel, and the plot's log.
STATE_PLOT = "state_plot.png"
ACTION_PLOT = "action_plot.png"
MERGED_VIDEO = "merged_with_plot.mp4"
PLOT_LOG = "plot.log"
#: The plot images, in the order they are shown.
PLOT_IMAGES = (STATE_PLOT, ACTION_PLOT)


def awaiting_note_name(pid: int) -> str:
    """The awaiting-result note of process ``pid`` (the pid makes claiming one atomic rename)."""
    return f"{AWAITING_NOTE_PREFIX}{pid}{NOTE_SUFFIX}"


def pending_note_name(pid: int) -> str:
    """The pending-result note of process ``pid``."""
    return f"{PENDING_NOTE_PREFIX}{pid}{NOTE_SUFFIX}"


def note_pid(name: str) -> str | None:
    """The pid part of an awaiting- or pending-result note's file name, as written (the inverse of
    :func:`awaiting_note_name` and :func:`pending_note_name`): ``"4242"`` for
    ``.pending_result.4242.json``. None when ``name`` is no such note or has an empty pid part.

    The text, not a number: whether it is a pid is ``genmanip_results.live.parse_pid``'s to say,
    and ``owner_alive`` takes it as recorded.
    """
    for prefix in (AWAITING_NOTE_PREFIX, PENDING_NOTE_PREFIX):
        # (the length check: the prefix and the suffix must not overlap, ".pending_result.json")
        if name.startswith(prefix) and name.endswith(NOTE_SUFFIX) and len(name) > len(prefix) + len(NOTE_SUFFIX):
            return name[len(prefix):-len(NOTE_SUFFIX)]
    return None


# --- provenance of generated files (genmanip_results.provenance) -------------------------------
#: Per-directory manifest of the files gmp generated there (plots, viewer caches): one JSON line
#: per file, written by the writer right after the file. ``gmp clean`` deletes only what a
#: record proves (same name, inode, size and mtime); hidden, so bundles leave it out.
GENERATED_MANIFEST = ".gmp-generated.jsonl"
#: gmp's cache directory carries a Cache Directory Tag (https://bford.info/cachedir/) written
#: when gmp creates it; ``gmp clean`` empties only a tagged cache directory.
CACHE_DIR_TAG = "CACHEDIR.TAG"

__all__ += ["CACHE_DIR_TAG", "GENERATED_MANIFEST"]  # appended: the list above stays as it was
__all__ += ["FRAME_STORE_SUFFIX", "VIDEO_LOCK", "VIDEO_PART_SUFFIX"]
__all__ += ["ACTION_PLOT", "MERGED_VIDEO", "PLOT_IMAGES", "PLOT_LOG", "STATE_PLOT"]
