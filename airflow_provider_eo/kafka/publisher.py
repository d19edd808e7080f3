"""The transactional publisher of one commit shard, with Kafka errors sorted.

Error classes (docs/design.md §3a):

1. ``retriable()``: repeat the same call (``send_offsets_to_transaction`` with identical
   offsets: retriable but not resumable).
2. ``txn_requires_abort()``: abort the transaction and redo the whole shard. A failed
   delivery report puts the transaction in this state too: the next ``produce()`` raises
   ``_STATE`` and the commit step says ``txn_requires_abort``; the failed reports are kept
   (:class:`DeliveryFailures`) so a record the broker will always refuse (too large for
   the sink topic) stops the shard with an error naming it, instead of a redo loop.
3. fatal / fenced: destroy the producer and fail with the reason.
4. anything else: fail loudly, saying whether data may be affected.

A producer is never reused across an error of any kind: librdkafka lacks KIP-890's
per-transaction epoch bump, so a request of a failed transaction could land in the next one
(KAFKA-17754); after any failure a fresh producer and ``init_transactions`` follow. Only a
producer whose last transaction committed cleanly (every record and the end of the
transaction acknowledged, nothing in flight) is kept, idle, for the same transactional id's
next transaction in the same process (:class:`ProducerPool`): the first use of an id in a
process still creates the producer and calls ``init_transactions``.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from airflow_provider_eo import names
from airflow_provider_eo.errors import CommitError, CommitFenced, ControlSignal, TransactionalIdUnauthorized
from airflow_provider_eo.kafka.acls import is_authorization_error
from airflow_provider_eo.names import HEADER_PROVENANCE
from airflow_provider_eo.provenance import compact_provenance_values as compact_provenance_values
from airflow_provider_eo.provenance import provenance_values as provenance_values

T = TypeVar("T")


class Abortable(ControlSignal):
    """The open transaction must be aborted and the shard redone."""


class ProducerLost(ControlSignal):
    """An indefinite failure: this producer may not be used again; re-init and decide by marker."""


def _classify(err: KafkaError) -> str:
    if err.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        return "unauthorized"
    if err.fatal() or err.code() in (
        KafkaError._FATAL,  # produce() on a producer that already raised a fatal error
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    ):
        return "fatal"
    if err.txn_requires_abort():
        return "abort"
    if err.retriable():
        return "retry"
    return "unknown"


# Delivery errors a redo cannot cure: the broker refuses these records every time.
_PERMANENT_DELIVERY = {
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.INVALID_RECORD,
    KafkaError.INVALID_MSG,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
}


_PURGED = {KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT}


class DeliveryFailures:
    """The producer's ``on_delivery`` callback: keeps the failed delivery reports of one
    producer (with ``delivery.report.only.error``, only failures are reported)."""

    def __init__(self) -> None:
        self.count = 0
        self.first: KafkaError | None = None
        self.permanent_error: KafkaError | None = None
        self.denied_topic: str | None = None  # a topic the ACLs refused WRITE on
        self.partitions: set[int] = set()  # sink partitions with a failed record

    def __call__(self, err: KafkaError | None, msg: Any) -> None:
        """Record one delivery report (called from ``poll``/``flush``)."""
        if err is None or err.code() in _PURGED:
            return  # purged by our own abort: a consequence, not a cause
        self.count += 1
        self.first = self.first or err
        if err.code() in _PERMANENT_DELIVERY and self.permanent_error is None:
            self.permanent_error = err
        if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            self.denied_topic = str(msg.topic())
        self.partitions.add(int(msg.partition()))

    def __bool__(self) -> bool:
        return self.count > 0

    @property
    def permanent(self) -> bool:
        """A record was refused for a reason a redo cannot cure."""
        return self.permanent_error is not None

    def describe(self) -> str:
        """How many records failed, in which sink partitions, and why."""
        err = self.permanent_error or self.first
        if err is None:
            return "no delivery failed"
        where = ", ".join(str(p) for p in sorted(self.partitions))
        return (
            f"{self.count} record(s) of sink partition {where} failed delivery with "
            f"{err.name()} ({err.str()})"
        )


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


def known_commit_outcome(err: KafkaError) -> bool:
    """A failed ``commit_transaction`` whose error is an answer: fenced or fatal (another
    producer of the id took over, or the broker aborted the transaction), abortable (not
    committed: abort it), or unauthorized. A timeout (retriable) or an unclassified error
    leaves the outcome unknown."""
    return _classify(err) in ("fatal", "abort", "unauthorized")


def sorted_error(what: str, exc: KafkaException, where: str) -> Exception:
    """The exception for a non-retriable Kafka error (Abortable, fenced, ...)."""
    err: KafkaError = exc.args[0]
    kind = _classify(err)
    if kind == "abort":
        return Abortable(f"{what}: {err}")
    if kind == "unauthorized":
        return TransactionalIdUnauthorized(
            f"{where}{what} was refused: {err.name()} ({err.str()}). The broker's ACLs do "
            "not let this principal use the transactional id; grant WRITE and DESCRIBE on "
            "the transactional id (prefix) and retry. Nothing was published."
        )
    if kind == "fatal":
        return CommitFenced(
            f"{where}{what} failed fatally: {err.name()} ({err.str()}). Another committer "
            "with the same transactional id took over, or the producer was fenced after "
            "a pause past transaction.timeout.ms; this process stops. Its open "
            "transaction is aborted by the broker: no data from it becomes visible."
        )
    return CommitError(
        f"{where}{what} failed with an unclassified Kafka error {err.name()} "
        f"({err.str()}). The open transaction was not committed by this call; the retry "
        "decides by the commit marker, so no data is duplicated."
    )


def fatal_cause(exc: SystemError) -> KafkaException | None:
    """The Kafka error behind a ``SystemError`` from ``poll()``/``flush()``/``commit_transaction()``.

    A fatal error (the broker fenced the producer, e.g. after aborting its transaction for
    its timeout) is set as the pending exception while delivery reports are being served;
    confluent-kafka then still calls the ``on_delivery`` callback, whose first C call turns
    the pending error into a ``SystemError`` caused by it. ``None`` for any other
    ``SystemError`` (a real bug: never taken for a Kafka error).
    """
    cause = exc.__cause__
    return cause if isinstance(cause, KafkaException) else None


def serve(what: str, fn: Callable[..., T], *args: Any, where: str = "") -> T:
    """``poll()`` or ``flush()``: serve delivery reports; a fatal error raised meanwhile is
    sorted like the Kafka error it is (:func:`fatal_cause`), never passed on raw."""
    try:
        return fn(*args)
    except KafkaException as exc:
        raise sorted_error(what, exc, where) from exc
    except SystemError as exc:
        cause = fatal_cause(exc)
        if cause is None:
            raise
        raise sorted_error(what, cause, where) from cause


def kafka_call(
    what: str,
    fn: Callable[..., T],
    *args: Any,
    deadline_s: float = 120.0,
    where: str = "",
    denied: Callable[[KafkaError], Exception] | None = None,
) -> T:
    """Call a transactional producer method, repeating it while Kafka says *retriable*.

    Raises :class:`Abortable`, :class:`CommitFenced`, :class:`ProducerLost` (retries ran out:
    the outcome is unknown) or :class:`CommitError` (unclassified); an ACL refusal raises
    ``denied(error)`` (naming the operation and the resource), never retried or aborted
    and redone.
    """
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            try:
                return fn(*args)
            except SystemError as exc:  # a fatal error met while serving delivery reports
                cause = fatal_cause(exc)
                if cause is None:
                    raise
                raise cause from None
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if denied is not None and is_authorization_error(err):
                raise denied(err) from exc
            if _classify(err) == "retry":
                if time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                raise ProducerLost(f"{what} kept failing with a retriable error: {err}") from exc
            raise sorted_error(what, exc, where) from exc


def new_producer(
    config: Mapping[str, Any],
    transactional_id: str,
    timeout_ms: int,
    on_failure: DeliveryFailures | None = None,
    *,
    topic_max_bytes: int | None = None,
) -> Producer:
    """A fresh transactional producer for one shard; failed deliveries go to ``on_failure``.

    :param topic_max_bytes: the sink topic's ``max.message.bytes``. The broker applies it to a
        whole record *batch*, so batches are kept below it: librdkafka's default ``batch.size``
        (1,000,000) against a smaller topic limit makes every produce request fail with
        MSG_SIZE_TOO_LARGE although each record fits (found by the torture run: a 64 KiB sink
        wedged the pipeline at one checkpoint). A single record larger than ``batch.size`` is
        still sent alone; prepare already refused records over the topic's limit.
    """
    message_timeout = int(config.get("message.timeout.ms", 0) or 0) or max(1000, timeout_ms - 5000)
    reports: dict[str, Any] = {}
    if on_failure is not None:
        # Only failures call back into Python: nothing per record on the hot path.
        reports = {"on_delivery": on_failure, "delivery.report.only.error": True}
    return Producer(
        {
            **config,
            **reports,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": timeout_ms,
            # Must stay below the transaction timeout, else a stuck message outlives its txn.
            "message.timeout.ms": min(message_timeout, timeout_ms - 1),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": int(config.get("linger.ms", 10)),
            "queue.buffering.max.messages": int(config.get("queue.buffering.max.messages", 100_000)),
            # Bounds the commit's memory whatever the checkpoint size (64 MB in flight at most).
            "queue.buffering.max.kbytes": int(config.get("queue.buffering.max.kbytes", 65_536)),
            **_batch_limits(config, topic_max_bytes),
        }
    )


@dataclass
class PooledProducer:
    """An idle transactional producer kept after a clean commit, with the delivery-report
    sink it was created with (librdkafka calls that one for the producer's whole life)."""

    producer: Any
    failures: DeliveryFailures | None
    pid: int  # the process that created it: never used, nor closed, in another one
    idle_since: float


class ProducerPool:
    """Idle transactional producers of this process, one per key, kept between clean
    commits of the same transactional id so a small commit does not pay a new producer, its
    connections and ``init_transactions`` every time.

    A producer is taken out while it is used (:meth:`take`) and only comes back through
    :meth:`give`, which the caller makes only after a clean ``commit_transaction``; any
    failure simply never gives it back. A key holds everything the producer was made from
    (the transactional id, the client config, the transaction timeout, the batch limits)
    plus the process id: a producer never crosses a fork (its librdkafka threads stay in the
    parent; the child forgets what it inherited without destroying it). Producers idle
    longer than ``max_idle_s``, and the least recently used beyond ``max_idle``, are closed.
    :meth:`close` closes every idle one (the end of a stream, a test session before its
    broker stops, and the interpreter's exit).
    """

    def __init__(self, *, max_idle: int = 32, max_idle_s: float = 300.0) -> None:
        self.max_idle = max_idle
        self.max_idle_s = max_idle_s
        self._idle: OrderedDict[Hashable, PooledProducer] = OrderedDict()
        self._lock = threading.Lock()
        #: Producers inherited through a fork: kept referenced, never destroyed here.
        self._inherited: list[PooledProducer] = []

    def take(self, key: Hashable) -> PooledProducer | None:
        """The idle producer of ``key`` made by this process (removed from the pool), or
        None: the caller creates one and calls ``init_transactions``."""
        now = time.monotonic()
        with self._lock:
            expired = self._expire(now)
            entry = self._idle.pop(key, None)
            if entry is not None and (entry.pid != os.getpid() or now - entry.idle_since > self.max_idle_s):
                expired.append(entry)
                entry = None
        self._close_all(expired)
        return entry

    def give(self, key: Hashable, producer: Any, failures: DeliveryFailures | None) -> None:
        """Keep ``producer`` for ``key``'s next transaction. Only after a clean
        ``commit_transaction`` of this producer: never after an error."""
        if failures:  # a failed delivery report: never reused (the caller should not get here)
            self._close_all([PooledProducer(producer, failures, os.getpid(), 0.0)])
            return
        now = time.monotonic()
        with self._lock:
            closing = self._expire(now)
            old = self._idle.pop(key, None)
            if old is not None:
                closing.append(old)
            self._idle[key] = PooledProducer(producer, failures, os.getpid(), now)
            while len(self._idle) > self.max_idle:
                closing.append(self._idle.popitem(last=False)[1])
        self._close_all(closing)

    def discard(self, match: Callable[[Hashable], bool]) -> int:
        """Close the idle producers whose key ``match`` accepts (a transactional id this
        process just fenced with another producer); returns how many."""
        with self._lock:
            gone = [key for key in self._idle if match(key)]
            closing = [self._idle.pop(key) for key in gone]
        self._close_all(closing)
        return len(closing)

    def close(self) -> int:
        """Close every idle producer (the ones in use are not in the pool); returns how many."""
        with self._lock:
            closing = list(self._idle.values())
            self._idle.clear()
        self._close_all(closing)
        return len(closing)

    def __len__(self) -> int:
        return len(self._idle)

    def forget_inherited(self) -> None:
        """In a forked child: drop the parent's producers from the pool without closing them
        (their threads are the parent's; destroying a copy here could hang)."""
        self._inherited.extend(self._idle.values())
        self._idle.clear()
        self._lock = threading.Lock()  # the parent's may have been held by another thread

    def _expire(self, now: float) -> list[PooledProducer]:
        """Under the lock: remove the producers idle too long (returned, to close)."""
        old = [key for key, entry in self._idle.items() if now - entry.idle_since > self.max_idle_s]
        return [self._idle.pop(key) for key in old]

    def _close_all(self, entries: list[PooledProducer]) -> None:
        for entry in entries:
            if entry.pid != os.getpid():
                self._inherited.append(entry)
                continue
            try:
                entry.producer.close()  # nothing is in flight after a clean commit
            except Exception:  # already closed, or the broker is gone: nothing more to do
                pass


#: The process's pool of idle transactional producers (core/shard.py takes and gives).
PRODUCERS = ProducerPool()


def close_producers() -> int:
    """Close the process's idle transactional producers (returns how many): at the end of a
    stream, and before the cluster goes away (a test session stopping its broker). The next
    commit of each transactional id creates and initializes a new producer."""
    return PRODUCERS.close()


atexit.register(close_producers)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=PRODUCERS.forget_inherited)


# Room for the record batch header (61 bytes) and librdkafka's own accounting slack.
BATCH_FRAMING_BYTES = 1024
LIBRDKAFKA_BATCH_SIZE = 1_000_000
LIBRDKAFKA_MESSAGE_MAX_BYTES = 1_000_000


def _batch_limits(config: Mapping[str, Any], topic_max_bytes: int | None) -> dict[str, int]:
    """``batch.size`` below the topic's limit, and ``message.max.bytes`` at least the topic's
    limit (so a record prepare accepted is never refused locally); user settings win when
    they are already safe."""
    if topic_max_bytes is None:
        return {}
    batch = int(config.get("batch.size", LIBRDKAFKA_BATCH_SIZE))
    message_max = int(config.get("message.max.bytes", LIBRDKAFKA_MESSAGE_MAX_BYTES))
    return {
        "batch.size": max(1, min(batch, topic_max_bytes - BATCH_FRAMING_BYTES)),
        "message.max.bytes": max(message_max, topic_max_bytes + BATCH_FRAMING_BYTES),
    }


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
