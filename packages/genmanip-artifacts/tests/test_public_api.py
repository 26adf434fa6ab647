from __future__ import annotations

import subprocess
import sys
import types

import genmanip_artifacts


def test_all_matches_public_names() -> None:
    public = {
        name
        for name, value in vars(genmanip_artifacts).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and name != "annotations"
    }
    assert set(genmanip_artifacts.__all__) == public | {"__version__"}
    assert len(genmanip_artifacts.__all__) == len(set(genmanip_artifacts.__all__))
    for name in genmanip_artifacts.__all__:
        assert getattr(genmanip_artifacts, name) is not None


def test_errors_derive_from_package_base_with_exit_codes() -> None:
    from genmanip_protocol.errors import ExitCode, GenmanipError

    base = genmanip_artifacts.GenmanipArtifactsError
    assert issubclass(base, GenmanipError)
    for cls in (
        genmanip_artifacts.EpisodeDataError,
        genmanip_artifacts.AlignmentError,
        genmanip_artifacts.PlotFailures,
        genmanip_artifacts.ArtifactsUsageError,
    ):
        assert issubclass(cls, base)
        assert isinstance(cls.exit_code, ExitCode)
    assert genmanip_artifacts.AlignmentError.exit_code == ExitCode.INVALID_INPUT


def test_import_does_not_load_matplotlib() -> None:
    # plot_episode is called by gmp eval off the hot path: importing the package must stay cheap.
    code = (
        "import sys, genmanip_artifacts, genmanip_artifacts.cli; print('matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
