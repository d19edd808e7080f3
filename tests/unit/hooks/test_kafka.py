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


# -- the apache-kafka provider's own config build (KafkaBaseHook._build_config) -------------------
def log_errors(err: object) -> None:
    """A callback a connection names by its import path (allowlisted below)."""


def tokens(config_str: str) -> tuple[str, float]:
    """A token callback a connection names by its import path."""
    return "token", 0.0


SASL = {"bootstrap.servers": "b:9093", "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}


def test_string_callbacks_resolve_only_through_the_providers_allowlist(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = f"{__name__}.log_errors"
    _conn(monkeypatch, "k", conn_type="kafka", extra={"bootstrap.servers": "b:9092", "error_cb": path})
    with pytest.raises(ValueError, match=r"connection 'k': Refusing to resolve Kafka callback error_cb"):
        EoKafkaHook(kafka_config_id="k").get_config()
    monkeypatch.setenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST", path)
    assert EoKafkaHook(kafka_config_id="k").get_config()["error_cb"] is log_errors


def test_a_python_token_callback_fails_apply_to_naming_the_java_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = f"{__name__}.tokens"
    monkeypatch.setenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST", path)
    _conn(monkeypatch, "k", conn_type="kafka", extra={**SASL, "oauth_cb": path})
    pipeline = Pipeline(name="p", kafka={"bootstrap.servers": "x:1"}, source_topics=["a"], sink_topic="b")
    hook = EoKafkaHook(kafka_config_id="k")
    assert hook.get_config()["oauth_cb"] is tokens  # the Airflow task's own clients can use it
    with pytest.raises(ValueError, match=r"connection 'k' \(pipeline 'p'\).*'oauth_cb'.*java\.sasl\.login"):
        hook.apply_to(pipeline)
    java = {**SASL, "oauth_cb": path, "java.sasl.login.callback.handler.class": "com.example.Tokens"}
    _conn(monkeypatch, "k", conn_type="kafka", extra=java)
    assert hook.apply_to(pipeline).kafka["java.sasl.login.callback.handler.class"] == "com.example.Tokens"


def test_msk_iam_gets_the_providers_callback_and_its_java_login(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    signer = types.ModuleType("aws_msk_iam_sasl_signer")
    signer.MSKAuthTokenProvider = types.SimpleNamespace(  # type: ignore[attr-defined]
        generate_auth_token=lambda region: (f"token-{region}", 5_000)
    )
    monkeypatch.setitem(__import__("sys").modules, "aws_msk_iam_sasl_signer", signer)
    msk = {**SASL, "bootstrap.servers": "b-1.demo.abc123.c2.kafka.eu-west-1.amazonaws.com:9098"}
    _conn(monkeypatch, "msk", conn_type="kafka", extra=msk)
    config = EoKafkaHook(kafka_config_id="msk").get_config()
    assert config["oauth_cb"]("") == ("token-eu-west-1", 5.0)  # the provider's signer callback
    handler = "software.amazon.msk.auth.iam.IAMOAuthBearerLoginCallbackHandler"
    assert config["java.sasl.login.callback.handler.class"] == handler
    assert config["java.sasl.client.callback.handler.class"] == handler
    pipeline = Pipeline(name="p", kafka={"bootstrap.servers": "x:1"}, source_topics=["a"], sink_topic="b")
    from airflow_provider_eo.kafka.client_config import java_client_options

    opts = java_client_options(EoKafkaHook(kafka_config_id="msk").apply_to(pipeline).kafka)
    assert opts["kafka.sasl.mechanism"] == "OAUTHBEARER"
    assert opts["kafka.sasl.login.callback.handler.class"] == handler


def test_the_provider_form_and_connection_type() -> None:
    from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook

    assert issubclass(EoKafkaHook, KafkaBaseHook) and EoKafkaHook.conn_type == "kafka"
    assert EoKafkaHook.get_ui_field_behaviour() == KafkaBaseHook.get_ui_field_behaviour()
