"""``gmp testbed serve`` with a shorter lock staleness, as a killable process (tests only).

The testbed mirrors the real server: a crashed server's seed locks block those seeds for 300 s.
CI cannot wait that long, so the fast subset runs the same server with ``CoreConfig.lock_stale_s``
lowered (an existing tunable). Usage: python _testbed_proc.py PORT ROOT RUN_ID TASKS LOCK_STALE_S [FAULTS]
"""

from __future__ import annotations

import sys
import time
from typing import Any

from genmanip_testbed.server import ServerOptions, serve_testbed


def main() -> None:
    port, root, run_id, tasks, stale = sys.argv[1:6]
    faults = sys.argv[6] if len(sys.argv) > 6 and sys.argv[6] else None
    original = ServerOptions.core_config

    def core_config(self: ServerOptions, **overrides: Any) -> Any:
        overrides.setdefault("lock_stale_s", float(stale))
        return original(self, **overrides)

    ServerOptions.core_config = core_config  # type: ignore[method-assign]
    with serve_testbed(tasks=tasks, run_id=run_id, results_root=root, port=int(port), faults=faults):
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main()
