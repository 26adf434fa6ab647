"""The exception tree of genmanip-leaderboard. Messages never contain the author token."""

from __future__ import annotations

from collections.abc import Sequence

from genmanip_protocol.errors import ExitCode, GenmanipError
from genmanip_runtime.errors import InsecureTransportError

__all__ = [
    "AmbiguousRunError",
    "BundleCorruptError",
    "BundleError",
    "BundleManifestError",
    "BundleMemberNameError",
    "BundleMismatchError",
    "BundleSourceChangedError",
    "BundleTooLargeError",
    "BundleUnsupportedError",
    "BundleVerifyError",
    "GenmanipLeaderboardError",
    "IncompleteRunError",
    "InsecureLeaderboardURL",
    "LeaderboardAuthError",
    "LeaderboardReplyError",
    "MissingTokenError",
    "RunNotFoundError",
    "UploadError",
    "UploadInterruptedError",
    "UploadRejectedError",
]


class GenmanipLeaderboardError(GenmanipError):
    """Base exception of genmanip-leaderboard."""


class RunNotFoundError(GenmanipLeaderboardError):
    """No run with that id (or path) under the results root."""

    exit_code = ExitCode.INVALID_INPUT


class AmbiguousRunError(GenmanipLeaderboardError):
    """The run id exists under several benchmarks or layouts; ``candidates`` are their run dirs."""

    exit_code = ExitCode.USAGE

    def __init__(self, run_id: str, candidates: Sequence[str], *, hint: str | None = None) -> None:
        listing = "; ".join(candidates)
        super().__init__(
            f"run id {run_id!r} is ambiguous: {len(candidates)} runs match: {listing}",
            hint=hint or "pick one with --benchmark-id BENCHMARK, or point --root at one results tree",
        )
        self.run_id = run_id
        self.candidates = list(candidates)


class IncompleteRunError(GenmanipLeaderboardError):
    """The run has unfinished or missing episodes; ``missing`` lists them (``task/seed``)."""

    exit_code = ExitCode.REFUSED

    def __init__(self, run_id: str, missing: Sequence[str], *, hint: str | None = None) -> None:
        shown = ", ".join(missing[:20]) + (f" (and {len(missing) - 20} more)" if len(missing) > 20 else "")
        super().__init__(
            f"run {run_id!r} is incomplete: {len(missing)} episode(s) missing or unfinished: {shown}",
            hint=hint,
        )
        self.run_id = run_id
        self.missing = list(missing)


class BundleError(GenmanipLeaderboardError):
    """A bundle cannot be built safely, or a bundle failed verification."""

    exit_code = ExitCode.REFUSED


class BundleSourceChangedError(BundleError):
    """A file of the run changed while it was being bundled (swapped for a symlink or another
    file, or a directory on its way swapped): it was not read and no bundle was written.
    ``member`` is its name in the run."""

    def __init__(self, member: str, reason: str) -> None:
        super().__init__(
            f"{member}: {reason} while bundling; nothing written",
            hint="bundle again once nothing else writes to the run",
        )
        self.member = member


class BundleVerifyError(BundleError):
    """A bundle failed verification. ``path`` is the zip (empty when the check ran on a name
    alone); ``member`` the zip member and ``field`` the ``manifest.json`` field the problem is in
    (either may be None). The message is ``<path>: member '<name>': <field>: <problem>``."""

    exit_code = ExitCode.INVALID_INPUT

    def __init__(
        self,
        path: str,
        problem: str,
        *,
        member: str | None = None,
        field: str | None = None,
        hint: str | None = None,
    ) -> None:
        parts = [path] if path else []
        if member is not None:
            parts.append(f"member {member!r}")
        if field is not None:
            parts.append(field)
        super().__init__(": ".join([*parts, problem]), hint=hint)
        self.path = path
        self.member = member
        self.field = field
        self.problem = problem


class BundleCorruptError(BundleVerifyError):
    """The zip's structure or a member's data is damaged: not a zip, truncated, a bad CRC-32, a
    corrupt deflate stream, inconsistent zip64 sizes, overlapping members."""


class BundleUnsupportedError(BundleVerifyError):
    """A member uses what a gmp bundle never does: a compression method other than stored or
    deflate, encryption."""


class BundleMemberNameError(BundleVerifyError):
    """A member name is unsafe (absolute, ``..``, backslash, control character, NUL) or appears
    twice. Refused (exit 9) like an unsafe name met while building."""

    exit_code = ExitCode.REFUSED


class BundleTooLargeError(BundleVerifyError):
    """A member (or the whole zip) declares more uncompressed bytes than the limit, or more than
    its compressed data can expand to (a zip bomb): refused before anything is decompressed."""

    exit_code = ExitCode.REFUSED


class BundleManifestError(BundleVerifyError):
    """``manifest.json`` is missing, not JSON, nested too deeply, or a field has the wrong type;
    ``field`` names it (``files[3].size``)."""


class BundleMismatchError(BundleVerifyError):
    """The members differ from ``manifest.json``: a member missing or unlisted, a size or
    SHA-256 that does not match, a wrong ``content_sha256``."""


class MissingTokenError(GenmanipLeaderboardError):
    """No author token (``--token``, ``USER_TOKEN`` or ``[leaderboard] token`` in the config file)."""

    exit_code = ExitCode.AUTH


class InsecureLeaderboardURL(GenmanipLeaderboardError, InsecureTransportError):
    """Plain HTTP was asked for a host that is not this machine (an ``InsecureTransportError``)."""

    exit_code = ExitCode.REFUSED


class UploadError(GenmanipLeaderboardError):
    """The upload did not succeed; nothing was marked as submitted."""

    exit_code = ExitCode.REMOTE_ERROR


class UploadRejectedError(UploadError):
    """The leaderboard answered and refused the bundle; ``status`` is the HTTP status, ``reason`` its text."""

    def __init__(
        self, status: int, reason: str, *, what: str = "the upload", hint: str | None = None
    ) -> None:
        super().__init__(f"the leaderboard rejected {what} (HTTP {status}): {reason}", hint=hint)
        self.status = status
        self.reason = reason


class LeaderboardAuthError(UploadRejectedError):
    """The author token was rejected."""

    exit_code = ExitCode.AUTH


class UploadInterruptedError(UploadError):
    """The connection failed or was dropped before the leaderboard answered."""

    exit_code = ExitCode.UNREACHABLE


class LeaderboardReplyError(UploadError):
    """The leaderboard's reply is not the documented shape; ``field`` names what is wrong."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"malformed leaderboard reply: {field}: {problem}")
        self.field = field
