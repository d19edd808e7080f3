"""Backfill in the ledger: which COMMITTED offsets of a live pipeline hold a time interval's
records, what a backfill pipeline already covers, and the transition that records a
backfill checkpoint (refusing any overlap with one already recorded).

A backfill pipeline (``eo_pipelines.backfill_of`` names its live pipeline) re-processes the
live pipeline's committed offsets into another sink. Each of its checkpoints reads offset
ranges and keeps only the records whose Kafka timestamp is in its *time filter*
``[filter_start_ms, filter_end_ms)``. Exactly once across reruns and overlapping requests
rests on one rule, enforced by :func:`plan_backfill_checkpoint`: two non-aborted
checkpoints of one backfill pipeline never share an offset of a partition while their
time filters intersect. The planner (:func:`backfill_work`) only avoids hitting it:

1. The request ``[s, e)`` is cut into *segments* at every filter boundary of an existing
   checkpoint that falls inside it, so each existing filter either contains a segment or
   misses it.
2. For a segment ``T``: the live pipeline's committed offsets whose ranges' min/max record
   timestamps overlap ``T`` (found by the ``(pipeline_id, min_timestamp)`` index), minus
   the offsets of existing checkpoints whose filter contains ``T``, is the work left.

So the same interval again plans nothing, adjacent intervals never overlap (disjoint
filters), and records the live pipeline commits later are picked up by a rerun once.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from airflow_provider_eo.ledger.engine import Database, utcnow
from airflow_provider_eo.ledger.errors import InvariantViolation
from airflow_provider_eo.ledger.events import add_event
from airflow_provider_eo.ledger.mapping import pipeline_record
from airflow_provider_eo.ledger.models import Checkpoint, CheckpointRange, Pipeline
from airflow_provider_eo.ledger.pipelines import ensure_pipeline
from airflow_provider_eo.ledger.reads import (
    pipeline_row,
)
from airflow_provider_eo.ledger.records import (
    Actor,
    CheckpointRecord,
    CommitPlan,
    PipelineRecord,
    RangeSpec,
    TopicPartition,
)
from airflow_provider_eo.ledger.states import CheckpointState
from airflow_provider_eo.ledger.transitions import check_plan_args, record_planned

Interval = tuple[int, int]
"""Offsets ``[start, end)`` of one partition."""

Offsets = dict[TopicPartition, list[Interval]]
"""Disjoint, sorted offset intervals per partition."""


# -- offset interval arithmetic (pure) ------------------------------------------------------


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """The sorted, disjoint union of ``intervals`` (touching ones merge; empty ones vanish)."""
    out: list[Interval] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def subtract(base: Sequence[Interval], cut: Sequence[Interval]) -> list[Interval]:
    """``base - cut``; both sorted and disjoint (as :func:`union` makes them)."""
    out: list[Interval] = []
    j = 0
    for a, b in base:
        start = a
        while j < len(cut) and cut[j][1] <= start:
            j += 1
        k = j
        while k < len(cut) and cut[k][0] < b:
            if cut[k][0] > start:
                out.append((start, cut[k][0]))
            start = max(start, cut[k][1])
            if start >= b:
                break
            k += 1
        if start < b:
            out.append((start, b))
    return out


def _overlaps(a: Interval, b: Interval) -> bool:
    return a[0] < b[1] and b[0] < a[1]


# -- what the ledger holds -------------------------------------------------------------------


@dataclass(frozen=True)
class CommittedRange:
    """One range of a COMMITTED checkpoint of the live pipeline, with the min/max Kafka
    timestamp of its records (both None for a range prepared before timestamps were kept)."""

    topic: str
    partition: int
    start: int
    end: int
    min_timestamp: int | None
    max_timestamp: int | None

    @property
    def key(self) -> TopicPartition:
        return (self.topic, self.partition)

    def overlaps_time(self, start_ms: int, end_ms: int) -> bool:
        """Whether it may hold a record stamped in ``[start_ms, end_ms)``; a non-empty range
        without timestamps (legacy) may."""
        if self.min_timestamp is None or self.max_timestamp is None:
            return self.end > self.start
        return self.min_timestamp < end_ms and self.max_timestamp >= start_ms


@dataclass(frozen=True)
class Covered:
    """A non-aborted checkpoint of a backfill pipeline: its time filter and its offsets."""

    checkpoint_id: int
    filter_start_ms: int | None
    filter_end_ms: int | None
    offsets: Offsets

    def contains(self, start_ms: int, end_ms: int) -> bool:
        """Whether its filter contains ``[start_ms, end_ms)`` (no filter: everything)."""
        lo = self.filter_start_ms if self.filter_start_ms is not None else start_ms
        hi = self.filter_end_ms if self.filter_end_ms is not None else end_ms
        return lo <= start_ms and end_ms <= hi

    def intersects(self, start_ms: int, end_ms: int) -> bool:
        """Whether its filter intersects ``[start_ms, end_ms)`` (no filter: always)."""
        lo = self.filter_start_ms if self.filter_start_ms is not None else start_ms
        hi = self.filter_end_ms if self.filter_end_ms is not None else end_ms
        return lo < end_ms and start_ms < hi


@dataclass(frozen=True)
class Segment:
    """One elementary time segment of a backfill request and the offsets still to read for it."""

    start_ms: int
    end_ms: int
    work: Offsets = field(default_factory=dict)

    @property
    def offsets(self) -> int:
        """Offsets left to read (an upper bound of the records)."""
        return sum(b - a for parts in self.work.values() for a, b in parts)


RangeRow = tuple[str, int, int, int, "int | None", "int | None"]
"""(topic, partition, start, end, min_timestamp, max_timestamp): a :class:`CommittedRange`'s fields."""


