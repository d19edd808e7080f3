"""Read-only queries behind the Airflow UI's "Exactly-once" page.

Every query is bounded by an index, so the page answers in the same time at 100 checkpoints
and at 100k (``bench/ui.py`` measures it):

- the overview reads a handful of rows per pipeline: the newest checkpoint, the newest
  COMMITTED one, the lowest unfinished one, the newest ABORTED one
  (``ix_eo_checkpoints_pipeline_state_id``);
- history pages are keyset-paginated on the primary key (``before=<checkpoint id>``), never
  ``OFFSET``: page 1000 costs what page 1 costs;
- committed ends per partition seek ``ix_eo_checkpoint_ranges_partition`` backwards.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from airflow_provider_eo.ledger.engine import Database
from airflow_provider_eo.ledger.models import (
    Checkpoint,
    CheckpointRange,
    Lineage,
    PartitionHead,
    Pipeline,
    StreamRun,
)
from airflow_provider_eo.ledger.reads import lowest_unfinished, pipeline_row
from airflow_provider_eo.ledger.states import CheckpointState

#: Largest page of the checkpoint history.
MAX_PAGE = 500
#: How many of the newest checkpoints the overview searches for the pipeline's DAG id.
DAG_LOOKBACK = 1000


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value else None


def _seconds(start: dt.datetime | None, end: dt.datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return round((end - start).total_seconds(), 3)


def _newest(s: Session, pid: int, state: CheckpointState | None = None) -> Checkpoint | None:
    stmt = select(Checkpoint).where(Checkpoint.pipeline_id == pid)
    if state is not None:
        stmt = stmt.where(Checkpoint.state == state)
    return s.execute(stmt.order_by(Checkpoint.checkpoint_id.desc()).limit(1)).scalar_one_or_none()


def _brief(row: Checkpoint | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {
        "checkpoint_id": row.checkpoint_id,
        "state": row.state.value,
        "records": row.records,
        "planned_at": _iso(row.planned_at),
        "prepared_at": _iso(row.prepared_at),
        "committed_at": _iso(row.committed_at),
        "aborted_at": _iso(row.aborted_at),
        "dag_id": row.dag_id,
        "run_id": row.run_id,
        # A Structured Streaming query's batch (None for eo's own checkpoints).
        "query_id": row.query_id,
        "batch_id": row.batch_id,
    }


def pipeline_overview(db: Database, name: str) -> dict[str, Any]:
    """One pipeline at a glance: ``state`` (``running`` / ``stopped`` / ``failing``), the
    last committed checkpoint, the one in flight, the last error, its DAG, its partitions,
    and its newest streaming run (``stream``: host, pid, heartbeat age, how it ended).

    ``failing``: the newest finished checkpoint was ABORTED (the last error says why).
    """
    with db.read() as s:
        row = pipeline_row(s, db, name)
        newest = _newest(s, row.id)
        committed = _newest(s, row.id, CheckpointState.COMMITTED)
        aborted = _newest(s, row.id, CheckpointState.ABORTED)
        in_flight = lowest_unfinished(s, row.id)
        partitions = s.execute(
            select(PartitionHead.topic, PartitionHead.partition)
            .where(PartitionHead.pipeline_id == row.id)
            .order_by(PartitionHead.topic, PartitionHead.partition)
        ).all()
        # The DAG that runs it: the newest checkpoint planned by an Airflow task, among the
        # last DAG_LOOKBACK (a pipeline run only from the CLI must not cost a full scan).
        dag_row = s.execute(
            select(Checkpoint.dag_id)
            .where(
                Checkpoint.pipeline_id == row.id,
                Checkpoint.checkpoint_id > row.last_checkpoint_id - DAG_LOOKBACK,
                Checkpoint.dag_id.is_not(None),
            )
            .order_by(Checkpoint.checkpoint_id.desc())
            .limit(1)
        ).scalar_one_or_none()
        stream = _stream_run(s, row.id)
        failing = aborted is not None and (
            committed is None or aborted.checkpoint_id > committed.checkpoint_id
        )
        if row.stopped_at is not None:
            state = "stopped"
        elif failing:
            state = "failing"
        else:
            state = "running"
        last_error = None
        if aborted is not None:
            last_error = {
                "checkpoint_id": aborted.checkpoint_id,
                "at": _iso(aborted.aborted_at),
                "reason": aborted.abort_reason or "",
            }
        return {
            "name": row.name,
            "state": state,
            "lineage": row.current_lineage,
            "checkpoints": row.last_checkpoint_id,
            "stopped": None
            if row.stopped_at is None
            else {"at": _iso(row.stopped_at), "by": row.stopped_by, "reason": row.stop_reason},
            "backfill_of": row.backfill_of,
            "dag_id": dag_row,
            "last_checkpoint": _brief(newest),
            "last_committed": _brief(committed),
            "in_flight": _brief(in_flight),
            "last_error": last_error,
            "partitions": [{"topic": t, "partition": p} for t, p in partitions],
            "created_at": _iso(row.created_at),
            "stream": stream,
        }


def _stream_run(s: Session, pid: int) -> dict[str, Any] | None:
    """The pipeline's newest streaming run (None: never streamed): ``state`` is the row's,
    or ``STALE`` for a RUNNING run silent past the stale bound (killed, or its host gone)."""
    from airflow_provider_eo.ledger.leases import database_now
    from airflow_provider_eo.ledger.streams import RUNNING, STALE_FACTOR

    run = s.execute(
        select(StreamRun).where(StreamRun.pipeline_id == pid).order_by(StreamRun.id.desc()).limit(1)
    ).scalar_one_or_none()
    if run is None:
        return None
    age = max(0.0, (database_now(s) - run.heartbeat_at).total_seconds())
    state = run.state
    if state == RUNNING and age > STALE_FACTOR * run.heartbeat_s:
        state = "STALE"
    return {
        "run_id": run.run_id,
        "state": state,
        "host": run.host,
        "pid": run.pid,
        "commit": run.commit_mode,
        "heartbeat_age_s": round(age, 1),
        "started_at": _iso(run.started_at),
        "ended_at": _iso(run.ended_at),
        "reason": run.reason,
        "stop_requested": run.stop_requested_at is not None,
    }


def pipeline_names(db: Database) -> list[str]:
    """Every registered pipeline's name, sorted."""
    with db.read() as s:
        return list(s.execute(select(Pipeline.name).order_by(Pipeline.name)).scalars())


