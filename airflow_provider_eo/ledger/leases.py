"""The commit's rows: the commit lease of a PREPARED checkpoint, and one row per commit shard.

The lease is not what keeps two committers from publishing twice: the pipeline's pinned
transactional-id prefix is (every committer uses the same ids, so Kafka fences the older
one). The lease only keeps two healthy committers from fencing each other in turn, and it
compares times on the DATABASE's clock (:func:`database_now`), never a worker's: a worker
whose clock runs ahead cannot see a held lease as expired.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import or_, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from airflow_provider_eo.ledger.engine import Database, rowcount, utcnow
from airflow_provider_eo.ledger.errors import CommitLeaseHeld, InvariantViolation
from airflow_provider_eo.ledger.events import add_event
from airflow_provider_eo.ledger.mapping import checkpoint_record_of
from airflow_provider_eo.ledger.models import Checkpoint, CommitShard
from airflow_provider_eo.ledger.reads import pipeline_row, require_checkpoint
from airflow_provider_eo.ledger.records import CheckpointRecord
from airflow_provider_eo.ledger.states import CheckpointState, ShardState
from airflow_provider_eo.ledger.transitions import check_order, conflict

PREPARED = CheckpointState.PREPARED


def database_now(s: Session) -> dt.datetime:
    """The database server's current time (aware, UTC), read in the caller's transaction.

    SQLite's clock is the host of the ledger file (``strftime(... 'now')`` is UTC, with
    milliseconds); PostgreSQL's is the server's (``CURRENT_TIMESTAMP``: the transaction's
    start, so every comparison in one transaction sees one instant).
    """
    if s.get_bind().dialect.name == "sqlite":
        raw = s.execute(text("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")).scalar_one()
        return dt.datetime.fromisoformat(str(raw)).replace(tzinfo=dt.timezone.utc)
    value = s.execute(text("SELECT CURRENT_TIMESTAMP")).scalar_one()
    if not isinstance(value, dt.datetime):
        raise TypeError(f"CURRENT_TIMESTAMP returned {value!r}, not a timestamp")
    if value.tzinfo is None:  # a server without time zones: its clock is taken as UTC
        return value.replace(tzinfo=dt.timezone.utc)
    return value.astimezone(dt.timezone.utc)


def acquire_commit_lease(
    db: Database, pipeline: str, checkpoint_id: int, *, owner: str, ttl_s: float
) -> CheckpointRecord:
    """Become the only committer of a PREPARED checkpoint until ``now + ttl_s``.

    A compare-and-set: succeeds when nobody holds the lease, when ``owner`` already
    holds it (renewal), or when the holder's lease expired (take-over). Otherwise
    :class:`CommitLeaseHeld`. Times are the database's clock, never this worker's. The
    lease keeps healthy committers from fencing each other; it is not what stops a
    duplicate (a pause beats any lease): the pinned transactional-id prefix is, since
    it lets Kafka fence every earlier committer.
    """
    if not owner:
        raise ValueError("owner must be non-empty")
    if ttl_s <= 0:
        raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
    with db.write() as s:
        pid = pipeline_row(s, db, pipeline).id
        now = database_now(s)  # never this worker's clock: it may be skewed or paused
        before = require_checkpoint(s, db, pipeline, pid, checkpoint_id)
        previous_owner, previous_until = before.commit_owner, before.commit_lease_until
        if before.state == PREPARED:
            check_order(s, pipeline, pid, checkpoint_id, "commit")
        # The compare-and-set: free, ours, or expired.
        result = s.execute(
            update(Checkpoint)
            .where(
                Checkpoint.pipeline_id == pid,
                Checkpoint.checkpoint_id == checkpoint_id,
                Checkpoint.state == PREPARED,
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
        row = require_checkpoint(s, db, pipeline, pid, checkpoint_id)
        if rowcount(result) != 1:
            if row.state != PREPARED:
                raise conflict(pipeline, row, PREPARED.value, "lease for commit")
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
            add_event(
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
        return checkpoint_record_of(s, pipeline, row)


def release_commit_lease(db: Database, pipeline: str, checkpoint_id: int, *, owner: str) -> bool:
    """Give up ``owner``'s lease early; False (nothing changed) when it does not hold it."""
    with db.write() as s:
        pid = pipeline_row(s, db, pipeline).id
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
        return rowcount(result) == 1


def record_shard(
    db: Database,
    pipeline: str,
    checkpoint_id: int,
    shard: int,
    *,
    transactional_id: str,
    producer_id: int | None,
    producer_epoch: int | None,
    state: ShardState,
    records: int,
) -> None:
    """Upsert one shard row, never COMMITTED -> PENDING; see :meth:`Ledger.record_shard`."""
    with db.write() as s:
        pid = pipeline_row(s, db, pipeline).id
        row = require_checkpoint(s, db, pipeline, pid, checkpoint_id)
        if row.state not in (PREPARED, CheckpointState.COMMITTED):
            raise conflict(pipeline, row, PREPARED.value, f"record shard {shard} of")
        table = CommitShard.__table__
        values = {
            "pipeline_id": pid,
            "checkpoint_id": checkpoint_id,
            "shard": shard,
            "transactional_id": transactional_id,
            "producer_id": producer_id,
            "producer_epoch": producer_epoch,
            "state": state,
            "records": records,
            "updated_at": utcnow(),
        }
        insert_fn: Any = postgresql.insert if db.dialect == "postgresql" else sqlite.insert
        ins = insert_fn(table).values(**values)
        stmt = ins.on_conflict_do_update(
            index_elements=["pipeline_id", "checkpoint_id", "shard"],
            set_={k: ins.excluded[k] for k in values if k not in ("pipeline_id", "checkpoint_id", "shard")},
            # A COMMITTED row only takes another COMMITTED write: never back to PENDING.
            where=or_(table.c.state != ShardState.COMMITTED, ins.excluded.state == ShardState.COMMITTED),
        )
        # preserve_rowcount: SQLAlchemy only keeps rowcount of UPDATE/DELETE by default.
        upserted = s.connection().execute(stmt.execution_options(preserve_rowcount=True))
        if upserted.rowcount != 1:
            raise InvariantViolation(
                f"pipeline '{pipeline}', checkpoint {checkpoint_id}: shard {shard} is "
                f"recorded COMMITTED and cannot go back to {state}; its transaction "
                "is visible in Kafka, do not publish it again"
            )
