"""The librdkafka -> Java client translation for Spark's Kafka source, row by row (the
table in docs/kafka-security.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from eo_tls import issue, make_ca, write_key

from airflow_provider_eo.errors import ConfigError
from airflow_provider_eo.kafka.client_config import (
    KERBEROS_LOGIN_MODULE,
    OAUTHBEARER_LOGIN_MODULE,
    OIDC_LOGIN_CALLBACK_HANDLER,
    PLAIN_LOGIN_MODULE,
    SCRAM_LOGIN_MODULE,
    java_client_options,
)

BROKER = {"bootstrap.servers": "b1:9093,b2:9093"}
SCRAM = {
    **BROKER,
    "security.protocol": "sasl_ssl",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "eo",
    "sasl.password": "s3cret",
}


def _refused(config: dict[str, object], *fragments: str) -> str:
    with pytest.raises(ConfigError) as info:
        java_client_options(config, owner="connection 'k'")
    message = str(info.value)
    assert message.startswith("connection 'k': ")
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_scram_over_tls_with_a_ca_file(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    opts = java_client_options({**SCRAM, "ssl.ca.location": str(ca.cert), "client.id": "not-for-java"})
    assert opts == {
        "kafka.bootstrap.servers": "b1:9093,b2:9093",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": f'{SCRAM_LOGIN_MODULE} required username="eo" password="s3cret";',
        "kafka.ssl.truststore.type": "PEM",
        # The CA travels in the options: nothing to copy to the executors.
        "kafka.ssl.truststore.certificates": ca.cert.read_text().strip() + "\n",
    }


def test_plain_and_the_jaas_quoting() -> None:
    opts = java_client_options(
        {
            **BROKER,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": "u",
            "sasl.password": 'a"b\\c',
        }
    )
    assert opts["kafka.sasl.mechanism"] == "PLAIN"
    assert (
        opts["kafka.sasl.jaas.config"] == f'{PLAIN_LOGIN_MODULE} required username="u" password="a\\"b\\\\c";'
    )
    assert "kafka.ssl.truststore.type" not in opts


def test_settings_of_an_unused_protocol_are_ignored_as_librdkafka_does() -> None:
    opts = java_client_options(
        {**BROKER, "sasl.mechanism": "OAUTHBEARER", "ssl.cipher.suites": "X", "oauth_cb": print}
    )
    assert opts == {"kafka.bootstrap.servers": "b1:9093,b2:9093"}


def test_python_only_settings_are_left_out() -> None:
    opts = java_client_options({**SCRAM, "error_cb": print, "stats_cb": print, "logger": object()})
    assert not any(("cb" in k or "logger" in k) for k in opts)


def test_gssapi_keytab_and_ticket_cache() -> None:
    kerberos = {
        **BROKER,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "GSSAPI",
        "sasl.kerberos.service.name": "kafka",
        "sasl.kerberos.keytab": "/etc/security/eo.keytab",
        "sasl.kerberos.principal": "eo@EXAMPLE.COM",
        "sasl.kerberos.kinit.cmd": "kinit -k -t %{sasl.kerberos.keytab} %{sasl.kerberos.principal}",
        "sasl.kerberos.min.time.before.relogin": "60000",
    }
    opts = java_client_options(kerberos)
    assert opts["kafka.sasl.jaas.config"] == (
        f"{KERBEROS_LOGIN_MODULE} required useKeyTab=true storeKey=true "
        'keyTab="/etc/security/eo.keytab" principal="eo@EXAMPLE.COM";'
    )
    assert opts["kafka.sasl.kerberos.service.name"] == "kafka"
    assert opts["kafka.sasl.kerberos.min.time.before.relogin"] == "60000"
    # librdkafka's default mechanism is GSSAPI, and so is the Java client's.
    cache = java_client_options({**BROKER, "security.protocol": "SASL_PLAINTEXT"})
    assert cache["kafka.sasl.mechanism"] == "GSSAPI"
    # librdkafka's default service name (the Java client has none and would not start).
    assert cache["kafka.sasl.kerberos.service.name"] == "kafka"
    assert cache["kafka.sasl.jaas.config"] == f"{KERBEROS_LOGIN_MODULE} required useTicketCache=true;"


def test_oauthbearer_oidc_client_credentials() -> None:
    opts = java_client_options(
        {
            **BROKER,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.client.id": "eo-client",
            "sasl.oauthbearer.client.secret": "xyz",
            "sasl.oauthbearer.token.endpoint.url": "https://idp.example.com/oauth2/token",
            "sasl.oauthbearer.scope": "kafka",
            "sasl.oauthbearer.extensions": "logicalCluster=lkc-1, identityPoolId=pool-2",
        }
    )
    assert opts["kafka.sasl.mechanism"] == "OAUTHBEARER"
    assert opts["kafka.sasl.login.callback.handler.class"] == OIDC_LOGIN_CALLBACK_HANDLER
    assert opts["kafka.sasl.oauthbearer.token.endpoint.url"] == "https://idp.example.com/oauth2/token"
    assert opts["kafka.sasl.jaas.config"] == (
        f'{OAUTHBEARER_LOGIN_MODULE} required clientId="eo-client" clientSecret="xyz" scope="kafka" '
        'extension_logicalCluster="lkc-1" extension_identityPoolId="pool-2";'
    )


def test_oauthbearer_refusals() -> None:
    oidc = {**BROKER, "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}
    _refused(
        {**oidc, "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": "c"},
        "'sasl.oauthbearer.token.endpoint.url', 'sasl.oauthbearer.client.secret'",
    )
    _refused(
        {
            **oidc,
            "sasl.oauthbearer.method": "OIDC",
            "sasl.oauthbearer.grant.type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
        },
        "'sasl.oauthbearer.grant.type'",
        "java.sasl.login.callback.handler.class",
    )
    # The unsecured development token of librdkafka's default method.
    _refused({**oidc, "sasl.oauthbearer.config": "principal=admin"}, "unsecured JWT", "java.sasl.jaas.config")


def test_a_python_token_callback_needs_a_java_login_handler() -> None:
    config = {**BROKER, "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER", "oauth_cb": print}
    _refused(config, "'oauth_cb'", "Python token callback", "java.sasl.login.callback.handler.class")
    opts = java_client_options({**config, "java.sasl.login.callback.handler.class": "com.example.Tokens"})
    assert opts["kafka.sasl.login.callback.handler.class"] == "com.example.Tokens"
    assert opts["kafka.sasl.jaas.config"] == f"{OAUTHBEARER_LOGIN_MODULE} required;"


def test_trust_store_forms(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    tls = {**BROKER, "security.protocol": "SSL"}
    assert java_client_options({**tls, "ssl.ca.location": "probe"}) == {
        "kafka.bootstrap.servers": "b1:9093,b2:9093",
        "kafka.security.protocol": "SSL",
    }  # probe: the system's CAs, the JVM's default trust store
    inline = java_client_options({**tls, "ssl.ca.pem": ca.cert.read_text()})
    assert inline["kafka.ssl.truststore.certificates"] == ca.cert.read_text().strip() + "\n"
    _refused({**tls, "ssl.ca.location": str(tmp_path)}, "is a directory", "java.ssl.truststore.location")
    _refused({**tls, "ssl.ca.location": str(tmp_path / "nope.pem")}, "cannot read", "nope.pem")
    own = java_client_options(
        {**tls, "ssl.ca.location": str(tmp_path), "java.ssl.truststore.location": "/jks/trust.jks"}
    )
    assert own["kafka.ssl.truststore.location"] == "/jks/trust.jks"
    assert "kafka.ssl.truststore.certificates" not in own


def test_client_certificate_becomes_a_pem_key_store(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    client = issue(ca, tmp_path, "eo-client", server=False)
    tls = {**BROKER, "security.protocol": "SSL", "ssl.certificate.location": str(client.cert)}
    opts = java_client_options({**tls, "ssl.key.location": str(client.key), "ssl.key.password": "unused"})
    assert opts["kafka.ssl.keystore.type"] == "PEM"
    assert opts["kafka.ssl.keystore.certificate.chain"] == client.cert.read_text().strip() + "\n"
    assert opts["kafka.ssl.keystore.key"].startswith("-----BEGIN PRIVATE KEY-----")
    # librdkafka ignores a password for a clear key; the Java client would try to decrypt it.
    assert "kafka.ssl.key.password" not in opts

    # Java's PEM key store reads unencrypted PKCS#8 only (and no PBES2-encrypted key on JDK
    # 17): an encrypted or traditional key is handed over decrypted, in PKCS#8.
    clear = opts["kafka.ssl.keystore.key"]
    locked = write_key(client.private_key, tmp_path / "locked.key", password="pw")
    traditional = write_key(client.private_key, tmp_path / "ec.key", form="traditional")
    for key, password in ((locked, "pw"), (traditional, None), (traditional, "ignored")):
        opts = java_client_options({**tls, "ssl.key.location": str(key), "ssl.key.password": password or ""})
        assert opts["kafka.ssl.keystore.key"] == clear, key
        assert "kafka.ssl.key.password" not in opts
    _refused({**tls, "ssl.key.location": str(locked)}, "'ssl.key.password' is not set")
    _refused(
        {**tls, "ssl.key.location": str(locked), "ssl.key.password": "wrong"},
        "cannot be read with 'ssl.key.password'",
    )
    _refused(tls, "'ssl.key.location' is missing")


def test_pkcs12_key_store_keeps_its_file() -> None:
    opts = java_client_options(
        {
            **BROKER,
            "security.protocol": "SSL",
            "ssl.keystore.location": "/secrets/client.p12",
            "ssl.keystore.password": "pw",
        }
    )
    assert opts["kafka.ssl.keystore.type"] == "PKCS12"
    assert opts["kafka.ssl.keystore.location"] == "/secrets/client.p12"
    assert opts["kafka.ssl.keystore.password"] == "pw"


@pytest.mark.parametrize(("librdkafka", "java"), [("https", "https"), ("none", ""), ("NONE", "")])
def test_endpoint_identification(librdkafka: str, java: str) -> None:
    opts = java_client_options(
        {**BROKER, "security.protocol": "SSL", "ssl.endpoint.identification.algorithm": librdkafka}
    )
    assert opts["kafka.ssl.endpoint.identification.algorithm"] == java


def test_untranslatable_settings_name_their_java_replacement() -> None:
    tls = {**BROKER, "security.protocol": "SSL"}
    message = _refused(
        {
            **tls,
            "ssl.cipher.suites": "ECDHE-RSA-AES256-GCM-SHA384",
            "ssl.crl.location": "/crl.pem",
            "enable.ssl.certificate.verification": "false",
            "ssl.endpoint.identification.algorithm": "dns",
        },
        "'ssl.cipher.suites' (OpenSSL cipher names; the Java client takes JSSE names): set "
        "java.ssl.cipher.suites",
        "'ssl.crl.location'",
        "'enable.ssl.certificate.verification'",
        "java.ssl.engine.factory.class",
        "'ssl.endpoint.identification.algorithm' is 'dns'",
    )
    assert message.count(";") >= 3  # every problem at once
    opts = java_client_options(
        {
            **tls,
            "ssl.cipher.suites": "ECDHE-RSA-AES256-GCM-SHA384",
            "java.ssl.cipher.suites": "TLS_AES_256_GCM_SHA384",
        }
    )
    assert opts["kafka.ssl.cipher.suites"] == "TLS_AES_256_GCM_SHA384"
    _refused({**SCRAM, "sasl.kerberos.weird": "x"}, "'sasl.kerberos.weird'", "java.sasl.kerberos.weird")


def test_java_settings_win_and_replace_the_login() -> None:
    jaas = 'org.example.Login required token="t";'
    opts = java_client_options(
        {
            **SCRAM,
            "sasl.mechanism": "OAUTHBEARER",
            "java.sasl.jaas.config": jaas,
            "java.sasl.mechanism": "OAUTHBEARER",
            "java.max.poll.records": "10",
        }
    )
    assert opts["kafka.sasl.jaas.config"] == jaas
    assert opts["kafka.max.poll.records"] == "10"
