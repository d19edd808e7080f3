"""One shard's Kafka transaction: a frozen committable and the object that commits it.

Shaped like Flink's ``KafkaCommittable`` + ``KafkaCommitter`` (docs/design.md §2, §3a):

- :class:`ShardCommittable` is everything one shard's transaction needs and nothing live:
  frozen, picklable, so it can travel to another process (a Spark task) as one object.
- :class:`ShardTransaction` runs the steps on a producer made by a :class:`KafkaClients`
  factory passed in (unit tests pass a fake): :meth:`~ShardTransaction.fence`,
  :meth:`~ShardTransaction.committed_through`, :meth:`~ShardTransaction.publish`,
  :meth:`~ShardTransaction.seal`, :meth:`~ShardTransaction.commit`.
- :func:`commit_shard` drives the rounds and sorts every failure onto a small ladder
  (:class:`Outcome`): *retriable* calls are repeated in place; *abortable* aborts and redoes
  the shard; *ambiguous* (the answer to ``commit_transaction`` was lost) drops the producer,
  re-inits a new one and lets the marker decide, never aborting; *permanent* fails with the
  reason. It never touches the ledger: what the ledger must record, and when, is the
  caller's :class:`ShardHooks`.

In a local commit, a producer whose transaction committed cleanly is kept idle in the
process's :class:`~airflow_provider_eo.kafka.publisher.ProducerPool` and used again for the
same transactional id's next transaction (no new producer, no ``init_transactions``: only
the first use in a process fences). Anything else drops it. A kept producer that another
process fenced meanwhile (an ``eo commit`` elsewhere, a restarted stream) fails as fenced at
its first request, and a marker read on a kept producer's round may be held by another
process's open transaction: a kept producer's round that fails for good is redone with a
new producer and ``init_transactions``, which is how every round began before, and the
marker decides (so keeping producers changes no outcome; a timed-out transaction and a
refused record still fail at once).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from time import monotonic
from typing import Any, Protocol

import pyarrow as pa
from confluent_kafka import KafkaException

from airflow_provider_eo import names, staging, staging_fs
from airflow_provider_eo.core.fault_seam import fault_point, fault_triggered
from airflow_provider_eo.core.markers import NO_MARKER, decide_marker
from airflow_provider_eo.errors import (
    CommitAccessDenied,
    CommitError,
    CommitFenced,
    LedgerBehindSink,
    TransactionTimedOut,
)
from airflow_provider_eo.kafka.acls import access_denied, commit_denied
from airflow_provider_eo.kafka.admin import unwritable_topic
from airflow_provider_eo.kafka.publisher import (
    PRODUCERS,
    Abortable,
    DeliveryFailures,
    ProducerLost,
    ProducerPool,
    Sent,
    connect,
    fatal_cause,
    kafka_call,
    known_commit_outcome,
    largest_record,
    offsets,
    produce_dead_letters,
    produce_staged,
    serve,
    sorted_error,
)

#: Rounds of abort-and-redo / re-init before a shard gives up (retry the commit later).
MAX_SHARD_ROUNDS = 5


class Outcome(enum.Enum):
    """How a failed step of a shard transaction is handled."""

    RETRIABLE = "retriable"  # repeat the same call (inside kafka_call)
    ABORTABLE = "abortable"  # abort the open transaction, redo the whole shard
    AMBIGUOUS = "ambiguous"  # outcome unknown: new producer, re-init, the marker decides
    PERMANENT = "permanent"  # fenced, unauthorized, refused every time: fail with the reason


def outcome_of(exc: BaseException) -> Outcome:
    """Where an exception raised by a shard step sits on the ladder."""
    if isinstance(exc, Abortable):
        return Outcome.ABORTABLE
    if isinstance(exc, ProducerLost):
        return Outcome.AMBIGUOUS
    return Outcome.PERMANENT


class KafkaClients(Protocol):
    """The Kafka side of a shard transaction, made fakeable (Flink passes a producer
    factory to its committer for the same reason)."""

    def producer(
        self,
        config: Mapping[str, Any],
        transactional_id: str,
        timeout_ms: int,
        on_failure: DeliveryFailures | None,
        topic_max_bytes: int | None,
    ) -> Any:
        """A fresh transactional producer (confluent_kafka.Producer's interface)."""

    def committed_marks(
        self, config: Mapping[str, Any], group: str, partitions: list[tuple[str, int]], *, stable: bool = True
    ) -> dict[tuple[str, int], tuple[int, str]]:
        """Committed offsets of ``group`` with their metadata. ``stable``: a pending
        transactional offset commit of one of ``partitions`` is waited out (until its
        transaction ends, or the read times out); else only what is committed now is read,
        without waiting."""

    def marks_elsewhere(
        self, config: Mapping[str, Any], group: str, sink_topic: str
    ) -> dict[tuple[str, int], tuple[int, str]]:
        """Committed offsets of ``group`` with their metadata on every topic but
        ``sink_topic`` (not waiting for open transactions)."""

    def group_metadata(self, config: Mapping[str, Any], group: str) -> Any:
        """Consumer-group metadata for ``send_offsets_to_transaction``."""

    def last_published_checkpoint(
        self, config: Mapping[str, Any], topic: str, partition: int, pipeline_name: str, identity: str
    ) -> int:
        """The highest checkpoint of this pipeline identity in ``topic[partition]``'s
        committed output (-1: none)."""

    def partition_count(self, config: Mapping[str, Any], topic: str) -> int:
        """Partitions of ``topic``."""

    def topic_max_message_bytes(self, config: Mapping[str, Any], topic: str, default: int) -> int:
        """The topic's ``max.message.bytes``."""

    def open_transactions(self, config: Mapping[str, Any], topic: str) -> dict[int, tuple[int, int]]:
        """Partitions of ``topic`` whose last stable offset is below the high watermark:
        partition -> (stable, high)."""


class RealKafka:
    """:class:`KafkaClients` on the real cluster (stateless, so picklable)."""

    def producer(
        self,
        config: Mapping[str, Any],
        transactional_id: str,
        timeout_ms: int,
        on_failure: DeliveryFailures | None,
        topic_max_bytes: int | None,
    ) -> Any:
        """:func:`kafka.publisher.new_producer`."""
        from airflow_provider_eo.kafka.publisher import new_producer

        return new_producer(config, transactional_id, timeout_ms, on_failure, topic_max_bytes=topic_max_bytes)

    def committed_marks(
        self, config: Mapping[str, Any], group: str, partitions: list[tuple[str, int]], *, stable: bool = True
    ) -> dict[tuple[str, int], tuple[int, str]]:
        """:func:`kafka.admin.committed_group_marks`."""
        from airflow_provider_eo.kafka import admin

        return admin.committed_group_marks(config, group, partitions, stable=stable)

    def marks_elsewhere(
        self, config: Mapping[str, Any], group: str, sink_topic: str
    ) -> dict[tuple[str, int], tuple[int, str]]:
        """:func:`kafka.admin.committed_group_marks_everywhere` but ``sink_topic``."""
        from airflow_provider_eo.kafka import admin

        return admin.committed_group_marks_everywhere(config, group, exclude=[sink_topic])

    def group_metadata(self, config: Mapping[str, Any], group: str) -> Any:
        """:func:`kafka.publisher.group_metadata`."""
        from airflow_provider_eo.kafka.publisher import group_metadata

        return group_metadata(config, group)

    def last_published_checkpoint(
        self, config: Mapping[str, Any], topic: str, partition: int, pipeline_name: str, identity: str
    ) -> int:
        """:func:`kafka.audit.last_published_checkpoint` (reads the partition's tail)."""
        from airflow_provider_eo.kafka import audit

        return audit.last_published_checkpoint(dict(config), topic, partition, pipeline_name, identity)

    def partition_count(self, config: Mapping[str, Any], topic: str) -> int:
        """:func:`kafka.admin.partition_count`."""
        from airflow_provider_eo.kafka import admin

        return admin.partition_count(config, topic)

    def topic_max_message_bytes(self, config: Mapping[str, Any], topic: str, default: int) -> int:
        """:func:`kafka.admin.topic_max_message_bytes`."""
        from airflow_provider_eo.kafka import admin

        return admin.topic_max_message_bytes(config, topic, default)

    def open_transactions(self, config: Mapping[str, Any], topic: str) -> dict[int, tuple[int, int]]:
        """Last stable offset vs high watermark of every partition, read_committed."""
        from airflow_provider_eo.kafka import admin

        stable, high = admin.sink_offsets(config, topic, admin.partition_count(config, topic))
        return {p: (stable[p], high[p]) for p in sorted(high) if stable.get(p, high[p]) < high[p]}


REAL_KAFKA = RealKafka()


@dataclass(frozen=True)
class ShardCommittable:
    """Everything one shard's transaction needs, frozen from the checkpoint's commit plan
    and manifest: picklable, no ledger, no live client."""

    pipeline: str
    identity: str  # the ledger's identity of the pipeline (markers and provenance name it)
    checkpoint_id: int
    shard: int
    transactional_id: str
    sink_topic: str
    staging_location: str
    parts: tuple[tuple[int, tuple[staging.StagedFile, ...]], ...]  # sink partition -> files
    marker_group: str
    group_id: str | None  # the pipeline's consumer group, moved by this shard's seal (or None)
    group_offsets: tuple[tuple[str, int, int], ...]  # (topic, partition, end) sent with the seal
    kafka: tuple[tuple[str, Any], ...]  # librdkafka client config
    transaction_timeout_ms: int
    topic_max_bytes: int | None = None
    # The checkpoint's dead letters (the shard that moves the group publishes them) and
    # their topic.
    dead_letter_topic: str | None = None
    dead_letters: tuple[staging.StagedFile, ...] = ()
    # How the staged files are opened (S3 settings and credentials: never logged); the
    # same on an executor as in the committing process.
    staging_store: staging_fs.StagingStore | None = None

    @property
    def config(self) -> dict[str, Any]:
        """The librdkafka client config."""
        return dict(self.kafka)

    @property
    def where(self) -> str:
        """The prefix of every error message: pipeline, checkpoint, shard."""
        return f"pipeline {self.pipeline!r}, checkpoint {self.checkpoint_id}, shard {self.shard}: "

    @property
    def timeout_s(self) -> float:
        """The transaction timeout in seconds."""
        return self.transaction_timeout_ms / 1000

    @property
    def partitions(self) -> list[int]:
        """The shard's sink partitions that have staged files."""
        return [p for p, _files in self.parts]

    @property
    def records(self) -> int:
        """Records staged for this shard."""
        return sum(f.records for _p, files in self.parts for f in files)

    def files_of(self, partition: int) -> list[staging.StagedFile]:
        """The staged files of one sink partition, in publish order."""
        return next((list(files) for p, files in self.parts if p == partition), [])

    def batches(self, partition: int) -> Iterator[pa.RecordBatch]:
        """The staged rows of one sink partition, as Arrow batches (bounded memory)."""
        return staging.iter_batches(self.staging_location, self.files_of(partition), store=self.staging_store)


class ShardHooks(Protocol):
    """What the caller records around one shard's transaction (the ledger, in local mode).
    Called at fixed points of :func:`commit_shard`."""

    def may_have_published(self) -> bool:
        """When the marker is missing: could a try of this checkpoint have begun a
        transaction for the shard (a shard row exists)? False means certainly not."""

    def before_begin(self) -> None:
        """Right before ``begin_transaction``: take the commit lease and record the shard
        PENDING (the missing-marker proof relies on the row existing before any begin)."""

    def committed(self, records: int) -> None:
        """The shard's transaction is committed (or the marker shows it was)."""


@dataclass(frozen=True)
class ShardResult:
    """What :func:`commit_shard` did for one shard."""

    shard: int
    records: int  # records produced by this call
    skipped: bool  # the marker already showed the checkpoint: nothing was sent
    rounds: int


@dataclass(frozen=True)
class Publisher:
    """The process that published (or found published) one shard.

    :param executor: the Spark executor id (``"driver"``: a task in the driver's JVM, local
        mode; ``"local"``: a local-mode commit, in the committing process itself).
    :param attempt: the Spark task attempt that did it (0 for a local commit).
    :param skipped: the shard's marker already showed the checkpoint: nothing was sent.
    :param publish_s: seconds the publishing transaction took (None when skipped).
    """

    shard: int
    host: str
    pid: int
    records: int
    executor: str = "local"
    attempt: int = 0
    skipped: bool = False
    publish_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (``eo commit --json``'s ``publishers``)."""
        return asdict(self)


@dataclass(frozen=True)
class ShardTask:
    """What a commit task gets: the shard's committable and whether the ledger had a row for
    the shard before this commit started (a try before it may have begun a transaction)."""

    committable: ShardCommittable
    row_before: bool


@dataclass(frozen=True)
class ShardFailure:
    """A shard task's error, returned (not raised) so the driver re-raises it as the same
    eo error with its message; :func:`commit_shard` already ran its own rounds, so Spark
    must not retry the task for it (only for a lost process)."""

    shard: int
    error: str  # the class name, in airflow_provider_eo.errors when it is an eo error
    message: str
    host: str
    pid: int


class ShardRunner(Protocol):
    """Runs shard transactions somewhere else than this process (a spark-mode commit:
    spark/commit.py runs each in a Spark task). The commit driver keeps the ledger."""

    @property
    def master(self) -> str:
        """Where the shards would run (a Spark master URL: ``local[...]`` or a cluster)."""

    @property
    def session_running(self) -> bool:
        """A Spark session is already running (a commit would not pay its start)."""

    @property
    def executors_elsewhere(self) -> bool:
        """The running session has executors on other hosts than this one (True when not
        known yet)."""

    def run(
        self, tasks: list[ShardTask], on_outcome: Callable[[Publisher | ShardFailure], None]
    ) -> list[tuple[int, Publisher | ShardFailure | BaseException]]:
        """Commit ``tasks`` in parallel; ``on_outcome`` (called in the caller's thread) gets
        each shard's outcome as it arrives. Returns every shard's outcome, or the exception
        of a shard whose run failed as a whole (its process lost too often)."""

    def unavailable(self) -> str | None:
        """Why no shard can run there now (None: it can); a caller may then commit locally."""

    def cancel(self, pipeline: str, checkpoint_id: int) -> None:
        """Stop the checkpoint's shards: none that has not started begins (called from
        another thread while :meth:`run` waits, when the commit lost its lease)."""


def pool_key(committable: ShardCommittable, clients: KafkaClients) -> Hashable:
    """What an idle producer of :data:`PRODUCERS` is kept under: everything it was made from
    (the clients' factory, the transactional id, the client config, the transaction timeout,
    the batch limits) and this process's id."""
    c = committable
    return (clients, os.getpid(), c.transactional_id, c.kafka, c.transaction_timeout_ms, c.topic_max_bytes)


class ShardTransaction:
    """One producer's go at one shard's transaction (a new one after any failure: librdkafka
    lacks KIP-890's epoch bump, so a producer is never reused across an error).

    :param pool: where a producer is taken from and, after a clean commit, given back to
        (None: a new producer every time, dropped afterwards).
    """

    def __init__(
        self,
        committable: ShardCommittable,
        clients: KafkaClients = REAL_KAFKA,
        pool: ProducerPool | None = None,
    ) -> None:
        self.committable = committable
        self.clients = clients
        self.pool = pool
        self.failures = DeliveryFailures()
        self.producer: Any = None
        self.reused = False  # the producer came from the pool: no init_transactions this round
        self.begun_at: float | None = None  # monotonic time of begin_transaction
        self.sent = Sent()  # records handed to the producer in this transaction
        self.committing = False  # commit_transaction was called: never abort after it

    def fence(self) -> None:
        """The shard's producer, ready for a transaction: an idle one of this process that
        committed the id's last transaction cleanly (from the pool), else a fresh producer on
        the shard's transactional id and ``init_transactions``: the broker aborts whatever an
        earlier producer of the id left open and fences it."""
        c = self.committable
        if self.pool is not None:
            kept = self.pool.take(pool_key(c, self.clients))
            if kept is not None and kept.failures is not None:
                self.producer, self.failures, self.reused = kept.producer, kept.failures, True
                return
        self.producer = self.clients.producer(
            c.config, c.transactional_id, c.transaction_timeout_ms, self.failures, c.topic_max_bytes
        )
        kafka_call("metadata", connect, self.producer, c.sink_topic, c.timeout_s, where=c.where)
        kafka_call(
            "init_transactions",
            self.producer.init_transactions,
            c.timeout_s,
            where=c.where,
            denied=self._denied("init_transactions", None, []),
        )

    def drop(self) -> None:
        """After an unknown outcome of ``commit_transaction``: this producer is never used
        again (not asked to commit again, not aborted, not kept). Its EndTxn may still be
        in flight, and librdkafka keeps the old transaction protocol (no KIP-890 epoch bump
        per transaction), so only a new producer's ``init_transactions``, which bumps the
        epoch, stops a late request of it from landing; the marker then decides."""
        if self.pool is not None:
            key = pool_key(self.committable, self.clients)
            self.pool.discard(lambda kept: kept == key)
        self.producer = None  # destroyed with its last reference (close() would flush first)

    def keep(self) -> None:
        """After a clean ``commit_transaction`` (and nothing else): give the producer to the
        pool for the id's next transaction. Without a pool it is dropped."""
        if self.pool is not None and self.producer is not None and not self.failures:
            self.pool.give(pool_key(self.committable, self.clients), self.producer, self.failures)
        self.producer = None

    def marker(self) -> int:
        """The checkpoint id the shard's marker shows (-1: none); a foreign one is refused."""
        c = self.committable
        # Only this shard's marker: another shard's may sit in a transaction a killed
        # committer left open (not fenced yet), and a stable read of it would wait for that
        # transaction's timeout.
        found = self.clients.committed_marks(c.config, c.marker_group, [(c.sink_topic, c.shard)])
        return decide_marker(
            c.pipeline,
            c.marker_group,
            c.sink_topic,
            c.shard,
            found.get((c.sink_topic, c.shard)),
            identity=c.identity,
        )

    def committed_through(self, hooks: ShardHooks) -> int:
        """The last checkpoint this shard committed: its marker, or — when the marker is gone
        (expired, the topic re-created) and a try may have begun — the committed output.

        Cases without a marker: no shard row means no transaction of this checkpoint was
        ever begun for the shard (the row is written before ``begin_transaction``): -1. A
        row exists: read back the tail of one of the shard's partitions this checkpoint has
        records for (a shard's transaction is atomic over its partitions, so one partition
        answers for the shard). No record for any of them: nothing can prove it, and nothing
        needs to: the redo republishes zero records and the same offsets.
        """
        c = self.committable
        done = self.marker()
        if done >= 0:
            return done
        if not hooks.may_have_published():
            return NO_MARKER
        staged = [p for p, files in c.parts if sum(f.records for f in files) > 0]
        if not staged:
            # Nothing in the sink can prove it. A shard holding only dead letters is redone
            # (they may appear twice on the dead-letter topic, the sink never).
            return NO_MARKER
        return self.clients.last_published_checkpoint(
            c.config, c.sink_topic, staged[0], c.pipeline, c.identity
        )

    def publish(self, batches: Iterable[tuple[int, Iterable[pa.RecordBatch]]]) -> int:
        """Begin the transaction and produce the staged records, each with the provenance
        header; everything acknowledged before returning. Raises :class:`Abortable` when the
        broker refused a record (a failed delivery report)."""
        c = self.committable
        # The broker's timer starts later (with the first record), so a transaction that
        # has been open less than its timeout by this clock was not aborted for it.
        self.begun_at = monotonic()
        kafka_call("begin_transaction", self.producer.begin_transaction, where=c.where)
        header = names.provenance_checkpoint_field(c.pipeline, c.checkpoint_id, c.identity).encode()
        produced = 0
        for partition, part in batches:
            produced += produce_staged(
                self.producer, c.sink_topic, partition, part, header, where=c.where, sent=self.sent
            )
            fault_point("commit.after_begin")
        if c.dead_letters and c.dead_letter_topic:
            # In the same transaction as the output and the group's offsets: a source record
            # is either published, or a dead letter, never both or neither.
            produce_dead_letters(
                self.producer,
                c.dead_letter_topic,
                staging.iter_batches(c.staging_location, list(c.dead_letters), store=c.staging_store),
                pipeline=c.pipeline,
                checkpoint_id=c.checkpoint_id,
                identity=c.identity,
                where=c.where,
                sent=self.sent,
            )
        # Acknowledged by the broker before the commit step (commit would flush anyway; this
        # makes the crash point before the commit well-defined).
        serve("flush", self.producer.flush, c.timeout_s, where=c.where)
        if self.failures:  # a refused record: the transaction can only be aborted now
            raise Abortable(self.failures.describe())
        return produced

    def open_seconds(self) -> float:
        """How long the transaction has been open (0 before ``begin_transaction``)."""
        return 0.0 if self.begun_at is None else monotonic() - self.begun_at

    def outlived_timeout(self, exc: BaseException) -> bool:
        """``exc`` is the broker's abort of a transaction open past its timeout: the producer
        was fenced (the broker bumps the epoch when it aborts) or the transaction became
        abortable, after the transaction had been open at least ``transaction.timeout.ms``.
        Before that the broker's timeout cannot be the cause (another committer can)."""
        return isinstance(exc, (Abortable, CommitFenced)) and (
            self.begun_at is not None and self.open_seconds() >= self.committable.timeout_s
        )

    def timed_out_error(self, exc: BaseException) -> TransactionTimedOut:
        """The error for a transaction the broker aborted for its timeout, with the measured
        publish time and what to change."""
        c = self.committable
        seconds = self.open_seconds()
        sent = self.sent.records
        progress = f"It had sent none of the shard's {c.records} records by then"
        if sent > 0 and seconds > 0:
            rate = sent / seconds
            progress = (
                f"It had sent {sent} of the shard's {c.records} records by then ({rate:,.1f} "
                f"records/s: all {c.records} take about {c.records / rate:,.1f} s)"
            )
        return TransactionTimedOut(
            f"{c.where}the transaction of {c.transactional_id!r} was open {seconds:.1f} s, as long "
            f"as its transaction.timeout.ms ({c.transaction_timeout_ms} ms) or longer, so the "
            f"broker aborted it ({_kafka_words(exc)}). {progress}. Nothing of it is "
            "visible and the checkpoint stays PREPARED; a redo of the same size would time out "
            "again. Raise the pipeline's transaction_timeout_ms (up to the broker's "
            "transaction.max.timeout.ms, 15 minutes by default) and retry the commit, or abort "
            f"the checkpoint (`eo abort MODULE:ATTR {c.checkpoint_id} --reason TEXT`; refused "
            "once another shard of it has published) and lower max_records_per_checkpoint, so "
            "its range is replanned smaller. A pause of this process or a stalled broker counts "
            "toward the timeout too."
        )

    def seal(self) -> None:
        """Send the marker (naming the writing ledger) and, when this shard moves it, the
        pipeline's consumer-group offsets, inside the open transaction."""
        c = self.committable
        fault_point("commit.before_commit_txn")
        kafka_call(
            "send_offsets_to_transaction(marker)",
            self.producer.send_offsets_to_transaction,
            offsets({(c.sink_topic, c.shard): c.checkpoint_id}, names.marker_metadata(c.identity)),
            self.clients.group_metadata(c.config, c.marker_group),
            c.timeout_s,
            where=c.where,
            denied=self._denied("the commit marker", c.marker_group, [c.sink_topic]),
        )
        if c.group_id is not None:
            kafka_call(
                "send_offsets_to_transaction(group)",
                self.producer.send_offsets_to_transaction,
                offsets({(t, p): end for t, p, end in c.group_offsets}),
                self.clients.group_metadata(c.config, c.group_id),
                c.timeout_s,
                where=c.where,
                denied=self._denied(
                    "the group offsets", c.group_id, sorted({t for t, _, _ in c.group_offsets})
                ),
            )

    def _denied(self, what: str, group: str | None, topics: list[str]) -> Callable[[Any], Exception]:
        """The ACL refusal of one of this shard's transactional calls (never aborted and redone)."""
        c = self.committable
        produced = [c.sink_topic, *([c.dead_letter_topic] if c.dead_letters and c.dead_letter_topic else [])]
        return lambda err: commit_denied(
            err,
            f"{c.where}{what}",
            transactional_id=c.transactional_id,
            group=group,
            topics=topics,
            produced=produced,
            unwritable=lambda topics: unwritable_topic(c.config, topics),
            config=c.config,
            error=CommitAccessDenied,
        )

    def commit(self) -> None:
        """``commit_transaction``, called once. Raises :class:`ProducerLost` when the outcome
        is unknown: a timeout (librdkafka's retriable ``_TIMED_OUT``) or any error Kafka does
        not classify. That producer is not asked again (a retry on it would keep a producer
        whose EndTxn may still land, see :meth:`drop`) and never followed by an abort: the
        caller drops it, a new producer re-inits and the marker decides. A fenced producer
        (:class:`CommitFenced`) and an abortable transaction (:class:`Abortable`: librdkafka
        says it did not commit) are answers, sorted as for every other call."""
        c = self.committable
        fault_point("commit.before_end_txn")
        if fault_triggered("commit.ambiguous_before"):
            raise ProducerLost("injected: commit_transaction timed out before it was sent")
        self.committing = True
        try:
            try:
                self.producer.commit_transaction(c.timeout_s)
            except SystemError as exc:  # a fatal error met while serving delivery reports
                cause = fatal_cause(exc)
                if cause is None:
                    raise
                raise cause from None
        except KafkaException as exc:
            err = exc.args[0]
            if known_commit_outcome(err):
                raise sorted_error("commit_transaction", exc, c.where) from exc
            raise ProducerLost(
                f"commit_transaction: outcome unknown ({err.name()}: {err.str()}); a new producer "
                "re-inits and the marker decides"
            ) from exc
        if fault_triggered("commit.ambiguous_after"):
            raise ProducerLost("injected: the answer to commit_transaction was lost")

    def abort(self) -> None:
        """Abort the open transaction (best effort: the next ``init_transactions`` aborts
        it anyway), then serve the delivery reports still queued (the cause, if any)."""
        try:
            self.producer.abort_transaction(self.committable.timeout_s)
        except Exception:
            pass
        try:
            serve("poll", self.producer.poll, 0)
        except (CommitError, Abortable):
            pass  # a fenced producer: its reports add nothing to the failure being handled

    def refused_record_error(self, exc: BaseException) -> CommitError:
        """The error for a record the broker refuses every time, naming the largest staged
        record of each refused partition."""
        c = self.committable
        message = self.failures.describe()
        if self.failures.denied_topic is not None:
            return access_denied(
                f"{c.where}publishing",
                "WRITE",
                "topic",
                self.failures.denied_topic,
                config=c.config,
                cause=f"{message}; the shard's transaction was aborted, nothing of it is visible",
                error=CommitAccessDenied,
            )
        for partition in sorted(self.failures.partitions & set(c.partitions)):
            found = largest_record(c.batches(partition))
            if found is not None:
                index, src, size = found
                message += (
                    f"; the largest record of sink partition {partition} is record "
                    f"{index} of its staged output (source {src}, {size} bytes of key+value)"
                )
        return CommitError(
            f"{c.where}{message}. The broker refuses this record every time, so "
            "the shard's transaction was aborted (nothing of it is visible) and the "
            "checkpoint stays PREPARED. A size refusal means the sink topic "
            f"{c.sink_topic!r} lowered max.message.bytes (or the broker its "
            "message.max.bytes) after prepare checked it: raise it above the record's "
            "size and retry the commit. An authorization refusal needs WRITE on the "
            "sink topic."
        )


def _kafka_words(exc: BaseException) -> str:
    """The Kafka error behind a sorted one, in the broker's and librdkafka's words (the sorted
    error's own explanation would guess at the cause)."""
    cause = exc.__cause__
    if isinstance(cause, KafkaException):
        err = cause.args[0]
        return f"{err.name()}: {err.str()}"
    return str(exc)


def commit_shard(
    committable: ShardCommittable,
    hooks: ShardHooks,
    clients: KafkaClients = REAL_KAFKA,
    *,
    pool: ProducerPool | None = None,
) -> ShardResult:
    """Publish one shard exactly once: rounds of fence -> marker -> publish -> seal ->
    commit until the marker or a commit settles it (see the module docstring for the ladder).

    Idempotent: a shard whose marker (or committed output) already shows the checkpoint is
    skipped, nothing re-sent. Raises :class:`CommitError` after :data:`MAX_SHARD_ROUNDS`
    rounds or for a record the broker refuses every time, and :class:`CommitFenced` /
    :class:`TransactionalIdUnauthorized` as they come.

    :param pool: idle producers of this process to take the shard's producer from
        (:data:`~airflow_provider_eo.kafka.publisher.PRODUCERS` in a local commit; None: a
        new producer every round). A producer is given back only when its round committed
        and the hooks recorded it.
    """
    c = committable
    last_failure = ""
    for round_ in range(1, MAX_SHARD_ROUNDS + 1):
        txn = ShardTransaction(c, clients, pool)
        try:
            txn.fence()
            done = txn.committed_through(hooks)
            if done > c.checkpoint_id:
                raise LedgerBehindSink(
                    f"pipeline {c.pipeline!r}: the ledger is older than the sink. Committing "
                    f"checkpoint {c.checkpoint_id}, shard {c.shard}'s commit marker (or output) "
                    f"already shows checkpoint {done}: checkpoints commit in order, so this "
                    "ledger was restored from an older copy. Nothing more was published by this "
                    "shard. Point ledger_url at the newest ledger of this pipeline."
                )
            if done >= c.checkpoint_id:
                hooks.committed(c.records)
                return ShardResult(c.shard, 0, True, round_)
            hooks.before_begin()
            produced = txn.publish((p, c.batches(p)) for p in c.partitions)
            txn.seal()
            try:
                txn.commit()
            except ProducerLost as exc:
                # Ambiguous: this producer is done for; a new one re-inits (fencing any late
                # request of this one) and the marker decides. Never an abort.
                txn.drop()
                last_failure = str(exc)
                continue
            fault_point("commit.after_commit_txn")
            hooks.committed(produced)
            txn.keep()
            return ShardResult(c.shard, produced, False, round_)
        except Exception as exc:
            if txn.reused and outcome_of(exc) is Outcome.PERMANENT and not txn.outlived_timeout(exc):
                # A kept producer's round: no init_transactions ran. Another process may have
                # fenced the producer while it was idle (then it fails as fenced), or left a
                # transaction open on the id that holds the stable marker read. Whatever it
                # was, redo the round as every round began before producers were kept: a new
                # producer and init_transactions (aborting what is open), then the marker
                # decides; a failure of that round is final as before.
                last_failure = str(exc)
                continue
            if txn.outlived_timeout(exc):
                # The same size would time out again: fail with the numbers, not a redo loop
                # (or a fence blamed on another committer). After commit_transaction only an
                # abortable answer (librdkafka: not committed, abort it) is aborted; a fenced
                # producer cannot abort anyway.
                if not txn.committing or outcome_of(exc) is Outcome.ABORTABLE:
                    txn.abort()
                raise txn.timed_out_error(exc) from exc
            outcome = outcome_of(exc)
            if outcome is Outcome.PERMANENT:
                raise
            if outcome is Outcome.ABORTABLE:
                txn.abort()
                last_failure = txn.failures.describe() if txn.failures else str(exc)
                if txn.failures.permanent:
                    raise txn.refused_record_error(exc) from exc
            # AMBIGUOUS (retries ran out, or the producer was lost): the next round's fresh
            # producer re-inits and the marker decides.
        finally:
            del txn  # a producer not given back to the pool goes with it
    raise CommitError(
        f"{c.where}could not publish after {MAX_SHARD_ROUNDS} rounds of retriable/abortable "
        f"errors (last: {last_failure or 'an ambiguous or retriable failure'}). Nothing from "
        "an unfinished round is visible (aborted or fenced); retry the commit task later — "
        "the marker prevents duplicates."
    )


def fence_id(
    transactional_id: str,
    *,
    config: Mapping[str, Any],
    sink_topic: str,
    transaction_timeout_ms: int,
    where: str,
    clients: KafkaClients = REAL_KAFKA,
) -> None:
    """``init_transactions`` with a fresh producer on ``transactional_id``: bumps its epoch,
    so the broker aborts any open transaction of an earlier producer and fences it. Raises
    :class:`ProducerLost` when the broker did not answer (the caller says what to do)."""
    timeout_s = transaction_timeout_ms / 1000
    # An idle producer this process kept for the id is fenced by this: close it now.
    PRODUCERS.discard(lambda key: isinstance(key, tuple) and key[0] is clients and key[2] == transactional_id)
    producer = clients.producer(config, transactional_id, transaction_timeout_ms, None, None)
    try:
        kafka_call("metadata", connect, producer, sink_topic, timeout_s, where=where)
        kafka_call(
            "init_transactions",
            producer.init_transactions,
            timeout_s,
            where=where,
            denied=lambda err: commit_denied(
                err, f"{where}fencing {transactional_id}", transactional_id=transactional_id, config=config
            ),
        )
    finally:
        del producer


__all__ = [
    "MAX_SHARD_ROUNDS",
    "REAL_KAFKA",
    "KafkaClients",
    "Outcome",
    "Publisher",
    "RealKafka",
    "ShardCommittable",
    "ShardFailure",
    "ShardHooks",
    "ShardResult",
    "ShardRunner",
    "ShardTask",
    "ShardTransaction",
    "commit_shard",
    "fence_id",
    "outcome_of",
    "pool_key",
]
