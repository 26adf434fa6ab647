from __future__ import annotations

import inspect

import genmanip_client
import genmanip_client.eval_client
import genmanip_eval


def test_all_matches_public_names() -> None:
    public = {
        n for n, v in vars(genmanip_eval).items()
        if not n.startswith("_") and not inspect.ismodule(v) and n != "annotations"
    }
    assert set(genmanip_eval.__all__) == public | {"__version__"}
    for name in genmanip_eval.__all__:
        assert getattr(genmanip_eval, name) is not None


def test_compat_import_path() -> None:
    from genmanip_client.eval_client import EvalClient

    assert EvalClient is genmanip_eval.EvalClient is genmanip_client.EvalClient
    assert genmanip_client.eval_client.__all__ == ["EvalClient"]


def test_version() -> None:
    assert genmanip_eval.__version__ == "0.1.0"
