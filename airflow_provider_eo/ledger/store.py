"""The checkpoint ledger: the one place that decides what a pipeline has read and published.

Every state change is ONE conditional UPDATE (``... WHERE state = :expected``) plus its
event row, in one database transaction. Zero rows updated means another process won;
the loser raises :class:`CheckpointConflict` naming what it expected and what it found.

Concurrency, per backend:

1. SQLite: every write transaction starts with ``BEGIN IMMEDIATE`` so writers queue on
   the file lock (``busy_timeout``) instead of failing on a stale WAL snapshot; reads
   use a deferred ``BEGIN``.
2. PostgreSQL (READ COMMITTED): writers that change where the next checkpoint starts
   (plan, abort, restore) lock the pipeline row first, so they see each other's heads;
   planning then moves ``pipelines.last_checkpoint_id`` with a compare-and-set, so two
   planners can never insert the same checkpoint even without that lock. Transitions
   lock only the checkpoint row through their conditional UPDATE: a waiting UPDATE
   re-checks ``state`` after the winner commits and matches nothing.
"""

from __future__ import annotations

import datetime as dt
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, delete, event, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import CursorResult, Result, make_url
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from airflow_provider_eo.ledger.errors import (
    CheckpointConflict,
    CheckpointNotFound,
    CommitLeaseHeld,
    InvariantViolation,
    LedgerError,
    LedgerUnavailable,
    PipelineFingerprintMismatch,
    SavepointNotFound,
)
from airflow_provider_eo.ledger.models import (
    VERSION_TABLE,
    Checkpoint,
    CheckpointRange,
    CommitShard,
    Event,
    Lineage,
    PartitionHead,
    Pipeline,
    Savepoint,
)
from airflow_provider_eo.ledger.records import (
    Actor,
    CheckpointRecord,
    EventRecord,
    PipelineRecord,
    RangeSpec,
    SavepointRecord,
    ShardRecord,
    TopicPartition,
)
from airflow_provider_eo.ledger.states import (
    UNFINISHED_STATES,
    CheckpointState,
    ShardState,
    can_transition,
)
from airflow_provider_eo.ledger.urls import redact_text, redact_url

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
_UNFINISHED = sorted(s.value for s in UNFINISHED_STATES)
_P = CheckpointState.PLANNED.value
_R = CheckpointState.PREPARED.value
_C = CheckpointState.COMMITTED.value
_A = CheckpointState.ABORTED.value


