"""Lineages and partition heads: where each partition's next checkpoint starts, and the
recorded breaks (restore, reset) that move it elsewhere on purpose."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import delete, update
from sqlalchemy.orm import Session

from airflow_provider_eo.ledger.engine import Database, rowcount, utcnow
from airflow_provider_eo.ledger.errors import CheckpointConflict, InvariantViolation
from airflow_provider_eo.ledger.events import add_event
from airflow_provider_eo.ledger.models import Lineage, PartitionHead, Pipeline
from airflow_provider_eo.ledger.reads import lowest_unfinished, pipeline_row
from airflow_provider_eo.ledger.records import Actor, TopicPartition


def set_head(s: Session, pid: int, key: TopicPartition, offset: int, lineage: int, cp: int | None) -> None:
    """Move one partition's head to ``offset`` (``cp``: the checkpoint that set it, if any)."""
    head = s.get(PartitionHead, (pid, key[0], key[1]))
    if head is None:
        s.add(
            PartitionHead(
                pipeline_id=pid,
                topic=key[0],
                partition=key[1],
                lineage=lineage,
                next_start=offset,
                checkpoint_id=cp,
            )
        )
    else:
        head.next_start = offset
        head.lineage = lineage
        head.checkpoint_id = cp


def restore(
    db: Database,
    pipeline: str,
    offsets: Mapping[TopicPartition, int],
    *,
    reason: str,
    actor: Actor | None = None,
) -> int:
    """Start a new lineage whose partitions start at ``offsets`` (an explicit break).

    Returns the new lineage number. Partitions not in ``offsets`` may start anywhere
    (``offsets={}`` is a full reset). Refuses while a checkpoint is unfinished.
    """
    clean = {(str(t), int(p)): int(o) for (t, p), o in offsets.items()}
    if any(o < 0 for o in clean.values()):
        raise ValueError(f"pipeline '{pipeline}': restore offsets must be >= 0")
    with db.write() as s:
        p = pipeline_row(s, db, pipeline, lock=True)
        low = lowest_unfinished(s, p.id)
        if low is not None:
            raise InvariantViolation(
                f"pipeline '{pipeline}': cannot restore while checkpoint "
                f"{low.checkpoint_id} is {low.state}; commit or abort it first"
            )
        old = p.current_lineage
        now = utcnow()
        # Compare-and-set on the lineage: of two concurrent restores only one moves it.
        moved = rowcount(
            s.execute(
                update(Pipeline)
                .where(Pipeline.id == p.id, Pipeline.current_lineage == old)
                .values(current_lineage=old + 1, updated_at=now)
                .execution_options(synchronize_session=False)
            )
        )
        if moved != 1:
            raise CheckpointConflict(
                f"pipeline '{pipeline}': another restore moved lineage {old} concurrently; "
                "re-read the pipeline and retry if still needed",
                pipeline=pipeline,
            )
        new = old + 1
        s.add(
            Lineage(
                pipeline_id=p.id,
                lineage=new,
                started_at=now,
                offsets=[[t, part, o] for (t, part), o in sorted(clean.items())],
                reason=reason,
            )
        )
        s.execute(
            delete(PartitionHead)
            .where(PartitionHead.pipeline_id == p.id)
            .execution_options(synchronize_session=False)
        )
        s.add_all(
            PartitionHead(
                pipeline_id=p.id,
                topic=t,
                partition=part,
                lineage=new,
                next_start=o,
                checkpoint_id=None,
            )
            for (t, part), o in clean.items()
        )
        add_event(
            s,
            p.id,
            None,
            "restore",
            actor=actor,
            at=now,
            details={
                "reason": reason,
                "from_lineage": old,
                "to_lineage": new,
                "offsets": {f"{t}[{part}]": o for (t, part), o in sorted(clean.items())},
            },
        )
        return new
