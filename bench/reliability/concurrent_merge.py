"""Item 6: several processes merging one task's ``episode_result.json``: no lost update.

``--processes`` writer processes each merge ``--merges`` distinct seeds into one
``<task>/episode_result.json`` with the recorder's exact call
(``merge_json(task/"episode_result.json", update, task/"episode_result.lock")``), two threads per
process (the recorder transcodes on a thread pool), all released at once by a start barrier.
A reader process parses the file continuously meanwhile. Checked afterwards: every seed present
with its own value, no parse failure seen by the reader, no ``.corrupt-*`` or ``.tmp`` leftovers.

Usage: python bench/reliability/concurrent_merge.py [--processes 8] [--merges 1000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rel import md_table


def _writer(task_dir: str, proc: int, merges: int, start: Any) -> None:
    from genmanip_runtime.atomic import merge_json

    d = Path(task_dir)
    start.wait()

    def work(thread: int) -> None:
        for i in range(thread, merges, 2):
            seed = f"p{proc}_{i:05d}"

            def update(cur: dict[str, Any], seed: str = seed, i: int = i) -> None:
                cur[seed] = {"score": i / merges, "sr": float(i % 2)}

            merge_json(d / "episode_result.json", update, d / "episode_result.lock", timeout=120)

    ts = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def _reader(task_dir: str, stop: Any, out: Any) -> None:
    path = Path(task_dir) / "episode_result.json"
    reads = bad = 0
    while not stop.is_set():
        time.sleep(0.005)  # a tight loop would starve the writers of CPU on a 2-core machine
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        reads += 1
        try:
            if not isinstance(json.loads(text), dict):
                bad += 1
        except ValueError:
            bad += 1
    out.put((reads, bad))


def run(processes: int = 8, merges: int = 1000, base_dir: str | None = None) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="gmp-merge-", dir=base_dir) as tmp:
        task = Path(tmp) / "bench" / "run" / "task" / "a"
        task.mkdir(parents=True)
        start = ctx.Event()
        stop = ctx.Event()
        q: Any = ctx.Queue()
        reader = ctx.Process(target=_reader, args=(str(task), stop, q))
        reader.start()
        procs = [ctx.Process(target=_writer, args=(str(task), p, merges, start)) for p in range(processes)]
        for p in procs:
            p.start()
        time.sleep(0.5)  # let every writer import and reach the barrier
        t0 = time.monotonic()
        start.set()
        for p in procs:
            p.join()
        elapsed = time.monotonic() - t0
        stop.set()
        reads, bad_reads = q.get(timeout=60)
        reader.join()
        data = json.loads((task / "episode_result.json").read_text())
        expected = {f"p{p}_{i:05d}": {"score": i / merges, "sr": float(i % 2)}
                    for p in range(processes) for i in range(merges)}
        missing = sorted(set(expected) - set(data))
        wrong = sorted(k for k in expected if k in data and data[k] != expected[k])
        leftovers = sorted(p.name for p in task.iterdir()
                           if p.name not in ("episode_result.json", "episode_result.lock"))
        return {
            "processes": processes,
            "merges": processes * merges,
            "exit_codes": [p.exitcode for p in procs],
            "keys": len(data),
            "missing": len(missing),
            "wrong": len(wrong),
            "extra": len(set(data) - set(expected)),
            "reader_reads": reads,
            "reader_bad_reads": bad_reads,
            "leftovers": leftovers,
            "seconds": round(elapsed, 2),
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--merges", type=int, default=1000, help="merges per process")
    a = ap.parse_args(argv)
    r = run(a.processes, a.merges)
    ok = (r["missing"] == r["wrong"] == r["extra"] == r["reader_bad_reads"] == 0 and not r["leftovers"]
          and all(c == 0 for c in r["exit_codes"]))
    print(f"### Concurrent episode_result.json merges: {r['processes']} processes x 2 threads\n")
    print(md_table(["figure", "value"], [
        ["merges (distinct seeds)", r["merges"]],
        ["seeds in the file afterwards", r["keys"]],
        ["lost / wrong / extra updates", f"{r['missing']} / {r['wrong']} / {r['extra']}"],
        ["concurrent reads / unparsable reads", f"{r['reader_reads']} / {r['reader_bad_reads']}"],
        ["leftover tmp/corrupt files", len(r["leftovers"])],
        ["wall time (s) / merges per s", f"{r['seconds']} / {r['merges'] / max(r['seconds'], 1e-9):.0f}"],
        ["verdict", "PASS" if ok else "FAIL"],
    ]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
