from __future__ import annotations

import inspect

import genmanip_serve


def test_all_matches_public_names() -> None:
    public = {
        n for n, v in vars(genmanip_serve).items()
        if not n.startswith("_") and not inspect.ismodule(v) and n != "annotations"
    }
    assert set(genmanip_serve.__all__) == public | {"__version__"}
    for name in genmanip_serve.__all__:
        assert getattr(genmanip_serve, name) is not None


def test_version() -> None:
    assert genmanip_serve.__version__ == "0.1.0"


def test_errors_are_one_tree() -> None:
    from genmanip_eval.errors import PolicyError
    from genmanip_protocol.errors import GenmanipError

    assert issubclass(genmanip_serve.GenmanipServeError, GenmanipError)
    for name in genmanip_serve.__all__:
        obj = getattr(genmanip_serve, name)
        if inspect.isclass(obj) and issubclass(obj, Exception):
            assert issubclass(obj, genmanip_serve.GenmanipServeError), name
    # the client's failures stop gmp eval like any policy failure
    assert issubclass(genmanip_serve.RemotePolicyError, PolicyError)
    assert issubclass(genmanip_serve.KeyMapError, PolicyError)


def test_entry_points_registered() -> None:
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="genmanip.policy_schemes")}
    assert eps["ws"] == eps["wss"] == "genmanip_serve.client:connect_policy"
