"""Savepoints: named, retained copies of a pipeline's offsets (restore starts from them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from airflow_provider_eo.errors import NothingCommitted as NothingCommitted
from airflow_provider_eo.ledger.engine import Database, utcnow
from airflow_provider_eo.ledger.errors import InvariantViolation, SavepointNotFound
from airflow_provider_eo.ledger.events import add_event
from airflow_provider_eo.ledger.mapping import actor_columns, savepoint_record
from airflow_provider_eo.ledger.models import Checkpoint, CheckpointRange, Lineage, Savepoint
from airflow_provider_eo.ledger.reads import pipeline_row, require_checkpoint
from airflow_provider_eo.ledger.records import Actor, SavepointRecord, savepoint_position
from airflow_provider_eo.ledger.states import CheckpointState


def _exists(pipeline: str, row: Savepoint) -> InvariantViolation:
    return InvariantViolation(
        f"pipeline '{pipeline}': savepoint '{row.name}' already exists (created "
        f"{row.created_at.isoformat()}, {savepoint_position(row.checkpoint_id)}); pick another name"
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


def _savepoint_row(s: Session, db: Database, pipeline: str, name: str, done: str = "") -> Savepoint:
    """The named savepoint's row; SavepointNotFound (saying ``done``, e.g. "nothing was
    deleted") when the pipeline has none by that name."""
    pid = pipeline_row(s, db, pipeline).id
    row = s.execute(
        select(Savepoint).where(Savepoint.pipeline_id == pid, Savepoint.name == name)
    ).scalar_one_or_none()
    if row is None:
        said = f"; {done}" if done else ""
        raise SavepointNotFound(
            f"pipeline '{pipeline}' has no savepoint '{name}'{said}. List them with "
            "`eo savepoint list MODULE:ATTR` (or Ledger.list_savepoints())."
        )
    return row


def get_savepoint(db: Database, pipeline: str, name: str) -> SavepointRecord:
    """The named savepoint; SavepointNotFound when absent."""
    with db.read() as s:
        return savepoint_record(pipeline, _savepoint_row(s, db, pipeline, name))


def list_savepoints(db: Database, pipeline: str) -> list[SavepointRecord]:
    """The pipeline's savepoints, oldest first."""
    with db.read() as s:
        pid = pipeline_row(s, db, pipeline).id
        rows = s.execute(
            select(Savepoint).where(Savepoint.pipeline_id == pid).order_by(Savepoint.id)
        ).scalars()
        return [savepoint_record(pipeline, r) for r in rows]


# -- savepoints at a checkpoint, delete (sp) -------------------------------------------------


def savepoint_at_checkpoint(
    db: Database,
    pipeline: str,
    name: str,
    *,
    at_or_below: int | None = None,
    note: str = "",
    created_by: str = "",
    actor: Actor | None = None,
) -> SavepointRecord:
    """Record savepoint ``name`` at the pipeline's position in its CURRENT lineage, in ONE
    transaction (the position is read and the row written together):

    1. the newest COMMITTED checkpoint of the current lineage whose id is at or below
       ``at_or_below`` (None: the newest one): its ranges' end offsets, exactly;
    2. none (a restore just started the lineage): the offsets the restore started it at,
       with no checkpoint id. Checkpoints of earlier lineages are never used: their ends
       lie past the range the restore asked to process again, so a later restore from
       such a savepoint would skip that range.

    Keeps the pipeline's settings fingerprint, who took it (``created_by``) and the Airflow
    run of ``actor``. Refuses a used name (InvariantViolation), and a lineage with nothing
    committed (at or below ``at_or_below``) that did not start at given offsets: the
    pipeline's first lineage, or one started by a full reset (:class:`NothingCommitted`).
    A refusal records nothing.
    """
    if not name:
        raise ValueError(f"pipeline '{pipeline}': a savepoint name must be non-empty")
    try:
        with db.write() as s:
            p = pipeline_row(s, db, pipeline)
            existing = s.execute(
                select(Savepoint).where(Savepoint.pipeline_id == p.id, Savepoint.name == name)
            ).scalar_one_or_none()
            if existing is not None:
                raise _exists(pipeline, existing)
            lineage = p.current_lineage
            cid = s.execute(select(_max_committed(p.id, lineage, at_or_below))).scalar_one_or_none()
            if cid is not None:
                offsets = _ends_of(s, p.id, int(cid))
            else:
                start = s.get(Lineage, (p.id, lineage))
                offsets = _lineage_start(start)
                if not offsets:
                    raise _nothing_committed(pipeline, name, at_or_below, start)
            columns = actor_columns(actor)
            row = Savepoint(
                pipeline_id=p.id,
                name=name,
                checkpoint_id=None if cid is None else int(cid),
                offsets=offsets,
                note=note,
                created_by=created_by,
                created_at=utcnow(),
                fingerprint=p.fingerprint,
                dag_id=columns.get("dag_id"),
                run_id=columns.get("run_id"),
            )
            s.add(row)
            s.flush()
            add_event(
                s,
                p.id,
                row.checkpoint_id,
                "savepoint",
                actor=actor,
                details={
                    "name": name,
                    "offsets": offsets,
                    "created_by": created_by,
                    "note": note,
                    "at_or_below": at_or_below,
                    "fingerprint": p.fingerprint,
                    "lineage": lineage,
                },
            )
            return savepoint_record(pipeline, row)
    except IntegrityError as exc:
        # A concurrent creator won the unique (pipeline, name) between our check and insert.
        raise InvariantViolation(
            f"pipeline '{pipeline}': savepoint '{name}' already exists (created concurrently); "
            "pick another name"
        ) from exc


