"""The exactly-once auditor: what a read_committed consumer of the sink really sees.

For every committed checkpoint it compares the records the manifest promised with the
records carrying that checkpoint's provenance header, and finds duplicates (a staged
position seen twice) and missing records (a staged position never seen). It checks the
protocol (ledger against sink), so it lives with the protocol; the Kafka reading is
:mod:`airflow_provider_eo.kafka.audit`'s.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_eo import names
from airflow_provider_eo.kafka.audit import read_sink
from airflow_provider_eo.kafka.client_config import librdkafka_config
from airflow_provider_eo.ledger import CheckpointState, Ledger
from airflow_provider_eo.ledger.errors import CheckpointNotFound
from airflow_provider_eo.pipeline import Pipeline


@dataclass
class CheckpointAudit:
    """Expected vs observed for one checkpoint."""

    checkpoint_id: int
    state: str
    expected: int
    observed: int = 0
    duplicates: int = 0
    missing: int = 0


@dataclass
class AuditReport:
    """The audit of one pipeline's sink."""

    pipeline: str
    sink_topic: str
    checkpoints: list[CheckpointAudit] = field(default_factory=list)
    foreign: int = 0  # sink records without our provenance (written by someone else)
    unexpected: int = 0  # records of checkpoints the ledger does not show as COMMITTED
    sources_duplicated: int = 0  # source offsets published by two different checkpoints

    @property
    def duplicates(self) -> int:
        """Duplicated output records, over all checkpoints."""
        return sum(c.duplicates for c in self.checkpoints) + self.sources_duplicated

    @property
    def missing(self) -> int:
        """Output records promised by a committed checkpoint but not in the sink."""
        return sum(c.missing for c in self.checkpoints)

    @property
    def ok(self) -> bool:
        """Nothing duplicated, nothing missing, nothing from an uncommitted checkpoint."""
        return self.duplicates == 0 and self.missing == 0 and self.unexpected == 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form (``eo audit --json``)."""
        return {
            "pipeline": self.pipeline,
            "sink_topic": self.sink_topic,
            "ok": self.ok,
            "duplicates": self.duplicates,
            "missing": self.missing,
            "unexpected": self.unexpected,
            "foreign": self.foreign,
            "checkpoints": [c.__dict__ for c in self.checkpoints],
        }


def audit_pipeline(pipeline: Pipeline, ledger: Ledger) -> AuditReport:
    """Audit the pipeline's sink against its ledger (reads the whole sink topic)."""
    config = librdkafka_config(pipeline.kafka)
    report = AuditReport(pipeline=pipeline.name, sink_topic=pipeline.sink_topic)
    checkpoints = {c.checkpoint_id: c for c in ledger.list_checkpoints(pipeline.name)}
    positions: dict[int, Counter[bytes]] = defaultdict(Counter)
    source_seen: dict[bytes, set[int]] = defaultdict(set)
    try:
        ident: str | None = ledger.get_pipeline(pipeline.name).identity[: names.PROVENANCE_IDENTITY_CHARS]
    except CheckpointNotFound:  # not registered in this ledger: nothing is ours
        ident = None
    for msg in read_sink(config, pipeline.sink_topic):
        prov = dict(msg.headers() or []).get(names.HEADER_PROVENANCE)
        fields = names.parse_provenance(prov) if prov is not None else None
        # "<pipeline>:<checkpoint>" (older records) or "<pipeline>:<checkpoint>:<identity8>"
        parsed = names.parse_checkpoint_field(fields[0], pipeline.name) if fields else None
        if fields is None or parsed is None or parsed[1] not in (ident, None):
            report.foreign += 1  # not ours, or the same name published by another ledger
            continue
        _ckpt, position, src = fields
        cid = parsed[0]
        positions[cid][position] += 1
        if src != b"-":
            source_seen[src].add(cid)
    for cid, cp in sorted(checkpoints.items()):
        if cp.state is not CheckpointState.COMMITTED:
            if cid in positions:
                report.unexpected += sum(positions[cid].values())
            continue
        seen = positions.get(cid, Counter())
        row = CheckpointAudit(cid, cp.state.value, expected=cp.records or 0)
        row.observed = sum(seen.values())
        row.duplicates = sum(n - 1 for n in seen.values() if n > 1)
        row.missing = max(0, row.expected - len(seen))
        report.checkpoints.append(row)
    report.unexpected += sum(sum(c.values()) for cid, c in positions.items() if cid not in checkpoints)
    report.sources_duplicated = sum(1 for cids in source_seen.values() if len(cids) > 1)
    return report
