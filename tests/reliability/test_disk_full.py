"""Item 4 (fast subset): the disk fills up during recording. A 3 MiB tmpfs is the results root
(root can mount here; elsewhere the run falls back to RLIMIT_FSIZE and the test says which it
used). The client stops with a clear typed error and leaves no corrupt result file; the episodes
it finished before are intact. The long run is ``python bench/reliability/disk_full.py``."""

from __future__ import annotations

import disk_full
import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("method", ["auto", "rlimit"])
def test_disk_full_stops_cleanly_and_keeps_finished_episodes(method: str) -> None:
    r = disk_full.run_one("3m" if method == "auto" else "300k", method=method)
    print(f"disk-full method: {r['method']}")
    assert r["problems"] == [], r["problems"]
    assert r["rc"] == 1, r["stderr_tail"]  # ExitCode.FAILURE: a RecordingError, not a crash (70)
    assert "No space left" in r["report"] or "File too large" in r["report"]
    assert "Traceback" not in r["stderr_tail"]
