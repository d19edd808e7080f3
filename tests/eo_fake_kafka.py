"""A fake Kafka for unit tests of the shard transaction, commit, abort and recover.

It keeps what a ``read_committed`` consumer would see (records and offsets of committed
transactions only), fences by epoch per transactional id like a broker (a new
``init_transactions`` aborts what an earlier producer of the id left open), and fails chosen
calls with real ``KafkaError`` objects so the code under test sorts them as it would on a
real cluster. Also: real staged Parquet with its manifest, and a PREPARED checkpoint in a
real ledger (:func:`prepared_checkpoint`).

It is no kinder than librdkafka and the broker where the protocol depends on it:

- ``begin_transaction`` is local (librdkafka sends nothing): a fenced producer learns of the
  fence at its first request, the first ``produce`` of the transaction (its
  AddPartitionsToTxn: the record is purged, the fatal error is raised from the next
  ``poll``/``flush`` as confluent-kafka raises it, and every later ``produce`` fails with
  ``_FATAL``), ``send_offsets_to_transaction`` or ``commit_transaction``.
- A *stable* read of committed offsets (``read_committed``: ``require_stable``) of a group
  partition with a pending transactional offset commit (a marker sent in a transaction still
  open) waits: until that transaction ends, or until the broker aborts it for its
  ``transaction.timeout.ms`` (the fake's clock, :attr:`FakeBroker.now`, moves by the wait),
  else the read times out after :attr:`FakeBroker.read_timeout_s` as
  ``kafka.admin.committed_group_marks`` does. Every wait is recorded in
  :attr:`FakeBroker.stable_waits`; the unit tests' ``broker`` fixture fails a test that waited
  without saying it expected to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import KafkaError, KafkaException

from airflow_provider_eo import names, staging
from airflow_provider_eo.core.shard import ShardCommittable
from airflow_provider_eo.errors import KafkaAdminError
from airflow_provider_eo.ledger import CheckpointRecord, Ledger, RangeSpec
from airflow_provider_eo.pipeline import Pipeline

STAGED_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        ("src_topic", pa.string()),
        ("src_partition", pa.int32()),
        ("src_offset", pa.int64()),
    ]
)


def kafka_error(code: int, *, retriable: bool = False, abortable: bool = False, fatal: bool = False) -> Any:
    """A ``KafkaException`` carrying a real ``KafkaError`` with the given flags."""
    return KafkaException(
        KafkaError(code, "injected", fatal=fatal, retriable=retriable, txn_requires_abort=abortable)
    )


@dataclass
class Record:
    """One produced record."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]

    @property
    def checkpoint(self) -> tuple[int, str | None] | None:
        """(checkpoint id, identity prefix) from the provenance header."""
        for k, v in self.headers:
            if k == names.HEADER_PROVENANCE:
                parsed = names.parse_provenance(v)
                assert parsed is not None
                return names.parse_checkpoint_field(parsed[0], parsed[0].split(b":")[0].decode())
        return None


#: Every fake broker made in this test (``check_no_unexpected_waits`` reads them).
BROKERS: list[FakeBroker] = []


def check_no_unexpected_waits() -> None:
    """Fail when a fake broker of this test made a stable offset read wait on an open
    transaction without the test expecting it (on a real broker that read would have stalled
    for the transaction's timeout, or failed after 30 s); forget the brokers."""
    waited = [(b, w) for b in BROKERS if not b.expect_waits for w in b.stable_waits]
    BROKERS.clear()
    assert not waited, (
        "a stable read of committed offsets waited on a pending transactional offset commit "
        f"(group, partitions, seconds, answered): {[w for _b, w in waited]}"
    )


