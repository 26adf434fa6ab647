"""Item 2 (fast subset): SIGKILL ``gmp eval`` (and its worker processes and ffmpeg children) at
random moments; every finished episode stays intact, partial ones are marked INCOMPLETE, and
re-running with the same run id completes the job without rewriting any finished episode.
The long run (>= 50 kills) is ``python bench/reliability/client_kill.py``."""

from __future__ import annotations

import client_kill
import pytest

pytestmark = pytest.mark.slow


def test_sigkill_at_random_moments_loses_nothing_and_resume_finishes_the_missing_seeds() -> None:
    r = client_kill.run(4, tasks="testbed/reach/easy", seed=11, max_delay=5.0)
    assert r["kills"] == 4
    assert r["problems"] == [], r["problems"]
    assert r["rewritten_finished"] == []
    assert r["final_rc"] == 0
    assert r["client_finished"] == r["server_finished"] == 8
    assert r["incomplete_left"] == []
    assert r["videos_checked"] >= 8
