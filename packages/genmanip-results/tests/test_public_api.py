from __future__ import annotations

import importlib
import pkgutil
import types

import genmanip_results


def _public_names(module: types.ModuleType) -> set[str]:
    """Names a user sees on the module: not private, not submodules, not ``__future__`` flags."""
    names = set()
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        if name == "annotations" and value.__class__.__name__ == "_Feature":
            continue
        names.add(name)
    return names


def test_all_matches_public_names() -> None:
    exported = list(genmanip_results.__all__)
    assert len(exported) == len(set(exported)), "duplicates in __all__"
    # The facade is lazy: every name of __all__ is loaded on first use, from the module _WHERE says.
    assert set(exported) - {"__version__"} == set(genmanip_results._WHERE)
    for name in exported:
        getattr(genmanip_results, name)
    typing_helpers = {"TYPE_CHECKING", "Any"}
    assert set(exported) - {"__version__"} == _public_names(genmanip_results) - typing_helpers
    assert "__version__" in exported


def test_importing_layout_loads_no_numpy() -> None:
    import subprocess
    import sys

    code = "import sys, genmanip_results.layout; print('numpy' in sys.modules); sys.exit('numpy' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_exported_name_resolves() -> None:
    for name in genmanip_results.__all__:
        assert getattr(genmanip_results, name) is not None, name


def test_version_matches_about() -> None:
    from genmanip_results.__about__ import __version__

    assert genmanip_results.__version__ == __version__
    assert __version__.count(".") == 2


def test_submodule_all_lists_resolve() -> None:
    """Every module's ``__all__`` names exist (catches stale exports after a rename)."""
    for info in pkgutil.walk_packages(genmanip_results.__path__, "genmanip_results."):
        mod = importlib.import_module(info.name)
        for name in getattr(mod, "__all__", ()):
            assert hasattr(mod, name), f"{info.name}.__all__ names missing {name!r}"


def test_errors_derive_from_package_base() -> None:
    from genmanip_protocol.errors import GenmanipError
    from genmanip_results.errors import GenmanipResultsError

    for name in genmanip_results.__all__:
        obj = getattr(genmanip_results, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, GenmanipError), name
            if obj is not GenmanipError:
                assert issubclass(obj, GenmanipResultsError), name
            assert hasattr(obj, "exit_code"), name
