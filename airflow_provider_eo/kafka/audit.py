"""Reading a topic back as its consumers see it: what the auditor
(:mod:`airflow_provider_eo.core.audit`) counts and the commit's read-back proof of which
checkpoint a shard last published.

Only Kafka here: which records a checkpoint promised is the ledger's business and is
compared by the auditor, never by this adapter.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from airflow_provider_eo import names
from airflow_provider_eo.errors import CommitError, ReadBackBlocked
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.acls import is_authorization_error, reader_denied
from airflow_provider_eo.kafka.client_config import CONSUME_WAIT_S, librdkafka_config


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
    except KafkaException as exc:
        if is_authorization_error(exc.args[0]):
            topic = partitions[0][0] if partitions else ""
            raise reader_denied(exc.args[0], "reading high watermarks", topic, "eo-hw-", config) from exc
        raise
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


def read_sink(
    config: dict[str, Any], topic: str, timeout_s: float = 120.0, *, settle_s: float = 15.0
) -> list[Any]:
    """Every record a read_committed consumer sees in ``topic`` up to its last stable offset,
    after waiting up to ``settle_s`` for open transactions to end (:func:`settled_ends`; 0:
    what such a consumer sees now)."""
    parts = admin.partitions_of(config, [topic])[topic]
    ends = settled_ends(config, [(topic, p) for p in parts], settle_s)
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
    return list(iter_topic(config, topic, ends, isolation=isolation, timeout_s=timeout_s))


def iter_topic(
    config: dict[str, Any],
    topic: str,
    ends: dict[tuple[str, int], int],
    *,
    isolation: str,
    timeout_s: float = 120.0,
) -> Iterator[Any]:
    """:func:`read_topic`'s records one at a time (memory bounded: millions of records are
    counted, not held). TimeoutError when a partition was not read to its end in time."""
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
    deadline = time.monotonic() + timeout_s
    try:
        consumer.assign([TopicPartition(topic, p, starts[(topic, p)]) for p in todo])
        while todo and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, CONSUME_WAIT_S):
                err = msg.error()
                partition = int(msg.partition() or 0)
                if err is not None:
                    if is_authorization_error(err):
                        raise reader_denied(err, f"reading {topic}", topic, "eo-audit-", config)
                    if err.code() == KafkaError._PARTITION_EOF:
                        pos = consumer.position([TopicPartition(topic, partition)])[0].offset
                        if pos >= ends[(topic, partition)]:
                            todo.discard(partition)
                    continue
                yield msg
                if int(msg.offset() or 0) + 1 >= ends[(topic, partition)]:
                    todo.discard(partition)
    finally:
        consumer.close()
    if todo:
        raise TimeoutError(f"audit: could not read {topic} partitions {sorted(todo)} to the end")


def _checkpoint_of(msg: Any, pipeline_name: str, ident: str) -> int | None:
    """The checkpoint id a record's provenance header names when the record is this
    pipeline's (its name, and this identity or none: written before headers carried one)."""
    prov = dict(msg.headers() or []).get(names.HEADER_PROVENANCE)
    fields = names.parse_provenance(prov) if isinstance(prov, bytes) else None
    parsed = names.parse_checkpoint_field(fields[0], pipeline_name) if fields else None
    if parsed is not None and parsed[1] in (ident, None):
        return parsed[0]
    return None


