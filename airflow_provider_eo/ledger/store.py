"""The checkpoint ledger's front: :class:`Ledger`, the one place that decides what a
pipeline has read and published.

Each method states its contract and delegates to the module that owns the concept:

=====================  ==================================================================
``engine``             connection settings, SQLite pragmas, session scopes, the clock
``schema``             Alembic revisions, upgrade/downgrade, the check made on open
``pipelines``          registration and the settings fingerprint
``reads``              row lookups and read-only queries
``transitions``        plan, prepare, commit, abort: each one conditional UPDATE
``leases``             the commit lease and the commit shard rows
``lineage``            partition heads and restore (a recorded lineage break)
``savepoints``         named, retained offsets
``events``             the append-only event log
``mapping``            row -> record
=====================  ==================================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Engine

from airflow_provider_eo.ledger import (
    events,
    leases,
    lineage,
    pipelines,
    reads,
    savepoints,
    schema,
    transitions,
)
from airflow_provider_eo.ledger.engine import Database
from airflow_provider_eo.ledger.records import (
    Actor,
    CheckpointRecord,
    CommitPlan,
    EventRecord,
    PipelineRecord,
    RangeSpec,
    SavepointRecord,
    TopicPartition,
)
from airflow_provider_eo.ledger.states import ShardState


class Ledger:
    """The checkpoint ledger on a SQL database.

    :param url: SQLAlchemy URL: ``sqlite:///path/ledger.db`` (embedded) or
        ``postgresql+psycopg://user:pw@host:5432/db`` (production).
    :param create: SQLite: create the file and upgrade the schema to head. Other
        databases: create the schema when the database has none, and refuse to run
        on an older schema (run ``eo ledger upgrade`` explicitly for those).
    """

    def __init__(self, url: str, *, create: bool = True) -> None:
        self._db = Database(url)
        #: The URL with its password masked: safe to print and log.
        self.url = self._db.url
        if create:
            schema.prepare_schema(self._db)

    # -- plumbing ------------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        return self._db.engine

    @property
    def dialect(self) -> str:
        return self._db.dialect

    def close(self) -> None:
        """Close pooled connections (the ledger stays usable; connections reopen lazily)."""
        self._db.engine.dispose()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- schema ----------------------------------------------------------------------------

    def head_revision(self) -> str:
        """The schema revision this package needs."""
        return schema.head_revision()

    def current_revision(self) -> str | None:
        """The schema revision in the database, None when it has no ledger schema."""
        return schema.current_revision(self._db)

    def upgrade(self, revision: str = "head") -> None:
        """Migrate the schema up to ``revision`` (idempotent)."""
        schema.upgrade(self._db, revision)

    def downgrade(self, revision: str = "base") -> None:
        """Migrate the schema down to ``revision``; ``base`` drops every ledger table."""
        schema.downgrade(self._db, revision)

    # -- pipelines -------------------------------------------------------------------------

    def ensure_pipeline(
        self, name: str, fingerprint: str, *, allow_fingerprint_change: bool = False
    ) -> PipelineRecord:
        """Register the pipeline, or check that its settings' fingerprint did not change.

        Idempotent: calling it again with the same fingerprint changes nothing.
        """
        return pipelines.ensure_pipeline(
            self._db, name, fingerprint, allow_fingerprint_change=allow_fingerprint_change
        )

    def pin_transactional_id_prefix(self, name: str, prefix: str) -> str:
        """Pin the pipeline's transactional-id prefix, or check ``prefix`` against it.

        One conditional UPDATE (``... WHERE transactional_id_prefix IS NULL``), then a
        compare: a process configured with another prefix gets
        :class:`~airflow_provider_eo.ledger.pipelines.TransactionalIdPrefixMismatch` (Kafka
        fences committers only within one transactional id). Idempotent; returns the prefix.
        """
        return pipelines.pin_transactional_id_prefix(self._db, name, prefix)

    def get_pipeline(self, name: str) -> PipelineRecord:
        """The pipeline's record; CheckpointNotFound when it is not registered."""
        return reads.get_pipeline(self._db, name)

    def list_pipelines(self) -> list[PipelineRecord]:
        """Every registered pipeline, by name."""
        return reads.list_pipelines(self._db)

    # -- reading checkpoints -----------------------------------------------------------------

    def unfinished(self, pipeline: str) -> CheckpointRecord | None:
        """The lowest-id PLANNED or PREPARED checkpoint: the one a retry must resume."""
        return reads.unfinished(self._db, pipeline)

    def last_committed(self, pipeline: str) -> CheckpointRecord | None:
        """The highest-id COMMITTED checkpoint, None before the first commit."""
        return reads.last_committed(self._db, pipeline)

    def get(self, pipeline: str, checkpoint_id: int) -> CheckpointRecord:
        """One checkpoint; CheckpointNotFound when absent."""
        return reads.get(self._db, pipeline, checkpoint_id)

    def list_checkpoints(self, pipeline: str, *, limit: int | None = None) -> list[CheckpointRecord]:
        """Checkpoints in id order; with ``limit``, the latest ``limit`` of them."""
        return reads.list_checkpoints(self._db, pipeline, limit=limit)

    def next_starts(self, pipeline: str) -> dict[TopicPartition, int]:
        """Where the next checkpoint of each known partition must start.

        Per partition: the end of the latest non-aborted checkpoint of the current lineage,
        else the lineage's restore offset, else the start of the aborted checkpoint whose
        range must be replanned. Partitions absent here may start anywhere.
        """
        return reads.next_starts(self._db, pipeline)

    def events(self, pipeline: str, checkpoint_id: int | None = None) -> list[EventRecord]:
        """The append-only event log of the pipeline (or of one checkpoint), oldest first."""
        return events.list_events(self._db, pipeline, checkpoint_id)

    # -- transitions -----------------------------------------------------------------------

    def plan(
        self,
        pipeline: str,
        ranges: Sequence[RangeSpec],
        *,
        max_pending: int = 1,
        actor: Actor | None = None,
        details: dict[str, Any] | None = None,
        commit_plan: CommitPlan | None = None,
    ) -> CheckpointRecord:
        """Record the next checkpoint (PLANNED) reading exactly ``ranges``.

        Refuses (InvariantViolation) a gap or an overlap with where each partition must
        start (see :meth:`next_starts`), a repeated partition, and more than
        ``max_pending`` unfinished checkpoints. Not idempotent by itself: callers resume
        :meth:`unfinished` first; two concurrent planners cannot both succeed.

        ``commit_plan`` (how the checkpoint will be published) is stored in the same
        transaction, and its transactional-id prefix is pinned for the pipeline (a plan
        with another prefix than the pinned one is refused).
        """
        return transitions.plan(
            self._db,
            pipeline,
            ranges,
            max_pending=max_pending,
            actor=actor,
            details=details,
            commit_plan=commit_plan,
        )

    def freeze_commit_plan(
        self,
        pipeline: str,
        checkpoint_id: int,
        commit_plan: CommitPlan,
        *,
        actor: Actor | None = None,
    ) -> CheckpointRecord:
        """Give an unfinished checkpoint planned before ledger revision 0002 its commit plan.

        One conditional UPDATE (``... WHERE commit_plan IS NULL``): the first caller's plan
        wins and every caller gets the checkpoint with the plan that won. Pins the plan's
        transactional-id prefix like :meth:`plan`. CheckpointConflict when the checkpoint is
        finished and has no plan.
        """
        return transitions.freeze_commit_plan(self._db, pipeline, checkpoint_id, commit_plan, actor=actor)

    def mark_prepared(
        self,
        pipeline: str,
        checkpoint_id: int,
        *,
        attempt: str,
        staging_location: str,
        records: int,
        bytes_: int,
        shard_counts: Mapping[int, int],
        range_stats: Mapping[TopicPartition, tuple[int | None, int | None]] | None = None,
        spark_app_id: str | None = None,
        actor: Actor | None = None,
    ) -> CheckpointRecord:
        """PLANNED -> PREPARED, naming the attempt whose staged output wins.

        Idempotent for the winning attempt: preparing again with the same ``attempt``
        returns the record; any other attempt gets :class:`CheckpointConflict`.
        """
        return transitions.mark_prepared(
            self._db,
            pipeline,
            checkpoint_id,
            attempt=attempt,
            staging_location=staging_location,
            records=records,
            bytes_=bytes_,
            shard_counts=shard_counts,
            range_stats=range_stats,
            spark_app_id=spark_app_id,
            actor=actor,
        )

    def mark_committed(
        self, pipeline: str, checkpoint_id: int, *, actor: Actor | None = None
    ) -> CheckpointRecord:
        """PREPARED -> COMMITTED once every shard's transaction committed.

        Idempotent: committing a COMMITTED checkpoint does nothing and returns it. Refuses
        (InvariantViolation) while an earlier checkpoint is unfinished or a shard of its
        commit plan is not recorded COMMITTED (without a plan: while a recorded shard is
        still PENDING).
        """
        return transitions.mark_committed(self._db, pipeline, checkpoint_id, actor=actor)

    def abort(
        self, pipeline: str, checkpoint_id: int, *, reason: str, actor: Actor | None = None
    ) -> CheckpointRecord:
        """PLANNED/PREPARED -> ABORTED; the range is replanned from the same start.

        Idempotent: aborting an ABORTED checkpoint does nothing. A COMMITTED checkpoint
        cannot be aborted (CheckpointConflict). Later unfinished checkpoints are aborted
        with it (their ranges continue this one's, so they could never commit without a
        gap). Only abort a PREPARED checkpoint after the commit markers show that no shard
        published it.
        """
        return transitions.abort(self._db, pipeline, checkpoint_id, reason=reason, actor=actor)

    # -- commit lease and shards -------------------------------------------------------------

    def acquire_commit_lease(
        self, pipeline: str, checkpoint_id: int, *, owner: str, ttl_s: float
    ) -> CheckpointRecord:
        """Become the only committer of a PREPARED checkpoint until ``now + ttl_s``.

        A compare-and-set: succeeds when nobody holds the lease, when ``owner`` already
        holds it (renewal), or when the holder's lease expired (take-over). Otherwise
        :class:`CommitLeaseHeld`. Times are the database's clock, never this worker's. The
        lease keeps healthy committers from fencing each other; it is not what stops a
        duplicate (a pause beats any lease): the pinned transactional-id prefix is, since
        it lets Kafka fence every earlier committer.
        """
        return leases.acquire_commit_lease(self._db, pipeline, checkpoint_id, owner=owner, ttl_s=ttl_s)

    def release_commit_lease(self, pipeline: str, checkpoint_id: int, *, owner: str) -> bool:
        """Give up ``owner``'s lease early; False (nothing changed) when it does not hold it."""
        return leases.release_commit_lease(self._db, pipeline, checkpoint_id, owner=owner)

    def record_shard(
        self,
        pipeline: str,
        checkpoint_id: int,
        shard: int,
        *,
        transactional_id: str,
        producer_id: int | None,
        producer_epoch: int | None,
        state: ShardState | str,
        records: int,
    ) -> None:
        """Upsert one commit shard's progress. A COMMITTED shard never goes back to PENDING
        (InvariantViolation); recording the same thing twice is a no-op. ``state`` is a
        :class:`ShardState` or its value (ValueError for anything else)."""
        leases.record_shard(
            self._db,
            pipeline,
            checkpoint_id,
            shard,
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            state=ShardState(state),
            records=records,
        )

    # -- savepoints and restore --------------------------------------------------------------

    def create_savepoint(
        self,
        pipeline: str,
        name: str,
        *,
        checkpoint_id: int | None,
        offsets: Mapping[str, Mapping[int, int]],
        note: str = "",
        created_by: str = "",
    ) -> SavepointRecord:
        """A named, retained copy of offsets (``{"topic": {partition: next_offset}}``).

        ``checkpoint_id``, when given, must be COMMITTED. Names are unique per pipeline
        (InvariantViolation on reuse).
        """
        return savepoints.create_savepoint(
            self._db,
            pipeline,
            name,
            checkpoint_id=checkpoint_id,
            offsets=offsets,
            note=note,
            created_by=created_by,
        )

    def get_savepoint(self, pipeline: str, name: str) -> SavepointRecord:
        """The named savepoint; SavepointNotFound when absent."""
        return savepoints.get_savepoint(self._db, pipeline, name)

    def list_savepoints(self, pipeline: str) -> list[SavepointRecord]:
        """The pipeline's savepoints, oldest first."""
        return savepoints.list_savepoints(self._db, pipeline)

    def restore(
        self,
        pipeline: str,
        offsets: Mapping[TopicPartition, int],
        *,
        reason: str,
        actor: Actor | None = None,
    ) -> int:
        """Start a new lineage whose partitions start at ``offsets`` (an explicit break).

        Returns the new lineage number. Partitions not in ``offsets`` may start anywhere
        (``offsets={}`` is a full reset). Refuses while a checkpoint is unfinished.
        """
        return lineage.restore(self._db, pipeline, offsets, reason=reason, actor=actor)
