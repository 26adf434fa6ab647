"""The user's policy fails on a replica: the run stops with the user's own error, as the local
launcher's ``--processes`` says it (the eval actor's failure carrying the user's
``PolicyCodeError``: the call, the exception, the user's ``file:line``, the ``-v`` hint, exit
FAILURE), not a Ray traceback nor a dropped connection retried."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from genmanip_eval import EvalConfig, run_eval
from genmanip_eval.errors import WorkerProcessError
from genmanip_eval.policy import USER_CODE_HINT
from genmanip_protocol.errors import ExitCode
from genmanip_testbed import serve_testbed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SOURCE = textwrap.dedent(
    """\
    def load_weights():
        raise RuntimeError("cuda out of memory")  # MARK


    class Policy:
        def get_actions(self, batch):
            return load_weights()


    def make():
        return Policy()
    """
)


def test_a_policy_exception_on_a_replica_is_the_users_error(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    line = next(i for i, s in enumerate(SOURCE.splitlines(), 1) if "# MARK" in s)
    (tmp_path / "user_policy_ray.py").write_text(SOURCE, encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # a policy module in the working directory, as users have them
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("user_policy_ray", None)
    with serve_testbed(tasks=("testbed/reach/easy",), run_id="usererr",
                       results_root=tmp_path / "srv") as tb:
        cfg = EvalConfig(url=tb.url, worker_ids=["0", "1"], policy="user_policy_ray:make",
                         results_dir=str(tmp_path / "res"), launcher="ray")
        with pytest.raises(WorkerProcessError) as ei:
            run_eval(cfg)  # (no Ray running: the launcher starts its own, with the cwd importable)
    e = ei.value
    assert "user_policy_ray:make: get_actions(batch) raised RuntimeError" in str(e), str(e)
    assert "raised RuntimeError: cuda out of memory" in str(e), str(e)
    assert f"user_policy_ray.py:{line}" in str(e), str(e)
    assert e.hint == USER_CODE_HINT
    assert e.exit_code == ExitCode.FAILURE
