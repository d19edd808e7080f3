"""Airflow hook for Kafka client settings: a connection's extra is a librdkafka config.

It reads the same connections as the apache-kafka provider (conn type ``kafka``, extra
``{"bootstrap.servers": "...", "security.protocol": ..., ...}``), so existing
connections work unchanged. The pipeline's own ``kafka`` dict stays the base; the
connection is merged over it at execute time (:meth:`EoKafkaHook.apply_to`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from airflow_provider_eo.errors import ConfigError
from airflow_provider_eo.pipeline import _FORBIDDEN_CLIENT_KEYS, Pipeline
from airflow_provider_eo.version_compat import BaseHook

# Keys a kafka connection may carry for other clients (a consumer's group.id, a
# producer's transactional.id) that the pipeline derives itself: dropped with a log line.
_DERIVED_KEYS = frozenset(_FORBIDDEN_CLIENT_KEYS)


class EoKafkaHook(BaseHook):
    """librdkafka client config from an Airflow connection.

    The config is the connection's extra (a JSON object). When the extra has no
    ``bootstrap.servers``, the connection's host (and port) are used for it. A password
    field, when set, becomes ``sasl.password`` (and login ``sasl.username``) unless the
    extra already names them.

    :param kafka_config_id: Airflow connection id (type ``kafka``, as in the apache-kafka
        provider).
    """

    conn_name_attr = "kafka_config_id"
    default_conn_name = "kafka_default"
    conn_type = "kafka"
    hook_name = "Kafka (librdkafka config)"

    def __init__(self, kafka_config_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kafka_config_id = kafka_config_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": ["schema"],
            "relabeling": {"extra": "librdkafka config (JSON)"},
            "placeholders": {
                "extra": json.dumps({"bootstrap.servers": "broker-1:9092,broker-2:9092"}),
            },
        }

    def get_config(self) -> dict[str, Any]:
        """The librdkafka config of the connection (secrets included: never log it)."""
        conn = self.get_connection(self.kafka_config_id)
        extra = conn.extra_dejson
        if not isinstance(extra, dict):
            raise ConfigError(
                f"connection {self.kafka_config_id!r}: extra must be a JSON object of librdkafka "
                'settings, e.g. {"bootstrap.servers": "host:9092"}'
            )
        config: dict[str, Any] = dict(extra)
        if not config.get("bootstrap.servers") and conn.host:
            hosts = conn.host if not conn.port else f"{conn.host}:{conn.port}"
            config["bootstrap.servers"] = hosts
        if conn.login and "sasl.username" not in config:
            config["sasl.username"] = conn.login
        if conn.password and "sasl.password" not in config:
            config["sasl.password"] = conn.password
        if not config.get("bootstrap.servers"):
            raise ConfigError(
                f"connection {self.kafka_config_id!r} has no bootstrap.servers (set it in the "
                "extra JSON or the host field)"
            )
        return config

    def apply_to(self, pipeline: Pipeline) -> Pipeline:
        """``pipeline`` with this connection's config merged over its ``kafka`` dict.

        Keys the pipeline derives itself (``group.id``, ``transactional.id``, ...) are
        dropped: a connection shared with ordinary consumers often carries a ``group.id``.
        """
        config = self.get_config()
        dropped = sorted(k for k in config if k in _DERIVED_KEYS)
        if dropped:
            self.log.info(
                "connection %s: ignoring %s (the pipeline derives them)", self.kafka_config_id, dropped
            )
        merged = {**pipeline.kafka, **{k: v for k, v in config.items() if k not in _DERIVED_KEYS}}
        return dataclasses.replace(pipeline, kafka=merged)

    def test_connection(self) -> tuple[bool, str]:
        """Used by the Airflow UI's "Test" button: lists the cluster's topics."""
        try:
            from confluent_kafka.admin import AdminClient

            from airflow_provider_eo.kafka.client_config import librdkafka_config

            config = librdkafka_config(self.get_config())
            metadata = AdminClient(config).list_topics(timeout=10)
        except Exception as exc:
            return False, str(exc)
        return True, f"connected: {len(metadata.brokers)} broker(s), {len(metadata.topics)} topic(s)"
