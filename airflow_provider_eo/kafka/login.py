"""One connection to the cluster that fails at once when the login or the TLS handshake is
refused.

librdkafka retries a refused SASL login (and a failed TLS handshake) until the call's
timeout and then reports only ``Broker transport failure``; the reason reaches the
client's error callback. :func:`check_login` watches that callback, so a wrong password
is an error that says so within a second instead of a time-out that does not.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from airflow_provider_eo.errors import KafkaAdminError
from airflow_provider_eo.errors import KafkaLoginRefused as KafkaLoginRefused
from airflow_provider_eo.kafka.client_config import librdkafka_config

# Errors that retrying cannot fix: the credentials, the mechanism or the certificates.
_REFUSED = {
    KafkaError._AUTHENTICATION: "refused the login",
    KafkaError.SASL_AUTHENTICATION_FAILED: "refused the login",
    KafkaError.UNSUPPORTED_SASL_MECHANISM: "does not offer this SASL mechanism",
    KafkaError.ILLEGAL_SASL_STATE: "refused the login",
    KafkaError._SSL: "failed the TLS handshake",
}


def check_login(
    config: Mapping[str, Any], *, timeout_s: float = 15.0, owner: str = "the Kafka config"
) -> int:
    """Connect with ``config`` and return the number of brokers the cluster reports.

    :param owner: what the config belongs to, for the message (e.g. ``connection 'k'``).
    :raises KafkaLoginRefused: at the first refused login or TLS handshake.
    :raises KafkaAdminError: no answer within ``timeout_s`` (unreachable cluster).
    """
    refused: list[KafkaError] = []
    conf = librdkafka_config(config)
    conf["error_cb"] = refused.append
    admin = AdminClient(conf)
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        try:
            return len(admin.list_topics(timeout=min(1.0, max(deadline - time.monotonic(), 0.1))).brokers)
        except KafkaException as exc:
            last = str(exc)
        admin.poll(0)  # delivers the error callbacks
        fatal = [e for e in refused if e.code() in _REFUSED]
        if fatal:
            raise KafkaLoginRefused(_refusal(config, fatal[-1], owner))
        if time.monotonic() >= deadline:
            raise KafkaAdminError(
                f"{owner}: no answer from Kafka at {config.get('bootstrap.servers')!r} within "
                f"{timeout_s:.0f}s ({last}); check bootstrap.servers and that the cluster is up"
            )


def _refusal(config: Mapping[str, Any], error: KafkaError, owner: str) -> str:
    what = _REFUSED[error.code()]
    mechanism = config.get("sasl.mechanism") or config.get("sasl.mechanisms")
    if error.code() == KafkaError._SSL:
        hint = (
            "check ssl.ca.location (the CA that signed the brokers' certificates) and the client certificate"
        )
        who = "this client"
    else:
        hint = "check sasl.username/sasl.password and that the user exists for this mechanism on the cluster"
        who = f"user {config.get('sasl.username')!r} ({mechanism})"
    return f"{owner}: Kafka at {config.get('bootstrap.servers')!r} {what} of {who}: {error.str()}; {hint}"
