from __future__ import annotations

import inspect

import genmanip_leaderboard


def test_all_matches_public_names():
    public = {n for n in vars(genmanip_leaderboard) if not n.startswith("_") and n != "annotations"}
    modules = {n for n in public if inspect.ismodule(getattr(genmanip_leaderboard, n))}
    assert set(genmanip_leaderboard.__all__) == (public - modules) | {"__version__"}
    for name in genmanip_leaderboard.__all__:
        assert getattr(genmanip_leaderboard, name) is not None
    assert genmanip_leaderboard.__version__ == "0.1.0"


def test_errors_share_the_package_base():
    from genmanip_protocol.errors import GenmanipError

    for name in genmanip_leaderboard.__all__:
        obj = getattr(genmanip_leaderboard, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, genmanip_leaderboard.GenmanipLeaderboardError)
            assert issubclass(obj, GenmanipError)
