"""The commit's rows: the commit lease of a PREPARED checkpoint, one row per commit shard, and
the fence lease with the conditional abort it guards.

The commit lease is not what keeps two committers from publishing twice: the pipeline's
pinned transactional-id prefix is (every committer uses the same ids, so Kafka fences the
older one). The lease only keeps two healthy committers from fencing each other in turn, and
it compares times on the DATABASE's clock (:func:`database_now`), never a worker's: a worker
whose clock runs ahead cannot see a held lease as expired.

The fence lease is the same columns held by an abort or a recovery on EVERY unfinished
checkpoint of the pipeline (:func:`acquire_fence_lease`): a pipeline's transactional ids are
one per commit shard, shared by all its checkpoints, so fencing them for one checkpoint fences
the committer of any other. It is refused while a committer holds a live lease; while it is
held, no committer passes its lease check, so none begins a transaction that the fence would
kill or that the abort's marker read would miss. :func:`abort` refuses the transition while a
committer holds a live lease on what it aborts, or once one took the fence lease over.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import ColumnElement, or_, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from airflow_provider_eo.errors import CommitInProgress as CommitInProgress
from airflow_provider_eo.ledger.engine import Database, rowcount, utcnow
from airflow_provider_eo.ledger.errors import CommitLeaseHeld, InvariantViolation
from airflow_provider_eo.ledger.events import add_event
from airflow_provider_eo.ledger.mapping import checkpoint_record_of
from airflow_provider_eo.ledger.models import Checkpoint, CommitShard
from airflow_provider_eo.ledger.reads import pipeline_row, require_checkpoint
from airflow_provider_eo.ledger.records import Actor, CheckpointRecord
from airflow_provider_eo.ledger.states import UNFINISHED_STATES, CheckpointState, ShardState
from airflow_provider_eo.ledger.transitions import check_order, conflict, record_aborted

PREPARED = CheckpointState.PREPARED
#: One equality seek per state on (pipeline_id, state, checkpoint_id) (see ledger/reads.py).
_UNFINISHED = sorted(UNFINISHED_STATES, key=lambda state: state.value)


#: The way out of a refusal while the lease holder is known to be dead (its lease still runs).
FORCE_LIVE_HINT = (
    "Only if that committer is known to be dead (its process gone, not paused or slow), "
    "`eo abort … --force-live` or `eo recover --force-live` takes its lease now; a live "
    "committer would be fenced and its commit would fail."
)


def _in_progress(
    pipeline: str, row: Checkpoint, now: dt.datetime, refused: str, *, lost: bool = False
) -> CommitInProgress:
    """The refusal naming ``row``'s lease holder; ``refused`` says what it stops and why;
    ``lost``: the caller's own lease was taken over by that holder (so it is alive)."""
    until = row.commit_lease_until
    if until is not None and until >= now:
        held = f"until {until.isoformat()} ({(until - now).total_seconds():.1f}s left)"
    else:  # took over a lease of ours that ran out: it may have begun since
        held = f"until {until.isoformat() if until else '?'} (run out, but it may have begun since)"
    way_out = "" if lost else f" {FORCE_LIVE_HINT}"
    return CommitInProgress(
        f"pipeline '{pipeline}': checkpoint {row.checkpoint_id} is being committed by "
        f"{row.commit_owner!r} {held}; wait, or stop it first. {refused} Nothing was changed."
        f"{way_out}",
        pipeline=pipeline,
        checkpoint_id=row.checkpoint_id,
        owner=row.commit_owner,
        until=until,
        lost=lost,
    )


def _live(row: Checkpoint, now: dt.datetime) -> bool:
    return (
        row.commit_owner is not None and row.commit_lease_until is not None and row.commit_lease_until >= now
    )


