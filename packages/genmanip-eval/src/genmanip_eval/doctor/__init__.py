"""``gmp doctor``: a pre-flight that measures the link and checks the policy's contract.

* :mod:`.measure` -- round trips, bytes and codec cost per wire mode, policy latency.
* :mod:`.contract` -- :class:`ContractChecker`: the policy's actions on real observations.
* :mod:`.advice` -- settings and expected throughput from the measurements (the formula).
* :mod:`.findings` -- :class:`Finding`, :class:`Report` and the ``--json`` schema.
* :mod:`.run` -- :func:`run_doctor` (the library entry point); :mod:`.cli` -- the handler.

See docs/doctor.md.
"""

from __future__ import annotations

from .advice import FORMULA, Inputs, advise
from .contract import ContractChecker
from .findings import SCHEMA, SEVERITIES, Finding, Report
from .run import DoctorConfig, run_doctor

__all__ = [
    "FORMULA",
    "SCHEMA",
    "SEVERITIES",
    "ContractChecker",
    "DoctorConfig",
    "Finding",
    "Inputs",
    "Report",
    "advise",
    "run_doctor",
]
