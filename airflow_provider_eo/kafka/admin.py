"""Topic administration and offset look-ups (log start, last stable offset)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from airflow_provider_eo.errors import KafkaAdminError
from airflow_provider_eo.kafka.acls import access_denied, is_authorization_error
from airflow_provider_eo.kafka.client_config import cache_key, librdkafka_config

_TRANSIENT_CODES = {
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    # A new leader whose high watermark has not caught up with its epoch's start answers
    # ListOffsets so until its followers fetch (seen right after a leader was killed).
    KafkaError.OFFSET_NOT_AVAILABLE,
}


def _transient(err: KafkaError) -> bool:
    """Errors that go away by themselves (a fresh broker or topic, a moving leader).

    librdkafka does not flag every one of them retriable() in admin responses (seen here:
    COORDINATOR_LOAD_IN_PROGRESS from ListConsumerGroupOffsets on a new broker).
    """
    return bool(err.retriable()) or err.code() in _TRANSIENT_CODES


_CLIENTS: dict[tuple[tuple[str, str], ...], AdminClient] = {}
_GROUP_CONSUMERS: dict[tuple[tuple[str, str], ...], Consumer] = {}
_CLIENTS_LOCK = threading.Lock()
# The refusal (GROUP_AUTHORIZATION_FAILED) each group consumer's coordinator look-up was
# answered with: librdkafka reports it once, as a consumer error event.
_GROUP_REFUSALS: dict[Consumer, KafkaError] = {}
# When each shared client (admin or group consumer, by key) was last handed out.
_LAST_USED: dict[tuple[tuple[str, str], ...], float] = {}
#: A shared client not handed out for this long is closed at the next fetch of any client:
#: a long-lived process (Airflow's triggerer, a streaming driver, a worker running many
#: pipelines) keeps only the clients it still uses. Every client and its connections hold
#: file descriptors (a process with over 1,024 of them also breaks py4j's callback server,
#: which selects on its socket: a Spark driver's streaming query then hangs at its start).
SHARED_CLIENT_IDLE_S = 300.0
#: Above this many shared clients, the least recently used one idle for over
#: :data:`SHARED_CLIENT_BUSY_S` is closed at each fetch.
SHARED_CLIENT_MAX = 32
#: A client handed out this recently may still be in a caller's hands: never closed early.
SHARED_CLIENT_BUSY_S = 120.0


def _retire_idle(now: float) -> list[Any]:
    """Under the lock: take the shared clients to close (idle too long, or the least
    recently used idle ones above the cap) out of the caches; the caller closes them."""
    gone = [key for key, used in _LAST_USED.items() if now - used > SHARED_CLIENT_IDLE_S]
    live = len(_LAST_USED) - len(gone)
    if live > SHARED_CLIENT_MAX:
        # Oldest use first (ties in the order the clients were made).
        idle = sorted(
            (
                (used, key)
                for key, used in _LAST_USED.items()
                if key not in gone and now - used > SHARED_CLIENT_BUSY_S
            ),
            key=lambda item: item[0],
        )
        gone += [key for _, key in idle[: live - SHARED_CLIENT_MAX]]
    retired: list[Any] = []
    for key in gone:
        _LAST_USED.pop(key, None)
        consumer = _GROUP_CONSUMERS.pop(key, None)
        if consumer is not None:
            _GROUP_REFUSALS.pop(consumer, None)
        retired += [c for c in (_CLIENTS.pop(key, None), consumer) if c is not None]
    return retired


def _close_clients(clients: Iterable[Any]) -> None:
    """Close shared clients taken out of the caches (consumers closed, admin clients served
    and dropped: the last reference goes with the list)."""
    for client in clients:
        try:
            if isinstance(client, Consumer):
                client.close()
            else:
                client.poll(0)
        except Exception:  # already closed, or the broker is gone: nothing more to do
            pass


def admin_client(config: Mapping[str, Any]) -> AdminClient:
    """A shared AdminClient per distinct config.

    Kept while in use: destroying AdminClients while librdkafka still has background
    events queued crashed the interpreter (seen here with confluent-kafka 2.16), so a
    client is dropped only after minutes unused (:data:`SHARED_CLIENT_IDLE_S`). Its
    librdkafka log lines go to Python logging; they are queued until ``poll``, which every
    fetch of the client does.
    """
    conf = librdkafka_config(config)
    key = ("admin", "1"), *cache_key(conf)
    now = time.monotonic()
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = _CLIENTS[key] = AdminClient(conf)
        _LAST_USED[key] = now
        retired = _retire_idle(now)
    _close_clients(retired)
    client.poll(0)  # serve queued log lines (bounded: never more than since the last call)
    return client


def ensure_topic(
    config: Mapping[str, Any],
    topic: str,
    *,
    partitions: int,
    topic_config: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
    replication_factor: int = -1,
) -> bool:
    """Create ``topic`` unless it exists. True when this call created it.

    ``replication_factor=-1`` takes the brokers' ``default.replication.factor``.
    """
    admin = admin_client(config)
    futures = admin.create_topics(
        [NewTopic(topic, partitions, replication_factor, config=dict(topic_config or {}))],
        operation_timeout=timeout_s,
        request_timeout=timeout_s,
    )
    try:
        futures[topic].result(timeout=timeout_s)
    except KafkaException as exc:
        if exc.args and exc.args[0].name() == "TOPIC_ALREADY_EXISTS":
            return False
        raise KafkaAdminError(f"creating topic {topic!r} failed: {exc}") from exc
    return True


def partitions_of(
    config: Mapping[str, Any], topics: Iterable[str], timeout_s: float = 15.0
) -> dict[str, list[int]]:
    """Partition ids per topic; a missing topic is an error naming it."""
    admin = admin_client(config)
    wanted = list(topics)
    try:
        md = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise KafkaAdminError(
            f"cannot reach Kafka at {config.get('bootstrap.servers')!r} to read metadata of "
            f"{wanted}: {exc}. Check bootstrap.servers and that the cluster is up."
        ) from exc
    out: dict[str, list[int]] = {}
    for topic in wanted:
        meta = md.topics.get(topic)
        if meta is None:
            # The cluster's metadata leaves out the topics this principal may not describe;
            # asked by name, the broker says which it is (refused, or unknown).
            try:
                meta = admin.list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
            except KafkaException:
                meta = None
        if meta is not None and meta.error is not None and is_authorization_error(meta.error):
            raise access_denied(
                f"reading the metadata of topic {topic!r}",
                "DESCRIBE",
                "topic",
                topic,
                config=config,
                cause=meta.error.name(),
            )
        if meta is None or meta.error is not None:
            raise KafkaAdminError(
                f"topic {topic!r} does not exist on {config.get('bootstrap.servers')!r}; "
                f"create it (kafka-topics --create --topic {topic}) or fix the pipeline's topics."
            )
        out[topic] = sorted(meta.partitions)
    return out


def partition_count(config: Mapping[str, Any], topic: str) -> int:
    """Number of partitions of ``topic`` (a missing topic is an error naming it)."""
    return len(partitions_of(config, [topic])[topic])


#: The broker's default ``max.message.bytes`` of a topic (``message.max.bytes``).
KAFKA_MAX_MESSAGE_BYTES = 1_048_588


def topic_max_message_bytes(config: Mapping[str, Any], topic: str, default: int) -> int:
    """The topic's ``max.message.bytes``: the largest record batch the broker accepts on it.

    ``default`` (the pipeline's setting) when the broker will not say, e.g. when describing
    topic configs is refused by ACLs.
    """
    from confluent_kafka.admin import ConfigResource, ResourceType

    try:
        futures = admin_client(config).describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
        configs = next(iter(futures.values())).result(timeout=15)
        return int(configs["max.message.bytes"].value)
    except Exception:  # describe may be forbidden by ACLs: fall back to the setting
        return default


def list_offsets(
    config: Mapping[str, Any],
    partitions: Iterable[tuple[str, int]],
    *,
    spec: str,
    timeout_s: float = 60.0,
) -> dict[tuple[str, int], int]:
    """Offsets per partition. ``spec`` is ``earliest`` (log start) or ``latest`` (the last
    stable offset: with read_committed isolation, open transactions are excluded).

    A partition whose leader is moving (a fresh topic, a dead broker whose partitions a
    cluster is re-electing) is asked again, each request bounded, until ``timeout_s``.
    """
    offset_spec = OffsetSpec.earliest() if spec == "earliest" else OffsetSpec.latest()
    return _offsets(
        config, partitions, offset_spec, IsolationLevel.READ_COMMITTED, f"{spec} offsets", timeout_s
    )


#: What librdkafka's ListOffsets reports, with no error, for a partition whose request to its
#: leader failed (the leader it has cached is gone: its result keeps the initial value).
_NO_ANSWER = -1001


def _offsets(
    config: Mapping[str, Any],
    partitions: Iterable[tuple[str, int]],
    offset_spec: OffsetSpec,
    isolation: IsolationLevel,
    what: str,
    timeout_s: float,
) -> dict[tuple[str, int], int]:
    """ListOffsets of ``partitions``, retried until ``timeout_s`` while a leader moves.

    librdkafka sends the request to the leader in its metadata cache and reports a partition
    whose request failed as offset -1001 with no error. A shared admin client subscribes to
    no topic, so nothing refreshes that cache when the leader dies (a cluster elects another
    at once): every later request would go to the dead broker for minutes (until
    ``topic.metadata.refresh.interval.ms``). Such a partition is asked again after a metadata
    request for its topic, which updates the cache.
    """
    pending = {TopicPartition(t, p) for t, p in partitions}
    admin = admin_client(config)
    out: dict[tuple[str, int], int] = {}
    deadline = time.monotonic() + timeout_s
    while pending:
        request_s = max(1.0, min(10.0, deadline - time.monotonic()))
        futures = admin.list_offsets(
            {tp: offset_spec for tp in pending}, isolation_level=isolation, request_timeout=request_s
        )
        retry: set[TopicPartition] = set()
        for tp, fut in futures.items():
            try:
                offset = int(fut.result(timeout=request_s + 5).offset)
            except (KafkaException, FutureTimeout) as exc:
                # A fresh topic or a leader move answers NOT_LEADER / LEADER_NOT_AVAILABLE
                # for a moment, or (a dead leader) not at all: retriable until the deadline.
                transient = isinstance(exc, FutureTimeout) or _transient(exc.args[0])
                if isinstance(exc, KafkaException) and is_authorization_error(exc.args[0]):
                    raise access_denied(
                        f"listing {what} of {tp.topic}[{tp.partition}]",
                        "DESCRIBE",
                        "topic",
                        tp.topic,
                        config=config,
                        cause=exc.args[0].name(),
                    ) from exc
                if transient and time.monotonic() < deadline:
                    retry.add(tp)
                    continue
                reason = str(exc) if isinstance(exc, KafkaException) else f"no answer in {timeout_s:.0f} s"
                raise KafkaAdminError(
                    f"listing {what} of {tp.topic}[{tp.partition}] failed: {reason}; "
                    "check that the partition has a live leader (kafka-topics --describe) and retry"
                ) from exc
            if offset != _NO_ANSWER:
                out[(tp.topic, tp.partition)] = offset
            elif time.monotonic() < deadline:
                retry.add(tp)
            else:
                raise KafkaAdminError(
                    f"listing {what} of {tp.topic}[{tp.partition}] failed: its leader did not "
                    f"answer in {timeout_s:.0f} s; check that the partition has a live leader "
                    "(kafka-topics --describe) and retry"
                )
        pending = retry
        if pending:
            time.sleep(0.2)
            for topic in sorted({tp.topic for tp in pending}):
                try:  # the current leaders into the client's cache
                    admin.list_topics(topic=topic, timeout=max(1.0, min(10.0, deadline - time.monotonic())))
                except KafkaException:
                    pass  # no broker answered: the next round's request fails the same way
    return out


def offsets_for_timestamp(
    config: Mapping[str, Any],
    partitions: Iterable[tuple[str, int]],
    timestamp_ms: int,
    timeout_s: float = 15.0,
) -> dict[tuple[str, int], int]:
    """Per partition, the first offset with a timestamp >= ``timestamp_ms`` (else the end)."""
    wanted = list(partitions)
    if not wanted:
        return {}
    found = _offsets(
        config,
        wanted,
        OffsetSpec.for_timestamp(timestamp_ms),
        IsolationLevel.READ_COMMITTED,
        f"offsets at {timestamp_ms} ms",
        timeout_s,
    )
    missing = [tp for tp, off in found.items() if off < 0]  # no record that late: the end
    if missing:
        found.update(list_offsets(config, missing, spec="latest", timeout_s=timeout_s))
    return found


def group_consumer(config: Mapping[str, Any], group: str, *, stable: bool = True) -> Consumer:
    """A consumer of ``group`` that never subscribes, consumes or commits, shared while in
    use (one per config, group and ``stable``; closed after minutes unused, like
    :func:`admin_client`'s clients).

    Used to read a group's committed offsets and for ``send_offsets_to_transaction``'s
    group metadata. Kept, not closed: closing consumers right after creating them, while
    their coordinator lookup was in flight, crashed librdkafka 2.16 here. ``stable=False``
    reads committed offsets without waiting for open transactions' offset commits.
    """
    conf = {
        **{k: v for k, v in librdkafka_config(config).items() if not k.startswith(("linger", "queue."))},
        "group.id": group,
        "enable.auto.commit": False,  # offsets move only inside the commit transaction
        # read_committed: committed() asks for stable offsets (KIP-447), waiting out open
        # transactions' offset commits
        "isolation.level": "read_committed" if stable else "read_uncommitted",
    }
    key = ("consumer", "1"), *cache_key(conf)
    now = time.monotonic()
    with _CLIENTS_LOCK:
        consumer = _GROUP_CONSUMERS.get(key)
        if consumer is None:
            consumer = _GROUP_CONSUMERS[key] = Consumer(conf)
        _LAST_USED[key] = now
        retired = _retire_idle(now)
    _close_clients(retired)
    _serve_group_consumer(consumer)
    return consumer


def _serve_group_consumer(consumer: Consumer) -> None:
    """Serve a group consumer's queue: librdkafka's log lines (Python logging) and its error
    events, of which a refused coordinator look-up is kept for :func:`group_refusal`. Never
    subscribed, so this polls no records and joins no group."""
    for _ in range(64):
        event = consumer.poll(0)
        if event is None:
            return
        err = event.error()
        if err is not None and is_authorization_error(err):
            with _CLIENTS_LOCK:
                _GROUP_REFUSALS[consumer] = err


def group_refusal(consumer: Consumer) -> KafkaError | None:
    """The refusal a :func:`group_consumer`'s coordinator look-up was answered with
    (GROUP_AUTHORIZATION_FAILED: no DESCRIBE on the group), or None.

    librdkafka retries a refused look-up silently and reports it once, as an error event
    on the consumer's queue, never from ``committed()``. Asking the broker instead
    (``describe_consumer_groups``) is an admin coordinator request, which librdkafka 2.16
    aborts the process in when the group's coordinator node is down
    (``rd_kafka_enq_once_del_source_return: Assertion 'eonce->refcnt > 0'``, seen here).
    """
    _serve_group_consumer(consumer)
    with _CLIENTS_LOCK:
        return _GROUP_REFUSALS.get(consumer)


def close_shared_clients() -> int:
    """Close the process's shared AdminClients and group consumers (returns how many).

    For a process that is about to lose its cluster (a test session stopping its broker):
    clients left to the interpreter's exit are destroyed after the broker is gone, and
    each one then waits on its dead connections (a test session with ~100 of them hung for
    minutes at exit). Closing them while the brokers still answer is immediate. The next
    :func:`admin_client` / :func:`group_consumer` call creates fresh ones.
    """
    with _CLIENTS_LOCK:
        consumers = list(_GROUP_CONSUMERS.values())
        admins = list(_CLIENTS.values())
        _GROUP_CONSUMERS.clear()
        _GROUP_REFUSALS.clear()
        _CLIENTS.clear()
        _LAST_USED.clear()
    _close_clients([*consumers, *admins])
    return len(consumers) + len(admins)


def committed_group_offsets(
    config: Mapping[str, Any], group: str, partitions: Iterable[tuple[str, int]], timeout_s: float = 30.0
) -> dict[tuple[str, int], int]:
    """The committed offsets of consumer group ``group`` (partitions without one are left out).

    See :func:`committed_group_marks` (this is it without the metadata).
    """
    marks = committed_group_marks(config, group, partitions, timeout_s)
    return {tp: offset for tp, (offset, _meta) in marks.items()}


#: Seconds :func:`committed_group_marks` waits for a group's offsets before it looks for the
#: group's refusal (:func:`group_refusal`: a refusal then fails at once, not at the read's
#: time-out); a read still waiting goes on until the time-out.
ACCESS_CHECK_AFTER_S = 2.0


def committed_group_marks(
    config: Mapping[str, Any],
    group: str,
    partitions: Iterable[tuple[str, int]],
    timeout_s: float = 30.0,
    *,
    stable: bool = True,
) -> dict[tuple[str, int], tuple[int, str]]:
    """The committed offsets of consumer group ``group`` with their metadata strings
    (``""`` when none), partitions without one left out. Commit markers carry the
    pipeline's identity in the metadata (``names.marker_metadata``): librdkafka sends it
    with ``send_offsets_to_transaction`` (TxnOffsetCommit) and returns it from
    ``committed()`` (checked against the real broker).

    Read through a consumer of that group (never subscribed, kept for the process's life),
    not ``AdminClient.list_consumer_group_offsets``: on a retriable OffsetFetch error
    (COORDINATOR_LOAD_IN_PROGRESS on a fresh broker, UNSTABLE_OFFSET_COMMIT while a
    transaction is open) librdkafka 2.16's admin path dereferences the missing group
    handle and kills the process (rd_kafka_handle_OffsetFetch -> rd_kafka_cgrp_op, seen
    here under gdb). A consumer retries those itself. ``read_committed`` makes it ask for
    stable offsets only (KIP-447): pending transactional commits are waited out
    (``stable=False``: they are not waited for, and not seen until they commit).
    """
    tps = [TopicPartition(t, p) for t, p in partitions]
    if not tps:
        return {}
    consumer = group_consumer(config, group, stable=stable)
    deadline = time.monotonic() + timeout_s
    asked = False
    while True:
        remaining = deadline - time.monotonic()
        try:
            # Until the group's refusal was looked for, a short wait: a refused coordinator
            # look-up (DESCRIBE on the group) is not reported by committed(), which librdkafka
            # retries until the time-out.
            found = consumer.committed(
                tps, timeout=max(1.0, remaining if asked else min(remaining, ACCESS_CHECK_AFTER_S))
            )
            break
        except KafkaException as exc:
            err = exc.args[0]
            _raise_if_denied(err, config, group, tps)
            if not asked:  # once: was the group's coordinator look-up refused?
                asked = True
                _raise_if_denied(group_refusal(consumer), config, group, tps)
            waited_out = err.code() == KafkaError._TIMED_OUT
            if not (_transient(err) or waited_out) or time.monotonic() >= deadline:
                raise KafkaAdminError(f"reading offsets of group {group!r} failed: {exc}") from exc
            if not waited_out:
                time.sleep(0.3)
    for tp in found:
        if tp.error is not None:
            _raise_if_denied(tp.error, config, group, [tp])
    with _CLIENTS_LOCK:  # read: a refusal kept from before is over (its ACL granted since)
        _GROUP_REFUSALS.pop(consumer, None)
    return {
        (tp.topic, tp.partition): (int(tp.offset), tp.metadata or "")
        for tp in found
        if tp.offset is not None and tp.offset >= 0
    }


def _raise_if_denied(
    err: KafkaError | None, config: Mapping[str, Any], group: str, tps: list[TopicPartition]
) -> None:
    """A refused offset read (OffsetFetch: DESCRIBE on the group and on the topic) as the
    :class:`KafkaAccessDenied` naming it; any other error passes."""
    if err is None or not is_authorization_error(err):
        return
    what = f"reading the committed offsets of group {group!r}"
    if err.name() == "GROUP_AUTHORIZATION_FAILED" or not tps:
        raise access_denied(what, "DESCRIBE", "group", group, config=config, cause=err.name())
    raise access_denied(what, "DESCRIBE", "topic", tps[0].topic, config=config, cause=err.name())


def committed_group_marks_everywhere(
    config: Mapping[str, Any], group: str, *, exclude: Iterable[str] = (), timeout_s: float = 30.0
) -> dict[tuple[str, int], tuple[int, str]]:
    """The committed offsets (with metadata) of ``group`` on every partition of every topic
    the cluster shows this client, but the topics in ``exclude`` and internal ``__`` topics:
    where the group has committed anything at all.

    The metadata of every topic (what :func:`partitions_of` reads anyway), then one read
    through :func:`committed_group_marks`, not stable: an offset commit of a transaction
    still open is not waited for (nor seen) so another producer's long transaction cannot
    stall the caller. Not
    ``AdminClient.list_consumer_group_offsets`` (which lists a group's partitions by
    itself): when its cached coordinator answers NOT_COORDINATOR or
    COORDINATOR_NOT_AVAILABLE (the coordinator moved: a broker restart, a leader election)
    librdkafka 2.16 asks the admin client's consumer-group handle, which it does not have,
    to look the coordinator up again, and the process dies (``rd_kafka_handle_OffsetFetch``
    -> ``rd_kafka_cgrp_op`` on a NULL group). Topics the principal may not describe are not
    seen, as with that call.
    """
    try:
        md = admin_client(config).list_topics(timeout=15)
    except KafkaException as exc:
        raise KafkaAdminError(
            f"cannot reach Kafka at {config.get('bootstrap.servers')!r} to list the topics "
            f"group {group!r} may have offsets on: {exc}"
        ) from exc
    skip = set(exclude)
    partitions = [
        (topic, p)
        for topic, meta in sorted(md.topics.items())
        if not topic.startswith("__") and topic not in skip and meta.error is None
        for p in sorted(meta.partitions)
    ]
    return committed_group_marks(config, group, partitions, timeout_s, stable=False)


def sink_offsets(
    config: Mapping[str, Any], topic: str, partitions: int
) -> tuple[dict[int, int], dict[int, int]]:
    """(last stable offset, high watermark) per partition of ``topic``: a partition whose
    stable offset is below its high watermark has an open transaction."""
    tps = [(topic, p) for p in range(partitions)]
    found = [
        {
            p: offset
            for (_t, p), offset in _offsets(config, tps, OffsetSpec.latest(), level, what, 15.0).items()
        }
        for level, what in (
            (IsolationLevel.READ_COMMITTED, "last stable offsets"),
            (IsolationLevel.READ_UNCOMMITTED, "high watermarks"),
        )
    ]
    return found[0], found[1]


def write_denied_topic(config: Mapping[str, Any], topics: Sequence[str]) -> str | None:
    """The first of ``topics`` the broker says this principal may not WRITE (its authorized
    operations, KIP-430), or None when it may write every one or the broker will not say."""
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AclOperation

    try:
        futures = admin_client(config).describe_topics(
            TopicCollection(list(topics)), include_authorized_operations=True, request_timeout=10
        )
        for topic, fut in futures.items():
            ops = fut.result(timeout=15).authorized_operations
            if ops is not None and AclOperation.WRITE not in ops and AclOperation.ALL not in ops:
                return str(topic)
    except Exception:  # no answer: nothing known
        return None
    return None


def unwritable_topic(config: Mapping[str, Any], topics: Sequence[str]) -> str:
    """The first of ``topics`` the broker says this principal may not WRITE
    (:func:`write_denied_topic`); all of them, comma-separated, when it will not say."""
    return write_denied_topic(config, topics) or ", ".join(topics)