def checkpoint_page(db: Database, name: str, *, limit: int = 50, before: int | None = None) -> dict[str, Any]:
    """The newest ``limit`` checkpoints with ids below ``before`` (all when None), newest
    first, with their ranges, durations and lineage breaks; ``next_before`` pages on.

    Durations: ``prepare_s`` is planned → prepared (waiting for Spark included),
    ``commit_s`` prepared → committed, ``total_s`` planned → committed (or aborted).
    """
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
    with db.read() as s:
        pid = pipeline_row(s, db, name).id
        stmt = select(Checkpoint).where(Checkpoint.pipeline_id == pid)
        if before is not None:
            stmt = stmt.where(Checkpoint.checkpoint_id < before)
        rows = list(s.execute(stmt.order_by(Checkpoint.checkpoint_id.desc()).limit(limit + 1)).scalars())
        more = len(rows) > limit
        rows = rows[:limit]
        ranges: dict[int, list[dict[str, Any]]] = {}
        if rows:
            lo, hi = rows[-1].checkpoint_id, rows[0].checkpoint_id
            for r in s.execute(
                select(CheckpointRange)
                .where(
                    CheckpointRange.pipeline_id == pid,
                    CheckpointRange.checkpoint_id.between(lo, hi),
                )
                .order_by(CheckpointRange.checkpoint_id, CheckpointRange.topic, CheckpointRange.partition)
            ).scalars():
                entry: dict[str, Any] = {
                    "topic": r.topic,
                    "partition": r.partition,
                    "start": r.start_offset,
                    "end": r.end_offset,
                }
                if r.skipped_from is not None:
                    entry["skipped_from"] = r.skipped_from
                ranges.setdefault(r.checkpoint_id, []).append(entry)
        lineages = s.execute(
            select(Lineage).where(Lineage.pipeline_id == pid).order_by(Lineage.lineage)
        ).scalars()
        breaks = [
            {"lineage": ln.lineage, "at": _iso(ln.started_at), "reason": ln.reason}
            for ln in lineages
            if ln.lineage > 1
        ]
        out = []
        for row in rows:
            rs = ranges.get(row.checkpoint_id, [])
            end = row.committed_at or row.aborted_at
            out.append(
                {
                    "checkpoint_id": row.checkpoint_id,
                    "state": row.state.value,
                    "lineage": row.lineage,
                    "records": row.records,
                    "dead_letters": row.dead_letters,
                    "records_planned": sum(r["end"] - r["start"] for r in rs),
                    "bytes": row.bytes,
                    "planned_at": _iso(row.planned_at),
                    "prepared_at": _iso(row.prepared_at),
                    "committed_at": _iso(row.committed_at),
                    "aborted_at": _iso(row.aborted_at),
                    "prepare_s": _seconds(row.planned_at, row.prepared_at),
                    "commit_s": _seconds(row.prepared_at, row.committed_at),
                    "total_s": _seconds(row.planned_at, end),
                    "ranges": rs,
                    "skipped": sum(r["start"] - r["skipped_from"] for r in rs if "skipped_from" in r),
                    "abort_reason": row.abort_reason,
                    "backfill": row.filter_start_ms is not None,
                    "dag_id": row.dag_id,
                    "run_id": row.run_id,
                    "query_id": row.query_id,
                    "batch_id": row.batch_id,
                }
            )
        return {
            "pipeline": name,
            "checkpoints": out,
            "next_before": rows[-1].checkpoint_id if more and rows else None,
            "lineage_breaks": breaks,
        }


