"""librdkafka settings derived from a pipeline's client config."""

from __future__ import annotations

from airflow_provider_eo.kafka.client_config import java_client_options, librdkafka_config


def test_defaults_never_override_the_user() -> None:
    conf = {"bootstrap.servers": "b:9092", "java.max.poll.records": "10"}
    expected = {"bootstrap.servers": "b:9092", "log_level": 4, "reconnect.backoff.ms": 20}
    assert librdkafka_config(conf) == expected
    mine = {"bootstrap.servers": "b:9092", "log_level": 7, "reconnect.backoff.ms": 500}
    assert librdkafka_config(mine) == mine


def test_java_options_keep_the_escape_hatch() -> None:
    opts = java_client_options({"bootstrap.servers": "b:9092", "java.max.poll.records": "10"})
    assert opts == {"kafka.bootstrap.servers": "b:9092", "kafka.max.poll.records": "10"}
