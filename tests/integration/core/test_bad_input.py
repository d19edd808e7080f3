"""Bad input: a clear error naming what and where, nothing published, the checkpoint retryable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import eo_test_transforms
import pytest
from confluent_kafka import Producer, TopicPartition

from airflow_provider_eo.errors import (
    DataLossError,
    KafkaAdminError,
    PrepareError,
    SparkEnvironmentError,
    TransformError,
)
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.ledger import CheckpointState
from airflow_provider_eo.stack.kafka import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def _sink_empty(h: Any) -> bool:
    parts = admin.partitions_of(h.config, [h.pipeline.sink_topic])[h.pipeline.sink_topic]
    ends = admin.list_offsets(h.config, [(h.pipeline.sink_topic, p) for p in parts], spec="latest")
    return all(v == 0 for v in ends.values())


def test_output_without_value_is_refused_then_retryable(harness: Callable[..., Any]) -> None:
    h = harness(transform="eo_test_transforms:drop_value_while_broken")
    h.produce(30)
    eo_test_transforms.STATE["broken"] = True
    try:
        with pytest.raises(PrepareError, match=r"checkpoint 1: the transform's output has no 'value'"):
            h.run_once()
        assert h.ledger.get(h.pipeline.name, 1).state is CheckpointState.PLANNED
        assert _sink_empty(h)
        eo_test_transforms.STATE["broken"] = False  # the user fixes the transform
        (result,) = h.drain()
    finally:
        eo_test_transforms.STATE["broken"] = True
    assert result.checkpoint.checkpoint_id == 1
    h.assert_exactly_once(expected_records=30)


def test_record_over_sink_size_limit_is_refused(harness: Callable[..., Any]) -> None:
    h = harness(
        source_partitions=1,
        sink_partitions=1,
        transform="eo_test_transforms:big_values",
        sink_config={"max.message.bytes": "3000"},
    )
    h.produce(5)
    with pytest.raises(PrepareError, match=r"offset 0\) exceeds the sink topic .* max.message.bytes=3000"):
        h.run_once()
    assert h.ledger.get(h.pipeline.name, 1).state is CheckpointState.PLANNED
    assert _sink_empty(h)


def test_poison_record_is_named(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=1, sink_partitions=1, transform="eo_test_transforms:poison")
    producer = Producer(h.config)
    for i in range(40):
        producer.produce(
            h.pipeline.source_topics[0], value=b"POISON" if i == 27 else b"ok%d" % i, partition=0
        )
    producer.flush(30)
    topic = h.pipeline.source_topics[0]
    with pytest.raises(TransformError, match=rf"failed at {topic}\[0\] offset 27: .*POISON"):
        h.run_once()
    assert h.ledger.get(h.pipeline.name, 1).state is CheckpointState.PLANNED
    assert _sink_empty(h)


def test_module_missing_on_executors_blames_the_environment_not_a_record(
    harness: Callable[..., Any],
) -> None:
    """A ModuleNotFoundError on the executors is no bad record: no poison search, no offset
    blamed, the error says to ship the module; nothing published, the checkpoint retryable."""
    h = harness(source_partitions=1, sink_partitions=1, transform="eo_test_transforms:needs_missing_module")
    h.produce(20)
    with pytest.raises(SparkEnvironmentError) as caught:
        h.run_once()
    message = str(caught.value)
    assert "module 'eo_not_shipped_to_executors' is not importable on the executors" in message
    assert "py_files" in message and "offset" not in message and "record)" not in message
    assert h.ledger.get(h.pipeline.name, 1).state is CheckpointState.PLANNED
    assert _sink_empty(h)


def test_transform_failing_on_every_record_is_called_a_code_bug(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=1, sink_partitions=1, transform="eo_test_transforms:always_fails")
    h.produce(20)
    topic = h.pipeline.source_topics[0]
    with pytest.raises(
        TransformError,
        match=rf"fails on the first record \({topic}\[0\] offset 0\) and on the last "
        rf"\({topic}\[0\] offset 19\) alike: .*AttributeError.*bug in the transform's code",
    ):
        h.run_once()
    assert h.ledger.get(h.pipeline.name, 1).state is CheckpointState.PLANNED
    assert _sink_empty(h)


def test_missing_source_topic(harness: Callable[..., Any]) -> None:
    h = harness()
    bad = h.with_(source_topics=["no-such-topic-xyz"])
    with pytest.raises(KafkaAdminError, match="topic 'no-such-topic-xyz' does not exist"):
        bad.run_once()


def test_missing_sink_topic(harness: Callable[..., Any]) -> None:
    h = harness()
    h.produce(3)
    bad = h.with_(sink_topic="no-such-sink-xyz")
    with pytest.raises(KafkaAdminError, match="topic 'no-such-sink-xyz' does not exist"):
        bad.run_once()
    assert bad.ledger.unfinished(bad.pipeline.name) is None  # nothing planned


def test_unreachable_broker(harness: Callable[..., Any]) -> None:
    h = harness()
    port = free_port()
    bad = h.with_(kafka={"bootstrap.servers": f"127.0.0.1:{port}"})
    with pytest.raises(KafkaAdminError, match=rf"cannot reach Kafka at '127.0.0.1:{port}'"):
        bad.run_once()


def test_retention_gap_fails_unless_skip(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=1, sink_partitions=1)
    h.produce(20)
    h.drain()
    h.produce(20, start=20)
    topic = h.pipeline.source_topics[0]
    client = admin.admin_client(h.config)
    fut = client.delete_records([TopicPartition(topic, 0, 30)])  # retention ate 20..29
    next(iter(fut.values())).result(30)
    with pytest.raises(DataLossError, match=rf"offsets \[20, 30\) of {topic}\[0\] were deleted"):
        h.run_once()
    skipping = h.with_(on_data_loss="skip")
    (result,) = skipping.drain()
    (r,) = result.checkpoint.ranges
    assert (r.skipped_from, r.start, r.end) == (20, 30, 40)
    skipping.assert_exactly_once(expected_records=30)
