"""The provider's one error tree.

Every error a user can hit derives from :class:`EoError`; each branch's docstring says
what happened and whether data may be at risk (Flink's ``KafkaCommitter`` states this per
failure kind). Messages name the pipeline/checkpoint/partition and what to do next.

::

    EoError
    ├── ConfigError            a setting is impossible or unsafe: change it (nothing read or written)
    │   ├── PipelineConfigError    a pipeline setting
    │   ├── OffsetLogError         the query's checkpoint location lacks what the sink needs
    │   ├── HandoffError           the connection hand-off file is missing or names other connections
    │   ├── StreamArgsError        a streaming setting (interval, heartbeat, bounds, mode)
    │   ├── QueryIdentityMismatch  another query already writes this sink under this name
    │   ├── CheckpointLocationError  the query's checkpoint location cannot be read or copied
    │   └── WatcherSetupError  an asset watcher cannot load its pipeline in the triggerer
    ├── LedgerError            the ledger refused or could not record a transition
    │   ├── CheckpointConflict         someone else moved the checkpoint first
    │   ├── CheckpointNotFound         no such checkpoint, pipeline or savepoint
    │   │   └── SavepointNotFound
    │   ├── InvariantViolation         gap, overlap, too many pending, order
    │   ├── PipelineFingerprintMismatch
    │   ├── CommitLeaseHeld            another committer holds the commit lease: wait or recover
    │   │   └── CommitInProgress       an abort or fence refused while a committer holds it
    │   ├── LedgerUnavailable          the database cannot be reached: retry later
    │   ├── InvalidTransition          not in the state machine's table (a bug)
    │   ├── NothingCommitted           a savepoint of a pipeline with no COMMITTED checkpoint
    │   ├── StreamRunConflict          another run of the streaming application is alive
    │   ├── StreamRunNotFound
    │   ├── StreamRunSuperseded        this run was replaced: stop at once
    │   ├── TransactionalIdPrefixMismatch  another prefix than the pinned one
    │   └── LedgerOnNetworkFilesystem  a SQLite ledger on a network filesystem (also a ConfigError)
    ├── KafkaFailure           Kafka refused or failed a request
    │   ├── KafkaAccessDenied  the broker's ACLs refused an operation on a resource
    │   ├── KafkaAdminError    an admin call (topics, offsets, groups)
    │   │   ├── KafkaLoginRefused  the SASL login or TLS handshake was refused: fix credentials
    │   │   └── TransactionAdminUnavailable  Kafka's Java transaction admin calls could not run
    │   ├── SourceError        a source topic/partition is missing or inconsistent
    │   │   └── DataLossError  planned offsets were deleted before they were read
    │   └── CommitError        a commit could not finish
    │       ├── CommitFenced
    │       ├── TransactionalIdUnauthorized  (also a KafkaAccessDenied)
    │       ├── CommitAccessDenied  ACLs refused a topic or group (also a KafkaAccessDenied)
    │       ├── NotPrepared
    │       ├── TransactionTimedOut  the broker aborted a shard's transaction for its timeout
    │       ├── CheckpointAborted  a spark-mode commit task began after an abort: nothing published
    │       ├── CommitLeaseLost  a spark-mode commit lost its lease: its Spark jobs cancelled
    │       ├── ReadBackBlocked  a missing marker cannot be decided: an open transaction hides
    │       │                    the shard's output
    │       ├── PipelineIdentityMismatch  markers written by another ledger
    │       ├── LedgerBehindSink  the sink shows checkpoints this ledger lacks (an older copy)
    │       ├── ForeignOutputInSink  a new ledger found this name's output from another ledger
    │       ├── PipelineNameInUse  another deployment runs this name (to another sink)
    │       └── AbortRefused   an abort was refused (live committer, published shard, COMMITTED)
    ├── BatchOutOfStep         a query's batch and the ledger disagree (a foreign checkpoint location)
    │   └── BatchRangesDiffer  the offset log gives a batch other ranges than the ledger
    ├── StagingError           staged output missing or not matching its manifest
    ├── StagingUnreadable      staging could not be read (I/O): retry, nothing aborted
    │   └── StagingNotVisible  the manifest is not visible from this process (another host?)
    ├── PrepareError           the prepare job refused the checkpoint
    │   ├── TransformError     the user's transform failed (a record, or its code)
    │   ├── SparkEnvironmentError  the executors' environment failed (no record to blame)
    │   └── DeadLetterTooLarge  a dead letter is over the dead-letter topic's limit
    ├── PipelineStopped        the pipeline is stopped: no new checkpoint is planned
    ├── SavepointError         a savepoint could not be taken
    │   └── SavepointTimeout   in-flight checkpoints did not finish within the wait
    ├── RestoreRefused         a restore/reset was refused (partitions differ, offsets gone)
    ├── BackfillRefused        a backfill request was refused before anything was planned
    ├── RecoverError           `eo recover` could not fence or finish (nothing published twice)
    └── StackError             the local development stack
        └── DemoNeedsCheckout  the Airflow demo needs a source checkout's dags/

Every class is defined here; the modules that raise them export them too
(``ledger.errors``, ``stack.errors``, ``pipeline.PipelineConfigError``, ...).
A spark-mode commit task's error is rebuilt in the driver by its class name in this module.

The operators' and sensors' task failures derive from Airflow's ``AirflowException``
instead (Airflow reads them), so they live beside their operators.

:class:`ControlSignal` is not part of the tree: its subclasses are raised and caught inside
the provider to steer a retry loop and never reach a user.

This module imports nothing from the package, so every layer (the ledger included) may
derive from it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any


class EoError(RuntimeError):
    """Root of the provider's errors. The CLI and the operators catch this one class."""


