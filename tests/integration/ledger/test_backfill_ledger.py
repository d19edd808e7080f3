"""Backfill in the ledger on SQLite and PostgreSQL: the interval lookup by index, the
coverage planner, and the transition that refuses any overlap."""

from __future__ import annotations

import pytest

from airflow_provider_eo.ledger import InvariantViolation, Ledger, RangeSpec
from airflow_provider_eo.ledger.backfill import next_checkpoint_ranges

LIVE = "live"
BF = "live.bf.out2"
DAY = 86_400_000


def _commit_live(ledger: Ledger, start: int, end: int, lo: int, hi: int) -> None:
    cp = ledger.plan(LIVE, [RangeSpec("t", 0, start, end)]).checkpoint_id
    ledger.mark_prepared(
        LIVE, cp, attempt="a", staging_location="/x", records=1, bytes_=1, shard_counts={0: 1},
        range_stats={("t", 0): (lo, hi)},
    )  # fmt: skip
    ledger.mark_committed(LIVE, cp)


def _backfill_once(ledger: Ledger, start: int, end: int) -> int | None:
    got = next_checkpoint_ranges(ledger.backfill_work(LIVE, BF, start, end), 1_000)
    if got is None:
        return None
    seg, ranges = got
    cp = ledger.plan_backfill(BF, ranges, filter_start_ms=seg.start_ms, filter_end_ms=seg.end_ms)
    ledger.mark_prepared(
        BF, cp.checkpoint_id, attempt="a", staging_location="/y", records=1, bytes_=1, shard_counts={}
    )
    ledger.mark_committed(BF, cp.checkpoint_id)
    return cp.checkpoint_id


def test_backfill_coverage_and_overlap_refusal(ledger_url: str) -> None:
    with Ledger(ledger_url) as ledger:
        ledger.ensure_pipeline(LIVE, "fp")
        _commit_live(ledger, 0, 100, 1, DAY - 1)
        _commit_live(ledger, 100, 150, DAY - 5, DAY + 5)
        _commit_live(ledger, 150, 200, DAY + 6, 2 * DAY - 1)
        ledger.plan(LIVE, [RangeSpec("t", 0, 200, 260)])  # not committed: never backfilled
        assert ledger.committed_ranges_in(LIVE, DAY, 2 * DAY) == {("t", 0): [(100, 200)]}
        ledger.register_backfill_pipeline(BF, "fp-bf", backfill_of=LIVE)
        assert _backfill_once(ledger, 0, DAY) == 1
        assert _backfill_once(ledger, 0, DAY) is None  # the same day again: nothing
        assert _backfill_once(ledger, DAY, 2 * DAY) == 2  # the adjacent day
        assert ledger.get(BF, 2).offsets == {("t", 0): (100, 200)}
        assert _backfill_once(ledger, 0, 2 * DAY) is None
        rows = ledger.list_checkpoints(BF)
        with pytest.raises(InvariantViolation, match="already reads"):
            ledger.plan_backfill(
                BF, [RangeSpec("t", 0, 120, 130)], filter_start_ms=DAY, filter_end_ms=DAY + 1
            )
        assert ledger.list_checkpoints(BF) == rows
        later = ledger.plan_backfill(
            BF, [RangeSpec("t", 0, 120, 130)], filter_start_ms=2 * DAY, filter_end_ms=3 * DAY
        )
        assert later.time_filter == (2 * DAY, 3 * DAY)