def _committed_rows(s: Session, pid: int, span: int | None, start_ms: int, end_ms: int) -> list[RangeRow]:
    """The live pipeline's COMMITTED ranges overlapping ``[start_ms, end_ms)``, by index.

    Two index range scans on ``(pipeline_id, min_timestamp)``: ``min_timestamp`` in
    ``[start - span, end)`` (``span`` is the widest max - min of any range, kept at prepare:
    a range with ``max >= start`` has ``min >= start - span``), and the ranges without
    timestamps (``min_timestamp IS NULL``), which count as overlapping when non-empty.
    """
    cols = (
        CheckpointRange.topic,
        CheckpointRange.partition,
        CheckpointRange.start_offset,
        CheckpointRange.end_offset,
        CheckpointRange.min_timestamp,
        CheckpointRange.max_timestamp,
    )
    joined = and_(
        Checkpoint.pipeline_id == CheckpointRange.pipeline_id,
        Checkpoint.checkpoint_id == CheckpointRange.checkpoint_id,
        Checkpoint.state == CheckpointState.COMMITTED,
    )
    queries = [
        select(*cols)
        .join(Checkpoint, joined)
        .where(
            CheckpointRange.pipeline_id == pid,
            CheckpointRange.min_timestamp.is_(None),
            CheckpointRange.end_offset > CheckpointRange.start_offset,
        )
    ]
    if span is not None:
        queries.append(
            select(*cols)
            .join(Checkpoint, joined)
            .where(
                CheckpointRange.pipeline_id == pid,
                CheckpointRange.min_timestamp >= start_ms - span,
                CheckpointRange.min_timestamp < end_ms,
                CheckpointRange.max_timestamp >= start_ms,
            )
        )
    # Plain rows on the session's connection: no ORM row processing (thousands per day).
    conn = s.connection()
    out: list[RangeRow] = []
    for query in queries:
        out.extend(conn.execute(query).all())
    return out


def _check_interval(start_ms: int, end_ms: int) -> None:
    if end_ms <= start_ms:
        raise ValueError(f"backfill interval [{start_ms}, {end_ms}): the end must be after the start")


def committed_ranges_in(db: Database, live: str, start_ms: int, end_ms: int) -> Offsets:
    """The offsets of the live pipeline's COMMITTED checkpoints (every lineage) whose ranges
    may hold records stamped in ``[start_ms, end_ms)``, unioned per partition (a restore
    re-processes offsets: each source record is read once). Found by index, never by a scan
    of the pipeline's ranges."""
    _check_interval(start_ms, end_ms)
    with db.read() as s:
        p = pipeline_row(s, db, live)
        rows = _committed_rows(s, p.id, p.max_range_span_ms, start_ms, end_ms)
    grouped: dict[TopicPartition, list[Interval]] = {}
    for topic, partition, a, b, _lo, _hi in rows:
        grouped.setdefault((topic, partition), []).append((a, b))
    return {tp: union(parts) for tp, parts in sorted(grouped.items())}