class ConfigError(EoError, ValueError):
    """A setting is impossible or unsafe. Nothing was read or written; change the setting."""


class OffsetLogError(ConfigError):
    """The query's checkpoint location lacks, or holds in an unknown form, what the sink needs."""


class HandoffError(ConfigError):
    """The connection hand-off file is missing, unreadable or names other connections."""


class StreamArgsError(ConfigError):
    """A streaming setting is impossible (commit mode, interval, heartbeat, bounds). Nothing
    was read or written; change the setting.

    ``str()`` names the settings as the Python API and the operator do (``interval``);
    :attr:`cli_message` as ``eo stream``'s flags (``--interval``).
    """

    def __init__(self, message: str, *, cli_message: str) -> None:
        super().__init__(message)
        self.cli_message = cli_message


class QueryIdentityMismatch(ConfigError):
    """Another Structured Streaming query (another checkpoint location) already writes this
    sink under this name."""


class PipelineConfigError(ConfigError):
    """An impossible or unsafe pipeline setting; the message says what to change."""


class CheckpointLocationError(ConfigError):
    """The query's checkpoint location (or a copy's destination) cannot be read, lacks what
    is asked of it, or is not empty where a copy is to be written; nothing was copied."""


class WatcherSetupError(ConfigError):
    """An Airflow asset watcher of a pipeline cannot run where the triggerer runs it: the
    pipeline's module cannot be imported there and the settings recorded when the DAG was
    parsed do not suffice (a secret left out and no connection to supply it), or a connection
    it names is not defined there. Nothing was read or written. Install the pipeline's module
    where the triggerer runs (Airflow's triggerer does not load DAG bundles), or name the
    cluster and the ledger by connection (``kafka_conn_id`` / ``ledger_conn_id``)."""


class LedgerError(EoError):
    """The ledger refused or could not record something. Its transitions are atomic: a
    refused one changed nothing, so no data is at risk; the message says what to do."""


class CheckpointConflict(LedgerError):
    """A conditional transition matched no row: someone else moved the checkpoint first."""

    def __init__(
        self,
        message: str,
        *,
        pipeline: str = "",
        checkpoint_id: int | None = None,
        expected: str | None = None,
        actual: str | None = None,
    ) -> None:
        super().__init__(message)
        self.pipeline = pipeline
        self.checkpoint_id = checkpoint_id
        self.expected = expected
        self.actual = actual


class CheckpointNotFound(LedgerError):
    """No checkpoint (or pipeline, or savepoint) with that id."""


class InvariantViolation(LedgerError):
    """A request would break a ledger invariant (gap, overlap, too many pending, order)."""