def _last_of_ours(
    config: dict[str, Any],
    tp: tuple[str, int],
    start: int,
    end: int,
    pipeline_name: str,
    ident: str,
    deadline: float,
) -> int | None:
    """The offset of the last record of this pipeline in ``[start, end)`` of the log, read
    uncommitted (records of open and aborted transactions included); ``None`` when there is
    none. Raises :class:`TimeoutError` when ``deadline`` (monotonic) passes first."""
    topic, partition = tp
    consumer = Consumer(
        {
            **librdkafka_config(config),
            "group.id": f"eo-readback-{uuid.uuid4().hex[:8]}",  # never commits
            "isolation.level": "read_uncommitted",  # beyond the last stable offset too
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    last: int | None = None
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        while time.monotonic() < deadline:
            for msg in consumer.consume(1000, CONSUME_WAIT_S):
                err = msg.error()
                if err is not None:
                    eof = err.code() == KafkaError._PARTITION_EOF
                    if eof and consumer.position([TopicPartition(topic, partition)])[0].offset >= end:
                        return last
                    continue
                offset = int(msg.offset() or 0)
                if offset >= end:
                    return last
                if _checkpoint_of(msg, pipeline_name, ident) is not None:
                    last = offset
                if offset + 1 >= end:
                    return last
    finally:
        consumer.close()
    raise TimeoutError(f"could not read {topic}[{partition}] [{start}, {end}) uncommitted")


def readback_end(
    config: dict[str, Any],
    topic: str,
    partition: int,
    pipeline_name: str,
    identity: str,
    *,
    settle_s: float,
    deadline: float,
) -> int:
    """The offset up to which a ``read_committed`` read of ``topic[partition]`` sees every
    committed record of this pipeline: the end of the read-back.

    A read_committed reader stops at the last stable offset (the start of the oldest open
    transaction), so a record of ours committed beyond it is invisible and would read as
    "not published". Cases:

    1. Last stable offset = high watermark: nothing is open; read to it.
    2. Something is open, and no record of ours lies at or beyond the last stable offset
       (read uncommitted): everything of ours is below it; read to it at once. A foreign
       transaction that opened after our records never holds the read-back up.
    3. Records of ours lie beyond it (committed or aborted: a reader cannot tell which until
       the transaction before them ends): wait up to ``settle_s`` for the last stable offset
       to pass the last of them (right after a commit, its markers lag for a moment), then
       read to it. Still blocked: :class:`ReadBackBlocked` naming the partition, never a
       guess. No record of ours can appear meanwhile: the caller's ``init_transactions``
       fenced every producer of the shard's transactional id.
    """
    tp = (topic, partition)
    stable = admin.list_offsets(config, [tp], spec="latest")[tp]
    high = high_watermarks(config, [tp])[tp]
    # A partition without a leader (one is being elected after a broker died) answers with
    # no offset (OFFSET_INVALID, -1001): ask again until it has one.
    while stable < 0 or high < 0:
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{topic}[{partition}] reported no offsets (stable {stable}, high {high})")
        time.sleep(0.5)
        stable = admin.list_offsets(config, [tp], spec="latest")[tp]
        high = high_watermarks(config, [tp])[tp]
    if stable >= high:
        return stable
    ident = identity[: names.PROVENANCE_IDENTITY_CHARS]
    last = _last_of_ours(config, tp, stable, high, pipeline_name, ident, deadline)
    until = time.monotonic() + settle_s
    while last is not None and stable <= last:
        if time.monotonic() >= until:
            raise ReadBackBlocked(
                f"pipeline {pipeline_name!r}: cannot tell which checkpoint {topic}[{partition}] "
                "last published (its commit marker is missing): a transaction that is not this "
                f"shard's stays open on the partition. Its last stable offset {stable} is below "
                f"its high watermark {high}, and records of this pipeline up to offset {last} "
                "lie beyond it, undecided for read_committed readers, still after "
                f"{settle_s:.0f} s. Deciding from what is visible could publish the checkpoint "
                "twice. Nothing was published by this try; the checkpoint stays as it was. The "
                f"open transaction began at offset {stable}: find its producer (id, epoch, "
                "start offset) with `kafka-transactions.sh --bootstrap-server ... "
                f"describe-producers --topic {topic} --partition {partition}` and its "
                "transactional id with `kafka-transactions.sh --bootstrap-server ... list` (this "
                "client cannot list transactions); let it finish or abort it "
                f"(`kafka-transactions.sh --bootstrap-server ... abort --topic {topic} "
                f"--partition {partition} --start-offset {stable}`), then retry the commit."
            )
        time.sleep(0.1)
        stable = max(stable, admin.list_offsets(config, [tp], spec="latest")[tp])
    return stable


def last_published_checkpoint(
    config: dict[str, Any],
    topic: str,
    partition: int,
    pipeline_name: str,
    identity: str,
    *,
    timeout_s: float = 120.0,
    settle_s: float | None = None,
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

    The read ends where every committed record of ours is visible (:func:`readback_end`):
    records of ours beyond an open transaction's start are waited for up to ``settle_s``
    (default: 15 s, at most a quarter of ``timeout_s``), then refused with
    :class:`~airflow_provider_eo.errors.ReadBackBlocked`. Raises
    :class:`~airflow_provider_eo.errors.CommitError` when it cannot read back in
    ``timeout_s`` (the caller must then not guess).
    """
    ident = identity[: names.PROVENANCE_IDENTITY_CHARS]
    tp = (topic, partition)
    deadline = time.monotonic() + timeout_s

    def unreadable(part: str) -> CommitError:
        return CommitError(
            f"pipeline {pipeline_name!r}: could not read back {topic}[{partition}] "
            f"{part} within {timeout_s:.0f}s to find which checkpoint it "
            "last published (its commit marker is missing). Nothing was published "
            "by this try; retry the commit when the sink is readable."
        )

    settle = min(15.0, timeout_s / 4) if settle_s is None else settle_s
    try:
        end = readback_end(
            config, topic, partition, pipeline_name, identity, settle_s=settle, deadline=deadline
        )
    except TimeoutError as exc:
        raise unreadable("beyond its last stable offset") from exc
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
    window = first_window
    try:
        while end > log_start:
            start = max(log_start, end - window)
            consumer.assign([TopicPartition(topic, partition, start)])
            found = -1
            done = False
            while not done:
                if time.monotonic() >= deadline:
                    raise unreadable(f"[{start}, {end})")
                for msg in consumer.consume(1000, CONSUME_WAIT_S):
                    err = msg.error()
                    if err is not None:
                        if is_authorization_error(err):
                            raise reader_denied(
                                err, f"reading back {topic}[{partition}]", topic, "eo-readback-", config
                            )
                        if err.code() == KafkaError._PARTITION_EOF:
                            pos = consumer.position([TopicPartition(topic, partition)])[0].offset
                            done = done or pos >= end
                        continue
                    offset = int(msg.offset() or 0)
                    if offset >= end:
                        done = True
                        continue
                    checkpoint = _checkpoint_of(msg, pipeline_name, ident)
                    if checkpoint is not None:
                        found = max(found, checkpoint)
                    done = done or offset + 1 >= end
            if found >= 0:
                return found
            end = start
            window *= 2
    finally:
        consumer.close()
    return -1