def _coverage(s: Session, pid: int, start_ms: int, end_ms: int) -> list[Covered]:
    """The backfill pipeline's non-aborted checkpoints whose filter intersects the interval."""
    rows = s.execute(
        select(Checkpoint.checkpoint_id, Checkpoint.filter_start_ms, Checkpoint.filter_end_ms).where(
            Checkpoint.pipeline_id == pid,
            Checkpoint.state != CheckpointState.ABORTED,
            or_(Checkpoint.filter_start_ms.is_(None), Checkpoint.filter_start_ms < end_ms),
            or_(Checkpoint.filter_end_ms.is_(None), Checkpoint.filter_end_ms > start_ms),
        )
    ).all()
    if not rows:
        return []
    offsets: dict[int, dict[TopicPartition, list[Interval]]] = {int(r[0]): {} for r in rows}
    ids = sorted(offsets)
    for i in range(0, len(ids), 500):
        for cid, topic, partition, a, b in s.execute(
            select(
                CheckpointRange.checkpoint_id,
                CheckpointRange.topic,
                CheckpointRange.partition,
                CheckpointRange.start_offset,
                CheckpointRange.end_offset,
            ).where(CheckpointRange.pipeline_id == pid, CheckpointRange.checkpoint_id.in_(ids[i : i + 500]))
        ):
            offsets[int(cid)].setdefault((topic, int(partition)), []).append((int(a), int(b)))
    return [
        Covered(
            int(cid),
            fs,
            fe,
            {tp: union(parts) for tp, parts in offsets[int(cid)].items()},
        )
        for cid, fs, fe in rows
    ]


def plan_segments(
    committed: Sequence[CommittedRange], coverage: Sequence[Covered], start_ms: int, end_ms: int
) -> list[Segment]:
    """The work of a backfill request ``[start_ms, end_ms)`` per elementary time segment
    (pure; see the module docstring). Segments with no work are left out."""
    _check_interval(start_ms, end_ms)
    cuts = {start_ms, end_ms}
    for c in coverage:
        for edge in (c.filter_start_ms, c.filter_end_ms):
            if edge is not None and start_ms < edge < end_ms:
                cuts.add(edge)
    edges = sorted(cuts)
    out: list[Segment] = []
    for a, b in itertools.pairwise(edges):
        wanted: dict[TopicPartition, list[Interval]] = {}
        for r in committed:
            if r.overlaps_time(a, b):
                wanted.setdefault(r.key, []).append((r.start, r.end))
        covered: dict[TopicPartition, list[Interval]] = {}
        for c in coverage:
            if c.contains(a, b):
                for tp, parts in c.offsets.items():
                    covered.setdefault(tp, []).extend(parts)
        work: Offsets = {}
        for tp in sorted(wanted):
            left = subtract(union(wanted[tp]), union(covered.get(tp, [])))
            if left:
                work[tp] = left
        if work:
            out.append(Segment(a, b, work))
    return out