class PipelineFingerprintMismatch(LedgerError):
    """The pipeline's settings changed since its checkpoints were recorded."""


class CommitLeaseHeld(LedgerError):
    """Another committer holds an unexpired commit lease on the checkpoint."""

    def __init__(self, message: str, *, owner: str | None = None) -> None:
        super().__init__(message)
        self.owner = owner


class LedgerUnavailable(LedgerError):
    """The ledger database cannot be reached; nothing was changed, retry later."""


class SavepointNotFound(CheckpointNotFound):
    """No savepoint with that name for the pipeline."""


class InvalidTransition(LedgerError):
    """A move that is not in the state machine's table of allowed transitions.

    A programming error, not a race: the ledger refuses it before touching the row, so
    nothing changed and no data is at risk.
    """

    def __init__(self, message: str, *, pipeline: str, checkpoint_id: int, source: str, target: str) -> None:
        super().__init__(message)
        self.pipeline = pipeline
        self.checkpoint_id = checkpoint_id
        self.source = source
        self.target = target


class NothingCommitted(LedgerError):
    """A savepoint was asked for a pipeline with no COMMITTED checkpoint (at or below the
    one in flight): there is no consistent position to name yet. Nothing was recorded; run
    the pipeline until a checkpoint commits, then ask again."""


class StreamRunConflict(LedgerError):
    """Another run of the pipeline's streaming application is alive (``other``: its
    :class:`~airflow_provider_eo.ledger.records.StreamRunRecord`)."""

    def __init__(self, message: str, other: Any) -> None:
        super().__init__(message)
        self.other = other


class StreamRunNotFound(LedgerError):
    """No stream run with that id in the ledger (not registered yet, or another ledger)."""


class StreamRunSuperseded(LedgerError):
    """This run's row is no longer RUNNING (declared LOST and replaced, or ended by someone
    else): the process must stop at once."""


class TransactionalIdPrefixMismatch(LedgerError):
    """A committer or planner is configured with another transactional-id prefix than the
    one pinned for the pipeline. Refused before anything is produced, so no data is at risk:
    Kafka fences committers only within one transactional id, so one pipeline has one
    prefix for life."""

    def __init__(self, message: str, *, pipeline: str, pinned: str, configured: str) -> None:
        super().__init__(message)
        self.pipeline = pipeline
        self.pinned = pinned
        self.configured = configured


class LedgerOnNetworkFilesystem(LedgerError, ConfigError):
    """The SQLite ledger file would live on a network filesystem, where SQLite's WAL and
    file locks are unreliable. Nothing was opened or created; put the file on a local disk
    or use PostgreSQL."""


class CommitInProgress(CommitLeaseHeld):
    """A committer holds the commit lease of a checkpoint of the pipeline: aborting it, or
    fencing the pipeline's transactional ids (shared by all its checkpoints), would let it
    publish what the abort replans or kill it. Nothing was changed, no data is at risk: wait
    until its lease runs out (``until``) or for that commit to finish, or stop it first; when
    that committer is known to be dead, ``--force-live`` (``force_live=True``) takes its lease
    at once. ``lost``: the refused fencer had held the lease and a committer took it over, so
    that committer is alive and ``--force-live`` is no way out."""

    def __init__(
        self,
        message: str,
        *,
        pipeline: str,
        checkpoint_id: int,
        owner: str | None,
        until: dt.datetime | None,
        lost: bool = False,
    ) -> None:
        super().__init__(message, owner=owner)
        self.pipeline = pipeline
        self.checkpoint_id = checkpoint_id
        self.until = until
        self.lost = lost


class KafkaFailure(EoError):
    """Kafka refused or failed a request. The message says whether data may be affected."""


class KafkaAccessDenied(KafkaFailure):
    """The broker's ACLs refused this principal an operation on a resource (a topic, a
    consumer group, a transactional id, the cluster). An environment failure, not bad data:
    never retried, never blamed on a record. Nothing was published or committed by the
    refused call; the message names the operation and the resource and gives the
    ``kafka-acls`` command that grants it (``eo doctor --acls`` prints every ACL a
    pipeline needs)."""

    #: The refused operation (``READ``, ``WRITE``, ``DESCRIBE``, ...), the resource type
    #: (``topic``, ``group``, ``transactional-id``, ``cluster``) and its name.
    operation: str = ""
    resource_type: str = ""
    resource: str = ""


