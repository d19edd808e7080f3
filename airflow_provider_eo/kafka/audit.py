"""The exactly-once auditor: what a read_committed consumer of the sink really sees.

For every committed checkpoint it compares the records the manifest promised with the
records carrying that checkpoint's provenance header, and finds duplicates (a staged
position seen twice) and missing records (a staged position never seen).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from airflow_provider_eo import names
from airflow_provider_eo.kafka import admin
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


def high_watermarks(config: dict[str, Any], partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The high watermark (end of the log, including open transactions) per partition."""
    consumer = Consumer(
        {
            **librdkafka_config(config),
            "group.id": f"eo-hw-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            # librdkafka consumers default to read_committed, whose "high" watermark is the
            # last stable offset: only read_uncommitted reports the end of the log.
            "isolation.level": "read_uncommitted",
        }
    )
    try:
        return {
            (t, p): int(consumer.get_watermark_offsets(TopicPartition(t, p), 15)[1]) for t, p in partitions
        }
    finally:
        consumer.close()


def settled_ends(
    config: dict[str, Any], partitions: list[tuple[str, int]], settle_s: float = 15.0
) -> dict[tuple[str, int], int]:
    """Last stable offsets, after waiting (up to ``settle_s``) for them to reach the high
    watermark. ``commit_transaction`` returns before the broker has written the commit
    markers, so right after a commit the LSO can still lag; a transaction that stays open
    (a paused producer) is waited for only that long, then read up to its start."""
    deadline = time.monotonic() + settle_s
    while True:
        lso = admin.list_offsets(config, partitions, spec="latest")
        if lso == high_watermarks(config, partitions) or time.monotonic() >= deadline:
            return lso
        time.sleep(0.1)


def read_sink(config: dict[str, Any], topic: str, timeout_s: float = 120.0) -> list[Any]:
    """Every record a read_committed consumer sees in ``topic`` up to its last stable offset."""
    parts = admin.partitions_of(config, [topic])[topic]
    ends = settled_ends(config, [(topic, p) for p in parts])
    return read_topic(config, topic, ends, isolation="read_committed", timeout_s=timeout_s)


def read_topic(
    config: dict[str, Any],
    topic: str,
    ends: dict[tuple[str, int], int],
    *,
    isolation: str,
    timeout_s: float = 120.0,
) -> list[Any]:
    """Every record of ``topic`` from the log start up to ``ends`` (per partition), read with
    ``isolation`` (``read_committed``: what real consumers see; ``read_uncommitted``: aborted
    transactions too, for tests that compare input with output)."""
    parts = sorted(p for t, p in ends if t == topic)
    starts = admin.list_offsets(config, [(topic, p) for p in parts], spec="earliest")
    todo = {p for p in parts if ends[(topic, p)] > starts[(topic, p)]}
    consumer = Consumer(
        {
            **librdkafka_config(config),
            "group.id": f"eo-audit-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        consumer.assign([TopicPartition(topic, p, starts[(topic, p)]) for p in todo])
        while todo and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 0.5):
                err = msg.error()
                partition = int(msg.partition() or 0)
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pos = consumer.position([TopicPartition(topic, partition)])[0].offset
                        if pos >= ends[(topic, partition)]:
                            todo.discard(partition)
                    continue
                out.append(msg)
                if int(msg.offset() or 0) + 1 >= ends[(topic, partition)]:
                    todo.discard(partition)
    finally:
        consumer.close()
    if todo:
        raise TimeoutError(f"audit: could not read {topic} partitions {sorted(todo)} to the end")
    return out


def last_published_checkpoint(
    config: dict[str, Any],
    topic: str,
    partition: int,
    pipeline_name: str,
    identity: str,
    *,
    timeout_s: float = 120.0,
    first_window: int = 256,
) -> int:
    """The highest checkpoint id of pipeline ``pipeline_name`` (with ledger identity
    ``identity``) in the committed output of ``topic[partition]``; -1 when there is none.

    The proof of a commit that does not expire (commit markers are group offsets and do):
    it reads the partition's tail backwards, read_committed, in windows that double from
    ``first_window`` offsets, and stops at the first (latest) record whose provenance header
    names this pipeline with this identity, or with no identity (written before headers
    carried one: nothing newer of ours exists then). Records of the same pipeline name with
    another identity (another deployment) and records without our header are skipped.
    Commits are strictly ordered, so the latest record of ours carries the highest id.
    Raises :class:`~airflow_provider_eo.errors.CommitError` when it cannot read back in
    ``timeout_s`` (the caller must then not guess).
    """
    from airflow_provider_eo.errors import CommitError

    ident = identity[: names.PROVENANCE_IDENTITY_CHARS]
    tp = (topic, partition)
    end = settled_ends(config, [tp], settle_s=min(15.0, timeout_s / 4))[tp]
    log_start = admin.list_offsets(config, [tp], spec="earliest")[tp]
    consumer = Consumer(
        {
            **librdkafka_config(config),
            "group.id": f"eo-readback-{uuid.uuid4().hex[:8]}",  # never commits
            "isolation.level": "read_committed",  # only what committed transactions wrote
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    deadline = time.monotonic() + timeout_s
    window = first_window
    try:
        while end > log_start:
            start = max(log_start, end - window)
            consumer.assign([TopicPartition(topic, partition, start)])
            found = -1
            done = False
            while not done:
                if time.monotonic() >= deadline:
                    raise CommitError(
                        f"pipeline {pipeline_name!r}: could not read back {topic}[{partition}] "
                        f"[{start}, {end}) within {timeout_s:.0f}s to find which checkpoint it "
                        "last published (its commit marker is missing). Nothing was published "
                        "by this try; retry the commit when the sink is readable."
                    )
                for msg in consumer.consume(1000, 0.5):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            pos = consumer.position([TopicPartition(topic, partition)])[0].offset
                            done = done or pos >= end
                        continue
                    offset = int(msg.offset() or 0)
                    if offset >= end:
                        done = True
                        continue
                    prov = dict(msg.headers() or []).get(names.HEADER_PROVENANCE)
                    fields = names.parse_provenance(prov) if isinstance(prov, bytes) else None
                    parsed = names.parse_checkpoint_field(fields[0], pipeline_name) if fields else None
                    if parsed is not None and parsed[1] in (ident, None):
                        found = max(found, parsed[0])
                    done = done or offset + 1 >= end
            if found >= 0:
                return found
            end = start
            window *= 2
    finally:
        consumer.close()
    return -1


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
