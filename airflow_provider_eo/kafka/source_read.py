"""Reading planned source ranges back, record by record, as a read_committed consumer sees
them: what the auditor (:mod:`airflow_provider_eo.core.audit`) checks every published
record against. Only Kafka here; which ranges to read is the ledger's business."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.acls import is_authorization_error, reader_denied
from airflow_provider_eo.kafka.client_config import CONSUME_WAIT_S, librdkafka_config

__all__ = ["SourceRecords", "read_source_ranges"]


@dataclass
class SourceRecords:
    """What a source partition holds in the ranges asked for.

    :param records: ``(offset, timestamp_ms)`` of every record read, in offset order.
    :param log_start: the partition's first retained offset when it was read: offsets below
        it were deleted by retention and cannot be checked any more.
    """

    records: list[tuple[int, int]] = field(default_factory=list)
    log_start: int = 0


def read_source_ranges(
    config: dict[str, Any],
    spans: Iterable[tuple[str, int, int, int]],
    *,
    isolation: str = "read_committed",
    timeout_s: float = 300.0,
) -> dict[tuple[str, int], SourceRecords]:
    """Every record in ``[start, end)`` of each ``(topic, partition, start, end)`` span (one
    span per partition: pass the hull of its ranges), read with ``isolation`` (the prepare
    reads read_committed, so does the audit). A transactional source has offset gaps
    (commit markers, aborted records): only real records are returned.

    :raises TimeoutError: a partition could not be read to the span's end in ``timeout_s``.
    """
    wanted = {(t, p): (s, e) for t, p, s, e in spans if e > s}
    out = {tp: SourceRecords() for tp in wanted}
    if not wanted:
        return out
    starts = admin.list_offsets(config, list(wanted), spec="earliest")
    for tp, result in out.items():
        result.log_start = starts[tp]
    todo = {tp for tp, (s, e) in wanted.items() if e > max(s, starts[tp])}
    consumer = Consumer(
        {
            **librdkafka_config(config),
            "group.id": f"eo-audit-source-{uuid.uuid4().hex[:8]}",  # never commits
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    deadline = time.monotonic() + timeout_s
    try:
        consumer.assign([TopicPartition(t, p, max(wanted[(t, p)][0], starts[(t, p)])) for t, p in todo])
        while todo:
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"audit: could not read source partitions {sorted(todo)} to the planned ends"
                )
            for msg in consumer.consume(10_000, CONSUME_WAIT_S):
                tp = (str(msg.topic()), int(msg.partition() or 0))
                if tp not in todo:
                    continue
                end = wanted[tp][1]
                err = msg.error()
                if err is not None:
                    if is_authorization_error(err):
                        raise reader_denied(err, f"reading source {tp[0]}", tp[0], "eo-audit-", config)
                    if err.code() == KafkaError._PARTITION_EOF:
                        pos = consumer.position([TopicPartition(tp[0], tp[1])])[0].offset
                        if pos >= end:
                            todo.discard(tp)
                    continue
                offset = int(msg.offset() or 0)
                if offset < end:
                    out[tp].records.append((offset, int(msg.timestamp()[1])))
                if offset + 1 >= end:
                    todo.discard(tp)
    finally:
        consumer.close()
    return out
