"""Backfill in the ledger: interval arithmetic, the coverage planner, the index lookup and
the transition that refuses any overlap (SQLite; PostgreSQL in tests/integration/ledger)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from airflow_provider_eo.ledger import InvariantViolation, Ledger, RangeSpec
from airflow_provider_eo.ledger.backfill import (
    CommittedRange,
    Covered,
    Segment,
    next_checkpoint_ranges,
    plan_segments,
    subtract,
    union,
)

LIVE = "orders"
BF = "orders.bf.out2"
DAY = 86_400_000


def test_union_and_subtract() -> None:
    assert union([(5, 9), (0, 3), (3, 4), (7, 12), (20, 20)]) == [(0, 4), (5, 12)]
    assert subtract([(0, 10), (20, 30)], [(2, 4), (8, 22), (29, 40)]) == [(0, 2), (4, 8), (22, 29)]
    assert subtract([(0, 10)], []) == [(0, 10)]
    assert subtract([(0, 10)], [(0, 10)]) == []
    assert subtract([(5, 10)], [(0, 1), (11, 12)]) == [(5, 10)]


def _r(p: int, a: int, b: int, lo: int | None, hi: int | None) -> CommittedRange:
    return CommittedRange("t", p, a, b, lo, hi)


def test_segments_leave_out_what_an_enclosing_filter_covers() -> None:
    committed = [_r(0, 0, 100, 0, DAY - 1), _r(0, 100, 200, DAY, 2 * DAY - 1), _r(1, 0, 50, 10, 2 * DAY)]
    # nothing covered: one segment, every overlapping range
    (seg,) = plan_segments(committed, [], 0, 2 * DAY)
    assert seg.work == {("t", 0): [(0, 200)], ("t", 1): [(0, 50)]}
    # day 1 covered on partition 0 [0, 100): the request for days 1-2 splits at the boundary
    done = Covered(1, 0, DAY, {("t", 0): [(0, 100)], ("t", 1): [(0, 50)]})
    segs = plan_segments(committed, [done], 0, 2 * DAY)
    assert [(s.start_ms, s.end_ms) for s in segs] == [(DAY, 2 * DAY)]
    assert segs[0].work == {("t", 0): [(100, 200)], ("t", 1): [(0, 50)]}
    # the same interval again: nothing
    assert plan_segments(committed, [done], 0, DAY) == []
    # a filter that only intersects the request does not cover it
    wide = Covered(2, DAY // 2, DAY + DAY // 2, {("t", 0): [(0, 200)]})
    segs = plan_segments(committed, [wide], 0, DAY)
    assert [(s.start_ms, s.end_ms) for s in segs] == [(0, DAY // 2), (DAY // 2, DAY)]
    assert segs[1].work == {("t", 1): [(0, 50)]}


def test_legacy_ranges_without_timestamps_count_as_overlapping() -> None:
    committed = [_r(0, 0, 10, None, None), _r(0, 10, 10, None, None)]
    (seg,) = plan_segments(committed, [], 5 * DAY, 6 * DAY)
    assert seg.work == {("t", 0): [(0, 10)]}


def test_next_checkpoint_one_range_per_partition_capped() -> None:
    seg = Segment(0, DAY, {("t", 0): [(0, 10), (20, 30)], ("t", 1): [(0, 100)]})
    got = next_checkpoint_ranges([Segment(0, 1), seg], 50)
    assert got is not None
    assert got[0] is seg
    assert got[1] == [RangeSpec("t", 0, 0, 10), RangeSpec("t", 1, 0, 40)]
    assert next_checkpoint_ranges([], 10) is None


# -- on a SQLite ledger -------------------------------------------------------------------


def commit_live(ledger: Ledger, ranges: list[tuple[int, int, int, int | None, int | None]]) -> int:
    """One COMMITTED checkpoint of LIVE: ranges (partition, start, end, min_ts, max_ts)."""
    specs = [RangeSpec("t", p, a, b) for p, a, b, _lo, _hi in ranges]
    starts = ledger.next_starts(LIVE)
    specs = [RangeSpec(r.topic, r.partition, starts.get(r.key, r.start), r.end) for r in specs]
    cp = ledger.plan(LIVE, specs).checkpoint_id
    ledger.mark_prepared(
        LIVE,
        cp,
        attempt="a",
        staging_location="/x",
        records=1,
        bytes_=1,
        shard_counts={0: 1},
        range_stats={("t", p): (lo, hi) for p, _a, _b, lo, hi in ranges},
    )
    ledger.mark_committed(LIVE, cp)
    return cp


def finish(ledger: Ledger, checkpoint_id: int) -> None:
    """PLANNED -> PREPARED -> COMMITTED for a backfill checkpoint."""
    ledger.mark_prepared(
        BF, checkpoint_id, attempt="a", staging_location="/y", records=1, bytes_=1, shard_counts={}
    )
    ledger.mark_committed(BF, checkpoint_id)


def next_backfill(ledger: Ledger, start: int, end: int, budget: int = 1_000) -> int | None:
    """Plan and commit the next backfill checkpoint of [start, end) as core/backfill does."""
    got = next_checkpoint_ranges(ledger.backfill_work(LIVE, BF, start, end), budget)
    if got is None:
        return None
    seg, ranges = got
    ledger.register_backfill_pipeline(BF, "fp-bf", backfill_of=LIVE)
    cp = ledger.plan_backfill(BF, ranges, filter_start_ms=seg.start_ms, filter_end_ms=seg.end_ms)
    finish(ledger, cp.checkpoint_id)
    return cp.checkpoint_id


def drain(ledger: Ledger, start: int, end: int, budget: int = 1_000) -> list[int]:
    out = []
    while (cp := next_backfill(ledger, start, end, budget)) is not None:
        out.append(cp)
        assert len(out) < 50
    return out


@pytest.fixture
def live(make_ledger: Callable[[], Ledger]) -> Ledger:
    ledger = make_ledger()
    ledger.ensure_pipeline(LIVE, "fp")
    # day 0: p0 [0,100), p1 [0,40); a checkpoint straddling days 0-1 on p0 [100,150)
    commit_live(ledger, [(0, 0, 100, 10, DAY - 10), (1, 0, 40, 5, DAY - 5)])
    commit_live(ledger, [(0, 100, 150, DAY - 5, DAY + 5), (1, 40, 40, None, None)])
    # day 1 and day 2
    commit_live(ledger, [(0, 150, 200, DAY + 10, 2 * DAY - 10), (1, 40, 90, DAY + 1, 2 * DAY - 1)])
    commit_live(ledger, [(0, 200, 260, 2 * DAY + 1, 3 * DAY - 1), (1, 90, 99, 2 * DAY, 2 * DAY + 5)])
    # planned but not committed: never part of a backfill
    ledger.plan(LIVE, [RangeSpec("t", 0, 260, 300)])
    return ledger


def test_committed_ranges_in_finds_a_day_by_index(live: Ledger) -> None:
    assert live.get_pipeline(LIVE).max_range_span_ms == DAY - 2
    assert live.committed_ranges_in(LIVE, DAY, 2 * DAY) == {("t", 0): [(100, 200)], ("t", 1): [(40, 90)]}
    assert live.committed_ranges_in(LIVE, 0, DAY) == {("t", 0): [(0, 150)], ("t", 1): [(0, 40)]}
    assert live.committed_ranges_in(LIVE, 10 * DAY, 11 * DAY) == {}
    with pytest.raises(ValueError, match="end must be after"):
        live.committed_ranges_in(LIVE, DAY, DAY)


def test_reruns_and_adjacent_days_never_overlap(live: Ledger) -> None:
    day0 = drain(live, 0, DAY)
    assert len(day0) == 1
    assert live.get(BF, day0[0]).offsets == {("t", 0): (0, 150), ("t", 1): (0, 40)}
    assert drain(live, 0, DAY) == []  # the same interval again plans nothing
    day1 = drain(live, DAY, 2 * DAY)  # the straddling range is read again, under another filter
    assert [live.get(BF, c).offsets for c in day1] == [{("t", 0): (100, 200), ("t", 1): (40, 90)}]
    assert drain(live, 0, 3 * DAY) != []  # only day 2 is left
    assert drain(live, 0, 3 * DAY) == []
    filters = [cp.time_filter for cp in live.list_checkpoints(BF)]
    assert filters == [(0, DAY), (DAY, 2 * DAY), (2 * DAY, 3 * DAY)]
    assert live.get_pipeline(BF).backfill_of == LIVE


def test_records_committed_later_are_added_once(live: Ledger) -> None:
    drain(live, 2 * DAY, 3 * DAY)
    live.abort(LIVE, 5, reason="test")
    commit_live(live, [(0, 260, 280, 2 * DAY + 50, 2 * DAY + 60)])
    (cp,) = drain(live, 2 * DAY, 3 * DAY)
    assert live.get(BF, cp).offsets == {("t", 0): (260, 280)}
    assert drain(live, 2 * DAY, 3 * DAY) == []


def test_budget_splits_the_work_into_several_checkpoints(live: Ledger) -> None:
    cps = drain(live, 0, DAY, budget=60)
    assert len(cps) == 4
    per_partition: dict[int, list[tuple[int, int]]] = {}
    for c in cps:
        cp = live.get(BF, c)
        assert sum(r.end - r.start for r in cp.ranges) <= 60
        for r in cp.ranges:
            per_partition.setdefault(r.partition, []).append((r.start, r.end))
    # every offset exactly once: the pieces are disjoint and union to the day's ranges
    for p, pieces in per_partition.items():
        assert sum(b - a for a, b in pieces) == sum(b - a for a, b in union(pieces)), p
    assert {p: union(pieces) for p, pieces in per_partition.items()} == {0: [(0, 150)], 1: [(0, 40)]}


def test_the_transition_refuses_overlap(live: Ledger) -> None:
    live.register_backfill_pipeline(BF, "fp-bf", backfill_of=LIVE)
    first = live.plan_backfill(BF, [RangeSpec("t", 0, 0, 100)], filter_start_ms=0, filter_end_ms=DAY)
    finish(live, first.checkpoint_id)
    before = live.list_checkpoints(BF)
    # intersecting offsets and intersecting filters: refused, nothing recorded
    with pytest.raises(InvariantViolation, match=r"t\[0\] \[50, 60\) is read by checkpoint 1"):
        live.plan_backfill(BF, [RangeSpec("t", 0, 50, 60)], filter_start_ms=DAY - 1, filter_end_ms=2 * DAY)
    assert live.list_checkpoints(BF) == before
    # same offsets under a disjoint filter, or other offsets under the same filter: fine
    second = live.plan_backfill(BF, [RangeSpec("t", 0, 50, 60)], filter_start_ms=DAY, filter_end_ms=2 * DAY)
    live.abort(BF, second.checkpoint_id, reason="test")
    # an aborted checkpoint covers nothing
    third = live.plan_backfill(BF, [RangeSpec("t", 0, 100, 120)], filter_start_ms=0, filter_end_ms=DAY)
    # one unfinished at a time
    with pytest.raises(InvariantViolation, match="unfinished"):
        live.plan_backfill(BF, [RangeSpec("t", 1, 0, 10)], filter_start_ms=0, filter_end_ms=DAY)
    assert third.time_filter == (0, DAY)
    # a live pipeline is not a backfill pipeline
    with pytest.raises(InvariantViolation, match="not a backfill pipeline"):
        live.plan_backfill(LIVE, [RangeSpec("t", 1, 0, 10)], filter_start_ms=0, filter_end_ms=DAY)


def test_register_refuses_another_live_pipeline(live: Ledger) -> None:
    live.register_backfill_pipeline(BF, "fp-bf", backfill_of=LIVE)
    assert live.register_backfill_pipeline(BF, "fp-bf", backfill_of=LIVE).backfill_of == LIVE
    with pytest.raises(InvariantViolation, match="backfill pipeline of 'orders'"):
        live.register_backfill_pipeline(BF, "fp-bf", backfill_of="other")
    with pytest.raises(InvariantViolation, match="already has checkpoints"):
        live.register_backfill_pipeline(LIVE, "fp", backfill_of="x")
