"""Run trees built by hand following docs/architecture.md (both layouts), and small helpers."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import pytest


def _write_json(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj), encoding="utf-8")


def make_server_run(
    project: Path,
    *,
    benchmark: str = "testbed",
    run_id: str = "run1",
    tasks: dict[str, int] | None = None,
    done: dict[str, Iterable[int]] | None = None,
    scores: dict[tuple[str, int], float] | None = None,
    videos: bool = True,
) -> Path:
    """A server-layout run: ``tasks`` maps task name -> num_test; ``done`` the finished seeds."""
    tasks = tasks or {f"{benchmark}/reach/red_easy": 2, f"{benchmark}/reach/blue_easy": 2}
    done = done if done is not None else {t: range(n) for t, n in tasks.items()}
    scores = scores or {}
    run = project / "saved" / "eval_results" / benchmark / run_id
    metric = {}
    all_done = True
    for task, n in tasks.items():
        seeds = list(done.get(task, []))
        all_done &= len(seeds) == n
        vals = []
        for s in seeds:
            score = scores.get((task, s), 1.0 if s % 2 == 0 else 0.25)
            vals.append(score)
            ep = run / task / f"{s:03d}"
            _write_json(
                ep / "result_info.json",
                {"score": score, "success_rate": int(score == 1.0),
                 "log_info": {"episode_start_time": "2026_01_01_00_00_00_000000",
                              "episode_end_time": "2026_01_01_00_01_00_000000",
                              "metric_score": [[[score]]]}},
            )
            (ep / "meta_record.pkl").write_bytes(b"\x80\x05N.")
            if videos:
                (ep / "left_camera.mp4").write_bytes(os.urandom(2048))
                (ep / "episode.rrd").write_bytes(os.urandom(512))
        prefix = "" if len(seeds) == n else "*"
        key = f"{prefix}({len(seeds)}/{n}){task}" if seeds else f"*{task}"
        mean = sum(vals) / len(vals) if vals else 0.0
        metric[key] = {"score": mean, "sr": sum(v == 1.0 for v in vals) / max(1, len(vals))}
    _write_json(run / ("result.json" if all_done else "progress.json"), metric)
    return run


def make_client_run(
    root: Path,
    *,
    benchmark: str = "testbed",
    run_id: str = "crun",
    tasks: dict[str, int] | None = None,
    incomplete: Iterable[tuple[str, int]] = (),
) -> Path:
    """A client-layout run under results root ``root`` (``<root>/<benchmark>/<run_id>``)."""
    tasks = tasks or {f"{benchmark}/reach/red_easy": 2}
    run = root / benchmark / run_id
    total = sum(tasks.values())
    _write_json(run / "run.json", {"run_id": run_id, "benchmark": benchmark, "total_episodes": total,
                                   "server_url": "http://127.0.0.1:8087", "started": "2026-01-01T00:00:00+00:00"})
    inc = set(incomplete)
    for task, n in tasks.items():
        er = {}
        for s in range(n):
            ep = run / task / f"{s:03d}"
            ep.mkdir(parents=True, exist_ok=True)
            (ep / "steps.jsonl").write_text('{"step": 0}\n{"step": 1}\n', encoding="utf-8")
            (ep / "left_camera.mp4").write_bytes(os.urandom(1024))
            if (task, s) in inc:
                (ep / "INCOMPLETE").write_text("", encoding="utf-8")
                continue
            score = 1.0 if s % 2 == 0 else 0.0
            _write_json(ep / "result.json", {
                "episode_id": f"{benchmark}/{run_id}/{task}/{s:03d}", "task_name": task,
                "seed": f"{s:03d}", "score": score, "sr": score, "steps": 2,
                "robot_id": "manip/lift2/R5a", "worker_id": "0", "instruction": "reach",
                "started": 1.0, "finished": 2.0})
            er[f"{s:03d}"] = {"score": score, "sr": score}
        _write_json(run / task / "episode_result.json", er)
    return run


@pytest.fixture
def project(tmp_path: Path) -> Path:
    p = tmp_path / "project"
    p.mkdir()
    return p


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Never read the developer's config file, cache or tokens.
    cfg = tmp_path / "empty-config.toml"
    cfg.write_text("", encoding="utf-8")
    monkeypatch.setenv("GMP_CONFIG", str(cfg))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    for var in ("USER_TOKEN", "LEADERBOARD_HOST", "LEADERBOARD_PORT", "GENMANIP_RESULT_DIR",
                "GMP_LEADERBOARD_CA", "GMP_ONLINE_TOKEN", "GMP_ONLINE_URL", "GMP_TOKEN"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def server_run():
    """The :func:`make_server_run` builder."""
    return make_server_run


@pytest.fixture
def client_run():
    """The :func:`make_client_run` builder."""
    return make_client_run


class TLSFiles:
    def __init__(self, ca: Path, cert: Path, key: Path) -> None:
        self.ca, self.cert, self.key = ca, cert, key


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost (trustme)."""
    import trustme

    d = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    files = TLSFiles(d / "ca.pem", d / "server.pem", d / "server.key")
    ca.cert_pem.write_to_path(str(files.ca))
    cert.private_key_and_cert_chain_pem.write_to_path(str(files.cert))
    cert.private_key_pem.write_to_path(str(files.key))
    return files
