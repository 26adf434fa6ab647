#!/usr/bin/env python3
"""Make sure the system programs the tests drive exist: Debian's Chromium (the viz and report
browser tests, ``/usr/bin/chromium``) and zsh (the shell-completion test).

* present: nothing to do;
* missing and running as root: ``apt-get update && apt-get install -y chromium zsh`` (what is
  missing);
* missing otherwise: print the exact command and exit 1 (the tests would fail anyway, and a test
  suite must not silently skip them).

Set GMP_CHROMIUM to use another Chromium binary (checked for existence only).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

DEFAULT = "/usr/bin/chromium"
CMD = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]


def main() -> int:
    rc = _chromium()
    return rc or _zsh()


def _zsh() -> int:
    if shutil.which("zsh"):
        return 0
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", "zsh"]
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        print("error: zsh is missing (needed by the shell-completion test); install it, e.g.\n"
              f"  sudo apt-get update && sudo {' '.join(cmd)}", file=sys.stderr)
        return 1
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print(f"installing zsh: {' '.join(cmd)}", file=sys.stderr)
    subprocess.run(["apt-get", "update"], check=True, env=env, stdin=subprocess.DEVNULL)
    subprocess.run(cmd, check=True, env=env, stdin=subprocess.DEVNULL)
    return 0 if shutil.which("zsh") else 1


def _chromium() -> int:
    target = os.environ.get("GMP_CHROMIUM", DEFAULT)
    if Path(target).exists():
        return 0
    if os.environ.get("GMP_CHROMIUM"):
        print(f"error: GMP_CHROMIUM={target} does not exist", file=sys.stderr)
        return 1
    if shutil.which("apt-get") is None:
        print(f"error: {DEFAULT} is missing and this is not a Debian-like system; install "
              "Chromium and set GMP_CHROMIUM=/path/to/chromium", file=sys.stderr)
        return 1
    if os.geteuid() != 0:
        print(f"error: {DEFAULT} is missing (needed by the viz browser test); run:\n"
              f"  sudo apt-get update && sudo {' '.join(CMD)}", file=sys.stderr)
        return 1
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print(f"installing Chromium: apt-get update && {' '.join(CMD)}", file=sys.stderr)
    subprocess.run(["apt-get", "update"], check=True, env=env, stdin=subprocess.DEVNULL)
    subprocess.run(CMD, check=True, env=env, stdin=subprocess.DEVNULL)
    if not Path(DEFAULT).exists():
        print(f"error: apt-get finished but {DEFAULT} is still missing", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
