"""Spark's Kafka source reads exactly a bounded range, skipping an aborted transaction."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer

from airflow_provider_eo.kafka.audit import settled_ends

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_bounded_read_committed_range(
    spark: Any, kafka_config: dict[str, Any], make_topic: Callable[..., str]
) -> None:
    topic = make_topic("range", partitions=2)
    producer = Producer({**kafka_config, "transactional.id": f"t-{uuid.uuid4().hex}"})
    producer.init_transactions(30)

    def batch(tag: str, commit: bool) -> None:
        producer.begin_transaction()
        for i in range(6):
            producer.produce(topic, value=f"{tag}-{i}".encode(), partition=i % 2)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.flush(30)
            producer.abort_transaction(30)

    batch("before", True)
    parts = [(topic, 0), (topic, 1)]
    start = settled_ends(kafka_config, parts)
    batch("in", True)
    batch("aborted", False)  # in the middle of the range
    batch("in2", True)
    # commit_transaction returns before the commit markers are written: wait for the
    # last stable offset to settle before taking it as the range's end
    end = settled_ends(kafka_config, parts)
    batch("after", True)  # past the range: must not be read

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
