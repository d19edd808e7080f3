"""Transactional producers: made with the sink topic's batch limits, and kept idle after a
clean commit for the same transactional id's next transaction in this process (closed at
exit, forgotten in a forked child)."""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer

from airflow_provider_eo.kafka.publish_errors import DeliveryFailures

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
        if "error_cb" not in config:
            reports["error_cb"] = on_failure.connection_error
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
        None: the caller creates one and calls ``init_transactions``. A producer that lost a
        broker connection while idle is closed instead (:func:`_still_connected`)."""
        now = time.monotonic()
        with self._lock:
            expired = self._expire(now)
            entry = self._idle.pop(key, None)
            if entry is not None and (entry.pid != os.getpid() or now - entry.idle_since > self.max_idle_s):
                expired.append(entry)
                entry = None
        if entry is not None and not _still_connected(entry):
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


def _still_connected(entry: PooledProducer) -> bool:
    """Whether a kept producer lost no broker connection while it was idle (its queued
    ``error_cb`` events served first). After a broker restart, librdkafka's
    ``send_offsets_to_transaction`` can wait with no end for the group coordinator such a
    producer cached; a fresh producer looks the coordinator up again."""
    if entry.failures is None:
        return True
    try:
        entry.producer.poll(0)
    except Exception:
        return False
    return not entry.failures.disconnected


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
