"""The checkpoint state machine's writes: plan, prepare, commit, abort.

Every state change is ONE conditional UPDATE (:func:`_move`: ``... WHERE state =
:source``) plus its event row, in one database transaction, and only for a move in
:data:`~airflow_provider_eo.ledger.states.ALLOWED_TRANSITIONS` (anything else raises
:class:`InvalidTransition` before the statement runs). Zero rows updated means another
process won; the loser raises :class:`CheckpointConflict` naming what it expected and
what it found. Planning hands out checkpoint ids with one compare-and-set on the
pipeline row (:func:`_claim_checkpoint_id`). The abort's transition is :func:`record_aborted`;
the ledger's abort (``Ledger.abort``) is the one guarded by the commit leases
(:func:`airflow_provider_eo.ledger.leases.abort`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import ColumnElement, String, cast, or_, select, update
from sqlalchemy.orm import Session

from airflow_provider_eo.errors import AbortRefused, PipelineStopped
from airflow_provider_eo.ledger.engine import Database, rowcount, utcnow
from airflow_provider_eo.ledger.errors import CheckpointConflict, InvariantViolation
from airflow_provider_eo.ledger.events import add_event
from airflow_provider_eo.ledger.lineage import set_head
from airflow_provider_eo.ledger.mapping import actor_columns, checkpoint_record_of
from airflow_provider_eo.ledger.models import Checkpoint, CheckpointRange, CommitShard, Pipeline
from airflow_provider_eo.ledger.pipelines import pin_prefix
from airflow_provider_eo.ledger.reads import (
    count_unfinished,
    heads,
    lowest_unfinished,
    pipeline_row,
    require_checkpoint,
)
from airflow_provider_eo.ledger.records import (
    Actor,
    CheckpointRecord,
    CommitPlan,
    RangeSpec,
    TopicPartition,
)
from airflow_provider_eo.ledger.states import UNFINISHED_STATES, CheckpointState, ShardState, check_transition

PLANNED = CheckpointState.PLANNED
PREPARED = CheckpointState.PREPARED
COMMITTED = CheckpointState.COMMITTED
ABORTED = CheckpointState.ABORTED


# -- the two conditional UPDATEs ------------------------------------------------------------


def _move(
    s: Session,
    pipeline: str,
    pid: int,
    checkpoint_id: int,
    source: CheckpointState,
    target: CheckpointState,
    values: Mapping[str, Any],
    *,
    also: ColumnElement[bool] | None = None,
) -> bool:
    """``source -> target`` as one conditional UPDATE; True when this call moved the row.

    :param also: a further condition the row must meet (the abort's: no committer's lease).
    """
    check_transition(source, target, pipeline=pipeline, checkpoint_id=checkpoint_id)
    conditions = [
        Checkpoint.pipeline_id == pid,
        Checkpoint.checkpoint_id == checkpoint_id,
        Checkpoint.state == source,
    ]
    if also is not None:
        conditions.append(also)
    result = s.execute(
        update(Checkpoint)
        .where(*conditions)
        .values(state=target, **values)
        .execution_options(synchronize_session=False)
    )
    return rowcount(result) == 1


def _claim_checkpoint_id(s: Session, pid: int, last: int, lineage: int, now: dt.datetime) -> bool:
    """Planning's compare-and-set: move ``last_checkpoint_id`` from ``last`` to ``last + 1``
    in ``lineage``; True when this planner won the id."""
    result = s.execute(
        update(Pipeline)
        .where(
            Pipeline.id == pid,
            Pipeline.last_checkpoint_id == last,
            Pipeline.current_lineage == lineage,
        )
        .values(last_checkpoint_id=last + 1, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    return rowcount(result) == 1


# -- refusals -------------------------------------------------------------------------------


def conflict(pipeline: str, row: Checkpoint, expected: str, action: str) -> CheckpointConflict:
    """The error for a checkpoint found in another state than ``expected``, with a hint."""
    actual = row.state
    if actual == COMMITTED:
        hint = "it is committed already: nothing to do"
    elif actual == ABORTED:
        hint = f"it was aborted ({row.abort_reason}): plan again, its range is replanned"
    elif actual == PREPARED and action == "prepare":
        hint = (
            f"attempt {row.prepared_attempt!r} prepared it first: this attempt's staged "
            "output is garbage; delete it and go on to the commit"
        )
    else:
        hint = "re-read it with Ledger.get() and continue from its current state"
    return CheckpointConflict(
        f"cannot {action} checkpoint {row.checkpoint_id} of pipeline '{pipeline}': expected "
        f"state {expected}, found {actual}; {hint}",
        pipeline=pipeline,
        checkpoint_id=row.checkpoint_id,
        expected=expected,
        actual=actual.value,
    )


def check_order(s: Session, pipeline: str, pid: int, checkpoint_id: int, what: str) -> None:
    """Refuse (InvariantViolation) while an earlier checkpoint is unfinished."""
    earlier = lowest_unfinished(s, pid, below=checkpoint_id)
    if earlier is not None:
        raise InvariantViolation(
            f"pipeline '{pipeline}': cannot {what} checkpoint {checkpoint_id} while "
            f"checkpoint {earlier.checkpoint_id} is {earlier.state}: checkpoints commit in "
            f"order; commit or abort checkpoint {earlier.checkpoint_id} first"
        )


def _check_contiguous(s: Session, pipeline: str, pid: int, new_id: int, ranges: Sequence[RangeSpec]) -> None:
    expected_starts = heads(s, pid)
    problems = []
    for r in ranges:
        expected = expected_starts.get(r.key)
        if expected is None:
            continue  # a partition seen for the first time in this lineage
        if r.skipped_from is None and r.start == expected:
            continue
        if r.skipped_from is not None and r.skipped_from == expected:
            continue  # on_data_loss=skip: the loss [skipped_from, start) is recorded
        got = r.skipped_from if r.skipped_from is not None else r.start
        what = f"gap of {got - expected}" if got > expected else f"overlap of {expected - got}"
        problems.append(f"{r.topic}[{r.partition}] must start at {expected}, got {got} ({what} offsets)")
    if problems:
        raise InvariantViolation(
            f"pipeline '{pipeline}', checkpoint {new_id}: ranges not contiguous with the "
            f"previous checkpoints: {'; '.join(problems)}. Plan from Ledger.next_starts(); "
            "to jump elsewhere on purpose, restore (a recorded lineage break)."
        )


# -- the transitions ------------------------------------------------------------------------


def check_plan_args(pipeline: str, ranges: Sequence[RangeSpec], max_pending: int) -> None:
    """Refuse a plan without ranges, with a partition twice, or with ``max_pending < 1``
    (before any database work)."""
    if max_pending < 1:
        raise ValueError(f"max_pending must be >= 1, got {max_pending}")
    if not ranges:
        raise ValueError(f"pipeline '{pipeline}': a checkpoint needs at least one range")
    seen: set[TopicPartition] = set()
    for r in ranges:
        if r.key in seen:
            raise InvariantViolation(
                f"pipeline '{pipeline}': {r.topic}[{r.partition}] appears twice in one "
                "plan; give each topic-partition one range (a partition's other interval "
                "goes into the next checkpoint)"
            )
        seen.add(r.key)


def record_planned(
    s: Session,
    db: Database,
    pipeline: str,
    p: Pipeline,
    ranges: Sequence[RangeSpec],
    *,
    max_pending: int,
    guard: Callable[[int], None],
    actor: Actor | None = None,
    details: Mapping[str, Any] | None = None,
    commit_plan: CommitPlan | None = None,
    time_filter: tuple[int, int] | None = None,
    batch: tuple[str, int] | None = None,
) -> CheckpointRecord:
    """Record checkpoint ``last + 1`` of the locked pipeline row ``p`` as PLANNED: the one
    way a checkpoint is planned, for live pipelines (:func:`plan`) and backfills.

    Refuses more than ``max_pending`` unfinished checkpoints, then runs ``guard(new_id)``
    (the caller's range check: contiguity for a live pipeline, no overlap for a backfill),
    pins the commit plan's prefix, claims the id (compare-and-set) and writes the row, its
    ranges and the event. A live checkpoint (no ``time_filter``) moves the partition heads.
    """
    last, lineage = p.last_checkpoint_id, p.current_lineage
    new_id = last + 1
    pending = count_unfinished(s, p.id)
    if pending >= max_pending:
        low = lowest_unfinished(s, p.id)
        lowest = f"{low.checkpoint_id}, {low.state}" if low is not None else "?"
        resume = low.checkpoint_id if low is not None else "it"
        raise InvariantViolation(
            f"pipeline '{pipeline}': cannot plan checkpoint {new_id}: {pending} "
            f"unfinished checkpoint(s) already (lowest: {lowest}) "
            f"and max_pending={max_pending}. Resume checkpoint {resume} "
            "(prepare, commit) or abort it first."
        )
    guard(new_id)
    if commit_plan is not None:  # the plan's prefix is the pipeline's, for life
        pin_prefix(s, p.id, pipeline, commit_plan.transactional_id_prefix)
    now = utcnow()
    if not _claim_checkpoint_id(s, p.id, last, lineage, now):
        raise CheckpointConflict(
            f"pipeline '{pipeline}': another planner recorded checkpoint {new_id} "
            "concurrently; resume Ledger.unfinished() instead of planning again",
            pipeline=pipeline,
            checkpoint_id=new_id,
        )
    filter_columns: dict[str, Any] = {}
    if time_filter is not None:
        filter_columns = {"filter_start_ms": time_filter[0], "filter_end_ms": time_filter[1]}
    if batch is not None:  # a Structured Streaming query's micro-batch
        filter_columns.update(query_id=batch[0], batch_id=int(batch[1]))
    s.add(
        Checkpoint(
            pipeline_id=p.id,
            checkpoint_id=new_id,
            state=PLANNED,
            lineage=lineage,
            planned_at=now,
            # Left out (SQL NULL) without a plan: the ORM would store a JSON 'null'.
            **({"commit_plan": commit_plan.to_json()} if commit_plan is not None else {}),
            **filter_columns,
            **actor_columns(actor),
        )
    )
    s.flush()
    s.add_all(
        CheckpointRange(
            pipeline_id=p.id,
            checkpoint_id=new_id,
            topic=r.topic,
            partition=r.partition,
            start_offset=r.start,
            end_offset=r.end,
            skipped_from=r.skipped_from,
        )
        for r in ranges
    )
    if time_filter is None:
        for r in ranges:
            set_head(s, p.id, r.key, r.end, lineage, new_id)
    skipped = {
        f"{r.topic}[{r.partition}]": [r.skipped_from, r.start] for r in ranges if r.skipped_from is not None
    }
    add_event(
        s,
        p.id,
        new_id,
        "transition",
        to_state=PLANNED,
        actor=actor,
        at=now,
        details={
            **(dict(details) if details else {}),
            **({"skipped": skipped} if skipped else {}),
            **({"backfill_of": p.backfill_of, "time_filter": list(time_filter)} if time_filter else {}),
            **({"commit_plan": commit_plan.to_json()} if commit_plan is not None else {}),
            **({"query_id": batch[0], "batch_id": int(batch[1])} if batch is not None else {}),
        },
    )
    s.flush()
    return checkpoint_record_of(s, pipeline, require_checkpoint(s, db, pipeline, p.id, new_id))


def plan(
    db: Database,
    pipeline: str,
    ranges: Sequence[RangeSpec],
    *,
    max_pending: int = 1,
    actor: Actor | None = None,
    details: dict[str, Any] | None = None,
    commit_plan: CommitPlan | None = None,
    batch: tuple[str, int] | None = None,
) -> CheckpointRecord:
    """Record the next checkpoint (PLANNED) reading exactly ``ranges``.

    Refuses (InvariantViolation) a gap or an overlap with where each partition must
    start (see :meth:`next_starts`), a repeated partition, and more than
    ``max_pending`` unfinished checkpoints; a stopped pipeline (PipelineStopped). Not
    idempotent by itself: callers resume :meth:`unfinished` first; two concurrent
    planners cannot both succeed.

    ``commit_plan`` (how the checkpoint will be published) is stored in the same
    transaction, and its transactional-id prefix is pinned for the pipeline (a plan
    with another prefix than the pinned one is refused).

    ``batch``: ``(query_id, batch_id)`` when the checkpoint is a Structured Streaming
    query's micro-batch (the query planned its ranges; :mod:`airflow_provider_eo.core.batches`).
    """
    check_plan_args(pipeline, ranges, max_pending)
    with db.write() as s:
        p = pipeline_row(s, db, pipeline, lock=True)
        if p.stopped_at is not None:  # checked under the row lock: a stop is never overtaken
            raise PipelineStopped.of(
                pipeline,
                stopped_by=p.stopped_by,
                stopped_at=p.stopped_at.isoformat(),
                reason=p.stop_reason,
            )
        return record_planned(
            s,
            db,
            pipeline,
            p,
            ranges,
            max_pending=max_pending,
            guard=lambda new_id: _check_contiguous(s, pipeline, p.id, new_id, ranges),
            actor=actor,
            details=details,
            commit_plan=commit_plan,
            batch=batch,
        )


def mark_prepared(
    db: Database,
    pipeline: str,
    checkpoint_id: int,
    *,
    attempt: str,
    staging_location: str,
    records: int,
    bytes_: int,
    shard_counts: Mapping[int, int],
    range_stats: Mapping[TopicPartition, tuple[int | None, int | None]] | None = None,
    spark_app_id: str | None = None,
    actor: Actor | None = None,
    records_read: int | None = None,
    records_dropped: int | None = None,
    records_created: int | None = None,
    dead_letters: int | None = None,
) -> CheckpointRecord:
    """PLANNED -> PREPARED, naming the attempt whose staged output wins.

    Idempotent for the winning attempt: preparing again with the same ``attempt``
    returns the record; any other attempt gets :class:`CheckpointConflict`.
    ``records_read``/``records_dropped``/``records_created``/``dead_letters`` are the source
    accounting the audit checks the sink against (source records read, dropped by the
    transform, output records without a source position, source records staged for the
    dead-letter topic).
    """
    if records < 0 or bytes_ < 0 or any(v < 0 for v in shard_counts.values()):
        raise ValueError("records, bytes_ and shard counts must be >= 0")
    with db.write() as s:
        pid = pipeline_row(s, db, pipeline).id
        now = utcnow()
        moved = _move(
            s,
            pipeline,
            pid,
            checkpoint_id,
            PLANNED,
            PREPARED,
            {
                "prepared_attempt": attempt,
                "staging_location": staging_location,
                "records": records,
                "bytes": bytes_,
                "shard_counts": {str(k): int(v) for k, v in shard_counts.items()},
                "prepared_at": now,
                "spark_app_id": spark_app_id,
                "records_read": records_read,
                "records_dropped": records_dropped,
                "records_created": records_created,
                "dead_letters": dead_letters,
                **actor_columns(actor),
            },
        )
        row = require_checkpoint(s, db, pipeline, pid, checkpoint_id)
        if not moved:
            if row.state == PREPARED and row.prepared_attempt == attempt:
                return checkpoint_record_of(s, pipeline, row)
            raise conflict(pipeline, row, PLANNED.value, "prepare")
        for (topic, partition), (lo, hi) in (range_stats or {}).items():
            hit = rowcount(
                s.execute(
                    update(CheckpointRange)
                    .where(
                        CheckpointRange.pipeline_id == pid,
                        CheckpointRange.checkpoint_id == checkpoint_id,
                        CheckpointRange.topic == topic,
                        CheckpointRange.partition == partition,
                    )
                    .values(min_timestamp=lo, max_timestamp=hi)
                    .execution_options(synchronize_session=False)
                )
            )
            if hit != 1:
                raise InvariantViolation(
                    f"pipeline '{pipeline}', checkpoint {checkpoint_id}: range_stats "
                    f"names {topic}[{partition}], which this checkpoint does not read"
                )
        spans = [hi - lo for lo, hi in (range_stats or {}).values() if lo is not None and hi is not None]
        if spans:  # keeps the backfill's index scan bounded (ledger/backfill.py)
            widest = max(spans)
            s.execute(
                update(Pipeline)
                .where(
                    Pipeline.id == pid,
                    or_(Pipeline.max_range_span_ms.is_(None), Pipeline.max_range_span_ms < widest),
                )
                .values(max_range_span_ms=widest)
                .execution_options(synchronize_session=False)
            )
        add_event(
            s,
            pid,
            checkpoint_id,
            "transition",
            from_state=PLANNED,
            to_state=PREPARED,
            actor=actor,
            at=now,
            details={
                "attempt": attempt,
                "staging_location": staging_location,
                "records": records,
                "bytes": bytes_,
                "spark_app_id": spark_app_id,
            },
        )
        return checkpoint_record_of(s, pipeline, row)


def mark_committed(
    db: Database, pipeline: str, checkpoint_id: int, *, actor: Actor | None = None
) -> CheckpointRecord:
    """PREPARED -> COMMITTED once every shard's transaction committed.

    Idempotent: committing a COMMITTED checkpoint does nothing and returns it. Refuses
    (InvariantViolation) while an earlier checkpoint is unfinished or a shard of its
    commit plan is not recorded COMMITTED (without a plan: while a recorded shard is
    still PENDING).
    """
    with db.write() as s:
        pid = pipeline_row(s, db, pipeline).id
        row = require_checkpoint(s, db, pipeline, pid, checkpoint_id)
        if row.state == COMMITTED:
            return checkpoint_record_of(s, pipeline, row)
        if row.state != PREPARED:
            raise conflict(pipeline, row, PREPARED.value, "commit")
        check_order(s, pipeline, pid, checkpoint_id, "commit")
        recorded: dict[int, ShardState] = {
            shard: state
            for shard, state in s.execute(
                select(CommitShard.shard, CommitShard.state).where(
                    CommitShard.pipeline_id == pid, CommitShard.checkpoint_id == checkpoint_id
                )
            )
        }
        if row.commit_plan is not None:
            # The frozen plan says which shards exist: each must be recorded COMMITTED. A row
            # outside the plan (a try made with other settings before the plan was frozen)
            # neither blocks nor replaces one of the plan's shards.
            shards = CommitPlan.from_json(row.commit_plan).shards
            pending = [n for n in range(shards) if recorded.get(n) != ShardState.COMMITTED]
        else:  # planned before revision 0002 and never frozen: every recorded shard
            pending = [n for n, state in recorded.items() if state != ShardState.COMMITTED]
        if pending:
            raise InvariantViolation(
                f"pipeline '{pipeline}', checkpoint {checkpoint_id}: shards {sorted(pending)} "
                "are not recorded COMMITTED yet; finish (or recover) those shards first"
            )
        now = utcnow()
        moved = _move(
            s,
            pipeline,
            pid,
            checkpoint_id,
            PREPARED,
            COMMITTED,
            {"committed_at": now, **actor_columns(actor)},
        )
        row = require_checkpoint(s, db, pipeline, pid, checkpoint_id)
        if not moved:
            if row.state == COMMITTED:
                return checkpoint_record_of(s, pipeline, row)
            raise conflict(pipeline, row, PREPARED.value, "commit")
        add_event(
            s,
            pid,
            checkpoint_id,
            "transition",
            from_state=PREPARED,
            to_state=COMMITTED,
            actor=actor,
            at=now,
            details={"commit_owner": row.commit_owner},
        )
        return checkpoint_record_of(s, pipeline, row)


def _refuse_published(
    s: Session, pipeline: str, pid: int, row: Checkpoint, later: Sequence[Checkpoint]
) -> None:
    """Refuse the abort when a checkpoint it would abort has a commit shard recorded COMMITTED:
    that shard's transaction committed, so its records are in the sink and a replanned range
    would publish them again. The row is final evidence (a commit marker expires)."""
    ids = [row.checkpoint_id, *(r.checkpoint_id for r in later)]
    published = s.execute(
        select(CommitShard.checkpoint_id, CommitShard.shard)
        .where(
            CommitShard.pipeline_id == pid,
            CommitShard.checkpoint_id.in_(ids),
            CommitShard.state == ShardState.COMMITTED,
        )
        .order_by(CommitShard.checkpoint_id, CommitShard.shard)
    ).all()
    if not published:
        return
    first = published[0].checkpoint_id
    shards = [shard for cp, shard in published if cp == first]
    state = row.state.value if first == row.checkpoint_id else "unfinished"
    raise AbortRefused(
        f"pipeline {pipeline!r}, checkpoint {first}: shards {shards} are recorded COMMITTED, so "
        "their output is in the sink and the checkpoint cannot be aborted (its range would be "
        f"published again). Nothing was aborted; it stays {state}. Finish its commit instead "
        f"(`eo commit MODULE:ATTR --checkpoint {first}`): it publishes only the shards not yet "
        "published."
    )


def record_aborted(
    s: Session,
    db: Database,
    pipeline: str,
    p: Pipeline,
    checkpoint_id: int,
    *,
    reason: str,
    actor: Actor | None = None,
    guard: Callable[[Checkpoint], None],
    also: ColumnElement[bool] | None = None,
) -> CheckpointRecord:
    """PLANNED/PREPARED -> ABORTED in the caller's transaction, which holds the pipeline row
    ``p`` locked: the one way a checkpoint is aborted (the conditional abort,
    :func:`airflow_provider_eo.ledger.leases.abort`, calls it).

    Idempotent: an ABORTED checkpoint is returned as it is. A COMMITTED one cannot be aborted
    (CheckpointConflict), nor one with a commit shard recorded COMMITTED (:class:`AbortRefused`:
    that shard's output is in the sink, whatever its commit marker shows). Later unfinished
    checkpoints are aborted with it (their ranges continue this one's, so they could never
    commit without a gap), and each partition's head goes back to where the earliest aborted
    checkpoint started reading it.

    :param guard: called with every row about to be aborted before anything is written;
        raises to refuse (the caller's lease check). Called again with a fresh row when a
        move matched nothing, so a refusal that raced the move is reported as such.
    :param also: a further condition each row's UPDATE must meet (the same check, in SQL).
    """
    row = require_checkpoint(s, db, pipeline, p.id, checkpoint_id)
    if row.state == ABORTED:
        return checkpoint_record_of(s, pipeline, row)
    if row.state == COMMITTED:
        raise conflict(pipeline, row, "PLANNED or PREPARED", "abort")
    later = (
        s.execute(
            select(Checkpoint)
            .where(
                Checkpoint.pipeline_id == p.id,
                Checkpoint.checkpoint_id > checkpoint_id,
                Checkpoint.state.in_(UNFINISHED_STATES),
            )
            .order_by(Checkpoint.checkpoint_id)
        )
        .scalars()
        .all()
    )
    for each in (row, *later):
        guard(each)
    _refuse_published(s, pipeline, p.id, row, later)
    now = utcnow()
    targets = [(row.checkpoint_id, row.state)] + [(r.checkpoint_id, r.state) for r in later]
    for cp, source in targets:
        cascade = cp != checkpoint_id
        why = reason if not cascade else f"checkpoint {checkpoint_id} aborted: {reason}"
        values = {"aborted_at": now, "abort_reason": why, **actor_columns(actor)}
        if not _move(s, pipeline, p.id, cp, source, ABORTED, values, also=also):
            current = require_checkpoint(s, db, pipeline, p.id, cp)
            if current.state == source:
                guard(current)  # the state is unchanged: the extra condition refused it
            raise conflict(pipeline, current, source.value, "abort")
        add_event(
            s,
            p.id,
            cp,
            "transition",
            from_state=source,
            to_state=ABORTED,
            actor=actor,
            at=now,
            details={"reason": why, **({"cascade_from": checkpoint_id} if cascade else {})},
        )
    # Replan from the same start: each partition's head goes back to the start of
    # the earliest aborted checkpoint that reads it.
    reverted: set[TopicPartition] = set()
    for cp, _ in targets:
        for rg in s.execute(
            select(CheckpointRange).where(
                CheckpointRange.pipeline_id == p.id, CheckpointRange.checkpoint_id == cp
            )
        ).scalars():
            key = (rg.topic, rg.partition)
            if key in reverted:
                continue
            reverted.add(key)
            start = rg.skipped_from if rg.skipped_from is not None else rg.start_offset
            set_head(s, p.id, key, start, row.lineage, None)
    p.updated_at = now
    row = require_checkpoint(s, db, pipeline, p.id, checkpoint_id)
    return checkpoint_record_of(s, pipeline, row)


def freeze_commit_plan(
    db: Database,
    pipeline: str,
    checkpoint_id: int,
    commit_plan: CommitPlan,
    *,
    actor: Actor | None = None,
) -> CheckpointRecord:
    """Give an unfinished checkpoint planned before ledger revision 0002 its commit plan.

    One conditional UPDATE (``... WHERE commit_plan IS NULL``): the first caller's plan
    wins and every caller gets the checkpoint with the plan that won. Pins the plan's
    transactional-id prefix like :meth:`plan`. CheckpointConflict when the checkpoint is
    finished and has no plan.
    """
    with db.write() as s:
        p = pipeline_row(s, db, pipeline)
        pin_prefix(s, p.id, pipeline, commit_plan.transactional_id_prefix)
        won = rowcount(
            s.execute(
                update(Checkpoint)
                .where(
                    Checkpoint.pipeline_id == p.id,
                    Checkpoint.checkpoint_id == checkpoint_id,
                    Checkpoint.state.in_(UNFINISHED_STATES),
                    # SQL NULL (rows from before revision 0002), or a JSON null.
                    or_(
                        Checkpoint.commit_plan.is_(None),
                        cast(Checkpoint.commit_plan, String) == "null",
                    ),
                )
                .values(commit_plan=commit_plan.to_json())
                .execution_options(synchronize_session=False)
            )
        )
        row = require_checkpoint(s, db, pipeline, p.id, checkpoint_id)
        s.refresh(row)
        if won:
            add_event(
                s,
                p.id,
                checkpoint_id,
                "commit_plan_frozen",
                actor=actor,
                details={"commit_plan": commit_plan.to_json()},
            )
        elif row.commit_plan is None:
            raise conflict(pipeline, row, "PLANNED or PREPARED", "freeze the commit plan of")
        return checkpoint_record_of(s, pipeline, row)
