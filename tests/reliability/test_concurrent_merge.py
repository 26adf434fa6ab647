"""Item 6 (fast subset): 4 processes x 250 merges into one episode_result.json lose nothing.

The long run is ``python bench/reliability/concurrent_merge.py`` (8 processes x 1000).
"""

from __future__ import annotations

import concurrent_merge


def test_1000_concurrent_merges_from_4_processes_lose_no_update() -> None:
    r = concurrent_merge.run(processes=4, merges=250)
    assert r["exit_codes"] == [0, 0, 0, 0]
    assert r["merges"] == 1000
    assert r["keys"] == 1000
    assert (r["missing"], r["wrong"], r["extra"]) == (0, 0, 0)
    assert r["reader_reads"] > 0 and r["reader_bad_reads"] == 0
    assert r["leftovers"] == []
