"""Every row of the librdkafka -> Java translation is accepted by the Kafka client Spark's
connector ships: a Java ``KafkaConsumer`` is built (in the Spark session's JVM) from the
options ``java_client_options`` produces, with no broker needed.

The TLS rows build a consumer; the login rows get as far as the login itself (Kerberos asks
its KDC, OIDC its token endpoint), past every configuration check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from eo_tls import issue, make_ca, write_key

from airflow_provider_eo.kafka.client_config import java_client_options

pytestmark = [pytest.mark.spark]

NOWHERE = {"bootstrap.servers": "127.0.0.1:1"}


def _build_consumer(spark: Any, config: dict[str, Any]) -> list[str]:
    """Build (and close) a Java consumer from the translated options; returns the cause
    chain of the failure (empty when it was built)."""
    jvm = spark.sparkContext._jvm
    props = jvm.java.util.Properties()
    for key, value in java_client_options(config).items():
        props.setProperty(key.removeprefix("kafka."), value)
    bytes_ = jvm.org.apache.kafka.common.serialization.ByteArrayDeserializer
    try:
        jvm.org.apache.kafka.clients.consumer.KafkaConsumer(props, bytes_(), bytes_()).close()
    except Exception as exc:  # Py4JJavaError: walk the Java cause chain
        causes = []
        cause = getattr(exc, "java_exception", None)
        while cause is not None:
            causes.append(f"{cause.getClass().getName()}: {cause.getMessage()}")
            cause = cause.getCause()
        return causes or [str(exc)]
    return []


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("java-tls")
    ca = make_ca(folder)
    client = issue(ca, folder, "client", server=False)
    return {
        "ca": ca.cert,
        "cert": client.cert,
        "key": client.key,
        "encrypted_key": write_key(client.private_key, folder / "encrypted.key", password="pw"),
        "ec_key": write_key(client.private_key, folder / "ec.key", form="traditional"),
    }


@pytest.mark.parametrize(
    ("key", "password"), [("key", None), ("encrypted_key", "pw"), ("ec_key", None)], ids=str
)
def test_mutual_tls_builds_a_pem_key_store(
    spark: Any, tls: dict[str, Path], key: str, password: str | None
) -> None:
    config = {
        **NOWHERE,
        "security.protocol": "SSL",
        "ssl.ca.location": str(tls["ca"]),
        "ssl.certificate.location": str(tls["cert"]),
        "ssl.key.location": str(tls[key]),
        "ssl.endpoint.identification.algorithm": "none",
        **({"ssl.key.password": password} if password else {}),
    }
    assert _build_consumer(spark, config) == []


def test_scram_login_with_quotes_in_the_password(spark: Any, tls: dict[str, Path]) -> None:
    config = {
        **NOWHERE,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "eo",
        "sasl.password": 'p"q\\r',
        "ssl.ca.location": str(tls["ca"]),
    }
    assert _build_consumer(spark, config) == []


def test_kerberos_login_reaches_the_keytab(spark: Any, tmp_path: Path) -> None:
    causes = _build_consumer(
        spark,
        {
            **NOWHERE,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.kerberos.keytab": str(tmp_path / "missing.keytab"),
            "sasl.kerberos.principal": "eo@EXAMPLE.COM",
        },
    )
    # Past the JAAS line and the service name: the Kerberos login itself fails (no keytab).
    assert any(c.startswith("javax.security.auth.login.LoginException") for c in causes), causes
    assert not any("serviceName" in c or "JAAS config" in c for c in causes), causes


def test_oidc_login_reaches_the_token_endpoint(spark: Any, tls: dict[str, Path]) -> None:
    causes = _build_consumer(
        spark,
        {
            **NOWHERE,
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(tls["ca"]),
            "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.client.id": "eo",
            "sasl.oauthbearer.client.secret": "secret",
            "sasl.oauthbearer.scope": "kafka",
            "sasl.oauthbearer.extensions": "logicalCluster=lkc-1",
            "sasl.oauthbearer.token.endpoint.url": "http://127.0.0.1:1/token",
        },
    )
    assert any("retrieving token from callback handler" in c for c in causes), causes
