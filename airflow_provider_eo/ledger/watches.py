"""Watch marks and the reads of the ledger's Airflow asset watchers.

A watcher (an event trigger in Airflow's triggerer) decides from the ledger and Kafka when
to fire an asset event. What it last fired for lives here, in ``eo_watch_marks``, so a
restarted triggerer neither fires again for it nor forgets it. A firing is claimed with a
compare-and-set on the mark's ``seq`` *before* the event is yielded: of two copies of one
watcher (a triggerer failing over), only the one whose claim matched fires.

The mark is the only thing a watcher writes; it never touches a checkpoint.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from airflow_provider_eo.ledger.engine import Database, rowcount
from airflow_provider_eo.ledger.leases import database_now
from airflow_provider_eo.ledger.mapping import checkpoint_records
from airflow_provider_eo.ledger.models import Checkpoint, StreamRun, WatchMark
from airflow_provider_eo.ledger.reads import pipeline_row
from airflow_provider_eo.ledger.records import CheckpointRecord


@dataclass(frozen=True)
class WatchMarkRecord:
    """A watch mark as read: ``seq`` (0: the watch never fired), the watch's ``state``, and
    how long ago (``age_s``, on the database's clock) it last fired."""

    pipeline: str
    watch: str
    seq: int
    state: dict[str, Any]
    fired_at: dt.datetime | None
    age_s: float | None


def get_watch_mark(db: Database, pipeline: str, watch: str) -> WatchMarkRecord:
    """The mark of ``pipeline``'s ``watch``; ``seq`` 0 and an empty state when it never fired."""
    with db.read() as s:
        row = s.get(WatchMark, (pipeline, watch))
        if row is None:
            return WatchMarkRecord(pipeline, watch, 0, {}, None, None)
        now = database_now(s)
        return WatchMarkRecord(
            pipeline,
            watch,
            row.seq,
            dict(row.state),
            row.fired_at,
            max(0.0, (now - row.fired_at).total_seconds()),
        )


def claim_watch_mark(db: Database, pipeline: str, watch: str, *, seq: int, state: dict[str, Any]) -> bool:
    """Record that ``watch`` fires for ``state``, if its mark still has ``seq`` (the one the
    watcher read before deciding); the mark's ``seq`` becomes ``seq + 1``. False when another
    copy of the watcher claimed first (the caller then reads the mark again and fires
    nothing for the old decision)."""
    try:
        with db.write() as s:
            now = database_now(s)
            if seq == 0:
                s.add(WatchMark(pipeline=pipeline, watch=watch, seq=1, state=state, fired_at=now))
                s.flush()
                return True
            moved = s.execute(
                update(WatchMark)
                .where(WatchMark.pipeline == pipeline, WatchMark.watch == watch, WatchMark.seq == seq)
                .values(seq=seq + 1, state=state, fired_at=now)
            )
            return rowcount(moved) == 1
    except IntegrityError:  # a first claim raced another copy's
        return False


def checkpoints_after(
    db: Database, pipeline: str, after_id: int, *, limit: int = 100
) -> list[CheckpointRecord]:
    """The pipeline's checkpoints with an id above ``after_id``, lowest first, at most ``limit``
    (a read the primary key bounds: a watcher polls it)."""
    with db.read() as s:
        pid = pipeline_row(s, db, pipeline).id
        rows = (
            s.execute(
                select(Checkpoint)
                .where(Checkpoint.pipeline_id == pid, Checkpoint.checkpoint_id > after_id)
                .order_by(Checkpoint.checkpoint_id)
                .limit(limit)
            )
            .scalars()
            .all()
        )
        return checkpoint_records(s, pipeline, rows)


def newest_checkpoint_id(db: Database, pipeline: str) -> int:
    """The highest checkpoint id of the pipeline (0 when it has none)."""
    with db.read() as s:
        pid = pipeline_row(s, db, pipeline).id
        found = s.execute(
            select(Checkpoint.checkpoint_id)
            .where(Checkpoint.pipeline_id == pid)
            .order_by(Checkpoint.checkpoint_id.desc())
            .limit(1)
        ).scalar_one_or_none()
        return int(found or 0)


@dataclass(frozen=True)
class StreamCommitter:
    """Who committed as a streaming application with ``commit="inline"``: its Airflow task
    (``dag_id``/``task_id``, None when started from the CLI) and when it ran."""

    run_id: str
    dag_id: str | None
    task_id: str | None
    started_at: dt.datetime
    ended_at: dt.datetime | None  # None while it runs

    def committed(self, cp: CheckpointRecord) -> bool:
        """Whether this run committed ``cp``: the ledger records the committer's task, which
        is this run's (a commit task is never the stream's task); a run started from the CLI
        has none, so there the commit time must fall within the run."""
        if cp.committed_at is None or (cp.dag_id, cp.task_id) != (self.dag_id, self.task_id):
            return False
        if self.dag_id is not None:
            return True
        return self.started_at <= cp.committed_at and (
            self.ended_at is None or cp.committed_at <= self.ended_at
        )


def stream_committers(db: Database, pipeline: str) -> list[StreamCommitter]:
    """The pipeline's stream runs that commit themselves (``commit="inline"``)."""
    with db.read() as s:
        pid = pipeline_row(s, db, pipeline).id
        rows = s.execute(
            select(StreamRun).where(StreamRun.pipeline_id == pid, StreamRun.commit_mode == "inline")
        ).scalars()
        return [
            StreamCommitter(
                run_id=r.run_id,
                dag_id=r.dag_id,
                task_id=r.task_id,
                started_at=r.started_at,
                ended_at=r.ended_at,
            )
            for r in rows
        ]
