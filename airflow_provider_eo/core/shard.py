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
from collections.abc import Callable, Hashable, Iterable
from time import monotonic
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaException

from airflow_provider_eo import names, staging
from airflow_provider_eo.core.committable import (
    Publisher,
    ShardCommittable,
    ShardFailure,
    ShardHooks,
    ShardResult,
    ShardRunner,
    ShardTask,
)
from airflow_provider_eo.core.fault_seam import fault_point, fault_triggered
from airflow_provider_eo.core.kafka_clients import KafkaClients, RealKafka
from airflow_provider_eo.core.markers import NO_MARKER, decide_marker
from airflow_provider_eo.core.shard_errors import refused_record_error, timed_out_error, write_denied_error
from airflow_provider_eo.errors import (
    CommitAccessDenied,
    CommitError,
    CommitFenced,
    LedgerBehindSink,
    TransactionTimedOut,
)
from airflow_provider_eo.kafka.acls import commit_denied
from airflow_provider_eo.kafka.admin import unwritable_topic
from airflow_provider_eo.kafka.publisher import (
    Abortable,
    DeliveryFailures,
    ProducerLost,
    ProducerPool,
    Sent,
    connect,
    fatal_cause,
    kafka_call,
    known_commit_outcome,
    offsets,
    produce_dead_letters,
    produce_staged,
    serve,
    sorted_error,
)

#: Rounds of abort-and-redo / re-init before a shard gives up (retry the commit later).
MAX_SHARD_ROUNDS = 5
#: Seconds an abort waits for the producer's in-flight records before it gives up (see
#: :meth:`ShardTransaction.abort`).
ABORT_WAIT_S = 10.0


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
        clients: KafkaClients,
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
            c.transactional_id, c.transaction_timeout_ms, self.failures, c.topic_max_bytes, config=c.config
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
        found = self.clients.committed_marks(c.marker_group, [(c.sink_topic, c.shard)])
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
        return self.clients.last_published_checkpoint(c.sink_topic, staged[0], c.pipeline, c.identity)

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
        serve("flush", self.producer.flush, c.timeout_s, where=c.where, in_transaction=True)
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
        """The error for a transaction the broker aborted for its timeout
        (:func:`~airflow_provider_eo.core.shard_errors.timed_out_error`)."""
        return timed_out_error(self.committable, self.open_seconds(), self.sent.records, exc)

    def seal(self) -> None:
        """Send the marker (naming the writing ledger) and, when this shard moves it, the
        pipeline's consumer-group offsets, inside the open transaction."""
        c = self.committable
        fault_point("commit.before_commit_txn")
        kafka_call(
            "send_offsets_to_transaction(marker)",
            self.producer.send_offsets_to_transaction,
            offsets({(c.sink_topic, c.shard): c.checkpoint_id}, names.marker_metadata(c.identity)),
            self.clients.group_metadata(c.marker_group),
            c.timeout_s,
            where=c.where,
            denied=self._denied("the commit marker", c.marker_group, [c.sink_topic]),
        )
        if c.group_id is not None:
            kafka_call(
                "send_offsets_to_transaction(group)",
                self.producer.send_offsets_to_transaction,
                offsets({(t, p): end for t, p, end in c.group_offsets}),
                self.clients.group_metadata(c.group_id),
                c.timeout_s,
                where=c.where,
                denied=self._denied(
                    "the group offsets", c.group_id, sorted({t for t, _, _ in c.group_offsets})
                ),
            )

    def _denied(self, what: str, group: str | None, topics: list[str]) -> Callable[[Any], Exception]:
        """The ACL refusal of one of this shard's transactional calls (never aborted and redone)."""
        c = self.committable
        produced = self.produced_topics()
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
        it anyway), then serve the delivery reports still queued (the cause, if any).

        Waits at most :data:`ABORT_WAIT_S`: librdkafka's abort first waits for every record
        in flight, and after the broker refused a record (MSG_SIZE_TOO_LARGE) the records
        queued behind it on that partition stay in flight until ``message.timeout.ms``
        (~55 s here) although the transaction is lost anyway. The producer is not used
        again after an abort: the next round's producer, or the task's retry, re-inits the
        transactional id, which aborts the transaction and fences this producer's late
        requests (or the broker aborts it at ``transaction.timeout.ms``)."""
        try:
            self.producer.abort_transaction(min(self.committable.timeout_s, ABORT_WAIT_S))
        except Exception:
            pass
        try:
            serve("poll", self.producer.poll, 0)
        except (CommitError, Abortable):
            pass  # a fenced producer: its reports add nothing to the failure being handled

    def produced_topics(self) -> list[str]:
        """The topics this shard's transaction writes: the sink, and its dead-letter topic."""
        c = self.committable
        return [c.sink_topic, *([c.dead_letter_topic] if c.dead_letters and c.dead_letter_topic else [])]

    def write_denied_topic(self) -> str | None:
        """The topic of this shard's output the broker says its principal may not WRITE."""
        return self.clients.write_denied_topic(self.produced_topics())

    def refused_record_error(self, exc: BaseException) -> CommitError:
        """The error for a record the broker refuses every time
        (:func:`~airflow_provider_eo.core.shard_errors.refused_record_error`)."""
        return refused_record_error(self.committable, self.failures)


def commit_shard(
    committable: ShardCommittable,
    hooks: ShardHooks,
    clients: KafkaClients | None = None,
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
    clients = clients if clients is not None else RealKafka(c.config)
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
                if not txn.failures:
                    # No record was refused: the transaction failed as a whole. An ACL that
                    # refuses WRITE on a topic it adds makes it abortable before any record
                    # is sent (librdkafka purges them): every redo would fail the same way.
                    denied = txn.write_denied_topic()
                    if denied is not None:
                        raise write_denied_error(c, denied, exc) from exc
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


__all__ = [
    "MAX_SHARD_ROUNDS",
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
    "outcome_of",
    "pool_key",
]
