"""How genmanip-eval reaches code above it: entry-point groups, and who provides what.

Eval's library never names a package that sits above it (testbed, artifacts, the meta package).
What it needs from them is registered in entry-point groups that eval only reads:

* ``genmanip.policies``: policy factories by name (``gmp eval --policy NAME``);
* ``genmanip.episode_hooks``: episode hooks by name (``gmp eval --plot-on-episode-end``);
* ``genmanip.providers``: install-hint tables, each loading to ``{group: {name: distribution}}``,
  so that a name that is not installed gets a hint naming what to install. The ``genmanip`` meta
  package, which depends on every gmp distribution anyway, publishes the table of gmp's own names.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from importlib.metadata import EntryPoint, distributions

__all__ = ["PROVIDERS_GROUP", "entry_points_of", "providers"]

log = logging.getLogger("genmanip_eval.plugins")

#: Entry-point group of install-hint tables: ``Mapping[group, Mapping[name, distribution]]``.
PROVIDERS_GROUP = "genmanip.providers"


def entry_points_of(group: str) -> list[EntryPoint]:
    """Every entry point of ``group``, each distribution read once (the first on ``sys.path`` wins).

    Read from the distributions rather than ``importlib.metadata.entry_points(group=...)``, which on
    some Pythons keeps only one entry point per name and so would hide a clash.
    """
    seen: set[str] = set()
    out: list[EntryPoint] = []
    for dist in distributions():
        key = re.sub(r"[-_.]+", "-", str(dist.metadata["Name"] or "")).lower()
        if key in seen:
            continue
        seen.add(key)
        out.extend(ep for ep in dist.entry_points if ep.group == group)
    return out


def providers(group: str) -> dict[str, str]:
    """Name -> the distribution that provides it in ``group``, from every installed hint table.

    A table that fails to load or has the wrong shape is skipped: it only improves a hint, and
    must never hide the real error (the name that is not installed).
    """
    out: dict[str, str] = {}
    for ep in entry_points_of(PROVIDERS_GROUP):
        try:
            table = ep.load()
        except Exception as exc:
            log.debug("provider table %s does not load: %s", ep.value, exc)
            continue
        names = table.get(group) if isinstance(table, Mapping) else None
        if isinstance(names, Mapping):
            out.update({str(k): str(v) for k, v in names.items()})
    return out
