"""genmanip-leaderboard: verified leaderboard submissions of GenManip runs.

List the local runs of both results layouts (:func:`~genmanip_leaderboard.runs.discover_runs`),
bundle one into a zip with a SHA-256 manifest (:func:`build_bundle`, checked by
:func:`verify_bundle`), and upload it over verified HTTPS (:class:`LeaderboardClient`,
:func:`submit_run`), marking the run submitted only once the leaderboard confirmed. The
``gmp leaderboard list|bundle|submit|status`` handlers are in :mod:`genmanip_leaderboard.cli`.
"""

from __future__ import annotations

from .__about__ import __version__
from .bundle import (
    BUNDLE_FORMAT,
    FLAG_NAME,
    MANIFEST_NAME,
    VIDEO_SUFFIXES,
    Bundle,
    Member,
    Skipped,
    build_bundle,
    bundle_filename,
    check_member_name,
    collect_members,
    content_digest,
    default_bundle_dir,
    file_sha256,
    verify_bundle,
)
from .client import DEFAULT_HOST, DEFAULT_PORT, LeaderboardClient, UploadResult, upload_timeout
from .errors import (
    AmbiguousRunError,
    BundleError,
    GenmanipLeaderboardError,
    IncompleteRunError,
    InsecureLeaderboardURL,
    LeaderboardAuthError,
    LeaderboardReplyError,
    MissingTokenError,
    RunNotFoundError,
    UploadError,
    UploadInterruptedError,
    UploadRejectedError,
)
from .runs import (
    Completeness,
    completeness,
    default_roots,
    discover_runs,
    resolve_run,
    results_tree,
    run_summary,
    select_run,
)
from .submit import SubmitOutcome, read_flag, submit_run, write_flag

__all__ = [
    "BUNDLE_FORMAT",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "FLAG_NAME",
    "MANIFEST_NAME",
    "VIDEO_SUFFIXES",
    "AmbiguousRunError",
    "Bundle",
    "BundleError",
    "Completeness",
    "GenmanipLeaderboardError",
    "IncompleteRunError",
    "InsecureLeaderboardURL",
    "LeaderboardAuthError",
    "LeaderboardClient",
    "LeaderboardReplyError",
    "Member",
    "MissingTokenError",
    "RunNotFoundError",
    "Skipped",
    "SubmitOutcome",
    "UploadError",
    "UploadInterruptedError",
    "UploadRejectedError",
    "UploadResult",
    "__version__",
    "build_bundle",
    "bundle_filename",
    "check_member_name",
    "collect_members",
    "completeness",
    "content_digest",
    "default_bundle_dir",
    "default_roots",
    "discover_runs",
    "file_sha256",
    "read_flag",
    "resolve_run",
    "results_tree",
    "run_summary",
    "select_run",
    "submit_run",
    "upload_timeout",
    "verify_bundle",
    "write_flag",
]
