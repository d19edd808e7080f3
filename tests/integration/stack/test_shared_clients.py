"""The process's shared Kafka clients can be closed while the broker is up (a test session
does it before stopping its broker: left to the exit, each waits on dead connections)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from airflow_provider_eo.kafka import admin

pytestmark = [pytest.mark.kafka]


def test_close_shared_clients_is_quick_and_clients_come_back(
    kafka_config: dict[str, Any], make_topic: Callable[..., str]
) -> None:
    topic = make_topic("shared", 2)
    # Untimed: clients earlier tests left (some to brokers they stopped) are not this test's.
    admin.close_shared_clients()
    first = admin.admin_client(kafka_config)
    admin.group_consumer(kafka_config, "eo-shared-clients-test")
    assert admin.list_offsets(kafka_config, [], spec="latest") == {}
    started = time.monotonic()
    closed = admin.close_shared_clients()
    assert closed >= 2 and time.monotonic() - started < 10
    assert admin.close_shared_clients() == 0  # nothing left
    again = admin.admin_client(kafka_config)  # a fresh one on demand, and it works
    assert again is not first
    assert admin.partitions_of(kafka_config, [topic]) == {topic: [0, 1]}
    assert admin.list_offsets(kafka_config, [(topic, 0)], spec="latest") == {(topic, 0): 0}
