from __future__ import annotations

import genmanip_viz
from genmanip_protocol.errors import GenmanipError


def test_all_matches_public_names() -> None:
    public = {n for n in vars(genmanip_viz) if not n.startswith("_")} - {
        # submodules are reachable but not re-exported names
        "annotations",
        "assets",
        "cli",
        "errors",
        "index",
        "pages",
        "paths",
        "recording",
        "server",
        "tls",
    }
    assert set(genmanip_viz.__all__) == public | {"__version__"}
    for name in genmanip_viz.__all__:
        assert getattr(genmanip_viz, name) is not None


def test_error_tree() -> None:
    assert issubclass(genmanip_viz.GenmanipVizError, GenmanipError)
    for name in (
        "NoRunError",
        "PortInUseError",
        "RecordingBuildError",
        "UnsafePathError",
        "ViewerAssetsError",
        "VizDependencyError",
    ):
        cls = getattr(genmanip_viz, name)
        assert issubclass(cls, genmanip_viz.GenmanipVizError)
        assert int(cls.exit_code) > 0
