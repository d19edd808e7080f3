"""The per-range observation of a prepare's read: records counted and min/max timestamps of
each live range, whether the read holds one topic or several sharing partition numbers."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_provider_eo.ledger import RangeSpec
from airflow_provider_eo.spark import source

pytestmark = [pytest.mark.spark]


def _ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def _observed(spark: Any, rows: list[tuple[str, int, int]], live: list[RangeSpec]) -> list[Any]:
    """The :func:`source.range_reads` of ``live`` over rows of (topic, partition, epoch ms)."""
    from pyspark.sql import Observation

    frame = spark.createDataFrame(
        [(t, p, i, _ms(ms)) for i, (t, p, ms) in enumerate(rows)],
        "topic string, partition int, offset long, timestamp timestamp",
    )
    observation = Observation()
    frame.observe(observation, *source.range_metrics(live)).write.format("noop").mode("overwrite").save()
    return [
        (r.range.topic, r.range.partition, r.records, r.min_timestamp_ms, r.max_timestamp_ms)
        for r in source.range_reads(live, observation.get)
    ]


def test_ranges_of_two_topics_with_the_same_partitions_are_counted_apart(spark: Any) -> None:
    rows = [("a", 0, 1000), ("a", 0, 3000), ("b", 0, 500), ("a", 1, 7000), ("b", 1, 9000), ("b", 1, 8000)]
    live = [
        RangeSpec("a", 0, 0, 9),
        RangeSpec("a", 1, 0, 9),
        RangeSpec("b", 0, 0, 9),
        RangeSpec("b", 1, 0, 9),
    ]
    assert _observed(spark, rows, live) == [
        ("a", 0, 2, 1000, 3000),
        ("a", 1, 1, 7000, 7000),
        ("b", 0, 1, 500, 500),
        ("b", 1, 2, 8000, 9000),
    ]


def test_ranges_of_one_topic_are_told_by_partition(spark: Any) -> None:
    rows = [("a", 2, 1000), ("a", 0, 4000), ("a", 2, 2000), ("a", 2, 1500)]
    live = [RangeSpec("a", 0, 0, 9), RangeSpec("a", 1, 0, 9), RangeSpec("a", 2, 0, 9)]
    assert _observed(spark, rows, live) == [
        ("a", 0, 1, 4000, 4000),
        ("a", 1, 0, None, None),
        ("a", 2, 3, 1000, 2000),
    ]
