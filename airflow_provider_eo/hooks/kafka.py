"""Airflow hook for Kafka client settings: a ``kafka`` connection read as the apache-kafka
provider reads it.

The connection's extra is a librdkafka config (``{"bootstrap.servers": "...",
"security.protocol": ..., ...}``), built by the provider's own
``KafkaBaseHook._build_config``: string callbacks are resolved only when listed in
``[apache_kafka] callback_allowlist``, and Amazon MSK IAM / Google managed Kafka
connections get their OAuth token callbacks. eo adds field fallbacks (host/port, login,
password), leaves out the keys it derives itself and checks that Spark's Java client can
use the same settings. The pipeline's own ``kafka`` dict stays the base; the connection is
merged over it at execute time (:meth:`EoKafkaHook.apply_to`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from airflow.providers.apache.kafka.hooks.base import MSK_BOOTSTRAP_SERVERS_REGEX, KafkaBaseHook

from airflow_provider_eo.errors import ConfigError
from airflow_provider_eo.kafka.client_config import (
    JAVA_PREFIX,
    OAUTHBEARER_LOGIN_MODULE,
    java_client_options,
)
from airflow_provider_eo.pipeline import _FORBIDDEN_CLIENT_KEYS, Pipeline

# Keys a kafka connection may carry for other clients (a consumer's group.id, a
# producer's transactional.id) that the pipeline derives itself: dropped with a log line.
_DERIVED_KEYS = frozenset(_FORBIDDEN_CLIENT_KEYS)

#: The Java login of the OAuth token callbacks the apache-kafka provider adds (the jar that
#: holds the handler must be on the Spark job's classpath).
MSK_IAM_JAVA_LOGIN = {
    "sasl.jaas.config": f"{OAUTHBEARER_LOGIN_MODULE} required;",
    # software.amazon.msk:aws-msk-iam-auth
    "sasl.login.callback.handler.class": "software.amazon.msk.auth.iam.IAMOAuthBearerLoginCallbackHandler",
    "sasl.client.callback.handler.class": "software.amazon.msk.auth.iam.IAMOAuthBearerLoginCallbackHandler",
}
GOOGLE_MANAGED_KAFKA_JAVA_LOGIN = {
    "sasl.jaas.config": f"{OAUTHBEARER_LOGIN_MODULE} required;",
    # Google's managed Kafka auth login handler jar
    "sasl.login.callback.handler.class": "com.google.cloud.hosted.kafka.auth.GcpLoginCallbackHandler",
}


class _FilledExtra:
    """What ``KafkaBaseHook._build_config`` reads of a connection: its extra (here with
    eo's field fallbacks filled in)."""

    def __init__(self, extra: dict[str, Any]) -> None:
        self._extra = extra

    @property
    def extra_dejson(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._extra))  # a fresh copy: the provider mutates it


class _ReadConnection(KafkaBaseHook):
    """``KafkaBaseHook`` over a connection eo has read, so the provider's own
    ``_build_config`` runs unchanged on what eo reads."""

    def __init__(self, kafka_config_id: str, extra: dict[str, Any]) -> None:
        super().__init__(kafka_config_id=kafka_config_id)
        self._filled = _FilledExtra(extra)

    def get_connection(self, conn_id: str) -> Any:  # type: ignore[override]
        return self._filled