def _max_committed(pid: int, lineage: int, at_or_below: int | None) -> Any:
    """``max(checkpoint_id)`` of the pipeline's COMMITTED checkpoints in ``lineage`` (at or
    below a bound)."""
    where = [
        Checkpoint.pipeline_id == pid,
        Checkpoint.state == CheckpointState.COMMITTED,
        Checkpoint.lineage == lineage,
    ]
    if at_or_below is not None:
        where.append(Checkpoint.checkpoint_id <= at_or_below)
    return select(func.max(Checkpoint.checkpoint_id)).where(*where).scalar_subquery()


def _ends_of(s: Session, pid: int, checkpoint_id: int) -> dict[str, dict[str, int]]:
    """The checkpoint's end offsets as a savepoint keeps them (``{"topic": {"partition": end}}``)."""
    offsets: dict[str, dict[str, int]] = {}
    for topic, partition, end in s.execute(
        select(CheckpointRange.topic, CheckpointRange.partition, CheckpointRange.end_offset)
        .where(CheckpointRange.pipeline_id == pid, CheckpointRange.checkpoint_id == checkpoint_id)
        .order_by(CheckpointRange.topic, CheckpointRange.partition)
    ):
        offsets.setdefault(str(topic), {})[str(int(partition))] = int(end)
    return offsets


def _lineage_start(row: Lineage | None) -> dict[str, dict[str, int]]:
    """The offsets a lineage started at, as a savepoint keeps them; empty when it may start
    anywhere (the first lineage, a full reset)."""
    offsets: dict[str, dict[str, int]] = {}
    for topic, partition, offset in sorted(row.offsets if row is not None else []):
        offsets.setdefault(str(topic), {})[str(int(partition))] = int(offset)
    return offsets


def _nothing_committed(
    pipeline: str, name: str, at_or_below: int | None, lineage: Lineage | None
) -> NothingCommitted:
    below = f" at or below checkpoint {at_or_below}" if at_or_below is not None else ""
    after = (
        "Run the pipeline until a checkpoint commits (`eo run-once MODULE:ATTR`), then take "
        "the savepoint again."
    )
    if lineage is None or lineage.lineage == 1:
        return NothingCommitted(
            f"pipeline '{pipeline}' has no COMMITTED checkpoint{below} yet, so savepoint "
            f"'{name}' has no position to name; nothing was recorded. {after}"
        )
    return NothingCommitted(
        f"pipeline '{pipeline}' is on lineage {lineage.lineage} (a reset on "
        f"{lineage.started_at.isoformat()}: {lineage.reason or 'no reason given'}), which "
        f"starts where the startup policy says and has no COMMITTED checkpoint{below} yet, so "
        f"savepoint '{name}' has no position to name; nothing was recorded. Checkpoints of "
        f"earlier lineages are not the pipeline's position any more. {after}"
    )


def delete_savepoint(
    db: Database, pipeline: str, name: str, *, actor: Actor | None = None
) -> SavepointRecord:
    """Delete the named savepoint (SavepointNotFound when absent, nothing changed); a
    ``savepoint_deleted`` event keeps what it held. Returns the deleted savepoint."""
    with db.write() as s:
        row = _savepoint_row(s, db, pipeline, name, "nothing was deleted")
        pid = row.pipeline_id
        record = savepoint_record(pipeline, row)
        s.execute(
            delete(Savepoint).where(Savepoint.id == row.id).execution_options(synchronize_session=False)
        )
        add_event(
            s,
            pid,
            row.checkpoint_id,
            "savepoint_deleted",
            actor=actor,
            details={"name": name, "offsets": dict(row.offsets), "created_by": row.created_by},
        )
        return record
