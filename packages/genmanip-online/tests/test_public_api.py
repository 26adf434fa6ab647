from __future__ import annotations

import inspect

import genmanip_online


def test_all_matches_public_names():
    public = {n for n in vars(genmanip_online) if not n.startswith("_") and n != "annotations"}
    modules = {n for n in public if inspect.ismodule(getattr(genmanip_online, n))}
    assert set(genmanip_online.__all__) == (public - modules) | {"__version__"}
    for name in genmanip_online.__all__:
        assert getattr(genmanip_online, name) is not None
    assert genmanip_online.__version__ == "0.1.0"


def test_errors_share_the_package_base():
    from genmanip_protocol.errors import GenmanipError

    for name in genmanip_online.__all__:
        obj = getattr(genmanip_online, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, genmanip_online.GenmanipOnlineError)
            assert issubclass(obj, GenmanipError)
