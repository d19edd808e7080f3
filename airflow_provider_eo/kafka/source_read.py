"""Reading planned source ranges, record by record, as a read_committed consumer sees them:
what the auditor (:mod:`airflow_provider_eo.core.audit`) checks every published record
against (:func:`read_source_ranges`), and a small checkpoint's records read by the driver
(:func:`read_records`). Only Kafka here; which ranges to read is the ledger's business."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, TopicPartition

from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.acls import is_authorization_error, reader_denied
from airflow_provider_eo.kafka.client_config import CONSUME_WAIT_S, cache_key, librdkafka_config

__all__ = ["RECORD_COLUMNS", "SourceRecords", "read_records", "read_source_ranges"]


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
    ends = {tp: wanted[tp][1] for tp in todo}

    def refused(tp: tuple[str, int], err: KafkaError) -> None:
        if is_authorization_error(err):
            raise reader_denied(err, f"reading source {tp[0]}", tp[0], "eo-audit-", config)

    try:
        consumer.assign([TopicPartition(t, p, max(wanted[(t, p)][0], starts[(t, p)])) for t, p in todo])
        for tp, msg in _range_records(consumer, ends, time.monotonic() + timeout_s, refused):
            out[tp].records.append((int(msg.offset() or 0), int(msg.timestamp()[1])))
    except TimeoutError as exc:
        raise TimeoutError(f"audit: could not read source partitions {exc} to the planned ends") from None
    finally:
        consumer.close()
    return out


def _range_records(
    consumer: Consumer,
    ends: Mapping[tuple[str, int], int],
    deadline: float,
    on_error: Callable[[tuple[str, int], KafkaError], None],
    wait_s: float = CONSUME_WAIT_S,
) -> Iterator[tuple[tuple[str, int], Any]]:
    """The records below ``ends`` (partition -> end offset) of the partitions ``consumer`` was
    assigned at their starts, as ``(partition, message)`` until each partition reached its end
    (a record at or past it, or its end reported there: a transactional source has offset
    gaps). ``on_error(partition, error)`` sees every other error of a partition still being
    read; it raises to stop, else the error is passed over.

    :raises TimeoutError: (naming the partitions left) not every end reached by ``deadline``.
    """
    todo = set(ends)
    while todo:
        if time.monotonic() >= deadline:
            raise TimeoutError(str(sorted(todo)))
        for msg in consumer.consume(100_000, wait_s):
            tp = (str(msg.topic()), int(msg.partition() or 0))
            if tp not in todo:
                continue
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    on_error(tp, err)
                elif consumer.position([TopicPartition(*tp)])[0].offset >= ends[tp]:
                    todo.discard(tp)
                continue
            offset = int(msg.offset() or 0)
            if offset < ends[tp]:
                yield tp, msg
            if offset + 1 >= ends[tp]:
                todo.discard(tp)


_LOG = logging.getLogger(__name__)

#: The columns of :func:`read_records`'s table, as Spark's Kafka source names them (its
#: batch read without headers): key, value, topic, partition, offset, timestamp (epoch ms,
#: UTC) and timestampType (Kafka's id: 0 create time, 1 log-append time).
RECORD_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")

#: How long a driver read may take before the caller reads with Spark instead.
DRIVER_READ_TIMEOUT_S = 10.0
#: How long each ``consume()`` of a driver read waits when the broker has nothing yet: short,
#: since a planned range exists in full and the read ends when its last offset arrives.
_DRIVER_CONSUME_WAIT_S = 0.005

#: A kept reader unused this long is closed at the next read (of any config).
READER_IDLE_S = 300.0


class _NotRecords(Exception):
    """A driver read met an error (not a record): the caller reads with Spark instead."""


_READERS: dict[tuple[tuple[str, str], ...], list[tuple[float, Consumer]]] = {}
_READERS_LOCK = threading.Lock()


@contextmanager
def _reader(conf: Mapping[str, Any]) -> Iterator[Consumer]:
    """A consumer of ``conf`` no other thread uses meanwhile, kept for the next read of the
    same config (a stream reads every interval: connecting a new consumer each time cost as
    much as the read; closing one right after creating it, while its coordinator lookup is
    in flight, crashed librdkafka 2.16 here). Unassigned when handed back; closed once
    unused for :data:`READER_IDLE_S`."""
    key = cache_key(conf)
    now = time.monotonic()
    retired: list[Consumer] = []
    with _READERS_LOCK:
        for k, kept in list(_READERS.items()):
            retired += [c for used, c in kept if now - used > READER_IDLE_S]
            _READERS[k] = [(used, c) for used, c in kept if now - used <= READER_IDLE_S]
        idle = _READERS.setdefault(key, [])
        consumer = idle.pop()[1] if idle else None
    for old in retired:
        try:
            old.close()
        except Exception:  # already closed, or the broker is gone: nothing more to do
            pass
    if consumer is None:
        consumer = Consumer(dict(conf))
    try:
        yield consumer
    finally:
        try:
            consumer.unassign()
        except Exception:  # closed, or broken: not handed out again
            return
        with _READERS_LOCK:
            _READERS.setdefault(key, []).append((time.monotonic(), consumer))


def read_records(
    config: Mapping[str, Any],
    spans: Iterable[tuple[str, int, int, int]],
    *,
    group: str,
    timeout_s: float = DRIVER_READ_TIMEOUT_S,
) -> pa.Table | None:
    """Every committed record in ``[start, end)`` of each ``(topic, partition, start, end)``
    span, read by this process (``read_committed``, as the prepare's Spark read), as one
    Arrow table of :data:`RECORD_COLUMNS` (offset order within a partition).

    ``group`` is the consumer's ``group.id`` (assign only: never joined, never committed;
    a refused coordinator look-up of it is ignored, the read does not need the group). One
    consumer per config and group is kept between reads.

    ``None`` when the read meets anything but records: a refused READ, a start below the
    partition's log start (deleted by retention), any other error, or no end within
    ``timeout_s``. The caller then reads with Spark's Kafka source, whose failures are the
    ones the prepare explains (access denied, data loss); nothing read here is kept.
    """
    wanted = [(t, p, s, e) for t, p, s, e in spans if e > s]
    conf = {
        **{k: v for k, v in librdkafka_config(config).items() if not k.startswith(("linger", "queue."))},
        "group.id": group,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",  # a start retention deleted is an error, never skipped
        "fetch.wait.max.ms": 20,  # a planned range exists in full: no fetch waits for more
    }
    ends = {(t, p): e for t, p, _, e in wanted}
    if len(ends) != len(wanted):
        return None  # two spans of one partition: Spark's read takes them
    columns: dict[str, list[Any]] = {name: [] for name in RECORD_COLUMNS}

    def not_records(tp: tuple[str, int], err: KafkaError) -> None:
        if str(err.name()) != "GROUP_AUTHORIZATION_FAILED":  # the group is only looked up
            raise _NotRecords(f"{tp} {err}")

    with _reader(conf) as consumer:
        if ends:
            consumer.assign([TopicPartition(t, p, s) for t, p, s, _ in wanted])
        try:
            deadline = time.monotonic() + timeout_s
            for tp, msg in _range_records(consumer, ends, deadline, not_records, _DRIVER_CONSUME_WAIT_S):
                kind, stamp = msg.timestamp()
                columns["key"].append(msg.key())
                columns["value"].append(msg.value())
                columns["topic"].append(tp[0])
                columns["partition"].append(tp[1])
                columns["offset"].append(int(msg.offset() or 0))
                columns["timestamp"].append(stamp)
                columns["timestampType"].append(kind - 1)  # librdkafka counts from 1
        except (_NotRecords, TimeoutError) as exc:
            _LOG.debug("driver read stopped (%s): Spark's Kafka source reads it", exc)
            return None
    return pa.table(
        {
            "key": pa.array(columns["key"], pa.binary()),
            "value": pa.array(columns["value"], pa.binary()),
            "topic": pa.array(columns["topic"], pa.string()),
            "partition": pa.array(columns["partition"], pa.int32()),
            "offset": pa.array(columns["offset"], pa.int64()),
            "timestamp": pa.array(columns["timestamp"], pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
            "timestampType": pa.array(columns["timestampType"], pa.int32()),
        }
    )
