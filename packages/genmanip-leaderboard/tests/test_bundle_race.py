"""Time-of-check/time-of-use while bundling: a thread keeps swapping a directory (or a file) of
the run for a symlink to the user's secrets, many rounds. Each bundle either is built from all of
the run's own files and nothing else, or fails with a typed error (never exit 70); no secret byte
ever lands in a zip, and the secrets are untouched."""

from __future__ import annotations

import os
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from genmanip_leaderboard import BundleError, build_bundle, verify_bundle
from genmanip_protocol.errors import ExitCode
from genmanip_results.discovery import load_run

SECRET = b"TOP-SECRET-user-data-0xDEADBEEF"
ROUNDS_S = 2.5
MIN_ROUNDS = 15


class Swapper(threading.Thread):
    """Swap ``target`` for a symlink to ``victim`` and back, forever."""

    def __init__(self, target: Path, victim: Path) -> None:
        super().__init__(daemon=True)
        self.target, self.victim = target, victim
        self.hidden = target.with_name("." + target.name + ".real")
        self.stop = threading.Event()
        self.swaps = 0

    def run(self) -> None:
        while not self.stop.is_set():
            os.rename(self.target, self.hidden)
            os.symlink(self.victim, self.target, target_is_directory=self.victim.is_dir())
            time.sleep(0.0002)
            os.unlink(self.target)
            os.rename(self.hidden, self.target)
            self.swaps += 1
            time.sleep(0)


@pytest.fixture
def fast_switching() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


def _secrets(tmp_path: Path) -> Path:
    """The user's directory, holding files with the very names of a seed directory's files."""
    victim = tmp_path / "home" / "user"
    victim.mkdir(parents=True)
    for name in ("result_info.json", "meta_record.pkl", "notes.txt", "id_rsa"):
        (victim / name).write_bytes(SECRET + name.encode())
    (victim / "sub").mkdir()
    (victim / "sub" / "secret.json").write_bytes(SECRET)
    return victim


@pytest.mark.timeout(120)
@pytest.mark.parametrize("what", ["seed-dir", "task-dir", "file"])
def test_swapping_for_a_symlink_never_bundles_a_secret(
    project: Path, server_run: Any, tmp_path: Path, what: str, fast_switching: None
) -> None:
    run_dir = server_run(project)
    victim = _secrets(tmp_path)
    secret_before = {p: p.read_bytes() for p in victim.rglob("*") if p.is_file()}
    if what == "seed-dir":
        target = run_dir / "testbed" / "reach" / "red_easy" / "000"
    elif what == "task-dir":
        target = run_dir / "testbed" / "reach"
    else:
        target = run_dir / "result.json"
        victim = victim / "id_rsa"
    run = load_run(run_dir)
    full = build_bundle(run, tmp_path / "before.zip").manifest["counts"]["files"]
    swapper = Swapper(target, victim)
    swapper.start()
    built = refused = rounds = 0
    deadline = time.monotonic() + ROUNDS_S
    try:
        while time.monotonic() < deadline or rounds < MIN_ROUNDS:
            out = tmp_path / "out" / f"b{rounds}.zip"
            rounds += 1
            try:
                b = build_bundle(run, out)
            except BundleError as exc:
                # Typed, with a named exit code; and no half-written zip is left behind.
                assert isinstance(exc.exit_code, ExitCode) and exc.exit_code != ExitCode.INTERNAL
                assert not out.exists()
                refused += 1
                continue
            built += 1
            verify_bundle(b.path)
            # Never a bundle that silently lacks what was swapped away.
            assert b.manifest["counts"]["files"] == full
            with zipfile.ZipFile(b.path) as zf:
                for name in zf.namelist():
                    assert SECRET not in zf.read(name), f"round {rounds}: {name} holds a secret"
            b.path.unlink()
    finally:
        swapper.stop.set()
        swapper.join(10)
    assert rounds >= MIN_ROUNDS and swapper.swaps >= MIN_ROUNDS
    assert built + refused == rounds
    assert {p: p.read_bytes() for p in secret_before} == secret_before
    # Once nothing swaps any more, the run bundles completely again.
    b = build_bundle(run, tmp_path / "final.zip")
    assert b.manifest["counts"]["files"] == full >= 9
