"""The produce loop of a shard's transaction: its staged Arrow batches and dead letters
handed to ``produce()`` with their headers, offsets for ``send_offsets_to_transaction``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from airflow_provider_eo import names
from airflow_provider_eo.kafka.producer_pool import (
    BATCH_FRAMING_BYTES,
    LIBRDKAFKA_BATCH_SIZE,
    LIBRDKAFKA_MESSAGE_MAX_BYTES,
)
from airflow_provider_eo.kafka.publish_errors import Abortable, serve, sorted_error
from airflow_provider_eo.names import HEADER_PROVENANCE
from airflow_provider_eo.provenance import compact_provenance_values


def connect(producer: Producer, topic: str, timeout_s: float) -> None:
    """Bring up a connection to a real broker before ``init_transactions``.

    A fresh librdkafka (2.x) producer sends its first FindCoordinator through the bootstrap
    connection, which it drops as soon as the cluster's metadata names the real brokers; the
    lost query then waits for the 500 ms coordinator-query timer. Two metadata requests (the
    second can only be answered by a learned broker) avoid that. Measured on a local broker
    (librdkafka 2.16, fresh process each): init_transactions alone 0.51 s in 6 of 6 runs;
    these two calls 0.06 s plus init_transactions 0.004 s in 6 of 6.
    """
    producer.list_topics(topic, timeout_s)
    producer.list_topics(topic, timeout_s)


def largest_record(batches: Iterable[pa.RecordBatch]) -> tuple[int, str, int] | None:
    """(index in the staged output, source position, key+value bytes) of the largest staged
    record: names the record a broker refused for its size (read only after a refusal)."""
    best: tuple[int, str, int] | None = None
    index = 0
    for batch in batches:
        if batch.num_rows:
            sizes = pc.add(
                pc.fill_null(pc.binary_length(batch.column("value")), 0),
                pc.fill_null(pc.binary_length(batch.column("key")), 0),
            )
            i = int(pc.index(sizes, pc.max(sizes)).as_py())
            size = int(sizes[i].as_py())
            if best is None or size > best[2]:
                row = {c: batch.column(c)[i].as_py() for c in ("src_topic", "src_partition", "src_offset")}
                src = (
                    "-"
                    if row["src_topic"] is None
                    else f"{row['src_topic']}:{row['src_partition']}:{row['src_offset']}"
                )
                best = (index + i, src, size)
        index += batch.num_rows
    return best


def group_metadata(config: Mapping[str, Any], group: str) -> Any:
    """Consumer-group metadata for ``send_offsets_to_transaction`` (from the process's
    standalone consumer of that group)."""
    from airflow_provider_eo.kafka.admin import group_consumer

    return group_consumer(config, group).consumer_group_metadata()


def produce(producer: Producer, topic: str, **kwargs: Any) -> None:
    """``produce()`` with back-pressure: when the local queue is full, serve delivery
    reports and try again (``produce_batch`` would drop headers)."""
    while True:
        try:
            producer.produce(topic, **kwargs)
            return
        except BufferError:
            serve("poll", producer.poll, 0.05)


def offsets(items: Mapping[tuple[str, int], int], metadata: str | None = None) -> list[TopicPartition]:
    """TopicPartition list for ``send_offsets_to_transaction``; ``metadata`` is committed with
    every offset (a commit marker carries ``names.marker_metadata(identity)``)."""
    if metadata is None:
        return [TopicPartition(t, p, o) for (t, p), o in sorted(items.items())]
    return [TopicPartition(t, p, o, metadata=metadata) for (t, p), o in sorted(items.items())]


def _produce_error(exc: KafkaException, where: str) -> Exception:
    err: KafkaError = exc.args[0]
    if err.code() == KafkaError._STATE:  # the transaction failed earlier (a delivery report)
        return Abortable(f"produce: the transaction is in an abortable state: {err}")
    return sorted_error("produce", exc, where)


class Sent:
    """How many records a shard's transaction has handed to ``produce()`` so far (read when
    the transaction fails: how far its publish got, and how fast)."""

    def __init__(self) -> None:
        self.records = 0


def produce_staged(
    producer: Producer,
    topic: str,
    partition: int,
    batches: Iterable[pa.RecordBatch],
    checkpoint_header: bytes,
    where: str = "",
    sent: Sent | None = None,
) -> int:
    """Produce one sink partition's staged rows, in staged order, each with the provenance
    header in its compact form (checkpoint, position in the staged output, source position;
    ``checkpoint_header`` is the text first field, :func:`names.provenance_checkpoint_field`).
    Returns the count; ``sent`` (when given) counts them as they go, a failure included.

    The user's headers are kept; ``produce()`` is used because ``produce_batch`` drops
    headers. Columns and header values become Python objects once per batch; the per-record
    work is one ``produce()`` call, its headers passed positionally (as a keyword argument
    they cost the C call a keyword lookup per record, more than the header itself).

    Raises :class:`Abortable` when the transaction already failed (a failed delivery report
    makes ``produce()`` raise ``_STATE``), else the sorted error of :func:`kafka_call`.
    """
    send = producer.produce
    key_name = HEADER_PROVENANCE
    prefix = names.compact_provenance_prefix(checkpoint_header, partition)
    index = 0
    for batch in batches:
        n = batch.num_rows
        if n == 0:
            continue
        prov = compact_provenance_values(batch, prefix, index)
        keys = batch.column("key").to_pylist()
        values = batch.column("value").to_pylist()
        user = batch.column("headers")
        user_headers = user.to_pylist() if user.null_count < n else None
        i = 0
        try:
            for i in range(n):
                hdrs: list[tuple[str, str | bytes | None]] = [(key_name, prov[i])]
                if user_headers is not None and user_headers[i]:
                    hdrs = [(h["key"], h["value"]) for h in user_headers[i]] + hdrs
                try:  # positional: topic, value, key, partition, callback, on_delivery, timestamp, headers
                    send(topic, values[i], keys[i], partition, None, None, 0, hdrs)
                except BufferError:  # local queue full: serve delivery reports, then block
                    serve("poll", producer.poll, 0.05, where=where)
                    try:
                        produce(
                            producer, topic, value=values[i], key=keys[i], partition=partition, headers=hdrs
                        )
                    except KafkaException as exc:
                        raise _produce_error(exc, where) from exc
                except KafkaException as exc:
                    raise _produce_error(exc, where) from exc
        except BaseException:
            if sent is not None:
                sent.records += i  # record i was not taken
            raise
        index += n
        if sent is not None:
            sent.records += n
        serve("poll", producer.poll, 0, where=where)  # delivery reports: the local queue drains
    return index


def produce_dead_letters(
    producer: Producer,
    topic: str,
    batches: Iterable[pa.RecordBatch],
    *,
    pipeline: str,
    checkpoint_id: int,
    identity: str,
    where: str = "",
    sent: Sent | None = None,
) -> int:
    """Produce a checkpoint's dead letters (staged by the prepare: the source record's key,
    value and headers, its position and the error) to the dead-letter ``topic``, each with
    the ``eo.*`` headers that say why and where from (:data:`names.HEADER_DLQ_ERROR` ...).
    The partition is the client's choice (by key). Returns the count."""
    produced = 0
    for batch in batches:
        for row in batch.to_pylist():
            hdrs = dead_letter_headers(row, pipeline=pipeline, checkpoint_id=checkpoint_id, identity=identity)
            try:
                produce(producer, topic, value=row["value"], key=row["key"], headers=hdrs)
            except KafkaException as exc:
                raise _produce_error(exc, where) from exc
            produced += 1
            if sent is not None:
                sent.records += 1
        serve("poll", producer.poll, 0, where=where)
    return produced