class KafkaAdminError(KafkaFailure):
    """A Kafka admin call (topics, offsets, groups) failed. Nothing was published or committed."""


class KafkaLoginRefused(KafkaAdminError):
    """The cluster refused the client's SASL login or TLS handshake (wrong password, unknown
    user, mechanism not enabled, untrusted certificate). Nothing was read or written; fix
    the credentials or certificates."""


class TransactionAdminUnavailable(KafkaAdminError):
    """Kafka's transaction admin calls (list, describe, abort: the Java client's, which
    librdkafka lacks) could not run or did not answer: no Java runtime, no kafka-clients jar,
    refused by the broker (ACLs) or timed out. Nothing was aborted; the message names what is
    missing and how to provide it."""


class SourceError(KafkaFailure):
    """A source topic/partition is missing or its offsets make no sense. Nothing was read or
    published; fix the topic (or the pipeline's source list) and retry."""


class DataLossError(SourceError):
    """Planned offsets were deleted by retention before the pipeline read them.

    Those records are gone from Kafka: data is lost unless another copy exists. The message
    names the ranges.
    """

    #: The PLANNED checkpoint whose ranges are gone (None: offsets not planned yet).
    checkpoint_id: int | None = None


class BatchOutOfStep(EoError):
    """The query's batch and the ledger disagree in a way only a tampered or foreign
    checkpoint location explains; nothing was staged or published."""


class BatchRangesDiffer(BatchOutOfStep):
    """The query's offset log gives a batch other ranges than the ledger recorded for it
    (or ranges past what the pipeline published, for a batch it holds no checkpoint of):
    the checkpoint location is not the one that wrote the ledger's batches. Skipping the
    batch would let Spark record it done with records never published; nothing was staged
    or published. Restart the query from the location that wrote the ledger's batches, or
    write this query under another pipeline name."""


class CommitError(KafkaFailure):
    """A commit could not finish. No duplicate is possible (the retry decides by the commit
    marker); the message says whether any output is at risk."""


class CommitFenced(CommitError):
    """Another producer with the same transactional id took over (or this one was fenced
    after a pause past ``transaction.timeout.ms``). This committer's open transaction is
    aborted by the broker: none of its records become visible, no data is at risk."""


class TransactionalIdUnauthorized(CommitError, KafkaAccessDenied):
    """The broker's ACLs do not allow this principal to use the transactional id.

    A configuration problem, not a competing committer: nothing was published. Grant
    ``WRITE``/``DESCRIBE`` on the transactional id (prefix) and retry.
    """


class CommitAccessDenied(CommitError, KafkaAccessDenied):
    """The broker's ACLs refused the commit a sink or dead-letter topic (WRITE, READ) or a
    consumer group (READ). The shard's transaction was aborted: nothing of it is visible,
    the checkpoint stays PREPARED. Grant the ACL the message names and retry the commit."""


class NotPrepared(CommitError):
    """The checkpoint to commit is not PREPARED yet; nothing was published. Run (or retry)
    its prepare step first."""


class AbortRefused(CommitError):
    """An abort was refused: the checkpoint is COMMITTED, a live committer may still publish
    it, or a shard already published it. Nothing was aborted; the message says whether
    data is at risk and what to do. While a committer's lease runs, that is: wait until the
    time it names, or, only if that committer is known to be dead, ``eo abort --force-live``
    (a live committer would be fenced)."""


class PipelineIdentityMismatch(CommitError):
    """The pipeline's commit markers were written by another ledger (a re-created ledger, or
    a second deployment with the same pipeline name on the same Kafka cluster).

    Nothing was planned or published: trusting those markers would skip publishing (silent
    loss). Point the pipeline at its original ledger; to start over on purpose, use a new
    pipeline name, or delete the marker group (``kafka-consumer-groups --delete --group``).
    """


class StagingError(EoError):
    """Staged output is missing or does not match its manifest: nothing is published from it."""


