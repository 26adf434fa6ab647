"""genmanip-ray: ``gmp eval --launcher ray`` spreads eval workers and policy replicas over a Ray
cluster (docs/scale-out.md). Ray is imported by this package only."""

from __future__ import annotations

from .__about__ import __version__

__all__ = ["__version__"]
