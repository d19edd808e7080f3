"""Fill a ledger with a pipeline's checkpoint history, for the UI's tests and ``bench/ui.py``.

Two ways: :func:`run_checkpoints` moves each checkpoint through the ledger's real
transitions (plan → prepared → committed), :func:`bulk_history` inserts many COMMITTED
checkpoints in a few statements (100k in seconds) with the rows the transitions would have
written, so a benchmark measures the page's queries and not the fill.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence

from sqlalchemy import insert, select, update

from airflow_provider_eo.ledger import Actor, Ledger, RangeSpec
from airflow_provider_eo.ledger.models import Checkpoint, CheckpointRange, PartitionHead, Pipeline
from airflow_provider_eo.ledger.states import CheckpointState


def run_checkpoints(
    ledger: Ledger,
    pipeline: str,
    partitions: Sequence[tuple[str, int]],
    *,
    count: int,
    per_partition: int,
    actor: Actor | None = None,
    leave_planned: bool = False,
) -> list[int]:
    """``count`` COMMITTED checkpoints of ``per_partition`` offsets on each partition
    (continuing where the pipeline is), then one PLANNED one when ``leave_planned``."""
    ledger.ensure_pipeline(pipeline, f"fp-{pipeline}")
    ids = []
    for i in range(count + (1 if leave_planned else 0)):
        starts = ledger.next_starts(pipeline)
        ranges = [
            RangeSpec(t, p, starts.get((t, p), 0), starts.get((t, p), 0) + per_partition)
            for t, p in partitions
        ]
        cp = ledger.plan(pipeline, ranges, actor=actor)
        ids.append(cp.checkpoint_id)
        if i == count:
            break
        ledger.mark_prepared(
            pipeline,
            cp.checkpoint_id,
            attempt=f"a-{uuid.uuid4().hex[:6]}",
            staging_location="/nowhere",
            records=per_partition * len(partitions),
            bytes_=100 * per_partition * len(partitions),
            shard_counts={0: per_partition * len(partitions)},
            actor=actor,
        )
        ledger.mark_committed(pipeline, cp.checkpoint_id, actor=actor)
    return ids


def bulk_history(
    ledger: Ledger,
    pipeline: str,
    partitions: Sequence[tuple[str, int]],
    *,
    count: int,
    per_partition: int = 10,
    dag_id: str | None = "eo_pipeline",
    batch: int = 5_000,
) -> None:
    """Insert ``count`` COMMITTED checkpoints of a new pipeline in bulk (ids 1..count)."""
    record = ledger.ensure_pipeline(pipeline, f"fp-{pipeline}")
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    with ledger.engine.begin() as conn:
        pid = conn.execute(select(Pipeline.id).where(Pipeline.name == record.name)).scalar_one()
        for lo in range(1, count + 1, batch):
            ids = range(lo, min(count, lo + batch - 1) + 1)
            conn.execute(
                insert(Checkpoint),
                [
                    {
                        "pipeline_id": pid,
                        "checkpoint_id": i,
                        "state": CheckpointState.COMMITTED.value,
                        "lineage": 1,
                        "records": per_partition * len(partitions),
                        "bytes": 100 * per_partition * len(partitions),
                        "planned_at": t0 + dt.timedelta(seconds=10 * i),
                        "prepared_at": t0 + dt.timedelta(seconds=10 * i + 6),
                        "committed_at": t0 + dt.timedelta(seconds=10 * i + 8),
                        "dag_id": dag_id,
                        "run_id": f"scheduled__{i}" if dag_id else None,
                        "task_id": "eo.plan" if dag_id else None,
                    }
                    for i in ids
                ],
            )
            conn.execute(
                insert(CheckpointRange),
                [
                    {
                        "pipeline_id": pid,
                        "checkpoint_id": i,
                        "topic": t,
                        "partition": p,
                        "start_offset": (i - 1) * per_partition,
                        "end_offset": i * per_partition,
                    }
                    for i in ids
                    for t, p in partitions
                ],
            )
        conn.execute(
            insert(PartitionHead),
            [
                {
                    "pipeline_id": pid,
                    "topic": t,
                    "partition": p,
                    "lineage": 1,
                    "next_start": count * per_partition,
                    "checkpoint_id": count,
                }
                for t, p in partitions
            ],
        )
        conn.execute(update(Pipeline).where(Pipeline.id == pid).values(last_checkpoint_id=count))
