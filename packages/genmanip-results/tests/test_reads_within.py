"""Every file a results reader opens is checked where it is opened (genmanip_results.paths
.open_within): a symlink out of the tree, also one swapped in after the scan, is never read.

Discovery, the series loader and the live-view readers, in both layouts: the secret's bytes never
appear in anything they return.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
from genmanip_results.discovery import find_runs, load_episode
from genmanip_results.live import live_workers, read_live_frame, read_live_state
from genmanip_results.series import SeriesError, load_series
from genmanip_results.testing import write_client_run, write_live_worker, write_server_run

SECRET = "TOPSECRET-reads-within"


def _secret_files(outside: Path) -> dict[str, Path]:
    outside.mkdir(parents=True, exist_ok=True)
    files = {
        "result.json": {"score": 1.0, "instruction": SECRET, "robot_id": SECRET},
        "result_info.json": {"score": 1.0, "instruction": SECRET},
        "run.json": {"run_id": SECRET, "benchmark": SECRET},
        "live.json": {"worker_id": SECRET},
    }
    out = {}
    for name, value in files.items():
        (outside / name).write_text(json.dumps(value))
        out[name] = outside / name
    (outside / "steps.jsonl").write_text(json.dumps({"step": 0, "robot_id": SECRET}) + "\n")
    out["steps.jsonl"] = outside / "steps.jsonl"
    (outside / "meta_record.pkl").write_bytes(pickle.dumps({"instruction": SECRET, "robot_id": SECRET}))
    out["meta_record.pkl"] = outside / "meta_record.pkl"
    (outside / "secret.jpg").write_bytes(b"\xff\xd8" + SECRET.encode())
    out["secret.jpg"] = outside / "secret.jpg"
    return out


def _client(root: Path, run_id: str = "r") -> Path:
    return write_client_run(root, "ebench", run_id, tasks={"ebench/t": [1.0]}, steps=3, videos=False)


def _server(project: Path) -> Path:
    return write_server_run(project, "ebench", "r", tasks={"ebench/t": [1.0]}, steps=3, cameras=None)


def _link(path: Path, target: Path) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(target)


def _no_secret(*values: object) -> None:
    for v in values:
        assert SECRET not in repr(v), v


@pytest.mark.parametrize("name", ["result.json", "steps.jsonl"])
def test_client_result_files_linked_out_are_not_read(tmp_path: Path, name: str) -> None:
    secrets = _secret_files(tmp_path / "outside")
    root = tmp_path / "proj" / "client_results"
    run = _client(root)
    ep = next(p.parent for p in run.rglob("result.json") if p.parent.name.isdigit())
    _link(ep / name, secrets[name])
    (info,) = find_runs(tmp_path / "proj")
    _no_secret(info.episodes, [e.result for e in info.episodes])
    one = load_episode(ep)
    _no_secret(one, one.result)
    assert name not in {p.name for p in (one.steps_file,) if p is not None}


@pytest.mark.parametrize("name", ["result_info.json", "meta_record.pkl"])
def test_server_result_files_linked_out_are_not_read(tmp_path: Path, name: str) -> None:
    secrets = _secret_files(tmp_path / "outside")
    run = _server(tmp_path / "proj")
    ep = next(p.parent for p in run.rglob("result_info.json"))
    _link(ep / name, secrets[name])
    (info,) = find_runs(tmp_path / "proj")
    _no_secret(info.episodes, [e.result for e in info.episodes])
    if name == "meta_record.pkl":
        assert info.episodes[0].meta_record is None


def test_run_json_linked_out_is_not_read(tmp_path: Path) -> None:
    secrets = _secret_files(tmp_path / "outside")
    run = _client(tmp_path / "proj" / "client_results")
    _link(run / "run.json", secrets["run.json"])
    (info,) = find_runs(tmp_path / "proj")
    assert info.manifest is None and "symlink" in " ".join(info.errors)
    _no_secret(info.run_id, info.benchmark, info.manifest)


@pytest.mark.parametrize("name", ["steps.jsonl", "meta_record.pkl"])
def test_recording_swapped_for_a_link_after_the_scan_is_refused(tmp_path: Path, name: str) -> None:
    """The scan found a real file; by the time the series loader opens it, it is a symlink out
    (a viewer's cached EpisodeInfo): refused where it is opened, with a typed error."""
    secrets = _secret_files(tmp_path / "outside")
    if name == "steps.jsonl":
        run = _client(tmp_path / "proj" / "client_results")
        ep_dir = next(p.parent for p in run.rglob("steps.jsonl"))
    else:
        run = _server(tmp_path / "proj")
        ep_dir = next(p.parent for p in run.rglob("meta_record.pkl"))
    (info,) = find_runs(tmp_path / "proj")
    episode = next(e for e in info.episodes if e.path == ep_dir)
    assert episode.root is not None and episode.containment == (tmp_path / "proj").resolve()
    load_series(episode)  # fine before the swap
    _link(ep_dir / name, secrets[name])
    with pytest.raises(SeriesError, match="resolves outside the results root") as ei:
        load_series(episode)
    _no_secret(str(ei.value))


def test_symlinked_episode_directory_is_not_an_episode(tmp_path: Path) -> None:
    outside_run = _client(tmp_path / "outside", "stolen")
    run = _client(tmp_path / "proj" / "client_results")
    task = next(p.parent.parent for p in run.rglob("result.json") if p.parent.name.isdigit())
    (task / "7").symlink_to(next(p.parent for p in outside_run.rglob("result.json") if p.parent.name.isdigit()))
    (info,) = find_runs(tmp_path / "proj")
    assert "7" not in {e.seed for e in info.episodes}


def test_live_files_linked_or_swapped_out_are_not_read(tmp_path: Path) -> None:
    secrets = _secret_files(tmp_path / "outside")
    run = _client(tmp_path / "root")
    live = write_live_worker(run, "1", episode_id="ebench/r/ebench/t/0")
    cam = next(live.glob("*.jpg"))
    state = live / "live.json"
    assert read_live_state(state, within=run) is not None
    assert read_live_frame(cam, within=run) is not None
    _link(state, secrets["live.json"])
    _link(cam, secrets["secret.jpg"])
    assert read_live_state(state, within=run) is None
    assert read_live_state(state) is None  # default boundary: its own directory
    assert read_live_frame(cam, within=run) is None
    workers = live_workers(run)
    _no_secret([w.state for w in workers])
    (run / ".live" / "2").symlink_to(tmp_path / "outside", target_is_directory=True)
    assert "2" not in {w.worker_id for w in live_workers(run)}


def test_a_fifo_under_a_result_name_does_not_hang_the_scan(tmp_path: Path) -> None:
    run = _client(tmp_path / "proj" / "client_results")
    ep = next(p.parent for p in run.rglob("result.json") if p.parent.name.isdigit())
    (ep / "result.json").unlink()
    os.mkfifo(ep / "result.json")
    (info,) = find_runs(tmp_path / "proj")  # returns (a plain open() would block forever)
    assert not info.episodes[0].complete
