"""Cost of results discovery and action validation (genmanip_results.discovery / .schema).

Builds a server-layout run of TASKS x SEEDS episodes in a temp dir and times:

* a naive scan (``rglob`` + parse every ``result_info.json``: what a per-tool scanner does),
* ``find_runs`` (cold, full parse),
* ``RunScanner.scan`` on an unchanged tree (the results browser's periodic rescan),

and the per-call cost of ``validate_action`` next to a bare ``np.asarray(...).tolist()``.
Prints a markdown table. Usage: ``python bench/protocol_core.py [TASKS] [SEEDS]``.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from genmanip_protocol.schema import validate_action
from genmanip_results.discovery import RunScanner, find_runs


def build(root: Path, tasks: int, seeds: int) -> Path:
    run = root / "saved" / "eval_results" / "ebench" / "bench_run"
    for t in range(tasks):
        task = run / "ebench" / "suite" / f"task_{t:03d}"
        for s in range(seeds):
            ep = task / f"{s:03d}"
            ep.mkdir(parents=True)
            (ep / "result_info.json").write_text(
                json.dumps({"score": float(s % 2), "success_rate": s % 2, "log_info": {}})
            )
            (ep / "left_camera.mp4").write_bytes(b"")
    (run / "progress.json").write_text("{}")
    return run


def best(fn, repeat: int = 5) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def naive(root: Path) -> int:
    n = 0
    for p in root.rglob("result_info.json"):
        json.loads(p.read_text())
        n += 1
    return n


def main() -> None:
    tasks = int(sys.argv[1]) if len(sys.argv) > 1 else 156
    seeds = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        build(root, tasks, seeds)
        n = tasks * seeds
        t_naive = best(lambda: naive(root))
        t_find = best(lambda: find_runs(root))
        # Directories modified within 2 s of a scan are never cached (a change inside one mtime
        # tick must not be missed): let the fresh tree age, as a finished run's has.
        time.sleep(2.1)
        scanner = RunScanner(root)
        scanner.scan()
        t_rescan = best(scanner.scan)

    vec = np.zeros(16, np.float32)
    action = {"action": vec, "control_type": "joint_position"}
    k = 20_000
    t_val = best(lambda: [validate_action("manip/lift2/R5a", action) for _ in range(k)], 3) / k
    t_bare = best(lambda: [np.asarray(vec, dtype=float).tolist() for _ in range(k)], 3) / k

    print(f"| measurement ({n} episodes) | time | ratio |")
    print("|---|---:|---:|")
    print(f"| naive rglob + json parse | {t_naive * 1e3:.1f} ms | 1.00 |")
    print(f"| find_runs (cold) | {t_find * 1e3:.1f} ms | {t_find / t_naive:.2f} |")
    print(f"| RunScanner.scan (unchanged) | {t_rescan * 1e3:.1f} ms | {t_rescan / t_naive:.2f} |")
    print(f"| np.asarray(...).tolist() per action | {t_bare * 1e6:.1f} us | 1.00 |")
    print(f"| validate_action per action | {t_val * 1e6:.1f} us | {t_val / t_bare:.2f} |")


if __name__ == "__main__":
    main()