def database_now(s: Session) -> dt.datetime:
    """The database server's current time (aware, UTC), read in the caller's transaction.

    SQLite has no server: ``strftime(... 'now')`` (UTC, with milliseconds) is read by the
    process that runs the statement, so a lease on SQLite is only as good as the calling
    host's clock (one host in practice: a SQLite ledger is refused on network filesystems).
    PostgreSQL's is the server's (``CURRENT_TIMESTAMP``: the transaction's start, so every
    comparison in one transaction sees one instant): a worker with a skewed clock cannot
    take over a lease still held.
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
    db: Database,
    pipeline: str,
    checkpoint_id: int,
    *,
    owner: str,
    ttl_s: float,
    replacing: str | None = None,
) -> CheckpointRecord:
    """Become the only committer of a PREPARED checkpoint until ``now + ttl_s``.

    A compare-and-set: succeeds when nobody holds the lease, when ``owner`` already
    holds it (renewal), when the holder's lease expired (take-over), or when it is held by
    exactly ``replacing`` (a holder the caller knows to be gone: its process no longer
    runs). Otherwise :class:`CommitLeaseHeld` naming the holder. Each committer process has
    its own owner (:func:`airflow_provider_eo.names.lease_owner`), so a second committer is
    refused while the first's lease is live. Times are the database's clock, never this worker's. The
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
                    *([Checkpoint.commit_owner == replacing] if replacing else []),
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
                f"pipeline '{pipeline}', checkpoint {checkpoint_id} is being committed by "
                f"{row.commit_owner!r} (lease until {until.isoformat() if until else '?'}, "
                f"{left:.1f}s left); this committer published nothing and fenced nothing. If "
                "that committer is alive, let it finish. If it died (a killed task or stream "
                "on another host), its lease runs out then: retry after it. Only if it is "
                "known to be dead (its process gone, not paused or slow), `eo recover "
                "MODULE:ATTR --force-live` takes its lease and finishes the commit now; a live "
                "committer would be fenced and its commit would fail.",
                owner=row.commit_owner,
            )
        if previous_owner != owner:
            details: dict[str, Any] = {
                "owner": owner,
                "ttl_s": ttl_s,
                "previous_owner": previous_owner,
                "previous_until": previous_until.isoformat() if previous_until else None,
            }
            if replacing is not None and previous_owner == replacing:
                details["previous_owner_gone"] = True
            add_event(s, pid, checkpoint_id, "lease", details=details, at=now)
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
    publish_s: float | None = None,
) -> None:
    """Upsert one shard row, never COMMITTED -> PENDING; see :meth:`Ledger.record_shard`.
    ``publish_s`` (COMMITTED only): how long the transaction that published the shard took,
    recorded as a ``publish`` event (the plan measures the publish rate from these)."""
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
        if publish_s is not None and state == ShardState.COMMITTED:
            add_event(
                s,
                pid,
                checkpoint_id,
                "publish",
                details={"shard": shard, "records": records, "seconds": round(publish_s, 6)},
            )


# -- the fence lease and the conditional abort ---------------------------------------------


_FENCE_REFUSED = (
    "The pipeline's transactional ids (one per commit shard) are shared by all its "
    "checkpoints, so fencing them now would kill that committer."
)


def _unfinished_rows(s: Session, pid: int) -> list[Checkpoint]:
    rows: list[Checkpoint] = []
    for state in _UNFINISHED:
        rows.extend(
            s.execute(
                select(Checkpoint)
                .where(Checkpoint.pipeline_id == pid, Checkpoint.state == state)
                .execution_options(populate_existing=True)
            ).scalars()
        )
    return sorted(rows, key=lambda row: row.checkpoint_id)


def _hold(
    db: Database, pipeline: str, *, owner: str, ttl_s: float, take_over: bool, renew: bool
) -> list[int]:
    """Lease every unfinished checkpoint to ``owner`` until ``now + ttl_s``, all or nothing.

    ``renew``: a row held by anyone else (live or not) refuses, since it was taken over from
    ``owner``. Otherwise a row held live by anyone else refuses, unless ``take_over``."""
    if not owner:
        raise ValueError("owner must be non-empty")
    if ttl_s <= 0:
        raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
    with db.write() as s:
        pid = pipeline_row(s, db, pipeline, lock=True).id
        now = database_now(s)  # never this worker's clock: it may be skewed or paused
        until = now + dt.timedelta(seconds=ttl_s)
        rows = _unfinished_rows(s, pid)
        for row in rows:
            if row.commit_owner in (None, owner):
                continue
            if renew or (_live(row, now) and not take_over):
                raise _in_progress(pipeline, row, now, _FENCE_REFUSED, lost=renew)
        free: ColumnElement[bool] = or_(Checkpoint.commit_owner.is_(None), Checkpoint.commit_owner == owner)
        if not renew and not take_over:
            free = or_(free, Checkpoint.commit_lease_until.is_(None), Checkpoint.commit_lease_until < now)
        held: list[int] = []
        for row in rows:
            previous_owner, previous_until = row.commit_owner, row.commit_lease_until
            conditions = [
                Checkpoint.pipeline_id == pid,
                Checkpoint.checkpoint_id == row.checkpoint_id,
                Checkpoint.state.in_(UNFINISHED_STATES),
            ]
            if not take_over:
                conditions.append(free)
            result = s.execute(
                update(Checkpoint)
                .where(*conditions)
                .values(commit_owner=owner, commit_lease_until=until)
                .execution_options(synchronize_session=False)
            )
            if rowcount(result) != 1:  # a committer won the row meanwhile (PostgreSQL), or it finished
                fresh = require_checkpoint(s, db, pipeline, pid, row.checkpoint_id)
                if fresh.state in UNFINISHED_STATES:
                    raise _in_progress(pipeline, fresh, now, _FENCE_REFUSED, lost=renew)
                continue
            held.append(row.checkpoint_id)
            if previous_owner != owner:
                add_event(
                    s,
                    pid,
                    row.checkpoint_id,
                    "lease",
                    details={
                        "owner": owner,
                        "ttl_s": ttl_s,
                        "purpose": "fence",
                        "previous_owner": previous_owner,
                        "previous_until": previous_until.isoformat() if previous_until else None,
                    },
                    at=now,
                )
        return held


