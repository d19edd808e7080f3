"""The exactly-once auditor: what a read_committed consumer of the sink really sees, checked
against the source.

Two checks per committed checkpoint:

1. Against the source: every record of its planned ranges (read back from the source
   topic, read_committed, as the prepare read it) is named by an output record's
   provenance, or was dropped by the transform (counted by the prepare, kept in the
   ledger), or is on the dead-letter topic (read back: its ``eo.*`` headers name the
   source position, this pipeline and its ledger identity). Anything else is
   ``missing``. This
   does not trust our own manifests: a checkpoint committed with fewer records than it
   read shows up here. A source record accounted for twice (published by two
   checkpoints, sent to the dead-letter topic twice, or sent there and published too) is
   a duplicate.
2. Against the staged output: every staged position (sink partition and index) is seen
   exactly once (``duplicates``), none is absent.

A checkpoint whose output carries no source position (an aggregation: no output record
stands for one source record; the prepare carries the position through every transform
that keeps rows, see :mod:`airflow_provider_eo.spark.provenance`) cannot be checked record
by record: its source records are neither dropped nor missing but ``unchecked``, and the
report's outcome is "checked by count only" (the staged check above still holds).

It checks the protocol (ledger against sink and source), so it lives with the protocol;
the Kafka reading is :mod:`airflow_provider_eo.kafka.audit`'s and
:mod:`airflow_provider_eo.kafka.source_read`'s.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_eo import names
from airflow_provider_eo.connections import require_applied
from airflow_provider_eo.kafka.audit import read_sink
from airflow_provider_eo.kafka.client_config import librdkafka_config
from airflow_provider_eo.kafka.source_read import read_source_ranges
from airflow_provider_eo.ledger import CheckpointRecord, CheckpointState, Ledger
from airflow_provider_eo.ledger.errors import CheckpointNotFound
from airflow_provider_eo.pipeline import Pipeline

#: Source positions a report names per kind (duplicated, missing): the first ones, in order.
EXAMPLES = 20


@dataclass
class CheckpointAudit:
    """Expected vs observed for one checkpoint."""

    checkpoint_id: int
    state: str
    expected: int  # output records staged (the manifest's count)
    observed: int = 0  # output records of this checkpoint in the sink
    duplicates: int = 0
    missing_staged: int = 0  # staged positions never seen in the sink
    source_records: int = 0  # records in the planned ranges, read back from the source
    source_published: int = 0  # of those, named by an output record's provenance
    dropped: int | None = None  # counted by the prepare; None: prepared before it counted
    dead_letters: int = 0  # of the source records, found on the dead-letter topic
    dead_letters_recorded: int = 0  # what the prepare staged as dead letters (the ledger)
    source_missing: int = 0  # read, not published, not dropped, not a dead letter
    source_expired: int = 0  # planned offsets already deleted by retention: not checkable
    unpositioned: int = 0  # output records carrying no source position (count-only check)
    source_unchecked: int = 0  # source records only a count-only check covers

    @property
    def missing(self) -> int:
        """Records lost: the larger of the two checks (one lost record is usually both a
        staged position and a source record)."""
        return max(self.missing_staged, self.source_missing)


@dataclass
class AuditReport:
    """The audit of one pipeline's sink."""

    pipeline: str
    sink_topic: str
    checkpoints: list[CheckpointAudit] = field(default_factory=list)
    foreign: int = 0  # sink records without our provenance (written by someone else)
    unexpected: int = 0  # records of checkpoints the ledger does not show as COMMITTED
    # Extra copies of source records: published by two checkpoints, a dead letter sent
    # twice, or a dead letter whose record was published too.
    sources_duplicated: int = 0
    duplicated_sources: list[str] = field(default_factory=list)  # the first EXAMPLES of them
    missing_sources: list[str] = field(default_factory=list)  # the first EXAMPLES missing

    @property
    def duplicates(self) -> int:
        """Duplicated output records, over all checkpoints."""
        return sum(c.duplicates for c in self.checkpoints) + self.sources_duplicated

    @property
    def missing(self) -> int:
        """Output records promised by a committed checkpoint but not in the sink."""
        return sum(c.missing for c in self.checkpoints)

    @property
    def source_records(self) -> int:
        """Source records of the committed ranges, read back from the source."""
        return sum(c.source_records for c in self.checkpoints)

    @property
    def dropped(self) -> int:
        """Source records the transform dropped (counted by the prepares)."""
        return sum(c.dropped or 0 for c in self.checkpoints)

    @property
    def dead_letters(self) -> int:
        """Source records sent to the dead-letter topic."""
        return sum(c.dead_letters for c in self.checkpoints)

    @property
    def source_expired(self) -> int:
        """Planned offsets retention deleted before the audit could read them."""
        return sum(c.source_expired for c in self.checkpoints)

    @property
    def unpositioned(self) -> int:
        """Output records carrying no source position, in checkpoints checked by count only."""
        return sum(c.unpositioned for c in self.checkpoints)

    @property
    def source_unchecked(self) -> int:
        """Source records of those checkpoints that no output record names."""
        return sum(c.source_unchecked for c in self.checkpoints)

    @property
    def ok(self) -> bool:
        """Nothing duplicated, nothing missing, nothing from an uncommitted checkpoint."""
        return self.duplicates == 0 and self.missing == 0 and self.unexpected == 0

    @property
    def per_record(self) -> bool:
        """Every checked source record was accounted for one by one (no checkpoint was
        checked by count only)."""
        return self.unpositioned == 0 and self.source_unchecked == 0

    @property
    def outcome(self) -> str:
        """``exactly once`` (every source record accounted for exactly once: published once,
        dropped by the transform, or one dead letter), ``NOT exactly once``, or ``checked by
        count only`` (nothing found wrong, but some output carries no source position)."""
        if not self.ok:
            return "NOT exactly once"
        return "exactly once" if self.per_record else "checked by count only"

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form (``eo audit --json``)."""
        return {
            "pipeline": self.pipeline,
            "sink_topic": self.sink_topic,
            "ok": self.ok,
            "outcome": self.outcome,
            "duplicates": self.duplicates,
            "missing": self.missing,
            "unexpected": self.unexpected,
            "foreign": self.foreign,
            "source_records": self.source_records,
            "dropped": self.dropped,
            "dead_letters": self.dead_letters,
            "source_expired": self.source_expired,
            "unpositioned": self.unpositioned,
            "source_unchecked": self.source_unchecked,
            "duplicated_sources": self.duplicated_sources,
            "missing_sources": self.missing_sources,
            "checkpoints": [{**c.__dict__, "missing": c.missing} for c in self.checkpoints],
        }


def audit_pipeline(pipeline: Pipeline, ledger: Ledger) -> AuditReport:
    """Audit the pipeline's sink against its ledger and its source (reads the whole sink
    topic, and the source ranges of every committed checkpoint)."""
    require_applied(pipeline, where="the audit")
    config = librdkafka_config(pipeline.kafka)
    report = AuditReport(pipeline=pipeline.name, sink_topic=pipeline.sink_topic)
    checkpoints = {c.checkpoint_id: c for c in ledger.list_checkpoints(pipeline.name)}
    positions: dict[int, Counter[bytes]] = defaultdict(Counter)
    source_seen: dict[bytes, set[int]] = defaultdict(set)
    unnamed: Counter[int] = Counter()  # per checkpoint, output records without a source position
    named: dict[tuple[int, bytes], bytes] = {}  # (checkpoint, staged position) -> its source position
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
        named[(cid, position)] = src
        if src != b"-":
            source_seen[src].add(cid)
        else:
            unnamed[cid] += 1
    dead = _dead_letters(config, pipeline, ident) if any(c.dead_letters for c in checkpoints.values()) else {}
    committed = [cp for _cid, cp in sorted(checkpoints.items()) if cp.state is CheckpointState.COMMITTED]
    rows = {
        cp.checkpoint_id: CheckpointAudit(cp.checkpoint_id, cp.state.value, expected=cp.records or 0)
        for cp in committed
    }
    twice: list[bytes | None] = []  # source positions of staged positions seen more than once
    for cid, cp in sorted(checkpoints.items()):
        if cp.state is not CheckpointState.COMMITTED:
            if cid in positions:
                report.unexpected += sum(positions[cid].values())
            continue
        seen = positions.get(cid, Counter())
        row = rows[cid]
        row.observed = sum(seen.values())
        row.duplicates = sum(n - 1 for n in seen.values() if n > 1)
        for position, n in seen.items():  # an output record written twice: name what it stands for
            if n > 1:
                twice.append(named[(cid, position)] if named[(cid, position)] != b"-" else None)
        row.missing_staged = max(0, row.expected - len(seen))
        report.checkpoints.append(row)
    # A Structured Streaming query's output names no source records (its state aggregates
    # them): its batches are checked against what they staged only.
    planned_here = [cp for cp in committed if cp.query_id is None]
    missing = _check_against_source(config, planned_here, rows, source_seen, dead, unnamed)
    report.missing_sources = missing[:EXAMPLES]
    report.unexpected += sum(sum(c.values()) for cid, c in positions.items() if cid not in checkpoints)
    extra = duplicated_sources(source_seen, dead)
    report.sources_duplicated = sum(extra.values())  # the staged duplicates are the rows'
    shown = {*extra, *(src for src in twice if src is not None)}
    report.duplicated_sources = [src.decode() for src in sorted(shown, key=_position_order)][:EXAMPLES]
    return report


def duplicated_sources(
    published: Mapping[bytes, set[int]], dead: Mapping[bytes, list[int]]
) -> dict[bytes, int]:
    """Source positions accounted for more than once, with their extra copies: a source
    record is accounted for by each checkpoint whose output names it and by each copy of
    it on the dead-letter topic; exactly once is one of these, once."""
    copies = Counter({src: len(cids) for src, cids in published.items()})
    for src, cids in dead.items():
        copies[src] += len(cids)
    return {src: n - 1 for src, n in copies.items() if n > 1}


def _position_order(position: bytes) -> tuple[bytes, int, int]:
    """``topic:partition:offset`` in source order (numbers as numbers)."""
    topic, partition, offset = position.rsplit(b":", 2)
    return topic, int(partition), int(offset)


def _check_against_source(
    config: dict[str, Any],
    committed: list[CheckpointRecord],
    rows: dict[int, CheckpointAudit],
    source_seen: dict[bytes, set[int]],
    dead: dict[bytes, list[int]],
    unnamed: Counter[int],
) -> list[str]:
    """Fill each committed checkpoint's source columns: read its planned ranges back from
    the source and find every record's position among the published provenance, else on
    the dead-letter topic. Returns the positions known to be missing (in source order; a
    checkpoint that also dropped records cannot tell which of its unnamed ones are gone).

    The unnamed records of a checkpoint whose output carries no source position and whose
    prepare could not count what the transform dropped (``records_dropped`` None,
    ``records_created`` not: an aggregation) are ``source_unchecked``, neither dropped nor
    missing. A checkpoint prepared before the prepare counted (both None) is checked as
    if nothing was dropped."""
    by_partition: dict[tuple[str, int], list[tuple[int, int, CheckpointRecord]]] = defaultdict(list)
    for cp in committed:
        for r in cp.ranges:
            if r.end > r.start:
                by_partition[r.key].append((r.start, r.end, cp))
    hulls = [
        (t, p, min(s for s, _, _ in spans), max(e for _, e, _ in spans))
        for (t, p), spans in by_partition.items()
    ]
    read = read_source_ranges(config, hulls)
    unseen: dict[int, list[str]] = defaultdict(list)
    for (topic, partition), spans in by_partition.items():
        got = read[(topic, partition)]
        offsets = [o for o, _ in got.records]
        for start, end, cp in spans:
            row = rows[cp.checkpoint_id]
            row.source_expired += max(0, min(end, got.log_start) - start)
            lo, hi = bisect.bisect_left(offsets, start), bisect.bisect_left(offsets, end)
            for offset, timestamp in got.records[lo:hi]:
                if cp.time_filter is not None and not cp.time_filter[0] <= timestamp < cp.time_filter[1]:
                    continue  # a backfill checkpoint reads only its time interval
                row.source_records += 1
                position = f"{topic}:{partition}:{offset}".encode()
                if position in source_seen:
                    row.source_published += 1
                elif position in dead:
                    row.dead_letters += 1
                else:
                    unseen[cp.checkpoint_id].append(position.decode())
    missing: list[str] = []
    for cp in committed:
        row = rows[cp.checkpoint_id]
        row.dropped = cp.records_dropped
        row.dead_letters_recorded = cp.dead_letters or 0
        nobody = unseen[cp.checkpoint_id]
        if cp.records_dropped is None and cp.records_created:
            row.unpositioned = unnamed[cp.checkpoint_id]
            row.source_unchecked = len(nobody)
            continue
        row.source_missing = max(0, len(nobody) - (cp.records_dropped or 0))
        if row.source_missing and not cp.records_dropped:
            missing += nobody
    return sorted(missing, key=lambda p: _position_order(p.encode()))


def _dead_letters(config: dict[str, Any], pipeline: Pipeline, ident: str | None) -> dict[bytes, list[int]]:
    """Source position (``topic:partition:offset``) -> checkpoints that sent it to the
    pipeline's dead-letter topic, from the ``eo.*`` headers of its committed records (this
    pipeline under this ledger identity only)."""
    found: dict[bytes, list[int]] = defaultdict(list)
    if pipeline.dead_letter_topic is None or ident is None:
        return found
    for msg in read_sink(config, pipeline.dead_letter_topic):
        h = dict(msg.headers() or [])
        if h.get(names.HEADER_DLQ_PIPELINE) != pipeline.name.encode():
            continue
        if h.get(names.HEADER_DLQ_IDENTITY) != ident.encode():
            continue
        try:
            cid = int(h[names.HEADER_DLQ_CHECKPOINT])
            position = b":".join(
                (h[names.HEADER_DLQ_TOPIC], h[names.HEADER_DLQ_PARTITION], h[names.HEADER_DLQ_OFFSET])
            )
        except (KeyError, ValueError):
            continue
        found[position].append(cid)
    return found
