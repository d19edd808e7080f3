"""The newest records of a topic's partitions, as a read_committed consumer sees them: what
a pipeline's sink shows of the ledgers that published into it (read at plan time, bounded)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from airflow_provider_eo.kafka import admin
from airflow_provider_eo.kafka.client_config import CONSUME_WAIT_S, librdkafka_config

__all__ = ["tail_records"]


def tail_records(
    config: dict[str, Any], topic: str, *, per_partition: int, timeout_s: float = 60.0
) -> list[Any]:
    """Up to the last ``per_partition`` offsets of every partition of ``topic`` below its last
    stable offset, read_committed (records of aborted or open transactions are not seen).

    :raises TimeoutError: a partition could not be read to its stable end in ``timeout_s``.
    """
    parts = admin.partitions_of(config, [topic])[topic]
    tps = [(topic, p) for p in parts]
    ends = admin.list_offsets(config, tps, spec="latest")
    starts = admin.list_offsets(config, tps, spec="earliest")
    todo = {p for p in parts if ends[(topic, p)] > starts[(topic, p)]}
    if not todo:
        return []
    consumer = Consumer(
        {
            **librdkafka_config(config),
            "group.id": f"eo-tail-{uuid.uuid4().hex[:8]}",  # never commits
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        consumer.assign(
            [
                TopicPartition(topic, p, max(starts[(topic, p)], ends[(topic, p)] - per_partition))
                for p in todo
            ]
        )
        while todo:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"could not read the newest records of {topic} partitions {sorted(todo)}")
            for msg in consumer.consume(1000, CONSUME_WAIT_S):
                partition = int(msg.partition() or 0)
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pos = consumer.position([TopicPartition(topic, partition)])[0].offset
                        if pos >= ends[(topic, partition)]:
                            todo.discard(partition)
                    continue
                if int(msg.offset() or 0) < ends[(topic, partition)]:
                    out.append(msg)
                if int(msg.offset() or 0) + 1 >= ends[(topic, partition)]:
                    todo.discard(partition)
    finally:
        consumer.close()
    return out
