"""What a prepare asks the broker, asked again by every prepare: nothing it protects with is
remembered from an earlier checkpoint of the same process.

- the sink topic's ``max.message.bytes``: lowered between two checkpoints, the next prepare
  refuses a record over the new limit (staged, it would wedge the commit);
- the source and dead-letter topics' existence: a topic deleted or missing after the plan
  fails the prepare naming it, whether the checkpoint reads from it or not.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from airflow_provider_eo.errors import KafkaAdminError, PrepareError
from airflow_provider_eo.kafka.admin import admin_client
from airflow_provider_eo.ledger import CheckpointState

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def _set_max_message_bytes(config: dict[str, Any], topic: str, value: int) -> None:
    entry = ConfigEntry("max.message.bytes", str(value), incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    for future in admin_client(config).incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def _produce(h: Any, n: int, size: int) -> None:
    producer = Producer(h.config)
    for i in range(n):
        producer.produce(h.pipeline.source_topics[0], key=f"k{i}".encode(), value=b"v" * size)
    assert producer.flush(30) == 0


def test_a_lowered_max_message_bytes_is_seen_by_the_next_prepare(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=1, sink_partitions=1)
    _produce(h, 3, 3_000)
    first = h.plan()
    assert h.prepare(first.checkpoint_id).checkpoint.state is CheckpointState.PREPARED
    h.commit(first.checkpoint_id)

    _set_max_message_bytes(h.config, h.pipeline.sink_topic, 2_000)
    _produce(h, 3, 3_000)
    second = h.plan()
    with pytest.raises(PrepareError, match=r"exceeds the sink topic .* max\.message\.bytes=2000"):
        h.prepare(second.checkpoint_id)
    assert h.ledger.get(h.pipeline.name, second.checkpoint_id).state is CheckpointState.PLANNED


def test_a_missing_dead_letter_topic_fails_the_prepare_naming_it(harness: Callable[..., Any]) -> None:
    h = harness(source_partitions=1, sink_partitions=1)
    h.produce(5)
    cp = h.plan()
    missing = f"no-such-dlq-{uuid.uuid4().hex[:8]}"
    bad = h.with_(dead_letter_topic=missing, max_dead_letters_per_checkpoint=1)
    with pytest.raises(KafkaAdminError, match=rf"topic '{missing}' does not exist"):
        bad.prepare(cp.checkpoint_id)
    assert h.ledger.get(h.pipeline.name, cp.checkpoint_id).state is CheckpointState.PLANNED
    # Without dead letters the same checkpoint prepares: the topic is asked for only then.
    assert h.prepare(cp.checkpoint_id).checkpoint.state is CheckpointState.PREPARED


def test_a_source_topic_deleted_after_the_plan_fails_the_prepare_naming_it(
    harness: Callable[..., Any],
) -> None:
    h = harness(source_partitions=1, sink_partitions=1)
    h.produce(5)
    cp = h.plan()
    topic = h.pipeline.source_topics[0]
    for future in admin_client(h.config).delete_topics([topic], operation_timeout=30).values():
        future.result(timeout=30)
    with pytest.raises(KafkaAdminError, match=rf"topic '{topic}' does not exist"):
        h.prepare(cp.checkpoint_id)
    assert h.ledger.get(h.pipeline.name, cp.checkpoint_id).state is CheckpointState.PLANNED


def test_a_deleted_source_topic_the_checkpoint_does_not_read_fails_the_prepare_naming_it(
    harness: Callable[..., Any], make_topic: Callable[..., str]
) -> None:
    h = harness(source_partitions=1, sink_partitions=1)
    idle = make_topic("idle", partitions=1)
    h = h.with_(source_topics=[*h.pipeline.source_topics, idle])
    h.produce(5)  # into the first source topic only: the idle topic's range is empty
    cp = h.plan()
    assert {r.topic for r in cp.ranges if r.end > r.start} == {h.pipeline.source_topics[0]}
    for future in admin_client(h.config).delete_topics([idle], operation_timeout=30).values():
        future.result(timeout=30)
    with pytest.raises(KafkaAdminError, match=rf"topic '{idle}' does not exist"):
        h.prepare(cp.checkpoint_id)
    assert h.ledger.get(h.pipeline.name, cp.checkpoint_id).state is CheckpointState.PLANNED
