"""Partitions found after the first checkpoint start from their earliest offset, as Flink's
Kafka source does, whatever the startup policy; the start is recorded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewPartitions

from airflow_provider_eo.kafka.admin import admin_client
from airflow_provider_eo.pipeline import Startup

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def _produce(config: dict[str, Any], topic: str, partition: int, values: list[str]) -> None:
    producer = Producer({**config, "linger.ms": 5})
    for v in values:
        producer.produce(topic, key=v.split(":")[0], value=v.encode(), partition=partition)
    assert producer.flush(30) == 0


def test_partitions_added_later_start_from_earliest_under_startup_latest(
    harness: Callable[..., Any],
) -> None:
    h = harness(source_partitions=2, sink_partitions=2, startup=Startup(mode="latest"))
    topic = h.pipeline.source_topics[0]
    _produce(h.config, topic, 0, [f"old:{i}" for i in range(20)])  # before the start: skipped
    first = h.drain()  # the first checkpoint starts at the end (startup=latest)
    assert first, "the first plan records where each partition starts"
    _produce(h.config, topic, 0, [f"a:{i}" for i in range(30)])
    _produce(h.config, topic, 1, [f"b:{i}" for i in range(30)])
    h.drain()

    futures = admin_client(h.config).create_partitions([NewPartitions(topic, 4)], request_timeout=30)
    futures[topic].result(timeout=30)
    added = {2: [f"c:{i}" for i in range(40)], 3: [f"d:{i}" for i in range(50)]}
    for partition, values in added.items():
        _produce(h.config, topic, partition, values)  # all before the next plan
    later = h.drain()
    assert later

    seen = [m.value().decode() for m in h.sink_records()]
    for values in added.values():
        missing = [v for v in values if v not in seen]
        assert not missing, f"{len(missing)} records of a partition added later were skipped"
    assert not [v for v in seen if v.startswith("old:")]
    h.assert_exactly_once(expected_records=60 + 90)

    # The start of each discovered partition is recorded with the plan that found it.
    plan_events = [
        e
        for e in h.ledger.events(h.pipeline.name, later[0].checkpoint.checkpoint_id)
        if e.kind == "transition" and e.from_state is None
    ]
    (event,) = plan_events
    assert event.details["discovered"] == {
        f"{topic}[2]": {"start": 0, "policy": "earliest"},
        f"{topic}[3]": {"start": 0, "policy": "earliest"},
    }
