"""The doctor's findings and report: what one check found and what to change."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["ok", "warn", "fail"]
SEVERITIES: tuple[Severity, ...] = ("ok", "warn", "fail")

#: Kafka's default ``transaction.max.timeout.ms``.
BROKER_DEFAULT_MAX_TXN_TIMEOUT_MS = 900_000


@dataclass(frozen=True)
class Finding:
    """One check's result.

    :param check: short name of the check (``transaction-timeout``, ``sink-topic`` ...).
    :param severity: ``ok`` | ``warn`` | ``fail``.
    :param found: what was found.
    :param change: what to change (empty when nothing needs to change).
    """

    check: str
    severity: Severity
    found: str
    change: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {SEVERITIES}")

    def as_dict(self) -> dict[str, str]:
        """JSON-ready form (``eo doctor --json``)."""
        return {"check": self.check, "severity": self.severity, "found": self.found, "change": self.change}


@dataclass(frozen=True)
class DoctorReport:
    """Every finding of one ``eo doctor`` run."""

    pipeline: str
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    @property
    def safe(self) -> bool:
        """True when no finding failed (warnings allowed): safe to run."""
        return all(f.severity != "fail" for f in self.findings)

    @property
    def exit_code(self) -> int:
        """0 when safe to run, 1 when any check failed."""
        return 0 if self.safe else 1

    def count(self, severity: Severity) -> int:
        """How many findings have ``severity``."""
        return sum(1 for f in self.findings if f.severity == severity)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``eo doctor --json``)."""
        return {
            "pipeline": self.pipeline,
            "safe": self.safe,
            "counts": {s: self.count(s) for s in SEVERITIES},
            "findings": [f.as_dict() for f in self.findings],
        }