def committed_ends(db: Database, name: str) -> dict[tuple[str, int], int]:
    """Per known partition: the end offset of its newest COMMITTED range in the current
    lineage (the restore offset of the lineage when none committed yet, else absent).

    Walks each partition's ranges backwards on ``ix_eo_checkpoint_ranges_partition`` from
    the newest COMMITTED checkpoint (a join lets SQLite's planner scan every committed
    checkpoint instead: 190 ms at 100k, measured by bench/ui.py).
    """
    with db.read() as s:
        row = pipeline_row(s, db, name)
        lineage = row.current_lineage
        parts = s.execute(
            select(PartitionHead.topic, PartitionHead.partition).where(PartitionHead.pipeline_id == row.id)
        ).all()
        newest = s.execute(
            select(Checkpoint.checkpoint_id)
            .where(
                Checkpoint.pipeline_id == row.id,
                Checkpoint.state == CheckpointState.COMMITTED,
                Checkpoint.lineage == lineage,
            )
            .order_by(Checkpoint.checkpoint_id.desc())
            .limit(1)
        ).scalar_one_or_none()
        out: dict[tuple[str, int], int] = {}
        for topic, partition in parts:
            end = (
                None
                if newest is None
                else _newest_committed_end(s, row.id, lineage, topic, partition, newest)
            )
            if end is None:
                restored = s.get(Lineage, (row.id, lineage))
                for t, p, offset in (restored.offsets if restored is not None else None) or []:
                    if t == topic and int(p) == partition:
                        end = int(offset)
            if end is not None:
                out[(topic, partition)] = end
        return out


def _newest_committed_end(
    s: Session, pid: int, lineage: int, topic: str, partition: int, newest: int, step: int = 50
) -> int | None:
    """The end of the partition's newest range in a COMMITTED checkpoint of ``lineage``
    at or below checkpoint ``newest``; None when the lineage has none."""
    cursor = newest + 1
    while True:
        ranges = s.execute(
            select(CheckpointRange.checkpoint_id, CheckpointRange.end_offset)
            .where(
                CheckpointRange.pipeline_id == pid,
                CheckpointRange.topic == topic,
                CheckpointRange.partition == partition,
                CheckpointRange.checkpoint_id < cursor,
            )
            .order_by(CheckpointRange.checkpoint_id.desc())
            .limit(step)
        ).all()
        if not ranges:
            return None
        states = dict(
            s.execute(
                select(Checkpoint.checkpoint_id, Checkpoint.state).where(
                    Checkpoint.pipeline_id == pid,
                    Checkpoint.lineage == lineage,
                    Checkpoint.checkpoint_id.in_([cid for cid, _ in ranges]),
                )
            ).all()
        )
        for cid, end in ranges:
            if cid not in states:  # an older lineage: this one committed nothing here
                return None
            if states[cid] == CheckpointState.COMMITTED:
                return int(end)
        cursor = ranges[-1][0]


def checkpoint_count(db: Database, name: str) -> int:
    """How many checkpoints the pipeline has in the ledger (all states)."""
    with db.read() as s:
        pid = pipeline_row(s, db, name).id
        return int(s.execute(select(func.count()).where(Checkpoint.pipeline_id == pid)).scalar_one())
