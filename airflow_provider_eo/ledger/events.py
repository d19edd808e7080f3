"""The append-only event log: one row per transition, lease, restore, savepoint, pipeline change."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from airflow_provider_eo.ledger.engine import Database, utcnow
from airflow_provider_eo.ledger.mapping import actor_columns, event_record
from airflow_provider_eo.ledger.models import Event
from airflow_provider_eo.ledger.reads import pipeline_row
from airflow_provider_eo.ledger.records import Actor, EventRecord
from airflow_provider_eo.ledger.states import CheckpointState

#: The event a detached prepare's launcher records on its checkpoint when spark-submit ended
#: and the checkpoint is not PREPARED; ``details``: ``launch_id``, ``error``, ``host``,
#: ``log_path``.
PREPARE_LAUNCH_FAILED = "prepare_launch_failed"


def add_event(
    s: Session,
    pid: int,
    checkpoint_id: int | None,
    kind: str,
    *,
    from_state: CheckpointState | None = None,
    to_state: CheckpointState | None = None,
    actor: Actor | None = None,
    details: Mapping[str, Any] | None = None,
    at: dt.datetime | None = None,
) -> None:
    """Append one event in the caller's transaction (it commits with the change it tells)."""
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
            **actor_columns(actor),
        )
    )


def list_events(db: Database, pipeline: str, checkpoint_id: int | None = None) -> list[EventRecord]:
    """The append-only event log of the pipeline (or of one checkpoint), oldest first."""
    with db.read() as s:
        pid = pipeline_row(s, db, pipeline).id
        stmt = select(Event).where(Event.pipeline_id == pid)
        if checkpoint_id is not None:
            stmt = stmt.where(Event.checkpoint_id == checkpoint_id)
        return [event_record(pipeline, e) for e in s.execute(stmt.order_by(Event.id)).scalars()]


def record_event(
    db: Database,
    pipeline: str,
    checkpoint_id: int | None,
    kind: str,
    *,
    details: Mapping[str, Any] | None = None,
) -> None:
    """Append one event that changes no state (a note, in its own transaction): e.g. a
    detached prepare whose spark-submit ended without the checkpoint PREPARED, which the
    task waiting on that checkpoint in the triggerer reads."""
    with db.write() as s:
        add_event(s, pipeline_row(s, db, pipeline).id, checkpoint_id, kind, details=details)
