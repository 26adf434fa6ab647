"""Where results trees are: the one rule every writer and reader of gmp follows.

A *results root* holds ``<benchmark>/<run_id>/`` run directories (either layout). A *project
directory* ``P`` (by default the current directory) may hold several, under known names
(:mod:`genmanip_results.layout`):

* ``P/saved/eval_results`` — the server layout (a GenManip server, or the testbed, run in ``P``);
* ``P/client_results`` — ``gmp eval``'s default;
* ``P/gmp-demo`` — ``gmp demo``'s default.

**Writers** (``gmp eval``; ``gmp demo`` passes its own default ``./gmp-demo`` as the flag) record
into :func:`resolve_results_root`: ``--results-dir``, else ``$GENMANIP_RESULT_DIR``, else
``./client_results``.

**Readers** (``gmp leaderboard``, ``gmp viz``, ``gmp clean``, discovery) search
:func:`search_roots`: the root the user named, else the current directory plus
``$GENMANIP_RESULT_DIR``. A project directory is searched through its known trees
(:func:`project_trees`; discovery falls back to the directory itself when it holds none, so a
results root, benchmark or run directory can be named too).

The invariant this buys: whatever a writer records with no flags, a reader started in the same
directory with no flags finds — which is why every writer default is one of the known trees.
"""

from __future__ import annotations

import os
from pathlib import Path

from .layout import (
    CLIENT_RESULTS_DIR,
    DEMO_RESULTS_DIR,
    EVAL_RESULTS_DIR,
    RESULTS_DIR_ENV,
    SAVED_DIR,
)

__all__ = ["known_trees", "project_trees", "resolve_results_root", "search_roots"]


def _env_root() -> Path | None:
    """``$GENMANIP_RESULT_DIR`` as an absolute path (``~`` expanded), or ``None`` when unset/empty."""
    value = os.environ.get(RESULTS_DIR_ENV)
    return Path(value).expanduser().absolute() if value else None


def resolve_results_root(results_dir: str | os.PathLike[str] | None = None) -> Path:
    """The writer's results root: ``results_dir`` (``--results-dir``), else
    ``$GENMANIP_RESULT_DIR``, else ``./client_results``; absolute, ``~`` expanded. An empty
    ``results_dir`` counts as not given."""
    if results_dir:
        return Path(results_dir).expanduser().absolute()
    return _env_root() or Path(CLIENT_RESULTS_DIR).absolute()


def project_trees(project: str | os.PathLike[str] = ".") -> list[Path]:
    """The known results trees of a project directory, whether they exist or not:
    ``saved/eval_results``, ``client_results``, ``gmp-demo`` (joined to ``project`` as given)."""
    p = Path(project)
    return [p / SAVED_DIR / EVAL_RESULTS_DIR, p / CLIENT_RESULTS_DIR, p / DEMO_RESULTS_DIR]


def known_trees(project: str | os.PathLike[str] = ".") -> list[Path]:
    """Every tree a flagless writer or reader started in ``project`` may use:
    :func:`project_trees` plus ``$GENMANIP_RESULT_DIR`` when set (wherever it points). Existence
    is not checked; duplicates (by absolute path) are dropped."""
    out: list[Path] = []
    seen: set[str] = set()
    env = _env_root()
    for tree in [*project_trees(project), *([env] if env is not None else [])]:
        key = os.path.abspath(tree)
        if key not in seen:
            seen.add(key)
            out.append(tree)
    return out


def search_roots(root: str | os.PathLike[str] | None = None) -> list[Path]:
    """The roots a reader searches: ``[root]`` as given when the user named one; else the current
    directory (a project directory: its known trees are searched) plus ``$GENMANIP_RESULT_DIR``
    when that is an existing directory other than the current one."""
    if root is not None:
        return [Path(root)]
    cwd = Path.cwd()
    roots = [cwd]
    env = _env_root()
    # (resolve(): the variable may name the cwd through a symlink or a relative path)
    if env is not None and env.is_dir() and env.resolve() != cwd.resolve():
        roots.append(env)
    return roots