def next_checkpoint_ranges(
    segments: Sequence[Segment], budget: int
) -> tuple[Segment, list[RangeSpec]] | None:
    """The next backfill checkpoint from ``segments`` (pure): the first segment with work,
    its first interval of each partition (one range per partition per checkpoint), capped
    to ``budget`` offsets in all, shared fairly (water-filling, as the live plan does).
    None when there is no work."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    for seg in segments:
        firsts = {tp: parts[0] for tp, parts in seg.work.items() if parts}
        if not firsts:
            continue
        order = sorted(firsts, key=lambda tp: (firsts[tp][1] - firsts[tp][0], tp))
        remaining = budget
        take: dict[TopicPartition, int] = {}
        for i, tp in enumerate(order):
            share = remaining // (len(order) - i)
            take[tp] = min(firsts[tp][1] - firsts[tp][0], share)
            remaining -= take[tp]
        ranges = [
            RangeSpec(tp[0], tp[1], firsts[tp][0], firsts[tp][0] + take[tp])
            for tp in sorted(firsts)
            if take[tp] > 0
        ]
        if ranges:
            return seg, ranges
    return None


def backfill_work(db: Database, live: str, backfill: str | None, start_ms: int, end_ms: int) -> list[Segment]:
    """What a backfill of ``live`` by the backfill pipeline ``backfill`` still has to read
    for ``[start_ms, end_ms)``, per segment (:func:`plan_segments`), in one read
    transaction. ``backfill=None`` (or not registered yet): nothing is covered."""
    _check_interval(start_ms, end_ms)
    with db.read() as s:
        p = pipeline_row(s, db, live)
        rows = _committed_rows(s, p.id, p.max_range_span_ms, start_ms, end_ms)
        committed = [CommittedRange(*row) for row in rows]
        coverage: list[Covered] = []
        if backfill is not None:
            row = s.execute(select(Pipeline).where(Pipeline.name == backfill)).scalar_one_or_none()
            if row is not None:
                coverage = _coverage(s, row.id, start_ms, end_ms)
    return plan_segments(committed, coverage, start_ms, end_ms)


# -- writes ------------------------------------------------------------------------------------


def register_backfill_pipeline(
    db: Database, name: str, fingerprint: str, *, backfill_of: str
) -> PipelineRecord:
    """Register the backfill pipeline ``name`` of the live pipeline ``backfill_of`` (or check
    it: same fingerprint, same live pipeline). Idempotent."""
    ensure_pipeline(db, name, fingerprint)
    with db.write() as s:
        p = pipeline_row(s, db, name, lock=True)
        if p.backfill_of is None:
            if p.last_checkpoint_id:
                raise InvariantViolation(
                    f"pipeline '{name}' already has checkpoints as a live pipeline; a backfill "
                    "pipeline needs a name of its own (it is derived from the live pipeline and "
                    "the backfill sink topic: rename the live pipeline or pick another sink)"
                )
            s.execute(
                update(Pipeline)
                .where(Pipeline.id == p.id, Pipeline.backfill_of.is_(None))
                .values(backfill_of=backfill_of, updated_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            add_event(s, p.id, None, "backfill_registered", details={"backfill_of": backfill_of})
            s.refresh(p)
        elif p.backfill_of != backfill_of:
            raise InvariantViolation(
                f"pipeline '{name}' is the backfill pipeline of '{p.backfill_of}', not of "
                f"'{backfill_of}': two live pipelines cannot share one backfill identity. "
                "Backfill into another sink topic."
            )
        return pipeline_record(p)


def _refuse_overlap(
    s: Session, pipeline: str, pid: int, new_id: int, ranges: Sequence[RangeSpec], fs: int, fe: int
) -> None:
    """Refuse (InvariantViolation) a range sharing an offset of a partition with a non-aborted
    checkpoint of the pipeline whose time filter intersects ``[fs, fe)``."""
    clashes: list[str] = []
    for c in _coverage(s, pid, fs, fe):
        for r in ranges:
            for part in c.offsets.get(r.key, []):
                if _overlaps((r.start, r.end), part):
                    clashes.append(
                        f"{r.topic}[{r.partition}] [{max(r.start, part[0])}, {min(r.end, part[1])}) "
                        f"is read by checkpoint {c.checkpoint_id} (time filter "
                        f"[{c.filter_start_ms}, {c.filter_end_ms}))"
                    )
    if clashes:
        raise InvariantViolation(
            f"backfill pipeline '{pipeline}', checkpoint {new_id} (time filter [{fs}, {fe})) "
            f"would read records a checkpoint already reads: {'; '.join(clashes)}. Nothing was "
            "recorded. Plan from Ledger.backfill_work(), which leaves covered offsets out."
        )


def plan_backfill_checkpoint(
    db: Database,
    pipeline: str,
    ranges: Sequence[RangeSpec],
    *,
    filter_start_ms: int,
    filter_end_ms: int,
    max_pending: int = 1,
    actor: Actor | None = None,
    details: Mapping[str, Any] | None = None,
    commit_plan: CommitPlan | None = None,
) -> CheckpointRecord:
    """Record the next checkpoint (PLANNED) of a backfill pipeline: read ``ranges``, keep
    the records stamped in ``[filter_start_ms, filter_end_ms)``.

    The guarantee of exactly once across reruns: refused (InvariantViolation, nothing
    recorded) when a range shares an offset with a non-aborted checkpoint of the pipeline
    whose time filter intersects this one, as well as for a pipeline not registered as a
    backfill, an empty or repeated range, and more than ``max_pending`` unfinished
    checkpoints. No partition heads or contiguity: a backfill reads wherever the live
    pipeline committed. Not idempotent by itself: callers resume :meth:`unfinished` first.
    """
    _check_interval(filter_start_ms, filter_end_ms)
    check_plan_args(pipeline, ranges, max_pending)
    for r in ranges:
        if r.end <= r.start or r.skipped_from is not None:
            raise InvariantViolation(
                f"pipeline '{pipeline}': backfill range {r.compact()} must hold at least one "
                "offset and skip nothing"
            )
    with db.write() as s:
        p = pipeline_row(s, db, pipeline, lock=True)
        if p.backfill_of is None:
            raise InvariantViolation(
                f"pipeline '{pipeline}' is not a backfill pipeline; register it with "
                "Ledger.register_backfill_pipeline first"
            )
        return record_planned(
            s,
            db,
            pipeline,
            p,
            ranges,
            max_pending=max_pending,
            guard=lambda new_id: _refuse_overlap(
                s, pipeline, p.id, new_id, ranges, filter_start_ms, filter_end_ms
            ),
            actor=actor,
            details=details,
            commit_plan=commit_plan,
            time_filter=(filter_start_ms, filter_end_ms),
        )


__all__ = [
    "CommittedRange",
    "Covered",
    "Interval",
    "Offsets",
    "Segment",
    "backfill_work",
    "committed_ranges_in",
    "next_checkpoint_ranges",
    "plan_backfill_checkpoint",
    "plan_segments",
    "register_backfill_pipeline",
    "subtract",
    "union",
]
