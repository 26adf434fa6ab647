"""The ``gmp`` command line: a stdlib-only parser (:mod:`.parser`) and the dispatcher (:mod:`.main`)."""

from __future__ import annotations

__all__: list[str] = []
