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

    # the reference's interface on gmp's client (records by default, load_config, kill_workers)
    assert issubclass(EvalClient, genmanip_eval.EvalClient) and EvalClient is genmanip_client.EvalClient
    assert genmanip_client.eval_client.__all__ == ["EvalClient"]


def test_version() -> None:
    assert genmanip_eval.__version__ == "0.1.0"


def test_interrupted_is_a_keyboard_interrupt() -> None:
    from genmanip_eval.errors import Interrupted

    assert genmanip_eval.Interrupted is Interrupted and "Interrupted" in genmanip_eval.__all__
    assert issubclass(Interrupted, KeyboardInterrupt) and not issubclass(Interrupted, Exception)
    assert callable(genmanip_eval.EvalClient.interrupt)
