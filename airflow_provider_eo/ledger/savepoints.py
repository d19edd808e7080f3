"""Savepoints: named, retained copies of a pipeline's offsets (restore starts from them)."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from airflow_provider_eo.ledger.engine import Database, utcnow
from airflow_provider_eo.ledger.errors import InvariantViolation, SavepointNotFound
from airflow_provider_eo.ledger.events import add_event
from airflow_provider_eo.ledger.mapping import savepoint_record
from airflow_provider_eo.ledger.models import Savepoint
from airflow_provider_eo.ledger.reads import pipeline_row, require_checkpoint
from airflow_provider_eo.ledger.records import SavepointRecord
from airflow_provider_eo.ledger.states import CheckpointState


def _exists(pipeline: str, row: Savepoint) -> InvariantViolation:
    return InvariantViolation(
        f"pipeline '{pipeline}': savepoint '{row.name}' already exists (created "
        f"{row.created_at.isoformat()}, checkpoint {row.checkpoint_id}); pick another name"
    )


def create_savepoint(
    db: Database,
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
        with db.write() as s:
            pid = pipeline_row(s, db, pipeline).id
            existing = s.execute(
                select(Savepoint).where(Savepoint.pipeline_id == pid, Savepoint.name == name)
            ).scalar_one_or_none()
            if existing is not None:
                raise _exists(pipeline, existing)
            if checkpoint_id is not None:
                cp = require_checkpoint(s, db, pipeline, pid, checkpoint_id)
                if cp.state != CheckpointState.COMMITTED:
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
            add_event(
                s,
                pid,
                checkpoint_id,
                "savepoint",
                details={"name": name, "offsets": clean, "created_by": created_by},
            )
            return savepoint_record(pipeline, row)
    except IntegrityError as exc:
        # A concurrent creator won the unique (pipeline, name) between our check and insert.
        existing_sp = get_savepoint(db, pipeline, name)
        raise InvariantViolation(
            f"pipeline '{pipeline}': savepoint '{name}' already exists (created "
            f"{existing_sp.created_at.isoformat()}); pick another name"
        ) from exc


def get_savepoint(db: Database, pipeline: str, name: str) -> SavepointRecord:
    """The named savepoint; SavepointNotFound when absent."""
    with db.read() as s:
        pid = pipeline_row(s, db, pipeline).id
        row = s.execute(
            select(Savepoint).where(Savepoint.pipeline_id == pid, Savepoint.name == name)
        ).scalar_one_or_none()
        if row is None:
            raise SavepointNotFound(
                f"pipeline '{pipeline}' has no savepoint '{name}': list them with Ledger.list_savepoints()"
            )
        return savepoint_record(pipeline, row)


def list_savepoints(db: Database, pipeline: str) -> list[SavepointRecord]:
    """The pipeline's savepoints, oldest first."""
    with db.read() as s:
        pid = pipeline_row(s, db, pipeline).id
        rows = s.execute(
            select(Savepoint).where(Savepoint.pipeline_id == pid).order_by(Savepoint.id)
        ).scalars()
        return [savepoint_record(pipeline, r) for r in rows]