class EoKafkaHook(KafkaBaseHook):
    """librdkafka client config from an Airflow ``kafka`` connection (the apache-kafka
    provider's connection type and form).

    The config is what ``KafkaBaseHook`` builds from the connection's extra. eo also reads
    the standard fields when the extra lacks them: host (and port) for
    ``bootstrap.servers``, login for ``sasl.username``, password for ``sasl.password``.
    Python callbacks (``oauth_cb`` ...) work for the Airflow task's clients; for Spark's
    Java client the Amazon MSK IAM and Google managed Kafka callbacks get their Java
    login handlers, any other ``oauth_cb`` needs ``java.sasl.login.callback.handler.class``.

    :param kafka_config_id: Airflow connection id (type ``kafka``, as in the apache-kafka
        provider).
    """

    def __init__(self, kafka_config_id: str = KafkaBaseHook.default_conn_name, **kwargs: Any) -> None:
        super().__init__(kafka_config_id=kafka_config_id, **kwargs)

    def _build_config(self) -> dict[str, Any]:
        """The provider's config build, with eo's fallbacks (so ``get_conn`` and the
        provider's own callers see the same config as eo)."""
        return self.get_config()

    def get_config(self) -> dict[str, Any]:
        """The librdkafka config of the connection (secrets included: never log it).

        :raises ConfigError: the extra is not a JSON object, there is no
            ``bootstrap.servers``, or a callback is refused by ``[apache_kafka]
            callback_allowlist``; the message names the connection.
        """
        conn = self.get_connection(self.kafka_config_id)
        extra = conn.extra_dejson
        if not isinstance(extra, dict):
            raise ConfigError(
                f"connection {self.kafka_config_id!r}: extra must be a JSON object of librdkafka "
                'settings, e.g. {"bootstrap.servers": "host:9092"}'
            )
        filled = dict(extra)
        if not filled.get("bootstrap.servers") and conn.host:
            filled["bootstrap.servers"] = conn.host if not conn.port else f"{conn.host}:{conn.port}"
        if conn.login and "sasl.username" not in filled:
            filled["sasl.username"] = conn.login
        if conn.password and "sasl.password" not in filled:
            filled["sasl.password"] = conn.password
        if not filled.get("bootstrap.servers"):
            raise ConfigError(
                f"connection {self.kafka_config_id!r} has no bootstrap.servers (set it in the "
                "extra JSON or the host field)"
            )
        reader = _ReadConnection(self.kafka_config_id, filled)
        try:
            config: dict[str, Any] = reader._build_config()
        except ValueError as exc:  # the provider's refusal of a callback not allowlisted
            raise ConfigError(f"connection {self.kafka_config_id!r}: {exc}") from exc
        if "oauth_cb" in config and "oauth_cb" not in extra:
            self._add_java_login(config)
        return config

    def _add_java_login(self, config: dict[str, Any]) -> None:
        """The Java login handler for the OAuth callback the provider added (MSK IAM or
        Google managed Kafka), unless the connection names its own ``java.*`` login."""
        bootstrap = str(config.get("bootstrap.servers", ""))
        if "cloud.goog" in bootstrap and "managedkafka" in bootstrap:
            login = GOOGLE_MANAGED_KAFKA_JAVA_LOGIN
        elif MSK_BOOTSTRAP_SERVERS_REGEX.search(bootstrap):
            login = MSK_IAM_JAVA_LOGIN
        else:
            return
        if any(f"{JAVA_PREFIX}{k}" in config for k in login):
            return
        config.update({f"{JAVA_PREFIX}{k}": v for k, v in login.items()})
        self.log.info(
            "connection %s: Spark's Kafka reader logs in with %s (its jar must be on the Spark "
            "job's classpath)",
            self.kafka_config_id,
            login["sasl.login.callback.handler.class"],
        )

    def apply_to(self, pipeline: Pipeline) -> Pipeline:
        """``pipeline`` with this connection's config merged over its ``kafka`` dict.

        Keys the pipeline derives itself (``group.id``, ``transactional.id``, ...) are
        dropped: a connection shared with ordinary consumers often carries a ``group.id``.

        :raises ConfigError: the connection cannot be read, or Spark's Java Kafka client
            cannot use its settings (the message names the connection and the
            ``java.<setting>`` keys to add).
        """
        config = self.get_config()
        dropped = sorted(k for k in config if k in _DERIVED_KEYS)
        if dropped:
            self.log.info(
                "connection %s: ignoring %s (the pipeline derives them)", self.kafka_config_id, dropped
            )
        merged = {**pipeline.kafka, **{k: v for k, v in config.items() if k not in _DERIVED_KEYS}}
        # Fail here, naming the connection, rather than in the Spark job.
        java_client_options(merged, owner=f"connection {self.kafka_config_id!r} (pipeline {pipeline.name!r})")
        return dataclasses.replace(pipeline, kafka=merged)

    def test_connection(self) -> tuple[bool, str]:
        """Used by the Airflow UI's "Test" button: one connection to the cluster; a refused
        login or TLS handshake is reported as such at once."""
        try:
            from airflow_provider_eo.kafka.login import check_login

            brokers = check_login(self.get_config(), owner=f"connection {self.kafka_config_id!r}")
        except Exception as exc:
            return False, str(exc)
        return True, f"connected: {brokers} broker(s)"