def acquire_fence_lease(
    db: Database, pipeline: str, *, owner: str, ttl_s: float, take_over: bool = False
) -> list[int]:
    """Hold the commit lease of every unfinished checkpoint of ``pipeline`` for ``owner`` until
    ``now + ttl_s``: taken before an abort or a recovery fences the pipeline's transactional
    ids, so no committer of any checkpoint begins a transaction meanwhile.

    All or nothing, under the pipeline row's lock, on the database's clock. Refuses
    (:class:`CommitInProgress`, nothing changed) while a committer holds a live lease on one of
    them; a lease that ran out is taken over (its committer is dead or paused: the fence that
    follows stops it). ``take_over``: take live leases too (a committer known to be dead).
    Holding it again is a renewal; the heartbeat is :func:`renew_fence_lease`.

    Returns the ids of the checkpoints now held, lowest first.
    """
    return _hold(db, pipeline, owner=owner, ttl_s=ttl_s, take_over=take_over, renew=False)


def renew_fence_lease(db: Database, pipeline: str, *, owner: str, ttl_s: float) -> list[int]:
    """The fence lease's heartbeat: every unfinished checkpoint still held by ``owner`` (even
    when its time ran out: nobody took it) is held until ``now + ttl_s``, and a checkpoint
    planned since is taken too.

    Refuses (:class:`CommitInProgress`, nothing changed) once anyone else holds one of them,
    live or not: a committer that took the lease over may have begun a transaction. Returns
    the ids of the checkpoints held, lowest first.
    """
    return _hold(db, pipeline, owner=owner, ttl_s=ttl_s, take_over=False, renew=True)


def release_fence_lease(db: Database, pipeline: str, *, owner: str) -> int:
    """End ``owner``'s hold on the pipeline's unfinished checkpoints at once (committers go on
    without waiting for it to run out); the number of checkpoints released."""
    with db.write() as s:
        pid = pipeline_row(s, db, pipeline).id
        return _release(s, pid, owner)


def _release(s: Session, pid: int, owner: str) -> int:
    result = s.execute(
        update(Checkpoint)
        .where(
            Checkpoint.pipeline_id == pid,
            Checkpoint.commit_owner == owner,
            Checkpoint.state.in_(UNFINISHED_STATES),
        )
        .values(commit_lease_until=None)
        .execution_options(synchronize_session=False)
    )
    return rowcount(result)


def abort(
    db: Database,
    pipeline: str,
    checkpoint_id: int,
    *,
    reason: str,
    actor: Actor | None = None,
    lease_owner: str | None = None,
) -> CheckpointRecord:
    """PLANNED/PREPARED -> ABORTED, unless a committer may still publish it; the range is
    replanned from the same start.

    The conditional abort, one transaction under the pipeline row's lock (see
    :func:`~airflow_provider_eo.ledger.transitions.record_aborted` for the transition and its
    cascade to later unfinished checkpoints). Refused (:class:`CommitInProgress` naming the
    pipeline, the checkpoint and the lease holder; nothing changed):

    - without ``lease_owner``: while anyone holds a live commit lease on a checkpoint it
      aborts;
    - with ``lease_owner`` (the owner of the fence lease taken before fencing and reading the
      markers, :func:`acquire_fence_lease`): once anyone else holds one of them, live or not,
      since that committer may have begun a transaction after the markers were read. Then
      ``lease_owner``'s leases on the checkpoints left unfinished are released.

    Idempotent: aborting an ABORTED checkpoint does nothing. A COMMITTED checkpoint cannot be
    aborted (CheckpointConflict). Only abort a PREPARED checkpoint after the commit markers
    show that no shard published it.
    """
    refused = (
        f"Aborting checkpoint {checkpoint_id} now would let that committer publish a range the abort replans."
    )
    with db.write() as s:
        p = pipeline_row(s, db, pipeline, lock=True)
        now = database_now(s)
        if lease_owner is None:
            unleased = or_(
                Checkpoint.commit_owner.is_(None),
                Checkpoint.commit_lease_until.is_(None),
                Checkpoint.commit_lease_until < now,
            )

            def guard(row: Checkpoint) -> None:
                if _live(row, now):
                    raise _in_progress(pipeline, row, now, refused)

        else:
            unleased = or_(Checkpoint.commit_owner.is_(None), Checkpoint.commit_owner == lease_owner)

            def guard(row: Checkpoint) -> None:
                if row.commit_owner not in (None, lease_owner):  # took the fence lease over
                    raise _in_progress(pipeline, row, now, refused, lost=True)

        record = record_aborted(
            s, db, pipeline, p, checkpoint_id, reason=reason, actor=actor, guard=guard, also=unleased
        )
        if lease_owner is not None:
            _release(s, p.id, lease_owner)
        return record
