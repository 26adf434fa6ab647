"""The real openpi-client (PyPI 0.1.2) against the policy server, in its own process.

openpi-client declares numpy<2 while the workspace needs numpy>=2, so it is in no extra: the
``openpi_client_path`` fixture installs it with ``--no-deps`` (it works with numpy 2; the modules
used here import msgpack, numpy, websockets and typing_extensions, not dm-tree or pillow).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

_SCRIPT = """
import json, sys, warnings
warnings.simplefilter("ignore", DeprecationWarning)  # websockets 17 on openpi's connect()
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from serve_helpers import make_obs
import openpi_client
policy = WebsocketClientPolicy(sys.argv[1])
out = {"module": openpi_client.__file__, "metadata": policy.get_server_metadata(), "replies": []}
for i in range(3):
    r = policy.infer(make_obs(i))
    out["replies"].append({"shape": list(r["actions"].shape), "dtype": str(r["actions"].dtype),
                           "first": r["actions"][0].tolist(), "timing": r["server_timing"]})
try:
    policy.infer({**make_obs(3, cameras=False), "instruction": "fail"})
except RuntimeError as exc:
    out["error"] = str(exc)
out["after_error"] = list(policy.infer(make_obs(4, cameras=False))["actions"].shape)
print(json.dumps(out))
"""


def test_openpi_client_gets_metadata_and_actions(
    server_proc: Callable[..., Any],
    openpi_client_path: str | None,
    child_env: Callable[[str | None], dict[str, str]],
) -> None:
    srv = server_proc(policy="serve_helpers:failing")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, srv.url], env=child_env(openpi_client_path),
                          cwd=str(HERE), capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    if openpi_client_path is not None:
        assert out["module"].startswith(openpi_client_path)
    meta = out["metadata"]
    assert meta["server"] == "genmanip-serve" and meta["policy"] == "serve_helpers:failing"
    # the echo policy's chunk: 3 actions of 16 joint values + 3 base values (timestep first)
    for i, r in enumerate(out["replies"]):
        assert r["shape"] == [3, 19] and r["dtype"] == "float64"
        assert r["first"][16] == float(i) and r["first"][6] == 0.044
        assert r["timing"]["batch_size"] == 1 and r["timing"]["infer_ms"] >= 0
    assert "prev_total_ms" in out["replies"][1]["timing"]
    assert "Error in inference server" in out["error"] and "out of cheese" in out["error"]
    assert out["after_error"] == [3, 19]
    assert srv.stop() == 130
