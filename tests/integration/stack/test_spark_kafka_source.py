"""Spark's Kafka source reads exactly a bounded range, skipping an aborted transaction."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from eo_source_sink import transactional_range

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_bounded_read_committed_range(
    spark: Any, kafka_config: dict[str, Any], make_topic: Callable[..., str]
) -> None:
    topic = make_topic("range", partitions=2)
    start, end = transactional_range(kafka_config, topic, 2, 6)
    parts = [(topic, 0), (topic, 1)]

    df = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka_config["bootstrap.servers"])
        .option("kafka.isolation.level", "read_committed")
        .option("subscribe", topic)
        .option("startingOffsets", json.dumps({topic: {str(p): start[(topic, p)] for _, p in parts}}))
        .option("endingOffsets", json.dumps({topic: {str(p): end[(topic, p)] for _, p in parts}}))
        .load()
    )
    values = sorted(r.value.decode() for r in df.select("value").collect())
    assert values == sorted([f"in-{i}" for i in range(6)] + [f"in2-{i}" for i in range(6)])
