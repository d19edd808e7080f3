"""A small checkpoint read by the driver (spark/source.py ``driver_source``) is the read
Spark's Kafka source makes: the same rows in the same columns (an aborted transaction in the
middle of the range skipped, keyless records kept), nothing past the planned end; a range
retention cut is left to Spark's read (which fails on it by name); and a pipeline whose
small checkpoints never touch Spark's Kafka source publishes each source record once."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from eo_source_sink import assert_sink_is_source_exactly_once, transactional_range

from airflow_provider_eo.kafka.source_read import read_records
from airflow_provider_eo.ledger import RangeSpec
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.spark import source

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def _rows(frame: Any) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in frame.collect()), key=lambda r: (r[2], r[3], r[4]))


def test_the_driver_reads_what_sparks_kafka_source_reads(
    spark: Any, kafka_config: dict[str, Any], make_topic: Callable[..., str]
) -> None:
    topic = make_topic("dread", partitions=3)
    start, end = transactional_range(kafka_config, topic, 3, 9, keyless_every=4)

    pipeline = Pipeline(
        name=f"dread-{uuid.uuid4().hex[:6]}",
        kafka=dict(kafka_config),
        source_topics=[topic],
        sink_topic="unused",
        transform="eo_test_transforms:identity",
        ledger_url="sqlite://",
    )
    live = [RangeSpec(topic, p, start[(topic, p)], end[(topic, p)]) for p in range(3)]
    driver = source.driver_source(spark, pipeline, live)
    assert driver is not None
    spark_read = source.kafka_source(spark, pipeline, live)
    assert driver.schema == spark_read.schema
    rows = _rows(driver)
    assert rows == _rows(spark_read)
    assert sorted(r[1].decode() for r in rows) == sorted(
        [f"in-{i}" for i in range(9)] + [f"in2-{i}" for i in range(9)]
    )
    assert sum(r[0] is None for r in rows) == 6  # keyless records stay keyless

    # Twice more with the same pipeline: the kept consumer reads each range anew.
    assert _rows(source.driver_source(spark, pipeline, live)) == rows
    one = [RangeSpec(topic, 1, start[(topic, 1)], end[(topic, 1)])]
    assert _rows(source.driver_source(spark, pipeline, one)) == [r for r in rows if r[3] == 1]


def test_a_range_retention_cut_is_left_to_sparks_read(
    kafka_config: dict[str, Any], make_topic: Callable[..., str]
) -> None:
    """The driver never reads from the new log start instead of the planned one: it answers
    None, and the caller's Spark read fails on the lost offsets (failOnDataLoss)."""
    topic = make_topic("dlost", partitions=1)
    producer = Producer(kafka_config)
    for i in range(20):
        producer.produce(topic, value=f"v{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    client = AdminClient(kafka_config)
    for fut in client.delete_records([TopicPartition(topic, 0, 5)], request_timeout=30).values():
        assert fut.result(timeout=60).low_watermark == 5
    group = f"eo-read.dlost-{uuid.uuid4().hex[:6]}"
    assert read_records(kafka_config, [(topic, 0, 0, 20)], group=group) is None
    table = read_records(kafka_config, [(topic, 0, 5, 20)], group=group)
    assert table is not None and table.column("offset").to_pylist() == list(range(5, 20))


def test_small_checkpoints_never_touch_sparks_kafka_source(
    harness: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipeline's small checkpoints (transactional source, an aborted batch among them)
    are read by the driver only, and every committed source record is published once."""

    def refused(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a small checkpoint was read with Spark's Kafka source")

    monkeypatch.setattr(source, "kafka_source", refused)
    h = harness(source_partitions=3, sink_partitions=2)
    h.produce(120, txn="commit")
    h.produce(30, start=120, txn="abort")
    h.produce(60, start=150)
    assert len(h.drain()) >= 1
    h.produce(45, start=210, txn="commit")
    assert len(h.drain()) == 1
    assert_sink_is_source_exactly_once(h.config, h.pipeline, source_records=225)


def test_ranges_ending_at_the_log_end_are_read_by_the_driver(
    kafka_config: dict[str, Any], make_topic: Callable[..., str]
) -> None:
    """A stream's ranges end at the log end: a partition read to its end reports that end
    (partition EOF) while the others are still being read, which is no reason to leave the
    read to Spark."""
    topic = make_topic("dend", partitions=4)
    producer = Producer(kafka_config)
    for i in range(400):
        producer.produce(topic, value=f"v{i}".encode(), partition=i % 4)
    assert producer.flush(30) == 0
    spans = [(topic, p, 0, 100) for p in range(4)]
    for _ in range(10):
        table = read_records(kafka_config, spans, group=source.DRIVER_READER_GROUP)
        assert table is not None and table.num_rows == 400