class StagingUnreadable(EoError):
    """The staging area could not be read (an I/O error: storage down, a transient S3/HDFS
    failure, permissions). Nothing was published and nothing was aborted: the staged output
    may be intact, so retry the commit once the storage answers.

    Not a :class:`StagingError` on purpose: only a verified mismatch aborts a checkpoint.
    """


class StagingNotVisible(StagingUnreadable):
    """The checkpoint's manifest is not visible from this process: absent is not corrupt (the
    staged output may be intact where it was written, e.g. a local ``staging_dir`` on another
    host). Nothing was published and nothing was aborted; run the commit where the staging
    location is visible, or abort the checkpoint on purpose (``eo abort``) if its staged
    output is really gone (its range is replanned)."""


class PrepareError(EoError):
    """The prepare job refused the checkpoint (bad transform output, oversized record, ...).

    Nothing was published; the checkpoint stays PLANNED and is retryable after the fix.
    """


class TransformError(PrepareError):
    """The user's transform raised; the message names the checkpoint and, when found, the
    record. Nothing was published."""


class SparkEnvironmentError(PrepareError):
    """The Spark job failed because of the executors' environment, not a record: the
    transform's module is not importable there, the driver's and the workers' Pythons
    differ, a function cannot be pickled. Nothing was published and no record is blamed;
    fix the deployment (ship the module with ``py_files``/archives, align the Pythons) and
    retry the prepare."""


class DeadLetterTooLarge(PrepareError):
    """A dead letter (the whole source record the transform failed on, or whose output the
    sink refused as too large) is larger than the dead-letter topic's ``max.message.bytes``:
    it could never be sent, so the checkpoint is refused before its commit. Nothing was
    published; the checkpoint stays PLANNED. Raise the dead-letter topic's
    ``max.message.bytes``, or fix the transform so the record is published or dropped, and
    retry the prepare."""


class BackfillRefused(EoError):
    """A backfill request was refused before anything was planned (unknown or never
    committed pipeline, an empty interval, the live sink as the target, a missing sink
    topic, another transform for an existing backfill target). Nothing was read, published
    or recorded; the message says what to change."""


class RecoverError(EoError):
    """``eo recover`` could not fence the pipeline's transactional ids or finish its
    unfinished checkpoint. Fencing only aborts what was never committed and a commit
    publishes only what the markers lack, so a retry is always safe. Refused while a
    committer's lease runs: wait until the time it names, or, only if that committer is
    known to be dead, ``eo recover --force-live`` (a live committer would be fenced)."""


class ControlSignal(Exception):
    """Base of the provider's internal control-flow signals (not user errors).

    Raised and caught inside one retry loop; reaching a user means a bug in the provider.
    """


