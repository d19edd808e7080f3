"""SQLAlchemy 2.x models of the checkpoint ledger.

Table names carry an ``eo_`` prefix so the ledger can share a database (even Airflow's
metadata database) without clashing; Alembic's version table is ``eo_alembic_version``
for the same reason. Offsets are ``BigInteger``: Kafka offsets are 64-bit.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from airflow_provider_eo.ledger.states import CheckpointState, ShardState

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

VERSION_TABLE = "eo_alembic_version"

# SQLite has no 64-bit autoincrement type other than INTEGER PRIMARY KEY.
BigId = BigInteger().with_variant(Integer(), "sqlite")

_STATES = ", ".join(f"'{s.value}'" for s in CheckpointState)
_SHARD_STATES = ", ".join(f"'{s.value}'" for s in ShardState)

#: The predicate of the partial index ``ix_eo_checkpoints_unfinished`` (migration 0005). A
#: query uses that index only when its WHERE holds this text as is (literals, this order).
UNFINISHED_PREDICATE = "state IN ('PLANNED', 'PREPARED')"


def _state_column(enum_class: type[enum.Enum]) -> Enum:
    """The enum stored as its value string in a VARCHAR(16), as migration 0001 made it.

    Not a native enum (no ``CREATE TYPE`` on PostgreSQL) and no constraint of its own: the
    tables' named CHECK constraints already list the values.
    """
    return Enum(
        enum_class,
        native_enum=False,
        create_constraint=False,
        length=16,
        validate_strings=True,
        values_callable=lambda members: [m.value for m in members],
    )


class UTCDateTime(TypeDecorator[dt.datetime]):
    """A timezone-aware UTC timestamp on every backend (SQLite drops the zone otherwise)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass an aware UTC datetime")
        value = value.astimezone(dt.timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Pipeline(Base):
    __tablename__ = "eo_pipelines"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    # Hash of the settings that must not change silently (source topics, sink, transform).
    fingerprint: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    # Bumped by every restore/reset; contiguity is only checked inside one lineage.
    current_lineage: Mapped[int] = mapped_column(Integer, default=1)
    # Highest checkpoint id handed out: the compare-and-set that serializes planners.
    last_checkpoint_id: Mapped[int] = mapped_column(Integer, default=0)
    # Random id made when this ledger registered the pipeline; carried by the commit markers.
    identity: Mapped[str] = mapped_column(String(64))
    # Pinned at the first commit: every committer must use it (Kafka fences only one id).
    transactional_id_prefix: Mapped[str | None] = mapped_column(String(200))
    # Stop(-with-savepoint): plan refuses new checkpoints while stopped_at is set.
    stopped_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    stopped_by: Mapped[str | None] = mapped_column(String(500))
    stop_reason: Mapped[str | None] = mapped_column(Text)
    # A backfill pipeline: the live pipeline whose COMMITTED ranges it re-processes.
    backfill_of: Mapped[str | None] = mapped_column(String(200))
    # Widest (max_timestamp - min_timestamp) of any prepared range: bounds the index scan
    # that finds a time interval's ranges (min_timestamp >= start - span).
    max_range_span_ms: Mapped[int | None] = mapped_column(BigInteger)
    # The absolute staging location, pinned at registration (revision 0006): every
    # process of the pipeline stages and reads there, whatever its working folder.
    staging_dir: Mapped[str | None] = mapped_column(Text)


class Lineage(Base):
    """One lineage of a pipeline: lineage 1 at creation, one more per restore/reset."""

    __tablename__ = "eo_lineages"

    pipeline_id: Mapped[int] = mapped_column(
        ForeignKey("eo_pipelines.id", ondelete="CASCADE"), primary_key=True
    )
    lineage: Mapped[int] = mapped_column(Integer, primary_key=True)
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    # Offsets the lineage starts from: [[topic, partition, offset], ...]; [] = anywhere.
    offsets: Mapped[list[Any]] = mapped_column(JSON)
    reason: Mapped[str] = mapped_column(Text, default="")


class Checkpoint(Base):
    __tablename__ = "eo_checkpoints"
    __table_args__ = (
        # unfinished() and last_committed(): an index seek at any table size.
        Index("ix_eo_checkpoints_pipeline_state_id", "pipeline_id", "state", "checkpoint_id"),
        # The PLANNED/PREPARED ones only (a handful at any ledger size): a stream's start.
        Index(
            "ix_eo_checkpoints_unfinished",
            "pipeline_id",
            "checkpoint_id",
            sqlite_where=text(UNFINISHED_PREDICATE),
            postgresql_where=text(UNFINISHED_PREDICATE),
        ),
        CheckConstraint(f"state IN ({_STATES})", name="state"),
    )

    pipeline_id: Mapped[int] = mapped_column(
        ForeignKey("eo_pipelines.id", ondelete="CASCADE"), primary_key=True
    )
    # 1, 2, 3... per pipeline, handed out by Pipeline.last_checkpoint_id.
    checkpoint_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    state: Mapped[CheckpointState] = mapped_column(_state_column(CheckpointState))
    lineage: Mapped[int] = mapped_column(Integer)
    # Attempt id (e.g. Spark attempt folder) whose output won PLANNED -> PREPARED.
    prepared_attempt: Mapped[str | None] = mapped_column(String(200))
    staging_location: Mapped[str | None] = mapped_column(Text)
    # Manifest stats: records actually read/written (never end - start) and staged bytes.
    records: Mapped[int | None] = mapped_column(BigInteger)
    bytes: Mapped[int | None] = mapped_column(BigInteger)
    # {"<shard>": <records>} from the manifest.
    shard_counts: Mapped[dict[str, int] | None] = mapped_column(JSON)
    # Source accounting (revision 0006), what the audit checks every source record against:
    # records read, read but named by no output record (the transform dropped them),
    # output records without a source position, records sent to the dead-letter topic.
    records_read: Mapped[int | None] = mapped_column(BigInteger)
    records_dropped: Mapped[int | None] = mapped_column(BigInteger)
    records_created: Mapped[int | None] = mapped_column(BigInteger)
    dead_letters: Mapped[int | None] = mapped_column(BigInteger)
    planned_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    prepared_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    committed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    aborted_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    # Airflow task instance that last moved this checkpoint (each event keeps its own).
    dag_id: Mapped[str | None] = mapped_column(String(250))
    run_id: Mapped[str | None] = mapped_column(String(250))
    task_id: Mapped[str | None] = mapped_column(String(250))
    try_number: Mapped[int | None] = mapped_column(Integer)
    spark_app_id: Mapped[str | None] = mapped_column(String(200))
    # Commit lease: only this owner may publish until commit_lease_until (CAS-acquired).
    commit_owner: Mapped[str | None] = mapped_column(String(250))
    commit_lease_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    abort_reason: Mapped[str | None] = mapped_column(Text)
    # CommitPlan.to_json(), frozen at plan time (NULL for rows planned before revision 0002).
    commit_plan: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Backfill checkpoints only: read the records with Kafka timestamp in [start, end).
    filter_start_ms: Mapped[int | None] = mapped_column(BigInteger)
    filter_end_ms: Mapped[int | None] = mapped_column(BigInteger)
    # Structured Streaming sink checkpoints only (revision 0008): the query and its micro-batch.
    query_id: Mapped[str | None] = mapped_column(String(64))
    batch_id: Mapped[int | None] = mapped_column(BigInteger)


class CheckpointRange(Base):
    __tablename__ = "eo_checkpoint_ranges"
    __table_args__ = (
        ForeignKeyConstraint(
            ["pipeline_id", "checkpoint_id"],
            ["eo_checkpoints.pipeline_id", "eo_checkpoints.checkpoint_id"],
            ondelete="CASCADE",
            name="fk_eo_checkpoint_ranges_checkpoint",
        ),
        # Backfill / audit: which checkpoints covered this partition, in order.
        Index(
            "ix_eo_checkpoint_ranges_partition",
            "pipeline_id",
            "topic",
            "partition",
            "checkpoint_id",
        ),
        # Backfill: a time interval's ranges by one range scan (see max_range_span_ms).
        Index("ix_eo_checkpoint_ranges_min_timestamp", "pipeline_id", "min_timestamp"),
        CheckConstraint("start_offset <= end_offset", name="bounds"),
    )

    pipeline_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    checkpoint_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    topic: Mapped[str] = mapped_column(String(249), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    # [start_offset, end_offset): start inclusive, end exclusive.
    start_offset: Mapped[int] = mapped_column(BigInteger)
    end_offset: Mapped[int] = mapped_column(BigInteger)
    # Record timestamps (ms since epoch) seen at prepare; NULL until then or when empty.
    min_timestamp: Mapped[int | None] = mapped_column(BigInteger)
    max_timestamp: Mapped[int | None] = mapped_column(BigInteger)
    # on_data_loss=skip: the start retention forced us past; [skipped_from, start) is lost.
    skipped_from: Mapped[int | None] = mapped_column(BigInteger)


class PartitionHead(Base):
    """Where the next checkpoint of a partition must start, kept in step with every write.

    Derived state (a cache of "end of the latest non-aborted checkpoint in the lineage, else
    the restore offset, else the start of an aborted checkpoint to replan"), maintained in
    the same transaction as the writes so planning costs O(partitions) at any ledger size.
    """

    __tablename__ = "eo_partition_heads"

    pipeline_id: Mapped[int] = mapped_column(
        ForeignKey("eo_pipelines.id", ondelete="CASCADE"), primary_key=True
    )
    topic: Mapped[str] = mapped_column(String(249), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    lineage: Mapped[int] = mapped_column(Integer)
    next_start: Mapped[int] = mapped_column(BigInteger)
    # Checkpoint that set next_start (NULL when a restore or an abort set it).
    checkpoint_id: Mapped[int | None] = mapped_column(Integer)


class CommitShard(Base):
    __tablename__ = "eo_commit_shards"
    __table_args__ = (
        ForeignKeyConstraint(
            ["pipeline_id", "checkpoint_id"],
            ["eo_checkpoints.pipeline_id", "eo_checkpoints.checkpoint_id"],
            ondelete="CASCADE",
            name="fk_eo_commit_shards_checkpoint",
        ),
        CheckConstraint(f"state IN ({_SHARD_STATES})", name="state"),
    )

    pipeline_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    checkpoint_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    shard: Mapped[int] = mapped_column(Integer, primary_key=True)
    transactional_id: Mapped[str] = mapped_column(String(250))
    # Producer id/epoch after init_transactions: tells which incarnation published.
    producer_id: Mapped[int | None] = mapped_column(BigInteger)
    producer_epoch: Mapped[int | None] = mapped_column(Integer)
    state: Mapped[ShardState] = mapped_column(_state_column(ShardState))
    records: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())


class Savepoint(Base):
    __tablename__ = "eo_savepoints"
    __table_args__ = (UniqueConstraint("pipeline_id", "name"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    pipeline_id: Mapped[int] = mapped_column(ForeignKey("eo_pipelines.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    # The committed checkpoint the offsets come from (NULL: offsets given by hand).
    checkpoint_id: Mapped[int | None] = mapped_column(Integer)
    # {"topic": {"partition": next_offset}}: JSON object keys are strings.
    offsets: Mapped[dict[str, dict[str, int]]] = mapped_column(JSON)
    note: Mapped[str] = mapped_column(Text, default="")
    created_by: Mapped[str] = mapped_column(String(250), default="")
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    # The pipeline's settings fingerprint when the savepoint was taken.
    fingerprint: Mapped[str | None] = mapped_column(String(200))
    # The Airflow run that took it (None from the CLI).
    dag_id: Mapped[str | None] = mapped_column(String(250))
    run_id: Mapped[str | None] = mapped_column(String(250))


class Event(Base):
    """Append-only: one row per transition, lease, restore, pipeline change."""

    __tablename__ = "eo_events"
    __table_args__ = (Index("ix_eo_events_pipeline_checkpoint", "pipeline_id", "checkpoint_id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    pipeline_id: Mapped[int] = mapped_column(ForeignKey("eo_pipelines.id", ondelete="CASCADE"))
    checkpoint_id: Mapped[int | None] = mapped_column(Integer)
    # transition | restore | lease | pipeline_created | fingerprint_changed | savepoint
    kind: Mapped[str] = mapped_column(String(32))
    from_state: Mapped[CheckpointState | None] = mapped_column(_state_column(CheckpointState))
    to_state: Mapped[CheckpointState | None] = mapped_column(_state_column(CheckpointState))
    # Free text: "dag/run/task#try@host:pid" or whatever the caller passed.
    actor: Mapped[str] = mapped_column(String(500), default="")
    dag_id: Mapped[str | None] = mapped_column(String(250))
    run_id: Mapped[str | None] = mapped_column(String(250))
    task_id: Mapped[str | None] = mapped_column(String(250))
    try_number: Mapped[int | None] = mapped_column(Integer)
    at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    details: Mapped[dict[str, Any]] = mapped_column(JSON)


class StreamRun(Base):
    """One run of a pipeline's streaming application (core/stream.py): who runs it, its
    heartbeat on the database's clock, a stop request, and how it ended.

    At most one run per pipeline is RUNNING with a fresh heartbeat: a second start is refused
    while it lives (``register_stream_run``). The row is what lets Airflow track a detached
    driver without holding a worker slot (``EoStreamOperator(deferrable=True)``).
    """

    __tablename__ = "eo_stream_runs"
    __table_args__ = (Index("ix_eo_stream_runs_pipeline_state", "pipeline_id", "state"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    pipeline_id: Mapped[int] = mapped_column(ForeignKey("eo_pipelines.id", ondelete="CASCADE"))
    run_id: Mapped[str] = mapped_column(String(64), unique=True)
    # RUNNING | ENDED (exited 0) | FAILED (exited with an error) | LOST (no heartbeat: killed)
    state: Mapped[str] = mapped_column(String(16))
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    commit_mode: Mapped[str] = mapped_column(String(16))
    heartbeat_s: Mapped[float] = mapped_column(Float)
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    ended_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    reason: Mapped[str] = mapped_column(Text, default="")
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    stop_requested_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    stop_requested_by: Mapped[str | None] = mapped_column(String(500))
    # Airflow's task that started it (None from the CLI); the log file of a detached driver.
    dag_id: Mapped[str | None] = mapped_column(String(250))
    task_id: Mapped[str | None] = mapped_column(String(250))
    log_path: Mapped[str | None] = mapped_column(Text)


class WatchMark(Base):
    """What an Airflow asset watcher of a pipeline last fired for (migration 0007).

    One row per pipeline and watch (``source``: the source-records watcher; ``stream_commits``:
    the announcer of stream-committed checkpoints). A watcher claims a firing by moving
    ``seq`` with a compare-and-set before it yields the event, so the row survives a
    triggerer restart and two copies of one watcher never fire for the same state. Keyed by
    the pipeline's name, not its id: a source watcher fires before the first plan registers
    the pipeline.
    """

    __tablename__ = "eo_watch_marks"

    pipeline: Mapped[str] = mapped_column(String(200), primary_key=True)
    watch: Mapped[str] = mapped_column(String(64), primary_key=True)
    # Moves by one with every claim; a claim names the seq it read (compare-and-set).
    seq: Mapped[int] = mapped_column(Integer)
    # The watch's own record of what it fired for (JSON; see triggers/source.py, stream.py).
    state: Mapped[dict[str, Any]] = mapped_column(JSON)
    fired_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
