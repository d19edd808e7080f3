"""Row -> record: the frozen values the ledger returns, built from its SQLAlchemy rows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from airflow_provider_eo.ledger.models import (
    Checkpoint,
    CheckpointRange,
    CommitShard,
    Event,
    Pipeline,
    Savepoint,
)
from airflow_provider_eo.ledger.records import (
    Actor,
    CheckpointRecord,
    CommitPlan,
    EventRecord,
    PipelineRecord,
    RangeSpec,
    SavepointRecord,
    ShardRecord,
)

# Checkpoint ids per IN (...) when loading ranges and shards of many checkpoints.
_CHUNK = 500


def actor_columns(actor: Actor | None) -> dict[str, Any]:
    """The Airflow task instance columns a row keeps of the actor that moved it."""
    if actor is None:
        return {}
    return {
        "dag_id": actor.dag_id,
        "run_id": actor.run_id,
        "task_id": actor.task_id,
        "try_number": actor.try_number,
    }


def pipeline_record(row: Pipeline) -> PipelineRecord:
    return PipelineRecord(
        name=row.name,
        fingerprint=row.fingerprint,
        current_lineage=row.current_lineage,
        last_checkpoint_id=row.last_checkpoint_id,
        created_at=row.created_at,
        updated_at=row.updated_at,
        identity=row.identity,
        transactional_id_prefix=row.transactional_id_prefix,
        stopped_at=row.stopped_at,
        stopped_by=row.stopped_by,
        stop_reason=row.stop_reason,
        backfill_of=row.backfill_of,
        max_range_span_ms=row.max_range_span_ms,
        staging_dir=row.staging_dir,
    )


def checkpoint_records(s: Session, pipeline: str, rows: Sequence[Checkpoint]) -> list[CheckpointRecord]:
    """Records of checkpoint rows of one pipeline, with their ranges and shards loaded in
    a few queries (not one per checkpoint)."""
    if not rows:
        return []
    pid = rows[0].pipeline_id
    ids = [r.checkpoint_id for r in rows]
    ranges: dict[int, list[CheckpointRange]] = {i: [] for i in ids}
    shards: dict[int, list[CommitShard]] = {i: [] for i in ids}
    for chunk_start in range(0, len(ids), _CHUNK):
        chunk = ids[chunk_start : chunk_start + _CHUNK]
        for rg in s.execute(
            select(CheckpointRange)
            .where(CheckpointRange.pipeline_id == pid, CheckpointRange.checkpoint_id.in_(chunk))
            .order_by(CheckpointRange.topic, CheckpointRange.partition)
        ).scalars():
            ranges[rg.checkpoint_id].append(rg)
        for sh in s.execute(
            select(CommitShard)
            .where(CommitShard.pipeline_id == pid, CommitShard.checkpoint_id.in_(chunk))
            .order_by(CommitShard.shard)
        ).scalars():
            shards[sh.checkpoint_id].append(sh)
    return [checkpoint_record(pipeline, r, ranges[r.checkpoint_id], shards[r.checkpoint_id]) for r in rows]


def checkpoint_record_of(s: Session, pipeline: str, row: Checkpoint) -> CheckpointRecord:
    """The record of one checkpoint row."""
    return checkpoint_records(s, pipeline, [row])[0]


def checkpoint_record(
    pipeline: str,
    row: Checkpoint,
    ranges: Iterable[CheckpointRange],
    shards: Iterable[CommitShard],
) -> CheckpointRecord:
    ranges = list(ranges)
    return CheckpointRecord(
        pipeline=pipeline,
        checkpoint_id=row.checkpoint_id,
        state=row.state,
        lineage=row.lineage,
        ranges=tuple(
            RangeSpec(r.topic, r.partition, r.start_offset, r.end_offset, r.skipped_from) for r in ranges
        ),
        range_stats={(r.topic, r.partition): (r.min_timestamp, r.max_timestamp) for r in ranges},
        shards=tuple(shard_record(sh) for sh in shards),
        planned_at=row.planned_at,
        prepared_at=row.prepared_at,
        committed_at=row.committed_at,
        aborted_at=row.aborted_at,
        prepared_attempt=row.prepared_attempt,
        staging_location=row.staging_location,
        records=row.records,
        bytes=row.bytes,
        shard_counts={int(k): int(v) for k, v in (row.shard_counts or {}).items()},
        dag_id=row.dag_id,
        run_id=row.run_id,
        task_id=row.task_id,
        try_number=row.try_number,
        spark_app_id=row.spark_app_id,
        commit_owner=row.commit_owner,
        commit_lease_until=row.commit_lease_until,
        abort_reason=row.abort_reason,
        commit_plan=CommitPlan.from_json(row.commit_plan) if row.commit_plan else None,
        time_filter=(
            (int(row.filter_start_ms), int(row.filter_end_ms))
            if row.filter_start_ms is not None and row.filter_end_ms is not None
            else None
        ),
        records_read=row.records_read,
        records_dropped=row.records_dropped,
        records_created=row.records_created,
        dead_letters=row.dead_letters,
        query_id=row.query_id,
        batch_id=row.batch_id,
    )


def shard_record(row: CommitShard) -> ShardRecord:
    return ShardRecord(
        shard=row.shard,
        transactional_id=row.transactional_id,
        producer_id=row.producer_id,
        producer_epoch=row.producer_epoch,
        state=row.state,
        records=row.records,
        updated_at=row.updated_at,
    )


def savepoint_record(pipeline: str, row: Savepoint) -> SavepointRecord:
    return SavepointRecord(
        pipeline=pipeline,
        name=row.name,
        checkpoint_id=row.checkpoint_id,
        # JSON object keys are strings: partitions and offsets come back as ints.
        offsets={t: {int(p): int(o) for p, o in parts.items()} for t, parts in row.offsets.items()},
        note=row.note,
        created_by=row.created_by,
        created_at=row.created_at,
        fingerprint=row.fingerprint,
        dag_id=row.dag_id,
        run_id=row.run_id,
    )


def event_record(pipeline: str, row: Event) -> EventRecord:
    return EventRecord(
        id=row.id,
        pipeline=pipeline,
        checkpoint_id=row.checkpoint_id,
        kind=row.kind,
        from_state=row.from_state,
        to_state=row.to_state,
        actor=row.actor,
        at=row.at,
        details=row.details,
        dag_id=row.dag_id,
        run_id=row.run_id,
        task_id=row.task_id,
        try_number=row.try_number,
    )