@dataclass
class FakeBroker:
    """Transactions, markers and fencing of one fake cluster."""

    partitions: dict[str, int] = field(default_factory=dict)
    committed: list[Record] = field(default_factory=list)
    marks: dict[tuple[str, str, int], tuple[int, str]] = field(default_factory=dict)  # (group, t, p)
    epochs: dict[str, int] = field(default_factory=dict)
    # call name -> exceptions to raise, one per call, in order (None = let the call through)
    failures: dict[str, list[BaseException | None]] = field(default_factory=dict)
    # (topic, partition) -> KafkaError code every produce to it is refused with (a delivery report)
    refuse: dict[tuple[str, int], int] = field(default_factory=dict)
    # hooks run when a call is made, before it takes effect (e.g. to commit behind the code's back)
    on_call: dict[str, Callable[[FakeProducer], None]] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)  # (transactional id, call)
    producers: list[FakeProducer] = field(default_factory=list)
    # The broker's clock in seconds: moves only by the waits of stable offset reads.
    now: float = 0.0
    # How long a stable offset read waits before it gives up (kafka.admin's default).
    read_timeout_s: float = 30.0
    # Every stable read that waited: (group, partitions asked, seconds waited, answered).
    stable_waits: list[tuple[str, list[tuple[str, int]], float, bool]] = field(default_factory=list)
    # A test that makes a stable read wait on purpose says so (else the test fails).
    expect_waits: bool = False
    # Source partitions: (topic, partition) -> (log start, last stable offset).
    logs: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    # Consumer groups' committed offsets: group -> (topic, partition) -> offset.
    groups: dict[str, dict[tuple[str, int], int]] = field(default_factory=dict)
    # Topics' max.message.bytes (a topic not named: the caller's default).
    max_message_bytes: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        BROKERS.append(self)

    def fail(self, call: str, *exceptions: BaseException | None) -> None:
        """Make the next calls of ``call`` raise these, in order."""
        self.failures.setdefault(call, []).extend(exceptions)

    def _maybe_fail(self, producer: FakeProducer, call: str) -> None:
        assert not producer.closed, f"{call} on a closed producer"
        self.calls.append((producer.transactional_id, call))
        if call in self.on_call:
            self.on_call[call](producer)
        queue = self.failures.get(call)
        if queue:
            exc = queue.pop(0)
            if exc is not None:
                raise exc

    def count(self, name: str, transactional_id: str | None = None) -> int:
        """How many times a call was made (by any producer, or by ``transactional_id``'s)."""
        return sum(1 for tid, call in self.calls if call == name and transactional_id in (None, tid))

    def visible(self, topic: str, partition: int) -> int:
        """Committed records of ``topic[partition]``."""
        return sum(1 for r in self.committed if (r.topic, r.partition) == (topic, partition))

    def values(self, topic: str, partition: int | None = None) -> list[bytes | None]:
        """Values a ``read_committed`` consumer sees, in order."""
        return [r.value for r in self.committed if r.topic == topic and partition in (None, r.partition)]

    def mark(self, group: str, topic: str, partition: int) -> int:
        """The committed marker offset (-1: none)."""
        return self.marks.get((group, topic, partition), (-1, ""))[0]

    def live(self, producer: FakeProducer) -> bool:
        """``producer`` holds the current epoch of its transactional id (not fenced)."""
        return producer.epoch is not None and producer.epoch == self.epochs.get(producer.transactional_id)

    def open_transactions_with_offsets(
        self, group: str, partitions: list[tuple[str, int]]
    ) -> list[FakeProducer]:
        """Producers whose open transaction holds a pending offset commit of ``group`` on one
        of ``partitions`` (what makes a stable read of them answer UNSTABLE_OFFSET_COMMIT)."""
        wanted = {(group, t, p) for t, p in partitions}
        return [
            producer
            for producer in self.producers
            if producer.open and self.live(producer) and wanted & set(producer.pending_marks)
        ]

    def expire(self, producer: FakeProducer) -> None:
        """The broker aborts ``producer``'s transaction for its timeout and bumps the epoch
        (the producer is fenced: it learns so at its next request)."""
        self.epochs[producer.transactional_id] = self.epochs.get(producer.transactional_id, 0) + 1
        self.calls.append((producer.transactional_id, "broker_abort_timeout"))
        producer.aborted_by_broker()

    def stable_read(self, group: str, partitions: list[tuple[str, int]]) -> None:
        """Wait, as a stable (``require_stable``) OffsetFetch does, while an open transaction
        holds a pending offset commit of ``group`` on one of ``partitions``: until the broker
        aborts it for its timeout, if that comes within :attr:`read_timeout_s`, else raise
        what ``kafka.admin.committed_group_marks`` raises when its read times out."""
        blockers = self.open_transactions_with_offsets(group, partitions)
        if not blockers:
            return
        ends = max(b.opened_at + b.timeout_s for b in blockers)
        if ends <= self.now + self.read_timeout_s:
            self.stable_waits.append((group, list(partitions), max(0.0, ends - self.now), True))
            self.now = max(self.now, ends)
            for blocker in blockers:
                self.expire(blocker)
            return
        self.stable_waits.append((group, list(partitions), self.read_timeout_s, False))
        self.now += self.read_timeout_s
        raise KafkaAdminError(
            f"reading offsets of group {group!r} failed: KafkaError{{code=_TIMED_OUT,val=-185,"
            'str="Failed to get committed offsets: Local: Timed out"} (fake: UNSTABLE_OFFSET_COMMIT '
            "for the whole wait)"
        )


