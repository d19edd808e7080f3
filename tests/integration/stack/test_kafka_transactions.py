"""The local broker is real: transactions, fencing and transactional offset commits work."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from airflow_provider_eo.kafka.admin import committed_group_offsets, list_offsets

pytestmark = pytest.mark.kafka


def _txn_producer(config: dict[str, Any], txn_id: str) -> Producer:
    producer = Producer({**config, "transactional.id": txn_id, "linger.ms": 1})
    producer.init_transactions(30)
    return producer


def _read_all(config: dict[str, Any], topic: str, partitions: int = 1) -> list[bytes]:
    """Everything a read_committed consumer sees up to the last stable offset."""
    ends = list_offsets(config, [(topic, p) for p in range(partitions)], spec="latest")
    consumer = Consumer(
        {
            **config,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[bytes] = []
    done: set[int] = set()
    import time

    deadline = time.monotonic() + 30
    try:
        while len(done) < partitions and time.monotonic() < deadline:
            for p in range(partitions):
                if p in done:
                    continue
                pos = consumer.position([TopicPartition(topic, p)])[0].offset
                if pos >= ends[(topic, p)] or ends[(topic, p)] == 0:
                    done.add(p)
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            values.append(msg.value())
    finally:
        consumer.close()
    assert len(done) == partitions, f"did not reach the end of {topic} in time"
    return values


def test_committed_visible_aborted_not(kafka_config: dict[str, Any], make_topic: Callable[..., str]) -> None:
    topic = make_topic("txn")
    producer = _txn_producer(kafka_config, f"t-{uuid.uuid4().hex}")
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, value=f"committed-{i}".encode())
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, value=f"aborted-{i}".encode())
    producer.flush(30)
    producer.abort_transaction(30)

    values = _read_all(kafka_config, topic)
    assert values == [f"committed-{i}".encode() for i in range(5)]


def test_second_producer_fences_the_first(
    kafka_config: dict[str, Any], make_topic: Callable[..., str]
) -> None:
    topic = make_topic("fence")
    txn_id = f"t-{uuid.uuid4().hex}"
    first = _txn_producer(kafka_config, txn_id)
    first.begin_transaction()
    first.produce(topic, value=b"zombie")
    first.flush(30)
    second = _txn_producer(kafka_config, txn_id)  # bumps the epoch, aborts first's txn
    with pytest.raises(KafkaException) as info:
        first.commit_transaction(30)
    error = info.value.args[0]
    # librdkafka reports the fencing as a fatal PRODUCER_FENCED / INVALID_PRODUCER_EPOCH.
    assert error.fatal() or "FENCED" in error.name() or "EPOCH" in error.name(), error
    second.begin_transaction()
    second.produce(topic, value=b"live")
    second.commit_transaction(30)
    assert _read_all(kafka_config, topic) == [b"live"]


@pytest.mark.parametrize("commit", [True, False])
def test_send_offsets_to_transaction_moves_group_offsets_only_on_commit(
    kafka_config: dict[str, Any], make_topic: Callable[..., str], commit: bool
) -> None:
    source = make_topic("src")
    sink = make_topic("sink")
    group = f"g-{uuid.uuid4().hex[:8]}"
    producer = _txn_producer(kafka_config, f"t-{uuid.uuid4().hex}")
    # Group metadata for send_offsets_to_transaction: a standalone (never joined) group.
    consumer = Consumer({**kafka_config, "group.id": group, "enable.auto.commit": False})
    try:
        producer.begin_transaction()
        producer.produce(sink, value=b"out")
        producer.send_offsets_to_transaction(
            [TopicPartition(source, 0, 42)], consumer.consumer_group_metadata(), 30
        )
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    finally:
        consumer.close()
    offsets = committed_group_offsets(kafka_config, group, [(source, 0)])
    assert offsets == ({(source, 0): 42} if commit else {})
