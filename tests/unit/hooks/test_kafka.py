"""EoKafkaHook reads apache-kafka style connections (extra = librdkafka config)."""

from __future__ import annotations

import json

import pytest

from airflow_provider_eo.hooks.kafka import EoKafkaHook
from airflow_provider_eo.pipeline import Pipeline


def _conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: object) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


def test_extra_is_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    extra = {"bootstrap.servers": "b1:9092,b2:9092", "security.protocol": "SASL_SSL"}
    _conn(monkeypatch, "kafka_default", conn_type="kafka", extra=extra)
    assert EoKafkaHook().get_config() == extra


def test_host_login_password_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    _conn(monkeypatch, "k", conn_type="kafka", host="broker", port=9093, login="u", password="p")
    assert EoKafkaHook(kafka_config_id="k").get_config() == {
        "bootstrap.servers": "broker:9093",
        "sasl.username": "u",
        "sasl.password": "p",
    }


def test_missing_bootstrap_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _conn(monkeypatch, "k", conn_type="kafka", extra={"client.id": "x"})
    with pytest.raises(ValueError, match=r"bootstrap\.servers"):
        EoKafkaHook(kafka_config_id="k").get_config()


def test_apply_to_merges_and_drops_derived_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    extra = {"bootstrap.servers": "prod:9092", "group.id": "consumers", "linger.ms": 5}
    _conn(monkeypatch, "k", conn_type="kafka", extra=extra)
    pipeline = Pipeline(
        name="p",
        kafka={"bootstrap.servers": "dev:9092", "client.id": "c"},
        source_topics=["a"],
        sink_topic="b",
    )
    merged = EoKafkaHook(kafka_config_id="k").apply_to(pipeline)
    assert dict(merged.kafka) == {"bootstrap.servers": "prod:9092", "client.id": "c", "linger.ms": 5}
    assert merged.name == "p" and pipeline.kafka["bootstrap.servers"] == "dev:9092"


def test_no_lookup_in_init(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(EoKafkaHook, "get_connection", lambda *_a: pytest.fail("looked up in __init__"))
    assert EoKafkaHook(kafka_config_id="x").kafka_config_id == "x"