def dead_letter_headers(
    row: Mapping[str, Any], *, pipeline: str, checkpoint_id: int, identity: str
) -> list[tuple[str, bytes | None]]:
    """A dead letter's headers: the source record's own, then the ``eo.dlq.*`` ones that say
    why and where from. ``row``: a staged dead letter (``headers``, ``error``, ``src_*``)."""
    return [(h["key"], h["value"]) for h in row["headers"] or []] + [
        (names.HEADER_DLQ_ERROR, str(row["error"]).encode()),
        (names.HEADER_DLQ_TOPIC, str(row["src_topic"]).encode()),
        (names.HEADER_DLQ_PARTITION, str(row["src_partition"]).encode()),
        (names.HEADER_DLQ_OFFSET, str(row["src_offset"]).encode()),
        (names.HEADER_DLQ_PIPELINE, pipeline.encode()),
        (names.HEADER_DLQ_CHECKPOINT, str(checkpoint_id).encode()),
        (names.HEADER_DLQ_IDENTITY, identity[: names.PROVENANCE_IDENTITY_CHARS].encode()),
    ]


# A record batch's header (61 bytes) and one record's length, attributes, timestamp and
# offset deltas, key and value lengths and header count as varints, at their widest.
RECORD_BATCH_FRAMING_BYTES = 61 + 5 + 1 + 10 + 5 + 5 + 5 + 5
# Each header's key and value lengths as varints, at their widest.
HEADER_FRAMING_BYTES = 10


def record_batch_size(key: bytes | None, value: bytes | None, headers: Iterable[tuple[str, Any]]) -> int:
    """The bytes of an uncompressed record batch holding only this record, at most: what the
    broker compares with the topic's ``max.message.bytes`` when the record is sent alone
    (librdkafka's local ``message.max.bytes`` check counts the same parts)."""
    size = RECORD_BATCH_FRAMING_BYTES + len(key or b"") + len(value or b"")
    for name, data in headers:
        size += HEADER_FRAMING_BYTES + len(name.encode()) + len(data or b"")
    return size


def with_dead_letter_limits(config: Mapping[str, Any], dead_letter_max_bytes: int) -> dict[str, Any]:
    """``config`` for a producer that also sends dead letters to a topic whose
    ``max.message.bytes`` is ``dead_letter_max_bytes``: ``message.max.bytes`` at least that
    (a dead letter is a whole source record, possibly larger than the sink allows: the
    sink's limit alone made librdkafka refuse it locally on every retry) and ``batch.size``
    below it (a batch of dead letters must fit the dead-letter topic). :func:`new_producer`
    then applies the sink topic's limits over these the same way."""
    batch = int(config.get("batch.size", LIBRDKAFKA_BATCH_SIZE))
    message_max = int(config.get("message.max.bytes", LIBRDKAFKA_MESSAGE_MAX_BYTES))
    return {
        **config,
        "batch.size": max(1, min(batch, dead_letter_max_bytes - BATCH_FRAMING_BYTES)),
        "message.max.bytes": max(message_max, dead_letter_max_bytes + BATCH_FRAMING_BYTES),
    }