class FakeProducer:
    """The subset of ``confluent_kafka.Producer`` the shard transaction uses."""

    def __init__(
        self,
        broker: FakeBroker,
        transactional_id: str,
        on_failure: Any,
        topic_max: int | None = None,
        timeout_ms: int = 60_000,
    ) -> None:
        self.broker = broker
        self.transactional_id = transactional_id
        self.on_failure = on_failure
        self.topic_max = topic_max
        self.timeout_s = timeout_ms / 1000
        self.epoch: int | None = None
        self.pending: list[Record] = []
        self.pending_marks: dict[tuple[str, str, int], tuple[int, str]] = {}
        self.open = False
        self.started = False  # the broker knows the transaction (a partition or offsets added)
        self.opened_at = 0.0  # the broker's clock when it did: its timeout runs from there
        self.closed = False
        self.fatal: KafkaError | None = None  # the fatal error this producer has learnt of
        self.fatal_unraised = False  # confluent-kafka raises it once, from poll()/flush()
        self.reports: list[tuple[Any, Any]] = []
        broker.producers.append(self)

    def _raise_fatal(self) -> None:
        if self.fatal is not None:
            raise KafkaException(self.fatal)

    def _check_epoch(self) -> None:
        """A request to the broker: a stale epoch is a fence, fatal from now on."""
        self._raise_fatal()
        if not self.broker.live(self):
            self.fatal = KafkaError(KafkaError._FENCED, "fenced (fake)", fatal=True)
            self._reset()
            raise KafkaException(self.fatal)

    def _start(self) -> None:
        """The broker's side of the transaction begins (its timeout starts)."""
        if not self.started:
            self.started, self.opened_at = True, self.broker.now

    def list_topics(self, topic: str, timeout: float) -> None:
        self.broker._maybe_fail(self, "metadata")

    def init_transactions(self, timeout: float) -> None:
        self.broker._maybe_fail(self, "init_transactions")
        self.broker.epochs[self.transactional_id] = self.broker.epochs.get(self.transactional_id, 0) + 1
        self.epoch = self.broker.epochs[self.transactional_id]
        for other in self.broker.producers:  # the broker aborts what an earlier epoch left open
            if other is not self and other.transactional_id == self.transactional_id:
                other.aborted_by_broker()

    def begin_transaction(self) -> None:
        """Local in librdkafka: no request, so no fence is seen here (only one already
        learnt of is raised)."""
        self.broker._maybe_fail(self, "begin_transaction")
        self._raise_fatal()
        if self.epoch is None:
            raise kafka_error(KafkaError._STATE)  # init_transactions first
        self.open = True

    def produce(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int = -1,
        callback: Any = None,
        on_delivery: Any = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        """confluent-kafka's ``produce()`` (its positional order: the commit passes headers
        positionally)."""
        self.broker._maybe_fail(self, "produce")
        if self.fatal is not None:  # librdkafka refuses to produce after a fatal error
            raise KafkaException(KafkaError(KafkaError._FATAL, "fatal error raised earlier", fatal=True))
        if not self.open:
            raise kafka_error(KafkaError._STATE)
        if not self.broker.live(self):
            # Queued locally; its AddPartitionsToTxn is answered PRODUCER_FENCED: the producer
            # raises a fatal error (from the next poll) and purges what it had queued.
            self.fatal = KafkaError(KafkaError._FENCED, "fenced (fake)", fatal=True)
            self.fatal_unraised = True
            self.reports.append((KafkaError(KafkaError._PURGE_QUEUE, "purged"), _Msg(partition)))
            self._reset()
            return
        self._start()
        code = self.broker.refuse.get((topic, partition))
        if code is not None:
            self.reports.append((KafkaError(code, "refused"), _Msg(partition)))
            return
        self.pending.append(Record(topic, partition, key, value, list(headers or [])))

    def poll(self, timeout: float = 0) -> int:
        served, self.reports = self.reports, []
        for err, msg in served:
            if self.on_failure is not None:
                self.on_failure(err, msg)
        if self.fatal_unraised:  # confluent-kafka raises a fatal error event from poll()
            self.fatal_unraised = False
            self._raise_fatal()
        return len(served)

    def flush(self, timeout: float = 0) -> int:
        self.broker._maybe_fail(self, "flush")
        self.poll(0)
        return 0

    def send_offsets_to_transaction(self, offsets: list[Any], group: Any, timeout: float) -> None:
        self.broker._maybe_fail(self, "send_offsets_to_transaction")
        self._raise_fatal()  # a fatal error is returned by every transactional call
        if not self.open:
            raise kafka_error(KafkaError._STATE)
        self._check_epoch()
        self._start()
        for tp in offsets:
            self.pending_marks[(str(group), tp.topic, tp.partition)] = (tp.offset, tp.metadata or "")

    def commit_transaction(self, timeout: float) -> None:
        self.broker._maybe_fail(self, "commit_transaction")
        self._raise_fatal()  # a fatal error is returned by every transactional call
        if not self.open:
            raise kafka_error(KafkaError._STATE)
        if self.started:  # an empty transaction is committed locally, no EndTxn
            self._check_epoch()
        else:
            self._raise_fatal()
        self.broker.committed.extend(self.pending)
        self.broker.marks.update(self.pending_marks)
        self._reset()

    def abort_transaction(self, timeout: float) -> None:
        self.broker._maybe_fail(self, "abort_transaction")
        try:
            if self.started:  # EndTxn(abort) goes to the broker only for a started one
                self._check_epoch()
            else:
                self._raise_fatal()
        finally:
            self._reset()

    def aborted_by_broker(self) -> None:
        """The broker aborted this producer's transaction (a fence, its timeout): what it
        sent is gone, but the producer itself does not know until its next request."""
        self.pending, self.pending_marks = [], {}

    def _reset(self) -> None:
        self.pending, self.pending_marks, self.open, self.started = [], {}, False, False

    def close(self) -> bool:
        """``Producer.close()``: flush, then destroy. librdkafka sends no EndTxn: an open
        transaction stays open on the broker (until a fence or its timeout aborts it); the
        producer is unusable after."""
        self.broker.calls.append((self.transactional_id, "close"))
        self.closed = True
        return True


class _Msg:
    def __init__(self, partition: int) -> None:
        self._partition = partition

    def partition(self) -> int:
        return self._partition


class _TailMsg:
    """A committed record as a consumer returns it (confluent_kafka.Message's getters)."""

    def __init__(self, record: Record) -> None:
        self._record = record

    def headers(self) -> list[tuple[str, bytes]]:
        return list(self._record.headers)

    def partition(self) -> int:
        return self._record.partition

    def value(self) -> bytes | None:
        return self._record.value

    def key(self) -> bytes | None:
        return self._record.key


class FakeClients:
    """:class:`airflow_provider_eo.core.kafka_clients.KafkaClients` on a :class:`FakeBroker`."""

    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        # open transactions of producers that are not ours: topic -> partition -> (stable, high)
        self.open: dict[str, dict[int, tuple[int, int]]] = {}
        # topics the broker says this principal may not WRITE (KIP-430 authorized operations),
        # and how many times that was asked
        self.write_denied: set[str] = set()
        self.write_checks = 0

    def producer(
        self,
        transactional_id: str,
        timeout_ms: int,
        on_failure: Any,
        topic_max: Any,
        config: Mapping[str, Any] | None = None,
    ) -> FakeProducer:
        self.broker.calls.append((transactional_id, "new_producer"))
        return FakeProducer(self.broker, transactional_id, on_failure, topic_max, timeout_ms)

    def committed_marks(
        self, group: str, partitions: list[tuple[str, int]], *, stable: bool = True
    ) -> dict[tuple[str, int], tuple[int, str]]:
        """Committed offsets; ``stable`` (a ``read_committed`` reader) waits out pending
        transactional offset commits of these partitions (:meth:`FakeBroker.stable_read`)."""
        self.broker.calls.append(("", "committed_marks" if stable else "committed_marks_unstable"))
        if stable:
            self.broker.stable_read(group, partitions)
        return {
            (t, p): self.broker.marks[(group, t, p)]
            for t, p in partitions
            if (group, t, p) in self.broker.marks
        }

    def marks_elsewhere(self, group: str, sink_topic: str) -> dict[tuple[str, int], tuple[int, str]]:
        return {
            (t, p): mark for (g, t, p), mark in self.broker.marks.items() if g == group and t != sink_topic
        }

    def group_metadata(self, group: str) -> str:
        return group

    def last_published_checkpoint(self, topic: str, partition: int, pipeline_name: str, identity: str) -> int:
        self.broker.calls.append(("", "read_back"))
        best = -1
        for rec in self.broker.committed:
            found = rec.checkpoint if (rec.topic, rec.partition) == (topic, partition) else None
            if found is not None and (found[1] is None or identity.startswith(found[1])):
                best = max(best, found[0])
        return best

    def partition_count(self, topic: str) -> int:
        return self.broker.partitions[topic]

    def partitions_of(self, topics: Any) -> dict[str, list[int]]:
        """A source topic's partitions from :attr:`FakeBroker.logs`, else a sink topic's; a
        missing topic is the real call's error."""
        from airflow_provider_eo.errors import KafkaAdminError

        out: dict[str, list[int]] = {}
        for topic in topics:
            parts = sorted(p for t, p in self.broker.logs if t == topic)
            if not parts and topic in self.broker.partitions:
                parts = list(range(self.broker.partitions[topic]))
            if not parts:
                raise KafkaAdminError(f"topic {topic!r} does not exist (fake broker)")
            out[topic] = parts
        return out

    def list_offsets(
        self, partitions: Any, *, spec: str, timeout_s: float = 60.0
    ) -> dict[tuple[str, int], int]:
        self.broker.calls.append(("", f"list_offsets:{spec}"))
        return {tp: self.broker.logs[tp][0 if spec == "earliest" else 1] for tp in partitions}

    def offsets_for_timestamp(self, partitions: Any, timestamp_ms: int) -> Any:
        raise AssertionError("the fake broker keeps no record timestamps")

    def committed_offsets(self, group: str, partitions: Any) -> dict[tuple[str, int], int]:
        held = self.broker.groups.get(group, {})
        return {tp: held[tp] for tp in partitions if tp in held}

    def tail_records(self, topic: str, *, per_partition: int) -> list[Any]:
        """The newest ``per_partition`` committed records of each partition of ``topic``."""
        self.broker.calls.append(("", "tail_records"))
        out: list[Any] = []
        for partition in range(self.broker.partitions.get(topic, 0)):
            records = [r for r in self.broker.committed if (r.topic, r.partition) == (topic, partition)]
            out.extend(_TailMsg(r) for r in records[-per_partition:])
        return out

    def topic_max_message_bytes(self, topic: str, default: int) -> int:
        return self.broker.max_message_bytes.get(topic, default)

    def write_denied_topic(self, topics: Any) -> str | None:
        self.write_checks += 1
        return next((t for t in topics if t in self.write_denied), None)

    def open_transactions(self, topic: str) -> dict[int, tuple[int, int]]:
        """Partitions holding records of a still-open transaction: (committed, + open)."""
        out = dict(self.open.get(topic, {}))
        for producer in self.broker.producers:
            for rec in producer.pending:
                if rec.topic == topic:
                    stable, high = out.get(rec.partition, (self.broker.visible(topic, rec.partition),) * 2)
                    out[rec.partition] = (stable, high + 1)
        return dict(sorted(out.items()))


def write_staged(
    root: Path, partition: int, values: list[bytes], *, src_topic: str = "src"
) -> staging.StagedFile:
    """One staged Parquet file of ``values`` for ``partition`` in the attempt folder ``root``,
    laid out as prepare lays it out."""
    path = root / "data" / f"sink_partition={partition}" / "part-0.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    n = len(values)
    table = pa.table(
        {
            "key": pa.array([None] * n, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "headers": pa.array([None] * n, STAGED_SCHEMA.field("headers").type),
            "src_topic": pa.array([src_topic] * n, pa.string()),
            "src_partition": pa.array([0] * n, pa.int32()),
            "src_offset": pa.array(list(range(n)), pa.int64()),
        },
        schema=STAGED_SCHEMA,
    )
    pq.write_table(table, path)
    return staging.describe_attempt(str(root))[partition][0]


def prepared_checkpoint(
    ledger: Ledger,
    pipeline: Pipeline,
    output: dict[int, list[bytes]],
    *,
    sink_partitions: int,
    start: int = 0,
    read: int = 10,
    plan: bool = True,
) -> CheckpointRecord:
    """Plan the next checkpoint of ``pipeline`` (reading ``in[0]`` from ``start``), stage
    ``output`` (sink partition -> record values) as real Parquet with its manifest, and
    mark it PREPARED. ``plan=False``: no frozen commit plan (a checkpoint from before plans
    were recorded)."""
    commit_plan = names.commit_plan(pipeline, sink_partitions) if plan else None
    cp = ledger.plan(
        pipeline.name, [RangeSpec("in", 0, start, start + read)], commit_plan=commit_plan, max_pending=5
    )
    attempt = "a1"
    root = names.attempt_dir(pipeline, cp.checkpoint_id, attempt)
    files = {p: [write_staged(Path(root), p, values)] for p, values in output.items()}
    manifest = staging.Manifest(
        pipeline=pipeline.name,
        checkpoint_id=cp.checkpoint_id,
        attempt=attempt,
        sink_topic=pipeline.sink_topic,
        sink_partitions=sink_partitions,
        files=files,
        records_read=read,
        ranges=[],
    )
    staging.write_manifest(root, manifest)
    shards = (commit_plan or names.commit_plan(pipeline, sink_partitions)).shard_of_partition
    counts: dict[int, int] = {}
    for p, values in output.items():
        counts[shards[p]] = counts.get(shards[p], 0) + len(values)
    return ledger.mark_prepared(
        pipeline.name,
        cp.checkpoint_id,
        attempt=attempt,
        staging_location=root,
        records=manifest.records,
        bytes_=manifest.bytes,
        shard_counts=counts,
    )


def fake_pipeline(tmp_path: Path, *, sink: str, shards: int) -> Pipeline:
    """The pipeline ``orders`` of the commit/abort/recover unit tests: ``shards`` commit
    shards onto ``sink``, staging under ``tmp_path``, a broker that is never dialled."""
    return Pipeline(
        name="orders",
        kafka={"bootstrap.servers": "fake:9092"},
        source_topics=["in"],
        sink_topic=sink,
        staging_dir=str(tmp_path / "staging"),
        commit_shards=shards,
        transaction_timeout_ms=10_000,
    )


def patched_broker(monkeypatch: Any, partitions: dict[str, int]) -> FakeBroker:
    """A fake broker with these topics; the frozen plan's check, which asks Kafka for the
    sink's partition count directly, reads them too."""
    from airflow_provider_eo.kafka import admin

    fake = FakeBroker(partitions=partitions)
    monkeypatch.setattr(admin, "partition_count", lambda config, topic: fake.partitions[topic])
    return fake


def make_committable(
    root: Path, values: list[bytes], *, checkpoint: int = 3, last: bool = True, **changes: Any
) -> ShardCommittable:
    """A :class:`~airflow_provider_eo.core.shard.ShardCommittable` of shard 0 of pipeline
    ``orders`` publishing ``values`` (staged under ``root``) to sink partition 0 of ``sink``;
    ``last``: the shard that moves the group (``src[0]`` to 42). ``changes`` replace fields."""
    files = [write_staged(root, 0, values)]
    base = ShardCommittable(
        pipeline="orders",
        identity="0123456789abcdef",
        checkpoint_id=checkpoint,
        shard=0,
        transactional_id="eo.orders.0",
        sink_topic="sink",
        staging_location=str(root),
        parts=((0, tuple(files)),),
        marker_group="eo-markers",
        group_id="orders-group" if last else None,
        group_offsets=(("src", 0, 42),) if last else (),
        kafka=(("bootstrap.servers", "fake:9092"),),
        transaction_timeout_ms=10_000,
    )
    return replace(base, **changes)


def fire_once(step: str) -> tuple[Callable[[str], bool], list[str]]:
    """A stand-in for ``fault_triggered`` that fires ``step`` the first time it is asked
    (never again, never another step), and the list of what it fired."""
    fired: list[str] = []

    def triggered(name: str) -> bool:
        if name == step and not fired:
            fired.append(name)
            return True
        return False

    return triggered, fired
