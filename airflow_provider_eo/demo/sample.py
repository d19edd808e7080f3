"""The demo's input: two topics and sample events, with an aborted transaction among them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

DEMO_TOPIC = "eo-demo-events"


def produce_sample(
    bootstrap: str, topic: str, *, client_config: Mapping[str, Any] | None = None
) -> tuple[int, int]:
    """Produce sample events: two committed transactions with an aborted one in between.

    :param client_config: further librdkafka settings (e.g. a secured cluster's SASL/SSL).
    Returns (committed records, aborted records).
    """
    from confluent_kafka import Producer

    from airflow_provider_eo.kafka.client_config import librdkafka_config

    producer = Producer(
        librdkafka_config(
            {
                **(client_config or {}),
                "bootstrap.servers": bootstrap,
                "transactional.id": f"eo-demo-producer-{uuid.uuid4().hex[:8]}",
                "linger.ms": 5,
            }
        )
    )
    producer.init_transactions(30)
    committed = aborted = 0
    for batch, commit in ((0, True), (1, False), (2, True)):
        producer.begin_transaction()
        for i in range(20):
            key = f"user-{i % 7}"
            event = {"batch": batch, "seq": i, "user": key, "amount": (i * 37) % 100}
            producer.produce(topic, key=key, value=json.dumps(event), partition=i % 3)
        if commit:
            producer.commit_transaction(30)
            committed += 20
        else:
            producer.flush(30)
            producer.abort_transaction(30)
            aborted += 20
    return committed, aborted


def seed_demo_topics(bootstrap: str, source: str, sink: str) -> tuple[int, int]:
    """Create the demo's source and sink topics (3 partitions each) and produce the sample
    events into the source. Returns (committed records, aborted records)."""
    from airflow_provider_eo.kafka.admin import ensure_topic

    conf = {"bootstrap.servers": bootstrap}
    ensure_topic(conf, source, partitions=3)
    ensure_topic(conf, sink, partitions=3)
    return produce_sample(bootstrap, source)
