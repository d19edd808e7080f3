"""A delivery failure inside a commit transaction.

A record the broker refuses (here: larger than the sink topic's ``max.message.bytes``, set
after prepare staged it) fails its delivery report; librdkafka then puts the transaction in
an abortable state: the next ``produce()`` raises ``KafkaException(_STATE)`` and the commit
step says ``txn_requires_abort``. The commit must abort the transaction (nothing from it
visible), not loop, and fail with an error naming the record and its partition and what to
do; after the fix (the limit raised again) the retry publishes exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from airflow_provider_eo.errors import CommitError
from airflow_provider_eo.kafka.admin import admin_client
from airflow_provider_eo.kafka.partitioner import java_partition
from airflow_provider_eo.ledger import CheckpointState

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

AFTER = 20_000


def _set_max_message_bytes(config: dict[str, Any], topic: str, value: int) -> None:
    entry = ConfigEntry("max.message.bytes", str(value), incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    for future in admin_client(config).incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def test_record_refused_by_the_broker_aborts_the_shard_and_names_the_record(
    harness: Callable[..., Any],
) -> None:
    h = harness(source_partitions=1, sink_partitions=2, commit_shards=2)
    h.produce(40, keys=5)
    producer = Producer(h.config)
    producer.produce(h.pipeline.source_topics[0], key=b"big", value=b"big:" + b"x" * 40_000)
    # Many records after it in the same sink partition: produce() is still being called
    # when the refusal comes back, so it raises KafkaException(_STATE).
    for i in range(AFTER):
        producer.produce(h.pipeline.source_topics[0], key=b"big", value=f"big:{i}".encode())
        producer.poll(0)
    assert producer.flush(30) == 0
    big_partition = java_partition(b"big", 2)

    cp = h.plan()
    h.prepare(cp.checkpoint_id)
    _set_max_message_bytes(h.config, h.pipeline.sink_topic, 10_000)  # after prepare checked it

    started = time.monotonic()
    with pytest.raises(CommitError) as failed:
        h.commit(cp.checkpoint_id)
    # Promptly: not looping, and not waiting out the records librdkafka keeps in flight
    # behind the refused one until message.timeout.ms (~55 s) before it aborts.
    assert time.monotonic() - started < 40, "the commit must give up at once, not loop or wait"
    message = str(failed.value)
    assert f"checkpoint {cp.checkpoint_id}" in message, message
    assert f"partition {big_partition}" in message, message
    assert f"{h.pipeline.source_topics[0]}:0:40" in message, message  # the record's source
    assert "max.message.bytes" in message, message
    assert h.ledger.get(h.pipeline.name, cp.checkpoint_id).state is CheckpointState.PREPARED
    # Nothing of the failed transaction is visible to a read_committed consumer.
    assert not [m for m in h.sink_records() if m.partition() == big_partition]

    _set_max_message_bytes(h.config, h.pipeline.sink_topic, 1_048_588)
    result = h.commit(cp.checkpoint_id)
    assert result.checkpoint.state is CheckpointState.COMMITTED
    h.assert_exactly_once(expected_records=41 + AFTER)


def test_batches_stay_below_the_sink_topics_limit(harness: Callable[..., Any]) -> None:
    """Records that each fit the sink's ``max.message.bytes`` are committed, whatever
    librdkafka's default ``batch.size`` (1 MB): the broker applies the limit to a whole batch.
    Found by the torture run: a 64 KiB sink wedged the pipeline on every commit try."""
    h = harness(source_partitions=1, sink_partitions=1)
    _set_max_message_bytes(h.config, h.pipeline.source_topics[0], 1_048_588)
    _set_max_message_bytes(h.config, h.pipeline.sink_topic, 64 * 1024)
    producer = Producer(h.config)
    for i in range(30):  # each ~40 KB: fits alone, two of them do not
        producer.produce(h.pipeline.source_topics[0], key=b"k", value=f"{i}:".encode() + b"y" * 40_000)
    assert producer.flush(30) == 0

    cp = h.plan()
    h.prepare(cp.checkpoint_id)
    result = h.commit(cp.checkpoint_id)
    assert result.checkpoint.state is CheckpointState.COMMITTED
    h.assert_exactly_once(expected_records=30)
