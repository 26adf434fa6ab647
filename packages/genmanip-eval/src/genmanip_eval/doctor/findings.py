"""Findings and the report of ``gmp doctor``: what was found, how bad, the evidence and the fix.

The JSON form (:meth:`Report.to_json`) is a stable schema (``"schema": "gmp-doctor/1"``,
documented in ``docs/doctor.md``): keys are only ever added, never renamed or removed, within one
schema version.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from genmanip_protocol.errors import ExitCode

__all__ = ["SCHEMA", "SEVERITIES", "Finding", "Report"]

#: Schema id of the ``--json`` document.
SCHEMA = "gmp-doctor/1"
#: Severities, worst first. ``fail``: the contract is broken (the server rejects the action or
#: the episode is doomed); ``warn``: very likely wrong, check it; ``info``: a measurement or a
#: note. A report with any ``fail`` or ``warn`` is not healthy.
SEVERITIES: tuple[str, ...] = ("fail", "warn", "info")


@dataclass
class Finding:
    """One finding.

    Attributes:
        id: stable identifier, e.g. ``"contract.gripper_polarity"`` (see docs/doctor.md).
        part: ``"link"`` (link and capacity) or ``"contract"`` (the policy's contract).
        severity: one of :data:`SEVERITIES`.
        title: one line saying what was found.
        evidence: what was measured or seen (numbers, keys, the step).
        fix: what to do about it (empty for a plain measurement).
        data: machine-readable details (numbers, lists).
    """

    id: str
    part: str
    severity: str
    title: str
    evidence: str = ""
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r}: expected one of {SEVERITIES}")
        if self.part not in ("link", "contract"):
            raise ValueError(f"part {self.part!r}: expected link or contract")


@dataclass
class Report:
    """Everything ``gmp doctor`` measured, advised and found.

    Attributes:
        server: url (without token), codec, frames, what ``GET /protocol`` said, robot id.
        probe: what the doctor spent on the server: ``worker_id``, ``steps``, ``resets``,
            ``no_steps``, ``episode_ended``.
        measurements: link, wire, server and policy numbers (docs/doctor.md).
        advice: the recommended settings, the expected throughput and the formula.
        findings: every finding, worst first.
    """

    server: dict[str, Any] = field(default_factory=dict)
    probe: dict[str, Any] = field(default_factory=dict)
    measurements: dict[str, Any] = field(default_factory=dict)
    advice: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    def add(self, finding: Finding) -> None:
        """Append a finding."""
        self.findings.append(finding)

    def sorted_findings(self) -> list[Finding]:
        """Findings worst first (stable within a severity)."""
        return sorted(self.findings, key=lambda f: SEVERITIES.index(f.severity))

    def ids(self, *severities: str) -> list[str]:
        """Ids of the findings of the given severities (all when none given)."""
        want = severities or SEVERITIES
        return [f.id for f in self.findings if f.severity in want]

    @property
    def healthy(self) -> bool:
        """No ``fail`` and no ``warn`` finding."""
        return not any(f.severity in ("fail", "warn") for f in self.findings)

    @property
    def exit_code(self) -> int:
        """``ExitCode.OK`` when healthy, else ``ExitCode.FAILURE`` (a check failed)."""
        return int(ExitCode.OK if self.healthy else ExitCode.FAILURE)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document (schema :data:`SCHEMA`)."""
        counts = {s: sum(1 for f in self.findings if f.severity == s) for s in SEVERITIES}
        return {
            "schema": SCHEMA,
            "healthy": self.healthy,
            "exit_code": self.exit_code,
            "counts": counts,
            "server": self.server,
            "probe": self.probe,
            "measurements": self.measurements,
            "advice": self.advice,
            "findings": [asdict(f) for f in self.sorted_findings()],
        }
