"""Reads: the row lookups every operation starts with, and the ledger's read-only queries."""

from __future__ import annotations

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from airflow_provider_eo.ledger.engine import Database
from airflow_provider_eo.ledger.errors import CheckpointNotFound
from airflow_provider_eo.ledger.mapping import checkpoint_record_of, checkpoint_records, pipeline_record
from airflow_provider_eo.ledger.models import (
    UNFINISHED_PREDICATE,
    Checkpoint,
    CommitShard,
    PartitionHead,
    Pipeline,
)
from airflow_provider_eo.ledger.records import CheckpointRecord, PipelineRecord, TopicPartition
from airflow_provider_eo.ledger.states import UNFINISHED_STATES, CheckpointState

# A stable order for the per-state queries below.
_UNFINISHED = sorted(UNFINISHED_STATES, key=lambda state: state.value)


# -- row lookups inside a session ---------------------------------------------------------


def pipeline_row(s: Session, db: Database, name: str, *, lock: bool = False) -> Pipeline:
    """The pipeline's row (``FOR UPDATE`` with ``lock``), or CheckpointNotFound."""
    stmt = select(Pipeline).where(Pipeline.name == name)
    if lock:
        stmt = stmt.with_for_update()
    row = s.execute(stmt).scalar_one_or_none()
    if row is None:
        raise CheckpointNotFound(
            f"pipeline '{name}' is not in the ledger at {db.url}: run its plan task "
            "(or Ledger.ensure_pipeline) first, or check the pipeline name / ledger URL"
        )
    return row