def _rowcount(result: Result[Any]) -> int:
    """Rows matched by an UPDATE/DELETE (the conditional transitions rely on it)."""
    return int(cast("CursorResult[Any]", result).rowcount)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _install_sqlite_pragmas(engine: Engine, *, wal: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves, see _on_begin
        cursor = dbapi_connection.cursor()
        try:
            if wal:
                cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=FULL")  # a committed transition survives power loss
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        readonly = conn.get_execution_options().get("eo_readonly", False)
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")


def make_engine(url: str) -> Engine:
    """An engine with the ledger's connection settings for ``url`` (SQLite or PostgreSQL)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        memory = database in ("", ":memory:") or database.startswith("file::memory:")
        if memory:
            engine = create_engine(
                parsed,
                poolclass=StaticPool,
                connect_args={"check_same_thread": False},
            )
        else:
            Path(database).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
            engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        _install_sqlite_pragmas(engine, wal=not memory)
        return engine
    return create_engine(parsed, pool_pre_ping=True)


def _actor_columns(actor: Actor | None) -> dict[str, Any]:
    if actor is None:
        return {}
    return {
        "dag_id": actor.dag_id,
        "run_id": actor.run_id,
        "task_id": actor.task_id,
        "try_number": actor.try_number,
    }


class Ledger:
    """The checkpoint ledger on a SQL database.

    :param url: SQLAlchemy URL: ``sqlite:///path/ledger.db`` (embedded) or
        ``postgresql+psycopg://user:pw@host:5432/db`` (production).
    :param create: SQLite: create the file and upgrade the schema to head. Other
        databases: create the schema when the database has none, and refuse to run
        on an older schema (run ``eo upgrade`` explicitly for those).
    """

    def __init__(self, url: str, *, create: bool = True) -> None:
        self._url = url
        self._engine = make_engine(url)
        self._setup(create)

    @classmethod
    def from_engine(cls, engine: Engine, *, create: bool = False) -> Ledger:
        """A ledger on an engine you built (pool, connect args); SQLite engines need the
        pragmas of :func:`make_engine` to be safe across processes."""
        self = cls.__new__(cls)
        self._url = engine.url.render_as_string(hide_password=False)
        self._engine = engine
        self._setup(create)
        return self

    def _setup(self, create: bool) -> None:
        self._read_engine = self._engine.execution_options(eo_readonly=True)
        self.url = redact_url(self._url)
        if not create:
            return
        if self.dialect == "sqlite":
            self.upgrade()
            return
        current = self.current_revision()
        if current is None:
            self.upgrade()
        elif current != self.head_revision():
            raise LedgerError(
                f"ledger database at {self.url} has schema revision {current}, this "
                f"airflow-provider-eo needs {self.head_revision()}: run `eo upgrade "
                "--ledger-url ...` (or Ledger.upgrade()) once, then retry"
            )

    # -- plumbing ------------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def dialect(self) -> str:
        return self._engine.dialect.name

    def close(self) -> None:
        """Close pooled connections (the ledger stays usable; connections reopen lazily)."""
        self._engine.dispose()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _unavailable(self, exc: OperationalError) -> LedgerUnavailable:
        detail = str(getattr(exc, "orig", exc) or exc).strip().splitlines()
        first = redact_text(detail[0] if detail else type(exc).__name__, self._url)
        return LedgerUnavailable(
            f"ledger database at {self.url} unavailable: {first}; retry later "
            "(every transition is conditional, so retrying a call is safe)"
        )

    @contextmanager
    def _write(self) -> Iterator[Session]:
        try:
            with Session(self._engine, expire_on_commit=False) as session, session.begin():
                yield session
        except OperationalError as exc:
            raise self._unavailable(exc) from exc

    @contextmanager
    def _read(self) -> Iterator[Session]:
        try:
            with Session(self._read_engine, expire_on_commit=False) as session, session.begin():
                yield session
        except OperationalError as exc:
            raise self._unavailable(exc) from exc

    # -- schema ----------------------------------------------------------------------------

    def _alembic_config(self, connection: Connection | None = None) -> Config:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
        cfg.set_main_option("path_separator", "os")
        if connection is not None:
            cfg.attributes["connection"] = connection
        return cfg

    def head_revision(self) -> str:
        head = ScriptDirectory.from_config(self._alembic_config()).get_current_head()
        assert head is not None
        return head

    def current_revision(self) -> str | None:
        """The schema revision in the database, None when it has no ledger schema."""
        try:
            with self._engine.connect() as conn:
                ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
                return ctx.get_current_revision()
        except OperationalError as exc:
            raise self._unavailable(exc) from exc

    def _migrate(self, fn: Any, revision: str) -> None:
        try:
            with self._engine.begin() as conn:
                if self.dialect == "postgresql":
                    # Two processes creating a fresh ledger at once: the second waits, then
                    # finds the schema at head and does nothing.
                    conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({zlib.crc32(b'eo-ledger-migrate')})")
                fn(self._alembic_config(conn), revision)
        except OperationalError as exc:
            raise self._unavailable(exc) from exc

    def upgrade(self, revision: str = "head") -> None:
        """Migrate the schema up to ``revision`` (idempotent)."""
        self._migrate(command.upgrade, revision)

    def downgrade(self, revision: str = "base") -> None:
        """Migrate the schema down to ``revision``; ``base`` drops every ledger table."""
        self._migrate(command.downgrade, revision)

    # -- pipelines -------------------------------------------------------------------------

    def _pipeline(self, s: Session, name: str, *, lock: bool = False) -> Pipeline:
        stmt = select(Pipeline).where(Pipeline.name == name)
        if lock:
            stmt = stmt.with_for_update()
        row = s.execute(stmt).scalar_one_or_none()
        if row is None:
            raise CheckpointNotFound(
                f"pipeline '{name}' is not in the ledger at {self.url}: run its plan task "
                "(or Ledger.ensure_pipeline) first, or check the pipeline name / ledger URL"
            )
        return row

    @staticmethod
    def _pipeline_record(row: Pipeline) -> PipelineRecord:
        return PipelineRecord(
            name=row.name,
            fingerprint=row.fingerprint,
            current_lineage=row.current_lineage,
            last_checkpoint_id=row.last_checkpoint_id,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )

    def ensure_pipeline(
        self, name: str, fingerprint: str, *, allow_fingerprint_change: bool = False
    ) -> PipelineRecord:
        """Register the pipeline, or check that its settings' fingerprint did not change.

        Idempotent: calling it again with the same fingerprint changes nothing.
        """
        if not name:
            raise ValueError("pipeline name must be non-empty")
        for _ in range(2):  # a concurrent creator may win the unique name: then re-read
            try:
                with self._write() as s:
                    row = s.execute(
                        select(Pipeline).where(Pipeline.name == name).with_for_update()
                    ).scalar_one_or_none()
                    now = utcnow()
                    if row is None:
                        row = Pipeline(
                            name=name,
                            fingerprint=fingerprint,
                            created_at=now,
                            updated_at=now,
                            current_lineage=1,
                            last_checkpoint_id=0,
                        )
                        s.add(row)
                        s.flush()
                        s.add(
                            Lineage(
                                pipeline_id=row.id,
                                lineage=1,
                                started_at=now,
                                offsets=[],
                                reason="pipeline created",
                            )
                        )
                        self._event(s, row.id, None, "pipeline_created", details={"fingerprint": fingerprint})
                    elif row.fingerprint != fingerprint:
                        if not allow_fingerprint_change:
                            raise PipelineFingerprintMismatch(
                                f"pipeline '{name}' was recorded with settings fingerprint "
                                f"{row.fingerprint} but its settings now hash to {fingerprint}: "
                                "the source topics, sink topic or transform changed under "
                                "existing checkpoints. Restore the old settings, or use a new "
                                "pipeline name, or accept the change explicitly with "
                                "allow_fingerprint_change=True (after a savepoint)."
                            )
                        self._event(
                            s,
                            row.id,
                            None,
                            "fingerprint_changed",
                            details={"old": row.fingerprint, "new": fingerprint},
                        )
                        row.fingerprint = fingerprint
                        row.updated_at = now
                    return self._pipeline_record(row)
            except IntegrityError:
                continue
        raise LedgerError(f"could not register pipeline '{name}' (concurrent creation); retry")

    def get_pipeline(self, name: str) -> PipelineRecord:
        with self._read() as s:
            return self._pipeline_record(self._pipeline(s, name))

    def list_pipelines(self) -> list[PipelineRecord]:
        with self._read() as s:
            rows = s.execute(select(Pipeline).order_by(Pipeline.name)).scalars()
            return [self._pipeline_record(r) for r in rows]

    # -- reading checkpoints -----------------------------------------------------------------

    def _records(self, s: Session, pipeline: str, rows: Sequence[Checkpoint]) -> list[CheckpointRecord]:
        if not rows:
            return []
        pid = rows[0].pipeline_id
        ids = [r.checkpoint_id for r in rows]
        ranges: dict[int, list[CheckpointRange]] = {i: [] for i in ids}
        shards: dict[int, list[CommitShard]] = {i: [] for i in ids}
        for chunk_start in range(0, len(ids), 500):
            chunk = ids[chunk_start : chunk_start + 500]
            for rg in s.execute(
                select(CheckpointRange)
                .where(CheckpointRange.pipeline_id == pid, CheckpointRange.checkpoint_id.in_(chunk))
                .order_by(CheckpointRange.topic, CheckpointRange.partition)
            ).scalars():
                ranges[rg.checkpoint_id].append(rg)
            for sh in s.execute(
                select(CommitShard)
                .where(CommitShard.pipeline_id == pid, CommitShard.checkpoint_id.in_(chunk))
                .order_by(CommitShard.shard)
            ).scalars():
                shards[sh.checkpoint_id].append(sh)
        return [self._record(pipeline, r, ranges[r.checkpoint_id], shards[r.checkpoint_id]) for r in rows]

    @staticmethod
    def _record(
        pipeline: str,
        row: Checkpoint,
        ranges: Iterable[CheckpointRange],
        shards: Iterable[CommitShard],
    ) -> CheckpointRecord:
        ranges = list(ranges)
        return CheckpointRecord(
            pipeline=pipeline,
            checkpoint_id=row.checkpoint_id,
            state=CheckpointState(row.state),
            lineage=row.lineage,
            ranges=tuple(
                RangeSpec(r.topic, r.partition, r.start_offset, r.end_offset, r.skipped_from) for r in ranges
            ),
            range_stats={(r.topic, r.partition): (r.min_timestamp, r.max_timestamp) for r in ranges},
            shards=tuple(
                ShardRecord(
                    shard=sh.shard,
                    transactional_id=sh.transactional_id,
                    producer_id=sh.producer_id,
                    producer_epoch=sh.producer_epoch,
                    state=ShardState(sh.state),
                    records=sh.records,
                    updated_at=sh.updated_at,
                )
                for sh in shards
            ),
            planned_at=row.planned_at,
            prepared_at=row.prepared_at,
            committed_at=row.committed_at,
            aborted_at=row.aborted_at,
            prepared_attempt=row.prepared_attempt,
            staging_location=row.staging_location,
            records=row.records,
            bytes=row.bytes,
            shard_counts={int(k): int(v) for k, v in (row.shard_counts or {}).items()},
            dag_id=row.dag_id,
            run_id=row.run_id,
            task_id=row.task_id,
            try_number=row.try_number,
            spark_app_id=row.spark_app_id,
            commit_owner=row.commit_owner,
            commit_lease_until=row.commit_lease_until,
            abort_reason=row.abort_reason,
        )

    def _one(self, s: Session, pipeline: str, row: Checkpoint | None) -> CheckpointRecord | None:
        if row is None:
            return None
        return self._records(s, pipeline, [row])[0]

    def _row(self, s: Session, pid: int, checkpoint_id: int) -> Checkpoint | None:
        # populate_existing: after a conditional UPDATE the identity map may be stale.
        return s.execute(
            select(Checkpoint)
            .where(Checkpoint.pipeline_id == pid, Checkpoint.checkpoint_id == checkpoint_id)
            .execution_options(populate_existing=True)
        ).scalar_one_or_none()

    def _require(self, s: Session, pipeline: str, pid: int, checkpoint_id: int) -> Checkpoint:
        row = self._row(s, pid, checkpoint_id)
        if row is None:
            raise CheckpointNotFound(
                f"checkpoint {checkpoint_id} of pipeline '{pipeline}' is not in the ledger at "
                f"{self.url}: list them with `eo checkpoints {pipeline}`"
            )
        return row

    def _lowest_unfinished(self, s: Session, pid: int, below: int | None = None) -> Checkpoint | None:
        # One equality seek per state on (pipeline_id, state, checkpoint_id): with
        # ``state IN (...)`` SQLite's planner walks the primary key instead (O(rows)).
        lowest: int | None = None
        for state in _UNFINISHED:
            stmt = select(func.min(Checkpoint.checkpoint_id)).where(
                Checkpoint.pipeline_id == pid, Checkpoint.state == state
            )
            if below is not None:
                stmt = stmt.where(Checkpoint.checkpoint_id < below)
            found = s.execute(stmt).scalar_one_or_none()
            if found is not None and (lowest is None or found < lowest):
                lowest = found
        return None if lowest is None else self._row(s, pid, lowest)

    def _count_unfinished(self, s: Session, pid: int) -> int:
        return sum(
            s.execute(
                select(func.count())
                .select_from(Checkpoint)
                .where(Checkpoint.pipeline_id == pid, Checkpoint.state == state)
            ).scalar_one()
            for state in _UNFINISHED
        )

    def unfinished(self, pipeline: str) -> CheckpointRecord | None:
        """The lowest-id PLANNED or PREPARED checkpoint: the one a retry must resume."""
        with self._read() as s:
            pid = self._pipeline(s, pipeline).id
            return self._one(s, pipeline, self._lowest_unfinished(s, pid))

    def last_committed(self, pipeline: str) -> CheckpointRecord | None:
        with self._read() as s:
            pid = self._pipeline(s, pipeline).id
            row = s.execute(
                select(Checkpoint)
                .where(Checkpoint.pipeline_id == pid, Checkpoint.state == _C)
                .order_by(Checkpoint.checkpoint_id.desc())
                .limit(1)
            ).scalar_one_or_none()
            return self._one(s, pipeline, row)

    def get(self, pipeline: str, checkpoint_id: int) -> CheckpointRecord:
        with self._read() as s:
            pid = self._pipeline(s, pipeline).id
            return self._records(s, pipeline, [self._require(s, pipeline, pid, checkpoint_id)])[0]

    def list_checkpoints(self, pipeline: str, *, limit: int | None = None) -> list[CheckpointRecord]:
        """Checkpoints in id order; with ``limit``, the latest ``limit`` of them."""
        with self._read() as s:
            pid = self._pipeline(s, pipeline).id
            stmt = select(Checkpoint).where(Checkpoint.pipeline_id == pid)
            if limit is not None:
                stmt = stmt.order_by(Checkpoint.checkpoint_id.desc()).limit(limit)
                rows = list(reversed(s.execute(stmt).scalars().all()))
            else:
                rows = list(s.execute(stmt.order_by(Checkpoint.checkpoint_id)).scalars())
            return self._records(s, pipeline, rows)

    def next_starts(self, pipeline: str) -> dict[TopicPartition, int]:
        """Where the next checkpoint of each known partition must start.

        Per partition: the end of the latest non-aborted checkpoint of the current lineage,
        else the lineage's restore offset, else the start of the aborted checkpoint whose
        range must be replanned. Partitions absent here may start anywhere.
        """
        with self._read() as s:
            pid = self._pipeline(s, pipeline).id
            return self._heads(s, pid)

    @staticmethod
    def _heads(s: Session, pid: int) -> dict[TopicPartition, int]:
        rows = s.execute(
            select(PartitionHead.topic, PartitionHead.partition, PartitionHead.next_start).where(
                PartitionHead.pipeline_id == pid
            )
        )
        return {(t, p): int(o) for t, p, o in rows}

    # -- events ----------------------------------------------------------------------------

    @staticmethod
    def _event(
        s: Session,
        pid: int,
        checkpoint_id: int | None,
        kind: str,
        *,
        from_state: str | None = None,
        to_state: str | None = None,
        actor: Actor | None = None,
        details: Mapping[str, Any] | None = None,
        at: dt.datetime | None = None,
    ) -> None:
        s.add(
            Event(
                pipeline_id=pid,
                checkpoint_id=checkpoint_id,
                kind=kind,
                from_state=from_state,
                to_state=to_state,
                actor=actor.label() if actor else "",
                at=at or utcnow(),
                details=dict(details or {}),
                **_actor_columns(actor),
            )
        )

    def events(self, pipeline: str, checkpoint_id: int | None = None) -> list[EventRecord]:
        """The append-only event log of the pipeline (or of one checkpoint), oldest first."""
        with self._read() as s:
            pid = self._pipeline(s, pipeline).id
            stmt = select(Event).where(Event.pipeline_id == pid)
            if checkpoint_id is not None:
                stmt = stmt.where(Event.checkpoint_id == checkpoint_id)
            return [
                EventRecord(
                    id=e.id,
                    pipeline=pipeline,
                    checkpoint_id=e.checkpoint_id,
                    kind=e.kind,
                    from_state=CheckpointState(e.from_state) if e.from_state else None,
                    to_state=CheckpointState(e.to_state) if e.to_state else None,
                    actor=e.actor,
                    at=e.at,
                    details=e.details,
                    dag_id=e.dag_id,
                    run_id=e.run_id,
                    task_id=e.task_id,
                    try_number=e.try_number,
                )
                for e in s.execute(stmt.order_by(Event.id)).scalars()
            ]

    # -- plan ------------------------------------------------------------------------------

    def plan(
        self,
        pipeline: str,
        ranges: Sequence[RangeSpec],
        *,
        max_pending: int = 1,
        actor: Actor | None = None,
        details: dict[str, Any] | None = None,
    ) -> CheckpointRecord:
        """Record the next checkpoint (PLANNED) reading exactly ``ranges``.

        Refuses (InvariantViolation) a gap or an overlap with where each partition must
        start (see :meth:`next_starts`), a repeated partition, and more than
        ``max_pending`` unfinished checkpoints. Not idempotent by itself: callers resume
        :meth:`unfinished` first; two concurrent planners cannot both succeed.
        """
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        if not ranges:
            raise ValueError(f"pipeline '{pipeline}': a checkpoint needs at least one range")
        seen: set[TopicPartition] = set()
        for r in ranges:
            if r.key in seen:
                raise InvariantViolation(
                    f"pipeline '{pipeline}': {r.topic}[{r.partition}] appears twice in one "
                    "plan; give each topic-partition one range"
                )
            seen.add(r.key)
        with self._write() as s:
            p = self._pipeline(s, pipeline, lock=True)
            n, lineage = p.last_checkpoint_id, p.current_lineage
            new_id = n + 1
            pending = self._count_unfinished(s, p.id)
            if pending >= max_pending:
                low = self._lowest_unfinished(s, p.id)
                assert low is not None
                raise InvariantViolation(
                    f"pipeline '{pipeline}': cannot plan checkpoint {new_id}: {pending} "
                    f"unfinished checkpoint(s) already (lowest: {low.checkpoint_id}, {low.state}) "
                    f"and max_pending={max_pending}. Resume checkpoint {low.checkpoint_id} "
                    "(prepare, commit) or abort it first."
                )
            self._check_contiguous(s, pipeline, p.id, new_id, ranges)
            # The compare-and-set that serializes planners: only one can move n -> n+1.
            now = utcnow()
            moved = _rowcount(
                s.execute(
                    update(Pipeline)
                    .where(
                        Pipeline.id == p.id,
                        Pipeline.last_checkpoint_id == n,
                        Pipeline.current_lineage == lineage,
                    )
                    .values(last_checkpoint_id=new_id, updated_at=now)
                    .execution_options(synchronize_session=False)
                )
            )
            if moved != 1:
                raise CheckpointConflict(
                    f"pipeline '{pipeline}': another planner recorded checkpoint {new_id} "
                    "concurrently; resume Ledger.unfinished() instead of planning again",
                    pipeline=pipeline,
                    checkpoint_id=new_id,
                )
            s.add(
                Checkpoint(
                    pipeline_id=p.id,
                    checkpoint_id=new_id,
                    state=_P,
                    lineage=lineage,
                    planned_at=now,
                    **_actor_columns(actor),
                )
            )
            s.flush()
            s.add_all(
                CheckpointRange(
                    pipeline_id=p.id,
                    checkpoint_id=new_id,
                    topic=r.topic,
                    partition=r.partition,
                    start_offset=r.start,
                    end_offset=r.end,
                    skipped_from=r.skipped_from,
                )
                for r in ranges
            )
            for r in ranges:
                self._set_head(s, p.id, r.key, r.end, lineage, new_id)
            skipped = {
                f"{r.topic}[{r.partition}]": [r.skipped_from, r.start]
                for r in ranges
                if r.skipped_from is not None
            }
            self._event(
                s,
                p.id,
                new_id,
                "transition",
                to_state=_P,
                actor=actor,
                at=now,
                details={**(details or {}), **({"skipped": skipped} if skipped else {})},
            )
            s.flush()
            row = self._require(s, pipeline, p.id, new_id)
            return self._records(s, pipeline, [row])[0]

    def _check_contiguous(
        self, s: Session, pipeline: str, pid: int, new_id: int, ranges: Sequence[RangeSpec]
    ) -> None:
        heads = self._heads(s, pid)
        problems = []
        for r in ranges:
            expected = heads.get(r.key)
            if expected is None:
                continue  # a partition seen for the first time in this lineage
            if r.skipped_from is None and r.start == expected:
                continue
            if r.skipped_from is not None and r.skipped_from == expected:
                continue  # on_data_loss=skip: the loss [skipped_from, start) is recorded
            got = r.skipped_from if r.skipped_from is not None else r.start
            what = f"gap of {got - expected}" if got > expected else f"overlap of {expected - got}"
            problems.append(f"{r.topic}[{r.partition}] must start at {expected}, got {got} ({what} offsets)")
        if problems:
            raise InvariantViolation(
                f"pipeline '{pipeline}', checkpoint {new_id}: ranges not contiguous with the "
                f"previous checkpoints: {'; '.join(problems)}. Plan from Ledger.next_starts(); "
                "to jump elsewhere on purpose, restore (a recorded lineage break)."
            )

    @staticmethod
    def _set_head(
        s: Session, pid: int, key: TopicPartition, offset: int, lineage: int, cp: int | None
    ) -> None:
        head = s.get(PartitionHead, (pid, key[0], key[1]))
        if head is None:
            s.add(
                PartitionHead(
                    pipeline_id=pid,
                    topic=key[0],
                    partition=key[1],
                    lineage=lineage,
                    next_start=offset,
                    checkpoint_id=cp,
                )
            )
        else:
            head.next_start = offset
            head.lineage = lineage
            head.checkpoint_id = cp

    # -- transitions -----------------------------------------------------------------------

    def _conflict(self, pipeline: str, row: Checkpoint, expected: str, action: str) -> CheckpointConflict:
        actual = row.state
        if actual == _C:
            hint = "it is committed already: nothing to do"
        elif actual == _A:
            hint = f"it was aborted ({row.abort_reason}): plan again, its range is replanned"
        elif actual == _R and action == "prepare":
            hint = (
                f"attempt {row.prepared_attempt!r} prepared it first: this attempt's staged "
                "output is garbage; delete it and go on to the commit"
            )
        else:
            hint = "re-read it with Ledger.get() and continue from its current state"
        return CheckpointConflict(
            f"cannot {action} checkpoint {row.checkpoint_id} of pipeline '{pipeline}': expected "
            f"state {expected}, found {actual}; {hint}",
            pipeline=pipeline,
            checkpoint_id=row.checkpoint_id,
            expected=expected,
            actual=actual,
        )

    def _transition(
        self,
        s: Session,
        pipeline: str,
        pid: int,
        checkpoint_id: int,
        source: str,
        target: str,
        values: Mapping[str, Any],
    ) -> bool:
        """The one conditional UPDATE; True when this call moved the row."""
        assert can_transition(CheckpointState(source), CheckpointState(target))
        result = s.execute(
            update(Checkpoint)
            .where(
                Checkpoint.pipeline_id == pid,
                Checkpoint.checkpoint_id == checkpoint_id,
                Checkpoint.state == source,
            )
            .values(state=target, **values)
            .execution_options(synchronize_session=False)
        )
        return _rowcount(result) == 1

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
        if records < 0 or bytes_ < 0 or any(v < 0 for v in shard_counts.values()):
            raise ValueError("records, bytes_ and shard counts must be >= 0")
        with self._write() as s:
            pid = self._pipeline(s, pipeline).id
            now = utcnow()
            moved = self._transition(
                s,
                pipeline,
                pid,
                checkpoint_id,
                _P,
                _R,
                {
                    "prepared_attempt": attempt,
                    "staging_location": staging_location,
                    "records": records,
                    "bytes": bytes_,
                    "shard_counts": {str(k): int(v) for k, v in shard_counts.items()},
                    "prepared_at": now,
                    "spark_app_id": spark_app_id,
                    **_actor_columns(actor),
                },
            )
            row = self._require(s, pipeline, pid, checkpoint_id)
            if not moved:
                if row.state == _R and row.prepared_attempt == attempt:
                    return self._records(s, pipeline, [row])[0]
                raise self._conflict(pipeline, row, _P, "prepare")
            if range_stats:
                for (topic, partition), (lo, hi) in range_stats.items():
                    hit = _rowcount(
                        s.execute(
                            update(CheckpointRange)
                            .where(
                                CheckpointRange.pipeline_id == pid,
                                CheckpointRange.checkpoint_id == checkpoint_id,
                                CheckpointRange.topic == topic,
                                CheckpointRange.partition == partition,
                            )
                            .values(min_timestamp=lo, max_timestamp=hi)
                            .execution_options(synchronize_session=False)
                        )
                    )
                    if hit != 1:
                        raise InvariantViolation(
                            f"pipeline '{pipeline}', checkpoint {checkpoint_id}: range_stats "
                            f"names {topic}[{partition}], which this checkpoint does not read"
                        )
            self._event(
                s,
                pid,
                checkpoint_id,
                "transition",
                from_state=_P,
                to_state=_R,
                actor=actor,
                at=now,
                details={
                    "attempt": attempt,
                    "staging_location": staging_location,
                    "records": records,
                    "bytes": bytes_,
                    "spark_app_id": spark_app_id,
                },
            )
            return self._records(s, pipeline, [row])[0]

    def _check_order(self, s: Session, pipeline: str, pid: int, checkpoint_id: int, what: str) -> None:
        earlier = self._lowest_unfinished(s, pid, below=checkpoint_id)
        if earlier is not None:
            raise InvariantViolation(
                f"pipeline '{pipeline}': cannot {what} checkpoint {checkpoint_id} while "
                f"checkpoint {earlier.checkpoint_id} is {earlier.state}: checkpoints commit in "
                f"order; commit or abort checkpoint {earlier.checkpoint_id} first"
            )

    def acquire_commit_lease(
        self, pipeline: str, checkpoint_id: int, *, owner: str, ttl_s: float
    ) -> CheckpointRecord:
        """Become the only committer of a PREPARED checkpoint until ``now + ttl_s``.

        A compare-and-set: succeeds when nobody holds the lease, when ``owner`` already
        holds it (renewal), or when the holder's lease expired (take-over). Otherwise
        :class:`CommitLeaseHeld`. Checked before ``begin_transaction``: Kafka cannot fence a
        second committer that uses a different transactional id, this lease does.
        Leases use this host's clock; keep committer clocks in sync (NTP).
        """
        if not owner:
            raise ValueError("owner must be non-empty")
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        with self._write() as s:
            pid = self._pipeline(s, pipeline).id
            now = utcnow()
            before = self._require(s, pipeline, pid, checkpoint_id)
            previous_owner, previous_until = before.commit_owner, before.commit_lease_until
            if before.state == _R:
                self._check_order(s, pipeline, pid, checkpoint_id, "commit")
            result = s.execute(
                update(Checkpoint)
                .where(
                    Checkpoint.pipeline_id == pid,
                    Checkpoint.checkpoint_id == checkpoint_id,
                    Checkpoint.state == _R,
                    or_(
                        Checkpoint.commit_owner.is_(None),
                        Checkpoint.commit_owner == owner,
                        Checkpoint.commit_lease_until.is_(None),
                        Checkpoint.commit_lease_until < now,
                    ),
                )
                .values(commit_owner=owner, commit_lease_until=now + dt.timedelta(seconds=ttl_s))
                .execution_options(synchronize_session=False)
            )
            row = self._require(s, pipeline, pid, checkpoint_id)
            if _rowcount(result) != 1:
                if row.state != _R:
                    raise self._conflict(pipeline, row, _R, "lease for commit")
                until = row.commit_lease_until
                left = (until - now).total_seconds() if until else 0.0
                raise CommitLeaseHeld(
                    f"checkpoint {checkpoint_id} of pipeline '{pipeline}' is being committed by "
                    f"{row.commit_owner!r} (lease until {until.isoformat() if until else '?'}, "
                    f"{left:.1f}s left): do not publish; wait for that committer to finish or "
                    "for its lease to expire, then retry",
                    owner=row.commit_owner,
                )
            if previous_owner != owner:
                self._event(
                    s,
                    pid,
                    checkpoint_id,
                    "lease",
                    details={
                        "owner": owner,
                        "ttl_s": ttl_s,
                        "previous_owner": previous_owner,
                        "previous_until": previous_until.isoformat() if previous_until else None,
                    },
                    at=now,
                )
            return self._records(s, pipeline, [row])[0]

    def release_commit_lease(self, pipeline: str, checkpoint_id: int, *, owner: str) -> bool:
        """Give up ``owner``'s lease early; False (nothing changed) when it does not hold it."""
        with self._write() as s:
            pid = self._pipeline(s, pipeline).id
            result = s.execute(
                update(Checkpoint)
                .where(
                    Checkpoint.pipeline_id == pid,
                    Checkpoint.checkpoint_id == checkpoint_id,
                    Checkpoint.commit_owner == owner,
                )
                .values(commit_lease_until=None)
                .execution_options(synchronize_session=False)
            )
            return _rowcount(result) == 1

    def record_shard(
        self,
        pipeline: str,
        checkpoint_id: int,
        shard: int,
        *,
        transactional_id: str,
        producer_id: int | None,
        producer_epoch: int | None,
        state: str,
        records: int,
    ) -> None:
        """Upsert one commit shard's progress. A COMMITTED shard never goes back to PENDING
        (InvariantViolation); recording the same thing twice is a no-op."""
        shard_state = ShardState(state)
        with self._write() as s:
            pid = self._pipeline(s, pipeline).id
            row = self._require(s, pipeline, pid, checkpoint_id)
            if row.state not in (_R, _C):
                raise self._conflict(pipeline, row, _R, f"record shard {shard} of")
            values = {
                "pipeline_id": pid,
                "checkpoint_id": checkpoint_id,
                "shard": shard,
                "transactional_id": transactional_id,
                "producer_id": producer_id,
                "producer_epoch": producer_epoch,
                "state": shard_state.value,
                "records": records,
                "updated_at": utcnow(),
            }
            insert_fn: Any = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
            ins = insert_fn(CommitShard.__table__).values(**values)
            stmt = ins.on_conflict_do_update(
                index_elements=["pipeline_id", "checkpoint_id", "shard"],
                set_={
                    k: ins.excluded[k] for k in values if k not in ("pipeline_id", "checkpoint_id", "shard")
                },
                where=or_(
                    CommitShard.__table__.c.state != ShardState.COMMITTED.value,
                    ins.excluded.state == ShardState.COMMITTED.value,
                ),
            )
            # preserve_rowcount: SQLAlchemy only keeps rowcount of UPDATE/DELETE by default.
            upserted = s.connection().execute(stmt.execution_options(preserve_rowcount=True))
            if upserted.rowcount != 1:
                raise InvariantViolation(
                    f"pipeline '{pipeline}', checkpoint {checkpoint_id}: shard {shard} is "
                    f"recorded COMMITTED and cannot go back to {shard_state}; its transaction "
                    "is visible in Kafka, do not publish it again"
                )

    def mark_committed(
        self, pipeline: str, checkpoint_id: int, *, actor: Actor | None = None
    ) -> CheckpointRecord:
        """PREPARED -> COMMITTED once every shard's transaction committed.

        Idempotent: committing a COMMITTED checkpoint does nothing and returns it. Refuses
        (InvariantViolation) while an earlier checkpoint is unfinished or a recorded shard
        is still PENDING.
        """
        with self._write() as s:
            pid = self._pipeline(s, pipeline).id
            row = self._require(s, pipeline, pid, checkpoint_id)
            if row.state == _C:
                return self._records(s, pipeline, [row])[0]
            if row.state != _R:
                raise self._conflict(pipeline, row, _R, "commit")
            self._check_order(s, pipeline, pid, checkpoint_id, "commit")
            pending = (
                s.execute(
                    select(CommitShard.shard).where(
                        CommitShard.pipeline_id == pid,
                        CommitShard.checkpoint_id == checkpoint_id,
                        CommitShard.state != ShardState.COMMITTED.value,
                    )
                )
                .scalars()
                .all()
            )
            if pending:
                raise InvariantViolation(
                    f"pipeline '{pipeline}', checkpoint {checkpoint_id}: shards {sorted(pending)} "
                    "are not recorded COMMITTED yet; finish (or recover) those shards first"
                )
            now = utcnow()
            moved = self._transition(
                s,
                pipeline,
                pid,
                checkpoint_id,
                _R,
                _C,
                {"committed_at": now, **_actor_columns(actor)},
            )
            row = self._require(s, pipeline, pid, checkpoint_id)
            if not moved:
                if row.state == _C:
                    return self._records(s, pipeline, [row])[0]
                raise self._conflict(pipeline, row, _R, "commit")
            self._event(
                s,
                pid,
                checkpoint_id,
                "transition",
                from_state=_R,
                to_state=_C,
                actor=actor,
                at=now,
                details={"commit_owner": row.commit_owner},
            )
            return self._records(s, pipeline, [row])[0]

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
        with self._write() as s:
            p = self._pipeline(s, pipeline, lock=True)
            row = self._require(s, pipeline, p.id, checkpoint_id)
            if row.state == _A:
                return self._records(s, pipeline, [row])[0]
            if row.state == _C:
                raise self._conflict(pipeline, row, "PLANNED or PREPARED", "abort")
            later = (
                s.execute(
                    select(Checkpoint)
                    .where(
                        Checkpoint.pipeline_id == p.id,
                        Checkpoint.checkpoint_id > checkpoint_id,
                        Checkpoint.state.in_(_UNFINISHED),
                    )
                    .order_by(Checkpoint.checkpoint_id)
                )
                .scalars()
                .all()
            )
            now = utcnow()
            targets = [(row.checkpoint_id, row.state)] + [(r.checkpoint_id, r.state) for r in later]
            for cp, source in targets:
                cascade = cp != checkpoint_id
                why = reason if not cascade else f"checkpoint {checkpoint_id} aborted: {reason}"
                moved = self._transition(
                    s,
                    pipeline,
                    p.id,
                    cp,
                    source,
                    _A,
                    {"aborted_at": now, "abort_reason": why, **_actor_columns(actor)},
                )
                if not moved:
                    current = self._require(s, pipeline, p.id, cp)
                    raise self._conflict(pipeline, current, source, "abort")
                self._event(
                    s,
                    p.id,
                    cp,
                    "transition",
                    from_state=source,
                    to_state=_A,
                    actor=actor,
                    at=now,
                    details={"reason": why, **({"cascade_from": checkpoint_id} if cascade else {})},
                )
            # Replan from the same start: each partition's head goes back to the start of
            # the earliest aborted checkpoint that reads it.
            reverted: set[TopicPartition] = set()
            for cp, _ in targets:
                for rg in s.execute(
                    select(CheckpointRange).where(
                        CheckpointRange.pipeline_id == p.id, CheckpointRange.checkpoint_id == cp
                    )
                ).scalars():
                    key = (rg.topic, rg.partition)
                    if key in reverted:
                        continue
                    reverted.add(key)
                    start = rg.skipped_from if rg.skipped_from is not None else rg.start_offset
                    self._set_head(s, p.id, key, start, row.lineage, None)
            p.updated_at = now
            row = self._require(s, pipeline, p.id, checkpoint_id)
            return self._records(s, pipeline, [row])[0]

    # -- savepoints and restore --------------------------------------------------------------

    @staticmethod
    def _savepoint_record(pipeline: str, row: Savepoint) -> SavepointRecord:
        return SavepointRecord(
            pipeline=pipeline,
            name=row.name,
            checkpoint_id=row.checkpoint_id,
            offsets={t: {int(p): int(o) for p, o in parts.items()} for t, parts in row.offsets.items()},
            note=row.note,
            created_by=row.created_by,
            created_at=row.created_at,
        )

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
        if not name:
            raise ValueError("savepoint name must be non-empty")
        clean = {str(t): {str(int(p)): int(o) for p, o in parts.items()} for t, parts in offsets.items()}
        if any(o < 0 for parts in clean.values() for o in parts.values()):
            raise ValueError(f"savepoint '{name}': offsets must be >= 0")
        try:
            with self._write() as s:
                pid = self._pipeline(s, pipeline).id
                existing = s.execute(
                    select(Savepoint).where(Savepoint.pipeline_id == pid, Savepoint.name == name)
                ).scalar_one_or_none()
                if existing is not None:
                    raise self._savepoint_exists(pipeline, existing)
                if checkpoint_id is not None:
                    cp = self._require(s, pipeline, pid, checkpoint_id)
                    if cp.state != _C:
                        raise InvariantViolation(
                            f"pipeline '{pipeline}': savepoint '{name}' must point at a "
                            f"COMMITTED checkpoint, checkpoint {checkpoint_id} is {cp.state}; "
                            "wait for it to commit"
                        )
                row = Savepoint(
                    pipeline_id=pid,
                    name=name,
                    checkpoint_id=checkpoint_id,
                    offsets=clean,
                    note=note,
                    created_by=created_by,
                    created_at=utcnow(),
                )
                s.add(row)
                s.flush()
                self._event(
                    s,
                    pid,
                    checkpoint_id,
                    "savepoint",
                    details={"name": name, "offsets": clean, "created_by": created_by},
                )
                return self._savepoint_record(pipeline, row)
        except IntegrityError as exc:
            existing_sp = self.get_savepoint(pipeline, name)
            raise InvariantViolation(
                f"pipeline '{pipeline}': savepoint '{name}' already exists (created "
                f"{existing_sp.created_at.isoformat()}); pick another name"
            ) from exc

    @staticmethod
    def _savepoint_exists(pipeline: str, row: Savepoint) -> InvariantViolation:
        return InvariantViolation(
            f"pipeline '{pipeline}': savepoint '{row.name}' already exists (created "
            f"{row.created_at.isoformat()}, checkpoint {row.checkpoint_id}); pick another name"
        )

    def get_savepoint(self, pipeline: str, name: str) -> SavepointRecord:
        with self._read() as s:
            pid = self._pipeline(s, pipeline).id
            row = s.execute(
                select(Savepoint).where(Savepoint.pipeline_id == pid, Savepoint.name == name)
            ).scalar_one_or_none()
            if row is None:
                raise SavepointNotFound(
                    f"pipeline '{pipeline}' has no savepoint '{name}': list them with "
                    "Ledger.list_savepoints()"
                )
            return self._savepoint_record(pipeline, row)

    def list_savepoints(self, pipeline: str) -> list[SavepointRecord]:
        with self._read() as s:
            pid = self._pipeline(s, pipeline).id
            rows = s.execute(
                select(Savepoint).where(Savepoint.pipeline_id == pid).order_by(Savepoint.id)
            ).scalars()
            return [self._savepoint_record(pipeline, r) for r in rows]

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
        clean = {(str(t), int(p)): int(o) for (t, p), o in offsets.items()}
        if any(o < 0 for o in clean.values()):
            raise ValueError(f"pipeline '{pipeline}': restore offsets must be >= 0")
        with self._write() as s:
            p = self._pipeline(s, pipeline, lock=True)
            low = self._lowest_unfinished(s, p.id)
            if low is not None:
                raise InvariantViolation(
                    f"pipeline '{pipeline}': cannot restore while checkpoint "
                    f"{low.checkpoint_id} is {low.state}; commit or abort it first"
                )
            old = p.current_lineage
            now = utcnow()
            moved = _rowcount(
                s.execute(
                    update(Pipeline)
                    .where(Pipeline.id == p.id, Pipeline.current_lineage == old)
                    .values(current_lineage=old + 1, updated_at=now)
                    .execution_options(synchronize_session=False)
                )
            )
            if moved != 1:
                raise CheckpointConflict(
                    f"pipeline '{pipeline}': another restore moved lineage {old} concurrently; "
                    "re-read the pipeline and retry if still needed",
                    pipeline=pipeline,
                )
            new = old + 1
            s.add(
                Lineage(
                    pipeline_id=p.id,
                    lineage=new,
                    started_at=now,
                    offsets=[[t, part, o] for (t, part), o in sorted(clean.items())],
                    reason=reason,
                )
            )
            s.execute(
                delete(PartitionHead)
                .where(PartitionHead.pipeline_id == p.id)
                .execution_options(synchronize_session=False)
            )
            s.add_all(
                PartitionHead(
                    pipeline_id=p.id,
                    topic=t,
                    partition=part,
                    lineage=new,
                    next_start=o,
                    checkpoint_id=None,
                )
                for (t, part), o in clean.items()
            )
            self._event(
                s,
                p.id,
                None,
                "restore",
                actor=actor,
                at=now,
                details={
                    "reason": reason,
                    "from_lineage": old,
                    "to_lineage": new,
                    "offsets": {f"{t}[{part}]": o for (t, part), o in sorted(clean.items())},
                },
            )
            return new
