"""Lineages and partition heads: where each partition's next checkpoint starts, and the
recorded breaks (restore, reset) that move it elsewhere on purpose."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from airflow_provider_eo.ledger.engine import Database, rowcount, utcnow
from airflow_provider_eo.ledger.errors import CheckpointConflict, InvariantViolation
from airflow_provider_eo.ledger.events import add_event
from airflow_provider_eo.ledger.models import Event, Lineage, PartitionHead, Pipeline
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
    return restore_once(db, pipeline, offsets, reason=reason, actor=actor).lineage


@dataclass(frozen=True)
class RestoreOutcome:
    """What :func:`restore_once` did: the lineage the pipeline is on after it, and for a
    repeated request the details recorded by the first one (``repeated``)."""

    lineage: int
    from_lineage: int
    details: Mapping[str, Any]
    repeated: bool = False


def _earlier_request(s: Session, pid: int, request_key: str) -> Event | None:
    # Restores are rare: the pipeline's restore events are few, so filter them here rather
    # than in a JSON query that differs between SQLite and PostgreSQL.
    rows = s.execute(
        select(Event).where(Event.pipeline_id == pid, Event.kind == "restore").order_by(Event.id)
    ).scalars()
    return next((e for e in rows if (e.details or {}).get("request_key") == request_key), None)


def _outcome_of(event: Event, current_lineage: int) -> RestoreOutcome:
    info = dict(event.details or {})
    return RestoreOutcome(
        lineage=int(info.get("to_lineage", current_lineage)),
        from_lineage=int(info.get("from_lineage", 0)),
        details=info,
        repeated=True,
    )


def find_restore(db: Database, pipeline: str, request_key: str) -> RestoreOutcome | None:
    """The restore recorded with ``request_key`` (``repeated=True``), None when none was."""
    with db.read() as s:
        p = pipeline_row(s, db, pipeline)
        earlier = _earlier_request(s, p.id, request_key)
        return None if earlier is None else _outcome_of(earlier, p.current_lineage)


def restore_once(
    db: Database,
    pipeline: str,
    offsets: Mapping[TopicPartition, int],
    *,
    reason: str,
    actor: Actor | None = None,
    expected_lineage: int | None = None,
    request_key: str | None = None,
    details: Mapping[str, Any] | None = None,
) -> RestoreOutcome:
    """:func:`restore` with the guards a user-facing restore needs, in ONE transaction:

    1. ``request_key`` (e.g. ``dag_id/run_id``): a request already recorded with this key
       returns the first outcome (``repeated=True``) and changes nothing, so a retried
       Airflow task never restores twice.
    2. A checkpoint is unfinished: refused (InvariantViolation), nothing changed.
    3. ``expected_lineage``: the lineage the caller decided on; when another restore moved
       it since, refused (CheckpointConflict): of two concurrent restores one wins.
    4. Otherwise the lineage moves by a compare-and-set on ``current_lineage`` and the
       ``restore`` event records ``reason``, the actor, ``request_key`` and ``details``.
    """
    clean = {(str(t), int(p)): int(o) for (t, p), o in offsets.items()}
    if any(o < 0 for o in clean.values()):
        raise ValueError(f"pipeline '{pipeline}': restore offsets must be >= 0")
    with db.write() as s:
        p = pipeline_row(s, db, pipeline, lock=True)
        if request_key:
            earlier = _earlier_request(s, p.id, request_key)
            if earlier is not None:
                return _outcome_of(earlier, p.current_lineage)
        low = lowest_unfinished(s, p.id)
        if low is not None:
            raise InvariantViolation(
                f"pipeline '{pipeline}': cannot restore while checkpoint "
                f"{low.checkpoint_id} is {low.state}; commit or abort it first"
            )
        old = p.current_lineage
        if expected_lineage is not None and old != expected_lineage:
            raise CheckpointConflict(
                f"pipeline '{pipeline}': another restore or reset moved it from lineage "
                f"{expected_lineage} to {old} while this one was being prepared; nothing was "
                "changed. Look at `eo checkpoints` and the ledger's events, and ask again if "
                "still needed.",
                pipeline=pipeline,
            )
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
        info = {
            **dict(details or {}),
            "reason": reason,
            "from_lineage": old,
            "to_lineage": new,
            "offsets": {f"{t}[{part}]": o for (t, part), o in sorted(clean.items())},
            **({"request_key": request_key} if request_key else {}),
        }
        add_event(s, p.id, None, "restore", actor=actor, at=now, details=info)
        return RestoreOutcome(lineage=new, from_lineage=old, details=info)
