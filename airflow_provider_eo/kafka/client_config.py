"""Turn the pipeline's librdkafka-style config into each client's settings: confluent-kafka's
(:func:`librdkafka_config`) and Spark's Java Kafka source (:func:`java_client_options`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from airflow_provider_eo.errors import ConfigError

#: librdkafka's own log lines (connection failures it retries, coordinator look-ups) go to
#: this logger instead of stderr (where they leaked into the CLI's and the demo's output).
LIBRDKAFKA_LOGGER = "airflow_provider_eo.kafka.librdkafka"


class LibrdkafkaLog(logging.LoggerAdapter[logging.Logger]):
    """The ``logger`` client setting: librdkafka's lines, one level lower than librdkafka's.

    librdkafka retries what it logs as an error (a refused connection, a coordinator still
    loading) by itself, and the provider raises a typed error when a call really fails, so
    its ``err`` lines are warnings here and its warnings are info.
    """

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        """Log one librdkafka line (called by confluent-kafka's log callback)."""
        if level >= logging.CRITICAL:
            level = logging.ERROR
        elif level >= logging.WARNING:
            level -= 10
        elif level >= logging.INFO:
            level = logging.DEBUG
        super().log(level, msg, *args, **kwargs)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        """Unchanged (no extra context)."""
        return msg, kwargs


_LOG = LibrdkafkaLog(logging.getLogger(LIBRDKAFKA_LOGGER), {})

# -- librdkafka settings -> Spark's Java Kafka client ----------------------------------------
# Spark's Kafka source is the Java client (kafka-clients 3.9.x in Spark 4's connector), so the
# pipeline's librdkafka settings are translated for it. What cannot be translated fails with
# the setting's name and the java.<setting> key that replaces it: a security setting that is
# silently dropped would connect differently (or not at all) on the executors.

#: Seconds each ``Consumer.consume()`` of a bounded read (audit, read-back, tail) waits. It
#: waits that long unless it fills its whole batch, so a small read's records and its
#: end-of-partition events come back only after it: 0.5 s made a 300-record read take 0.50 s,
#: this takes 0.05 s (each empty wait costs no CPU).
CONSUME_WAIT_S = 0.05

#: A key with this prefix goes only to Spark's reader, as ``kafka.<rest>``; it wins over a
#: translated setting of the same name and replaces what it stands in for.
JAVA_PREFIX = "java."

PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
OAUTHBEARER_LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
#: The OIDC client-credentials token fetcher (this package since kafka-clients 3.4; Spark
#: 4.0-4.2 ship kafka-clients 3.9).
OIDC_LOGIN_CALLBACK_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
KERBEROS_LOGIN_MODULE = "com.sun.security.auth.module.Krb5LoginModule"

# Spelled the same by both clients.
_SAME_NAME = ("bootstrap.servers", "client.dns.lookup")
_SASL_SAME_NAME = (
    "sasl.kerberos.service.name",
    "sasl.kerberos.min.time.before.relogin",
    "sasl.oauthbearer.token.endpoint.url",
)
_SSL_TRANSLATED = frozenset(
    {
        "ssl.ca.location",
        "ssl.ca.pem",
        "ssl.certificate.location",
        "ssl.certificate.pem",
        "ssl.key.location",
        "ssl.key.pem",
        "ssl.key.password",
        "ssl.keystore.location",
        "ssl.keystore.password",
        "ssl.endpoint.identification.algorithm",
    }
)
_SASL_TRANSLATED = frozenset(
    {
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
        "sasl.kerberos.principal",
        "sasl.kerberos.keytab",
        # How librdkafka refreshes its ticket from the keytab; the Java login module reads
        # the keytab itself.
        "sasl.kerberos.kinit.cmd",
        *_SASL_SAME_NAME,
    }
)
# librdkafka settings the Java client has no setting for: (why, the Java settings that do
# the job instead; setting one of them as java.<setting> replaces the librdkafka one).
_ENGINE = ("ssl.engine.factory.class",)
_NO_TRANSLATION: dict[str, tuple[str, tuple[str, ...]]] = {
    "ssl.cipher.suites": ("OpenSSL cipher names; the Java client takes JSSE names", ("ssl.cipher.suites",)),
    "ssl.curves.list": ("an OpenSSL setting", _ENGINE),
    "ssl.sigalgs.list": ("an OpenSSL setting", _ENGINE),
    "ssl.crl.location": ("the JVM checks revocation, not a client setting", _ENGINE),
    "ssl.providers": ("OpenSSL providers", _ENGINE),
    "ssl.engine.id": ("an OpenSSL engine", _ENGINE),
    "ssl.engine.location": ("an OpenSSL engine", _ENGINE),
    "ssl.certificate.verify_cb": ("a Python callable", _ENGINE),
    "ssl.ca.certificate.stores": (
        "Windows certificate stores",
        ("ssl.truststore.location", "ssl.truststore.certificates"),
    ),
}


def java_client_options(config: Mapping[str, Any], *, owner: str = "the Kafka config") -> dict[str, str]:
    """Options for Spark's Kafka source (``kafka.``-prefixed Java client settings) from a
    librdkafka ``config``.

    The table (docs/kafka-security.md): ``bootstrap.servers``, ``security.protocol``,
    ``sasl.mechanism(s)`` as they are; SASL PLAIN/SCRAM credentials, GSSAPI keytab and
    principal, and OAUTHBEARER ``oidc`` client credentials become the matching JAAS login;
    ``ssl.ca.location``/``ssl.ca.pem`` a PEM trust store and ``ssl.certificate.*`` +
    ``ssl.key.*`` a PEM key store, both carried in the options (no file is needed on the
    executors); ``ssl.keystore.location`` (PKCS#12) as it is; ``ssl.endpoint.identification.algorithm``
    ``none`` the Java client's empty value. ``ssl.*``/``sasl.*`` settings apply only when
    ``security.protocol`` uses them, as in librdkafka. Python-only settings (callbacks,
    ``logger``) and client tuning are left out; ``java.<setting>`` keys are passed as they
    are and win.

    :param config: librdkafka-style settings (the pipeline's ``kafka``).
    :param owner: what the config belongs to, for error messages (e.g. ``pipeline 'orders'``).
    :raises ConfigError: a security setting has no Java translation; the message names
        each such setting and the ``java.<setting>`` key that replaces it.
    """
    given = {k[len(JAVA_PREFIX) :]: str(v) for k, v in config.items() if k.startswith(JAVA_PREFIX)}
    protocol = str(config.get("security.protocol") or "PLAINTEXT").upper()
    out: dict[str, str] = {k: str(config[k]) for k in _SAME_NAME if k in config}
    if "security.protocol" in config:
        out["security.protocol"] = protocol
    problems: list[str] = []
    if protocol in ("SSL", "SASL_SSL"):
        out.update(_ssl_options(config, given, problems))
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        out.update(_sasl_options(config, given, problems))
    if problems:
        raise ConfigError(
            f"{owner}: Spark's Java Kafka client cannot use these settings as librdkafka does: "
            + "; ".join(problems)
            + ". A java.<setting> key goes to Spark's reader only (the Java client's own name)."
        )
    out.update(given)
    return {f"kafka.{k}": v for k, v in out.items()}


def _refuse(
    key: str, why: str, instead: tuple[str, ...], given: Mapping[str, str], problems: list[str]
) -> None:
    """Note ``key`` as untranslatable unless one of ``instead`` is given as java.<setting>."""
    if not any(k in given for k in instead):
        names = " or ".join(f"{JAVA_PREFIX}{k}" for k in instead)
        problems.append(f"{key!r} ({why}): set {names}")


def _read_text(path: str, key: str, problems: list[str]) -> str | None:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"{key!r}: cannot read {path!r} here ({exc})")
        return None


