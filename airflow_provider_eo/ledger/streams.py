"""Stream runs: the rows a streaming application keeps while it runs (core/stream.py).

A run registers before it plans anything, beats every ``heartbeat_s`` seconds, and ends with
a summary (ENDED), an error (FAILED) or, when nobody beat for ``stale_factor`` heartbeats,
is declared LOST by whoever looks next. Times are compared on the DATABASE's clock
(:func:`~airflow_provider_eo.ledger.leases.database_now`), never a worker's.

Two runs of one pipeline at once would plan and commit against each other (safe: the plan
is serialized and Kafka fences the older committer, but each run keeps failing the
other's commits), so :func:`register_stream_run` refuses a second RUNNING run while the
first one's heartbeat is fresh. A run that lost its row (declared LOST, then replaced) is
told so by its next heartbeat and stops at once.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from airflow_provider_eo.errors import StreamRunConflict as StreamRunConflict
from airflow_provider_eo.errors import StreamRunNotFound as StreamRunNotFound
from airflow_provider_eo.errors import StreamRunSuperseded as StreamRunSuperseded
from airflow_provider_eo.ledger.engine import Database, rowcount
from airflow_provider_eo.ledger.errors import LedgerError
from airflow_provider_eo.ledger.events import add_event
from airflow_provider_eo.ledger.leases import database_now
from airflow_provider_eo.ledger.models import StreamRun
from airflow_provider_eo.ledger.reads import pipeline_row
from airflow_provider_eo.ledger.records import Actor, StreamRunRecord

RUNNING = "RUNNING"
ENDED = "ENDED"
FAILED = "FAILED"
LOST = "LOST"
RUN_STATES = (RUNNING, ENDED, FAILED, LOST)

#: A RUNNING run whose heartbeat is older than this many heartbeats is LOST.
STALE_FACTOR = 4.0


def _record(run: StreamRun, pipeline: str, now: dt.datetime | None = None) -> StreamRunRecord:
    age = None if now is None else max(0.0, (now - run.heartbeat_at).total_seconds())
    return StreamRunRecord(
        pipeline=pipeline,
        run_id=run.run_id,
        state=run.state,
        host=run.host,
        pid=run.pid,
        commit_mode=run.commit_mode,
        heartbeat_s=run.heartbeat_s,
        started_at=run.started_at,
        heartbeat_at=run.heartbeat_at,
        ended_at=run.ended_at,
        reason=run.reason,
        summary=run.summary,
        error=run.error,
        stop_requested_at=run.stop_requested_at,
        stop_requested_by=run.stop_requested_by,
        dag_id=run.dag_id,
        task_id=run.task_id,
        log_path=run.log_path,
        heartbeat_age_s=age,
    )


def _stale(run: StreamRun, now: dt.datetime) -> bool:
    return (now - run.heartbeat_at).total_seconds() > STALE_FACTOR * run.heartbeat_s


def _run_row(s: Session, run_id: str) -> StreamRun:
    row = s.execute(
        select(StreamRun).where(StreamRun.run_id == run_id).execution_options(populate_existing=True)
    ).scalar_one_or_none()
    if row is None:
        raise StreamRunNotFound(f"stream run {run_id!r} is not in the ledger")
    return row


def _pipeline_name(s: Session, run: StreamRun) -> str:
    from airflow_provider_eo.ledger.models import Pipeline

    return str(s.execute(select(Pipeline.name).where(Pipeline.id == run.pipeline_id)).scalar_one())


def _lose(s: Session, run: StreamRun, now: dt.datetime, why: str) -> None:
    s.execute(
        update(StreamRun)
        .where(StreamRun.id == run.id, StreamRun.state == RUNNING)
        .values(state=LOST, ended_at=now, reason=why)
        .execution_options(synchronize_session=False)
    )
    add_event(s, run.pipeline_id, None, "stream_lost", at=now, details={"run_id": run.run_id, "why": why})


def register_stream_run(
    db: Database,
    pipeline: str,
    *,
    run_id: str,
    host: str,
    pid: int,
    commit_mode: str,
    heartbeat_s: float,
    dead: list[str] | None = None,
    dag_id: str | None = None,
    task_id: str | None = None,
    log_path: str | None = None,
    actor: Actor | None = None,
) -> StreamRunRecord:
    """Record a new RUNNING run of ``pipeline`` (the pipeline row is locked meanwhile).

    A RUNNING run of the pipeline whose heartbeat went stale, or whose run id is in ``dead``
    (the caller saw its process is gone, e.g. same host and no such pid), is declared LOST
    first. Any other RUNNING run is alive: :class:`StreamRunConflict` naming it.
    """
    with db.write() as s:
        p = pipeline_row(s, db, pipeline, lock=True)
        now = database_now(s)
        running = (
            s.execute(select(StreamRun).where(StreamRun.pipeline_id == p.id, StreamRun.state == RUNNING))
            .scalars()
            .all()  # fetched before any UPDATE below runs on the same connection
        )
        for other in running:
            if other.run_id == run_id:
                raise LedgerError(f"stream run {run_id!r} of pipeline {pipeline!r} is registered already")
            if _stale(other, now):
                _lose(s, other, now, f"no heartbeat since {other.heartbeat_at.isoformat()}")
            elif other.run_id in (dead or []):
                _lose(s, other, now, f"its process {other.host}:{other.pid} is gone")
            else:
                rec = _record(other, pipeline, now)
                raise StreamRunConflict(
                    f"pipeline {pipeline!r}: its streaming application already runs (run "
                    f"{other.run_id} on {other.host}, pid {other.pid}, last heartbeat "
                    f"{rec.heartbeat_age_s:.1f}s ago). Two at once would commit against each "
                    "other; stop that one first (SIGTERM, or `eo stream-stop "
                    f"{pipeline}`), or wait {STALE_FACTOR * other.heartbeat_s:.0f}s after it "
                    "died for it to count as lost.",
                    rec,
                )
        run = StreamRun(
            pipeline_id=p.id,
            run_id=run_id,
            state=RUNNING,
            host=host,
            pid=pid,
            commit_mode=commit_mode,
            heartbeat_s=float(heartbeat_s),
            started_at=now,
            heartbeat_at=now,
            reason="",
            dag_id=dag_id,
            task_id=task_id,
            log_path=log_path,
        )
        s.add(run)
        add_event(
            s,
            p.id,
            None,
            "stream_started",
            actor=actor,
            at=now,
            details={"run_id": run_id, "host": host, "pid": pid, "commit": commit_mode},
        )
        s.flush()
        return _record(run, pipeline, now)


def heartbeat_stream_run(db: Database, run_id: str) -> StreamRunRecord:
    """Beat (``heartbeat_at = now``) and return the run, whose ``stop_requested_at`` tells
    the application to stop cleanly. :class:`StreamRunSuperseded` when the row is no longer
    RUNNING (declared LOST, ended by another process): the caller must stop at once."""
    with db.write() as s:
        run = _run_row(s, run_id)
        now = database_now(s)
        name = _pipeline_name(s, run)
        if run.state != RUNNING:
            raise StreamRunSuperseded(
                f"pipeline {name!r}: stream run {run_id} is {run.state} in the ledger "
                f"({run.reason or 'no reason'}); this process stops planning at once"
            )
        run.heartbeat_at = now
        s.flush()
        return _record(run, name, now)


def end_stream_run(
    db: Database,
    run_id: str,
    *,
    state: str,
    reason: str,
    summary: dict[str, Any] | None = None,
    error: str | None = None,
) -> StreamRunRecord:
    """ENDED/FAILED/LOST with the reason, summary and error; a run already ended keeps its
    first ending (idempotent)."""
    if state not in (ENDED, FAILED, LOST):
        raise ValueError(f"a stream run ends ENDED, FAILED or LOST, not {state!r}")
    with db.write() as s:
        run = _run_row(s, run_id)
        now = database_now(s)
        won = rowcount(
            s.execute(
                update(StreamRun)
                .where(StreamRun.id == run.id, StreamRun.state == RUNNING)
                .values(state=state, ended_at=now, reason=reason, summary=summary, error=error)
                .execution_options(synchronize_session=False)
            )
        )
        if won:
            add_event(
                s,
                run.pipeline_id,
                None,
                "stream_ended",
                at=now,
                details={"run_id": run_id, "state": state, "reason": reason},
            )
        return _record(_run_row(s, run_id), _pipeline_name(s, run), now)


def request_stream_stop(
    db: Database, pipeline: str, *, requested_by: str, run_id: str | None = None
) -> list[str]:
    """Ask the pipeline's RUNNING run(s) (or only ``run_id``) to stop cleanly at their next
    heartbeat; returns the run ids asked. Idempotent (the first request's who/when stay)."""
    with db.write() as s:
        p = pipeline_row(s, db, pipeline)
        now = database_now(s)
        stmt = select(StreamRun).where(StreamRun.pipeline_id == p.id, StreamRun.state == RUNNING)
        if run_id is not None:
            stmt = stmt.where(StreamRun.run_id == run_id)
        asked = []
        for run in s.execute(stmt).scalars().all():
            if run.stop_requested_at is None:
                run.stop_requested_at = now
                run.stop_requested_by = requested_by
                add_event(
                    s, p.id, None, "stream_stop", at=now, details={"run_id": run.run_id, "by": requested_by}
                )
            asked.append(run.run_id)
        return asked


def get_stream_run(db: Database, run_id: str) -> StreamRunRecord:
    """One run, as the database has it now (``heartbeat_age_s`` on the database's clock)."""
    with db.read() as s:
        run = _run_row(s, run_id)
        return _record(run, _pipeline_name(s, run), database_now(s))


def live_stream_run(db: Database, pipeline: str) -> StreamRunRecord | None:
    """The pipeline's RUNNING run with a fresh heartbeat, None when there is none."""
    with db.read() as s:
        p = pipeline_row(s, db, pipeline)
        now = database_now(s)
        for run in s.execute(
            select(StreamRun)
            .where(StreamRun.pipeline_id == p.id, StreamRun.state == RUNNING)
            .order_by(StreamRun.id.desc())
        ).scalars():
            if not _stale(run, now):
                return _record(run, pipeline, now)
        return None
