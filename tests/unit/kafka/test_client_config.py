"""librdkafka settings derived from a pipeline's client config."""

from __future__ import annotations

import logging

from airflow_provider_eo.kafka.client_config import (
    LIBRDKAFKA_LOGGER,
    LibrdkafkaLog,
    cache_key,
    java_client_options,
    librdkafka_config,
)


def test_defaults_never_override_the_user() -> None:
    conf = {"bootstrap.servers": "b:9092", "java.max.poll.records": "10"}
    out = librdkafka_config(conf)
    logger = out.pop("logger")
    assert isinstance(logger, LibrdkafkaLog) and logger.logger.name == LIBRDKAFKA_LOGGER
    assert out == {"bootstrap.servers": "b:9092", "log_level": 4, "reconnect.backoff.ms": 20}
    mine = {"bootstrap.servers": "b:9092", "log_level": 7, "reconnect.backoff.ms": 500, "logger": "x"}
    assert librdkafka_config(mine) == mine
    assert librdkafka_config(librdkafka_config(conf)) == librdkafka_config(conf)


def test_librdkafka_levels_are_one_step_lower() -> None:
    seen: list[int] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.levelno)

    base = logging.getLogger("eo-test-librdkafka-levels")
    base.setLevel(logging.DEBUG)
    base.addHandler(Keep())
    log = LibrdkafkaLog(base, {})
    for level in (logging.CRITICAL, logging.ERROR, logging.WARNING, logging.INFO, logging.DEBUG):
        log.log(level, "%s [%s] %s", "FAIL", "rdkafka#producer-1", "refused")
    assert seen == [logging.ERROR, logging.WARNING, logging.INFO, logging.DEBUG, logging.DEBUG]


def test_cache_key_is_stable_and_hashable() -> None:
    conf = librdkafka_config({"bootstrap.servers": "b:9092"})
    assert cache_key(conf) == cache_key(librdkafka_config({"bootstrap.servers": "b:9092"}))
    assert hash(cache_key(conf))


def test_java_options_keep_the_escape_hatch() -> None:
    opts = java_client_options({"bootstrap.servers": "b:9092", "java.max.poll.records": "10"})
    assert opts == {"kafka.bootstrap.servers": "b:9092", "kafka.max.poll.records": "10"}
