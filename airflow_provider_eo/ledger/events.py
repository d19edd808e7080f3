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
