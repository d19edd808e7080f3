"""The frozen records the ledger returns, and the one checkpoint summary."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from airflow_provider_eo.ledger import (
    CheckpointRecord,
    CheckpointState,
    RangeSpec,
    ShardRecord,
    ShardState,
)

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)


def test_range_spec_validates() -> None:
    with pytest.raises(ValueError, match="start <= end"):
        RangeSpec("t", 0, 5, 4)
    with pytest.raises(ValueError, match="skipped_from"):
        RangeSpec("t", 0, 5, 9, skipped_from=5)
    assert RangeSpec("t", 1, 3, 3).compact() == "t[1]:3-3"


def _record(**changes: object) -> CheckpointRecord:
    base: dict[str, object] = {
        "pipeline": "orders",
        "checkpoint_id": 3,
        "state": CheckpointState.COMMITTED,
        "lineage": 1,
        "ranges": (RangeSpec("t", 0, 0, 10), RangeSpec("t", 1, 7, 9, skipped_from=5)),
        "planned_at": T0,
        "prepared_at": T0 + dt.timedelta(seconds=2),
        "committed_at": T0 + dt.timedelta(seconds=3),
        "prepared_attempt": "att-1",
        "records": 11,
        "bytes": 500,
        "spark_app_id": "app-1",
        "records_read": 12,
        "records_dropped": 1,
        "records_created": 0,
        "shards": (ShardRecord(0, "eo.orders.0", 1, 0, ShardState.COMMITTED, 11, T0),),
    }
    base.update(changes)
    return CheckpointRecord(**base)  # type: ignore[arg-type]


def test_summary_has_every_key_the_callers_use() -> None:
    summary = _record().summary()
    assert summary == {
        "pipeline": "orders",
        "checkpoint_id": 3,
        "state": "COMMITTED",
        "lineage": 1,
        "ranges": ["t[0]:0-10", "t[1]:7-9 (skipped from 5)"],
        "records_planned": 12,
        "records": 11,
        "bytes": 500,
        "records_read": 12,
        "records_dropped": 1,
        "records_created": 0,
        "dead_letters": None,
        "planned_at": "2030-01-01T00:00:00+00:00",
        "prepared_at": "2030-01-01T00:00:02+00:00",
        "committed_at": "2030-01-01T00:00:03+00:00",
        "aborted_at": None,
        "prepared_attempt": "att-1",
        "spark_app_id": "app-1",
        "abort_reason": None,
        "shards": [{"shard": 0, "state": "COMMITTED", "records": 11}],
    }
    assert json.loads(json.dumps(summary)) == summary  # XCom- and --json-ready


def test_summary_caps_the_ranges() -> None:
    ranges = tuple(RangeSpec("t", p, 0, 1) for p in range(5))
    summary = _record(ranges=ranges).summary(max_ranges=2)
    assert summary["ranges"] == ["t[0]:0-1", "t[1]:0-1", "... 3 more"]
    assert summary["records_planned"] == 5  # counted over every range, not the shown ones
    assert len(_record(ranges=ranges).summary(max_ranges=5)["ranges"]) == 5


def test_planned_summary_has_no_prepare_fields() -> None:
    summary = _record(
        state=CheckpointState.PLANNED, prepared_at=None, committed_at=None, records=None, shards=()
    ).summary()
    assert (summary["state"], summary["records"], summary["prepared_at"], summary["shards"]) == (
        "PLANNED",
        None,
        None,
        [],
    )
