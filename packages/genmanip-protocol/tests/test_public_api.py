from __future__ import annotations

import importlib
import pkgutil
import types

import genmanip_protocol


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
    exported = list(genmanip_protocol.__all__)
    assert len(exported) == len(set(exported)), "duplicates in __all__"
    assert set(exported) - {"__version__"} == _public_names(genmanip_protocol)
    assert "__version__" in exported


def test_every_exported_name_resolves() -> None:
    for name in genmanip_protocol.__all__:
        assert getattr(genmanip_protocol, name) is not None, name


def test_version_matches_about() -> None:
    from genmanip_protocol.__about__ import __version__

    assert genmanip_protocol.__version__ == __version__
    assert __version__.count(".") == 2


def test_submodule_all_lists_resolve() -> None:
    """Every module's ``__all__`` names exist (catches stale exports after a rename)."""
    for info in pkgutil.walk_packages(genmanip_protocol.__path__, "genmanip_protocol."):
        mod = importlib.import_module(info.name)
        for name in getattr(mod, "__all__", ()):
            assert hasattr(mod, name), f"{info.name}.__all__ names missing {name!r}"


def test_errors_derive_from_package_base() -> None:
    from genmanip_protocol.errors import GenmanipError, GenmanipProtocolError

    for name in genmanip_protocol.__all__:
        obj = getattr(genmanip_protocol, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, GenmanipError), name
            if obj is not GenmanipError:
                assert issubclass(obj, GenmanipProtocolError), name
            assert hasattr(obj, "exit_code"), name


#: What the wire vocabulary may import: numpy, msgpack and stdlib modules that do no I/O of
#: their own. HTTP, sockets, TLS, argparse and subprocesses belong to the packages above it.
#: (``urllib.parse`` is allowed: pathlib imports it, and it only parses strings.)
_FORBIDDEN = ("http", "socket", "ssl", "argparse", "subprocess", "urllib.request", "select",
              "asyncio", "genmanip_runtime", "genmanip_results", "genmanip_eval")


def test_protocol_imports_no_io_module() -> None:
    import subprocess
    import sys

    code = (
        "import sys; before = set(sys.modules);"
        "import genmanip_protocol, genmanip_protocol.codec, genmanip_protocol.schema;"
        "import pkgutil, importlib;"
        "[importlib.import_module(m.name) for m in pkgutil.walk_packages("
        "genmanip_protocol.__path__, 'genmanip_protocol.')];"
        "new = set(sys.modules) - before;"
        f"bad = sorted(m for m in new for f in {_FORBIDDEN!r} if m == f or m.startswith(f + '.'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
