"""Settings from Airflow connections: the pipeline's connection ids, applying what they
resolved to, the private hand-off file to a Spark driver, and the driver's side."""

from __future__ import annotations

import functools
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_eo import names
from airflow_provider_eo.apps import driver_pipeline
from airflow_provider_eo.connections import (
    ConnectionSettings,
    HandoffError,
    apply_settings,
    read_handoff,
    require_applied,
    write_handoff,
)
from airflow_provider_eo.errors import ConfigError
from airflow_provider_eo.pipeline import Pipeline, PipelineConfigError

SECRET = "s3cret-canary"


def oauth_token(region: str, config: str) -> tuple[str, float]:
    """A module-level callback, as a Kafka connection's ``oauth_cb`` resolves to."""
    return f"token-{region}", 0.0


def _pipeline(**kw: Any) -> Pipeline:
    base: dict[str, Any] = {"name": "orders", "source_topics": ["in"], "sink_topic": "out"}
    return Pipeline(**{**base, **kw})


def test_connections_are_enough_no_endpoint_in_code() -> None:
    p = _pipeline(kafka_conn_id="kafka_prod", ledger_conn_id="ledger_prod")
    assert p.connection_ids == {"kafka_conn_id": "kafka_prod", "ledger_conn_id": "ledger_prod"}
    with pytest.raises(PipelineConfigError, match=r"bootstrap\.servers.*kafka_conn_id"):
        _pipeline()
    with pytest.raises(PipelineConfigError, match="sink_topic is required"):
        Pipeline(name="x", kafka_conn_id="k", source_topics=["in"])


def test_apply_merges_kafka_replaces_the_ledger_and_clears_the_ids() -> None:
    p = _pipeline(kafka={"client.id": "mine", "linger.ms": 5}, kafka_conn_id="k", ledger_conn_id="l")
    settings = ConnectionSettings(
        kafka_conn_id="k",
        kafka={"bootstrap.servers": "b:9093", "client.id": "conn"},
        ledger_conn_id="l",
        ledger_url="postgresql+psycopg://u:pw@h/db",
    )
    applied = apply_settings(p, settings)
    assert dict(applied.kafka) == {"client.id": "conn", "linger.ms": 5, "bootstrap.servers": "b:9093"}
    assert applied.ledger_url == "postgresql+psycopg://u:pw@h/db"
    assert applied.connection_ids == {}
    require_applied(applied, where="the plan")
    with pytest.raises(ConfigError, match=r"pipeline 'orders': the plan needs .*kafka_conn_id='k'"):
        require_applied(p, where="the plan")
    # Only the Kafka side: the ledger id stays to be read.
    half = apply_settings(p, ConnectionSettings(kafka_conn_id="k", kafka={"bootstrap.servers": "b"}))
    assert half.connection_ids == {"ledger_conn_id": "l"}


def test_the_handoff_is_private_read_once_and_carries_callbacks_by_path() -> None:
    settings = ConnectionSettings(
        kafka_conn_id="k",
        kafka={
            "bootstrap.servers": "b:9093",
            "sasl.password": SECRET,
            "oauth_cb": functools.partial(oauth_token, "eu-west-1"),
            "error_cb": oauth_token,
        },
        ledger_conn_id="l",
        ledger_url=f"postgresql+psycopg://u:{SECRET}@h/db",
    )
    path = write_handoff(settings)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    back = read_handoff(path)
    assert not path.exists() and not path.parent.exists()  # read once
    assert back.kafka["sasl.password"] == SECRET and back.ledger_url == settings.ledger_url
    assert back.kafka["oauth_cb"]("ignored") == ("token-eu-west-1", 0.0)
    assert back.kafka["error_cb"] is oauth_token
    with pytest.raises(HandoffError, match="cannot read the connection settings"):
        read_handoff(path)


def test_an_object_that_cannot_travel_is_refused_with_the_setting_named() -> None:
    settings = ConnectionSettings(kafka_conn_id="k", kafka={"oauth_cb": lambda cfg: ("t", 0.0)})
    with pytest.raises(HandoffError, match=r"connection 'k': setting 'oauth_cb'"):
        settings.to_json()


def _pipeline_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> str:
    name = f"conn_pipelines_{tmp_path.name.replace('-', '_')}"
    mod = tmp_path / f"{name}.py"
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    mod.write_text(
        "from airflow_provider_eo.pipeline import Pipeline\n"
        f"P = Pipeline(name='orders', source_topics=['in'], sink_topic='out', {args})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:P"


def test_driver_applies_the_handoff_and_removes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = _pipeline_module(tmp_path, monkeypatch, kafka_conn_id="k", ledger_conn_id="l")
    path = write_handoff(
        ConnectionSettings(
            kafka_conn_id="k",
            kafka={"bootstrap.servers": "b:1"},
            ledger_conn_id="l",
            ledger_url="sqlite:////x.db",
        )
    )
    monkeypatch.setenv(names.CONNECTIONS_FILE_ENV, str(path))
    p = driver_pipeline(ref)
    assert p.kafka["bootstrap.servers"] == "b:1" and p.ledger_url == "sqlite:////x.db"
    assert names.CONNECTIONS_FILE_ENV not in os.environ and not path.exists()


def test_driver_without_handoff_reads_the_connections_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cluster deploy mode or a hand-run spark-submit: Airflow's own lookup in this process
    (``AIRFLOW_CONN_*`` here)."""
    ref = _pipeline_module(tmp_path, monkeypatch, kafka_conn_id="eo_unit_kafka")
    monkeypatch.delenv(names.CONNECTIONS_FILE_ENV, raising=False)
    monkeypatch.setenv(
        "AIRFLOW_CONN_EO_UNIT_KAFKA",
        json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": "k1:9092", "sasl.password": "pw"}}),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_EO_UNIT_LEDGER", json.dumps({"conn_type": "eo_ledger", "host": str(tmp_path / "l.db")})
    )
    p = driver_pipeline(ref, ledger_conn_id="eo_unit_ledger")
    assert p.kafka["bootstrap.servers"] == "k1:9092" and p.kafka["sasl.password"] == "pw"
    assert p.ledger_url == f"sqlite:///{tmp_path / 'l.db'}"
    assert p.connection_ids == {}


def test_a_connection_nowhere_to_be_found_says_where_it_may_come_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = _pipeline_module(tmp_path, monkeypatch, kafka_conn_id="eo_unit_missing")
    monkeypatch.delenv("AIRFLOW_CONN_EO_UNIT_MISSING", raising=False)
    with pytest.raises(
        ConfigError, match=r"'orders'.*'eo_unit_missing' is not defined.*AIRFLOW_CONN_EO_UNIT_MISSING"
    ):
        driver_pipeline(ref)