class PipelineStopped(EoError):
    """The pipeline is stopped (``eo stop`` or a stop-with-savepoint): no new checkpoint is
    planned until ``eo resume``. Not a failure and no data is at risk: an unfinished
    checkpoint still finishes, nothing else is read or published.

    The CLI exits with code 3 for it (``eo plan``, ``eo run-once``).
    """

    def __init__(
        self,
        message: str,
        *,
        pipeline: str = "",
        stopped_by: str | None = None,
        stopped_at: str | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.pipeline = pipeline
        self.stopped_by = stopped_by
        self.stopped_at = stopped_at
        self.reason = reason

    @classmethod
    def of(
        cls, pipeline: str, *, stopped_by: str | None, stopped_at: str | None, reason: str | None
    ) -> PipelineStopped:
        """The error for ``pipeline``, naming who stopped it, when and why."""
        return cls(
            f"pipeline {pipeline!r} is stopped (by {stopped_by or 'unknown'} at "
            f"{stopped_at or 'unknown time'}: {reason or 'no reason given'}): no new checkpoint "
            "is planned and nothing unfinished is left. Resume it with `eo resume MODULE:ATTR` "
            "(or restore it from a savepoint first, then resume).",
            pipeline=pipeline,
            stopped_by=stopped_by,
            stopped_at=stopped_at,
            reason=reason,
        )


class SavepointError(EoError):
    """A savepoint could not be taken. Taking one never changes output, so no data is at
    risk; the message says what to do (and whether a stop was left in place)."""


class SavepointTimeout(SavepointError):
    """The checkpoints in flight when the savepoint was requested did not finish within the
    wait. No savepoint was recorded; a stop requested with it stays in place (the message
    says so). Finish or abort the checkpoint and ask again, or wait longer."""


class RestoreRefused(EoError):
    """A restore or reset was refused before anything changed: the savepoint's partitions
    differ from the source topics', or an offset lies outside what Kafka still holds. The
    message lists every difference and what to do."""


class TransactionTimedOut(CommitError):
    """A shard's Kafka transaction stayed open longer than ``transaction.timeout.ms``, so the
    broker aborted it. Nothing of it is visible and no data is at risk; the checkpoint stays
    PREPARED. A redo of the same size would time out again: raise the pipeline's
    ``transaction_timeout_ms`` (up to the broker's ``transaction.max.timeout.ms``) and retry
    the commit, or abort the checkpoint and lower ``max_records_per_checkpoint`` so its range
    is replanned smaller. The message names the transactional id, the timeout, the records
    and the measured publish time."""


class CheckpointAborted(CommitError):
    """A spark-mode commit task began a shard's transaction after an abort of its checkpoint
    had fenced the shard and left its abort mark (consumer group ``eo-aborted.<name>``): it
    published nothing, since the abort's range is replanned. No data is at risk. If the ledger
    still shows the checkpoint PREPARED, the abort did not finish: run ``eo abort`` for it
    again."""


class CommitLeaseLost(CommitError):
    """A spark-mode commit could not keep its commit lease (the ledger did not answer until
    the lease would lapse, or another committer or an abort took it over), so its Spark jobs
    were cancelled: no queued task of it begins. Shards that committed are published (their
    markers show it); nothing of an unfinished one is visible. No data is at risk: retry the
    commit (the markers prevent duplicates), unless an abort took the checkpoint over."""


class ReadBackBlocked(CommitError):
    """A shard's commit marker is missing and reading its committed output back cannot
    decide which checkpoint it last published: a transaction stays open on the sink
    partition and hides this pipeline's records beyond its start from ``read_committed``
    readers. Deciding from what is visible could publish twice, so nothing was published;
    the checkpoint stays PREPARED. The message names the partition, its last stable offset
    and high watermark and how to find the open transaction's owner; retry the commit once
    it has finished."""


class LedgerBehindSink(CommitError):
    """The sink shows checkpoints of this pipeline (same ledger identity) that the ledger does
    not have: the ledger was restored from an older copy (a backup, a VM snapshot). Planning
    from it would re-issue checkpoint ids the sink already holds with other ranges (their
    output skipped as published: silent loss) or publish again (duplicates), so nothing was
    planned or published. Point the pipeline at its newest ledger; if this copy is all there
    is, reset it to where the sink's output ends (the message names the offsets)."""


class ForeignOutputInSink(CommitError):
    """A new ledger found output of this pipeline name written by another ledger in the sink
    (a re-created ledger whose commit markers expired, or a second deployment with the same
    name and sink). Starting would publish that input again, so nothing was planned. The
    message names what was found and the choices: reset to where that output ends, or use
    another pipeline name."""


class PipelineNameInUse(CommitError):
    """Another deployment runs a pipeline with this name on this Kafka cluster: the commit
    markers (consumer group ``eo-marker.<name>``) on a topic other than this pipeline's sink
    name another ledger identity. Two deployments of one name share their transactional ids
    (their committers fence each other) and the default consumer group (each moves the
    other's source offsets), so this one was refused before anything was planned or
    published: no data is at risk. The message names the other identity, the topics it
    publishes to and the choices: another pipeline name for one of the two, or, if that
    deployment is retired for good, deleting its markers."""


class StackError(EoError):
    """The local development stack could not be fetched, started or stopped; the message says
    what to do. It holds no pipeline data: nothing is at risk."""


class DemoNeedsCheckout(StackError):
    """The Airflow demo runs the example DAGs of a source checkout's ``dags/`` folder, which
    the installed package does not ship. Nothing was started; no data is involved."""