def _ssl_options(config: Mapping[str, Any], given: Mapping[str, str], problems: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key in sorted(k for k in config if k.startswith(("ssl.", "ssl_")) and k not in _SSL_TRANSLATED):
        why, instead = _NO_TRANSLATION.get(key, ("no Java setting of that meaning is known", (key,)))
        _refuse(key, why, instead, given, problems)
    verify = config.get("enable.ssl.certificate.verification", True)
    if str(verify).lower() in ("false", "0"):
        why = "the Java client always verifies the broker's certificate; trust its CA instead"
        _refuse("enable.ssl.certificate.verification", why, _ENGINE, given, problems)

    # The broker's CA: a PEM trust store in the options themselves.
    if not {"ssl.truststore.location", "ssl.truststore.certificates", "ssl.truststore.type"} & given.keys():
        pems: list[str] = []
        ca = config.get("ssl.ca.location")
        if ca and str(ca) != "probe":  # probe: the system's CAs, as the JVM's default trust store
            if Path(str(ca)).is_dir():
                _refuse(
                    "ssl.ca.location",
                    f"{ca!r} is a directory of CA files",
                    ("ssl.truststore.location", "ssl.truststore.certificates"),
                    given,
                    problems,
                )
            elif (text := _read_text(str(ca), "ssl.ca.location", problems)) is not None:
                pems.append(text.strip())
        if config.get("ssl.ca.pem"):
            pems.append(str(config["ssl.ca.pem"]).strip())
        if pems:
            out["ssl.truststore.type"] = "PEM"
            out["ssl.truststore.certificates"] = "\n".join(pems) + "\n"

    # The client's own certificate (mutual TLS).
    if not {"ssl.keystore.location", "ssl.keystore.key", "ssl.keystore.type"} & given.keys():
        out.update(_key_store(config, problems))

    algorithm = config.get("ssl.endpoint.identification.algorithm")
    if algorithm is not None and "ssl.endpoint.identification.algorithm" not in given:
        value = str(algorithm).lower()
        if value in ("none", ""):
            out["ssl.endpoint.identification.algorithm"] = ""  # the Java client's "off"
        elif value == "https":
            out["ssl.endpoint.identification.algorithm"] = "https"
        else:
            problems.append(
                f"'ssl.endpoint.identification.algorithm' is {algorithm!r} (librdkafka knows "
                "'https' and 'none')"
            )
    return out


def _key_store(config: Mapping[str, Any], problems: list[str]) -> dict[str, str]:
    cert = config.get("ssl.certificate.pem")
    if config.get("ssl.certificate.location"):
        cert = _read_text(str(config["ssl.certificate.location"]), "ssl.certificate.location", problems)
    key = config.get("ssl.key.pem")
    if config.get("ssl.key.location"):
        key = _read_text(str(config["ssl.key.location"]), "ssl.key.location", problems)
    has_cert = bool(config.get("ssl.certificate.pem") or config.get("ssl.certificate.location"))
    has_key = bool(config.get("ssl.key.pem") or config.get("ssl.key.location"))
    if has_cert != has_key:
        missing = "ssl.key.location" if has_cert else "ssl.certificate.location"
        problems.append(
            f"a client certificate needs both its certificate and its key: {missing!r} is missing"
        )
        return {}
    if cert is not None and key is not None:
        java_key = _pkcs8_key(str(key), config.get("ssl.key.password"), problems)
        if java_key is None:
            return {}
        return {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.certificate.chain": str(cert).strip() + "\n",
            "ssl.keystore.key": java_key.strip() + "\n",
        }
    if config.get("ssl.keystore.location"):
        out = {"ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(config["ssl.keystore.location"])}
        if config.get("ssl.keystore.password") is not None:
            out["ssl.keystore.password"] = str(config["ssl.keystore.password"])
        return out
    return {}


def _pkcs8_key(key: str, password: Any, problems: list[str]) -> str | None:
    """``key`` as an unencrypted PKCS#8 PEM key (``BEGIN PRIVATE KEY``).

    The Java client's PEM key store reads PKCS#8 only, and on JDK 17 no PBES2-encrypted
    key (``PBES2 SecretKeyFactory not available``), the form OpenSSL 3 and Python's
    ``cryptography`` write; librdkafka reads any OpenSSL key. So a key in another form, or
    encrypted, is decrypted here with ``ssl.key.password``: the password would travel in the
    same options as the encrypted key, so the clear key exposes nothing more.
    """
    if "BEGIN PRIVATE KEY" in key:
        return key  # librdkafka ignores a password for a clear key; so does this
    try:
        from cryptography.hazmat.primitives import serialization
    except ImportError:  # an Airflow dependency: missing only in a bare Spark environment
        problems.append(
            "the client key is not an unencrypted PKCS#8 key and Python 'cryptography' is not "
            "installed here to convert it: set java.ssl.keystore.key (a 'BEGIN PRIVATE KEY' PEM)"
        )
        return None
    secret = str(password).encode() if password else None
    try:
        try:
            loaded = serialization.load_pem_private_key(key.encode(), secret)
        except TypeError:  # a password given for a clear key: ignored, as librdkafka does
            if secret is None:
                problems.append("the client key is encrypted but 'ssl.key.password' is not set")
                return None
            loaded = serialization.load_pem_private_key(key.encode(), None)
    except (ValueError, TypeError) as exc:
        problems.append(f"the client key cannot be read with 'ssl.key.password' ({exc})")
        return None
    return loaded.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def _jaas(module: str, options: Mapping[str, str | bool]) -> str:
    """A JAAS login line; string values quoted (``\\`` and ``"`` escaped, as Kafka's parser
    reads them)."""
    parts = [module, "required"]
    for name, value in options.items():
        if isinstance(value, bool):
            parts.append(f"{name}={'true' if value else 'false'}")
        else:
            escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
            parts.append(f'{name}="{escaped}"')
    return " ".join(parts) + ";"


def _sasl_options(config: Mapping[str, Any], given: Mapping[str, str], problems: list[str]) -> dict[str, str]:
    # librdkafka's default mechanism is GSSAPI, as the Java client's.
    mechanism = str(config.get("sasl.mechanism") or config.get("sasl.mechanisms") or "GSSAPI").upper()
    out = {"sasl.mechanism": mechanism}
    out.update({k: str(config[k]) for k in _SASL_SAME_NAME if k in config})
    if "sasl.jaas.config" in given:  # the user's own login: the credentials are librdkafka's only
        return out
    for key in sorted(k for k in config if k.startswith("sasl.") and k not in _SASL_TRANSLATED):
        if not key.startswith("sasl.oauthbearer."):
            _refuse(key, "no Java setting of that meaning is known", (key,), given, problems)
    if mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        user, password = config.get("sasl.username"), config.get("sasl.password")
        if user is None or password is None:
            problems.append(f"SASL {mechanism} needs 'sasl.username' and 'sasl.password'")
        else:
            module = PLAIN_LOGIN_MODULE if mechanism == "PLAIN" else SCRAM_LOGIN_MODULE
            out["sasl.jaas.config"] = _jaas(module, {"username": str(user), "password": str(password)})
    elif mechanism == "GSSAPI":
        # librdkafka's default service name; the Java client has none and refuses to start.
        out.setdefault("sasl.kerberos.service.name", "kafka")
        out["sasl.jaas.config"] = _kerberos_login(config)
    elif mechanism == "OAUTHBEARER":
        out.update(_oauthbearer(config, given, problems))
    else:
        _refuse("sasl.mechanism", f"unknown mechanism {mechanism!r}", ("sasl.jaas.config",), given, problems)
    return out


def _kerberos_login(config: Mapping[str, Any]) -> str:
    """Krb5LoginModule from the keytab and principal librdkafka's kinit would use (the
    keytab must exist at that path on the driver and every executor)."""
    keytab = config.get("sasl.kerberos.keytab")
    principal = config.get("sasl.kerberos.principal")
    options: dict[str, str | bool]
    if keytab:
        # librdkafka's default principal when none is set.
        options = {"useKeyTab": True, "storeKey": True, "keyTab": str(keytab)}
        options["principal"] = str(principal or "kafkaclient")
    else:  # a ticket cache filled by kinit, as librdkafka's kinit renewal relies on
        options = {"useTicketCache": True}
        if principal:
            options["principal"] = str(principal)
    return _jaas(KERBEROS_LOGIN_MODULE, options)


def _oauthbearer(config: Mapping[str, Any], given: Mapping[str, str], problems: list[str]) -> dict[str, str]:
    method = str(config.get("sasl.oauthbearer.method") or "default").lower()
    if method == "oidc":
        return _oidc(config, given, problems)
    if config.get("oauth_cb") is not None:
        _refuse(
            "oauth_cb",
            "a Python token callback; the Java client needs a Java login callback handler that "
            "fetches the same token",
            ("sasl.login.callback.handler.class",),
            given,
            problems,
        )
        return {"sasl.jaas.config": f"{OAUTHBEARER_LOGIN_MODULE} required;"}
    _refuse(
        "sasl.oauthbearer.method",
        "librdkafka's unsecured JWT (method 'default' without oauth_cb) is for development only",
        ("sasl.jaas.config",),
        given,
        problems,
    )
    return {}


def _oidc(config: Mapping[str, Any], given: Mapping[str, str], problems: list[str]) -> dict[str, str]:
    grant = str(config.get("sasl.oauthbearer.grant.type") or "client_credentials")
    if grant != "client_credentials":
        _refuse(
            "sasl.oauthbearer.grant.type",
            f"{grant!r}: the Java OIDC login fetches client-credentials tokens only",
            ("sasl.login.callback.handler.class",),
            given,
            problems,
        )
        return {}
    if str(config.get("sasl.oauthbearer.metadata.authentication.type") or "none").lower() != "none":
        _refuse(
            "sasl.oauthbearer.metadata.authentication.type",
            "the Java OIDC login has no cloud metadata authentication",
            ("sasl.login.callback.handler.class",),
            given,
            problems,
        )
        return {}
    for key in sorted(k for k in config if k.startswith("https.")):
        # librdkafka's TLS settings for the token endpoint; the Java login reads its own
        # (ssl.* options inside the JAAS line, or the JVM's trust store).
        _refuse(key, "TLS of the token endpoint", ("sasl.jaas.config",), given, problems)
    missing = [
        k
        for k in (
            "sasl.oauthbearer.token.endpoint.url",
            "sasl.oauthbearer.client.id",
            "sasl.oauthbearer.client.secret",
        )
        if not config.get(k)
    ]
    if missing:
        problems.append(f"OAUTHBEARER oidc needs {', '.join(repr(k) for k in missing)}")
        return {}
    options: dict[str, str | bool] = {
        "clientId": str(config["sasl.oauthbearer.client.id"]),
        "clientSecret": str(config["sasl.oauthbearer.client.secret"]),
    }
    if config.get("sasl.oauthbearer.scope"):
        options["scope"] = str(config["sasl.oauthbearer.scope"])
    for pair in str(config.get("sasl.oauthbearer.extensions") or "").split(","):
        if not pair.strip():
            continue
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            problems.append(f"'sasl.oauthbearer.extensions' has {pair!r}; expected key=value pairs")
            continue
        options[f"extension_{name.strip()}"] = value.strip()
    return {
        "sasl.login.callback.handler.class": OIDC_LOGIN_CALLBACK_HANDLER,
        "sasl.jaas.config": _jaas(OAUTHBEARER_LOGIN_MODULE, options),
    }


def librdkafka_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config for confluent-kafka clients (``java.*`` escape-hatch keys removed, log
    lines routed to the :data:`LIBRDKAFKA_LOGGER` Python logger). Idempotent."""
    out = {k: v for k, v in config.items() if not k.startswith("java.")}
    out.setdefault("log_level", 4)  # warnings and worse; librdkafka's info lines are noise
    out.setdefault("logger", _LOG)  # through Python logging, never straight to stderr
    # Our clients are short-lived: each new one connects to the bootstrap server, learns the
    # brokers, and then waits reconnect.backoff.ms/2 (50 ms by default) before connecting to
    # them. 20 ms (exponential up to reconnect.backoff.max.ms as usual) cut the first
    # request of a fresh client from ~0.06 s to ~0.02 s here, ~0.1 s per commit.
    out.setdefault("reconnect.backoff.ms", 20)
    return out


def cache_key(config: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """A hashable key of a client config (objects such as the logger by identity)."""
    return tuple(
        sorted(
            (str(k), str(v) if isinstance(v, (str, int, float, bool)) else f"id:{id(v)}")
            for k, v in config.items()
        )
    )