def checkpoint_row(s: Session, pid: int, checkpoint_id: int) -> Checkpoint | None:
    """The checkpoint's row as the database has it now, None when absent."""
    # populate_existing: after a conditional UPDATE the identity map may be stale.
    return s.execute(
        select(Checkpoint)
        .where(Checkpoint.pipeline_id == pid, Checkpoint.checkpoint_id == checkpoint_id)
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()


def require_checkpoint(s: Session, db: Database, pipeline: str, pid: int, checkpoint_id: int) -> Checkpoint:
    """The checkpoint's row, or CheckpointNotFound naming the pipeline and the ledger."""
    row = checkpoint_row(s, pid, checkpoint_id)
    if row is None:
        raise CheckpointNotFound(
            f"checkpoint {checkpoint_id} of pipeline '{pipeline}' is not in the ledger at "
            f"{db.url}: list them with `eo checkpoints {pipeline}`"
        )
    return row


def lowest_unfinished(s: Session, pid: int, below: int | None = None) -> Checkpoint | None:
    """The lowest-id PLANNED or PREPARED checkpoint (below ``below`` when given)."""
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
    return None if lowest is None else checkpoint_row(s, pid, lowest)


def unfinished_rows(s: Session, pid: int) -> list[Checkpoint]:
    """Every PLANNED or PREPARED checkpoint row of the pipeline, lowest id first.

    Read through the partial index ``ix_eo_checkpoints_unfinished``, which holds only
    those rows: the cost follows the (``max_pending``-bounded) unfinished checkpoints, not
    the pipeline's history. The index is used only when the WHERE repeats its predicate as
    written, hence the literal SQL.
    """
    return list(
        s.execute(
            select(Checkpoint)
            .where(Checkpoint.pipeline_id == pid, text(UNFINISHED_PREDICATE))
            .order_by(Checkpoint.checkpoint_id)
        ).scalars()
    )


def count_unfinished(s: Session, pid: int) -> int:
    """How many checkpoints of the pipeline are PLANNED or PREPARED."""
    return sum(
        s.execute(
            select(func.count())
            .select_from(Checkpoint)
            .where(Checkpoint.pipeline_id == pid, Checkpoint.state == state)
        ).scalar_one()
        for state in _UNFINISHED
    )


def heads(s: Session, pid: int) -> dict[TopicPartition, int]:
    """The partition heads: where the next checkpoint of each known partition starts."""
    rows = s.execute(
        select(PartitionHead.topic, PartitionHead.partition, PartitionHead.next_start).where(
            PartitionHead.pipeline_id == pid
        )
    )
    return {(t, p): int(o) for t, p, o in rows}


# -- the ledger's read-only queries -------------------------------------------------------


def get_pipeline(db: Database, name: str) -> PipelineRecord:
    """The pipeline's record; CheckpointNotFound when it is not registered."""
    with db.read() as s:
        return pipeline_record(pipeline_row(s, db, name))


def list_pipelines(db: Database) -> list[PipelineRecord]:
    """Every registered pipeline, by name."""
    with db.read() as s:
        rows = s.execute(select(Pipeline).order_by(Pipeline.name)).scalars()
        return [pipeline_record(r) for r in rows]


def unfinished(db: Database, pipeline: str) -> CheckpointRecord | None:
    """The lowest-id PLANNED or PREPARED checkpoint: the one a retry must resume."""
    with db.read() as s:
        row = lowest_unfinished(s, pipeline_row(s, db, pipeline).id)
        return None if row is None else checkpoint_record_of(s, pipeline, row)


def unfinished_checkpoints(db: Database, pipeline: str) -> list[CheckpointRecord]:
    """Every PLANNED or PREPARED checkpoint of the pipeline with its ranges, lowest id first:
    what a streaming application resumes when it starts. Reads those checkpoints only,
    however long the pipeline's history (see :func:`unfinished_rows`)."""
    with db.read() as s:
        return checkpoint_records(s, pipeline, unfinished_rows(s, pipeline_row(s, db, pipeline).id))


def last_committed(db: Database, pipeline: str) -> CheckpointRecord | None:
    """The highest-id COMMITTED checkpoint, None before the first commit."""
    with db.read() as s:
        pid = pipeline_row(s, db, pipeline).id
        row = s.execute(
            select(Checkpoint)
            .where(Checkpoint.pipeline_id == pid, Checkpoint.state == CheckpointState.COMMITTED)
            .order_by(Checkpoint.checkpoint_id.desc())
            .limit(1)
        ).scalar_one_or_none()
        return None if row is None else checkpoint_record_of(s, pipeline, row)


def get(db: Database, pipeline: str, checkpoint_id: int) -> CheckpointRecord:
    """One checkpoint; CheckpointNotFound when absent."""
    with db.read() as s:
        pid = pipeline_row(s, db, pipeline).id
        return checkpoint_record_of(s, pipeline, require_checkpoint(s, db, pipeline, pid, checkpoint_id))


def list_checkpoints(db: Database, pipeline: str, *, limit: int | None = None) -> list[CheckpointRecord]:
    """Checkpoints in id order; with ``limit``, the latest ``limit`` of them."""
    with db.read() as s:
        pid = pipeline_row(s, db, pipeline).id
        stmt = select(Checkpoint).where(Checkpoint.pipeline_id == pid)
        if limit is not None:
            stmt = stmt.order_by(Checkpoint.checkpoint_id.desc()).limit(limit)
            rows = list(reversed(s.execute(stmt).scalars().all()))
        else:
            rows = list(s.execute(stmt.order_by(Checkpoint.checkpoint_id)).scalars())
        return checkpoint_records(s, pipeline, rows)


def next_starts(db: Database, pipeline: str) -> dict[TopicPartition, int]:
    """Where the next checkpoint of each known partition must start.

    Per partition: the end of the latest non-aborted checkpoint of the current lineage,
    else the lineage's restore offset, else the start of the aborted checkpoint whose
    range must be replanned. Partitions absent here may start anywhere.
    """
    with db.read() as s:
        return heads(s, pipeline_row(s, db, pipeline).id)


def transactional_ids(db: Database, pipeline: str) -> list[str]:
    """Every transactional id a commit of ``pipeline`` has used (from the commit shards),
    sorted: what ``eo recover`` fences."""
    with db.read() as s:
        pid = pipeline_row(s, db, pipeline).id
        rows = s.execute(
            select(CommitShard.transactional_id).where(CommitShard.pipeline_id == pid).distinct()
        ).scalars()
        return sorted(rows)
