"""The commit producer's batches stay below the sink topic's max.message.bytes."""

from __future__ import annotations

from airflow_provider_eo.kafka.publisher import BATCH_FRAMING_BYTES, _batch_limits


def test_no_topic_limit_leaves_librdkafka_defaults() -> None:
    assert _batch_limits({}, None) == {}


def test_small_topic_limit_caps_the_batch() -> None:
    limits = _batch_limits({}, 65_536)
    assert limits["batch.size"] == 65_536 - BATCH_FRAMING_BYTES
    assert limits["message.max.bytes"] >= 65_536


def test_large_topic_limit_raises_the_local_message_limit() -> None:
    limits = _batch_limits({}, 8_000_000)
    assert limits["batch.size"] == 1_000_000  # librdkafka's default is already below
    assert limits["message.max.bytes"] >= 8_000_000  # a record prepare accepted is never refused locally


def test_user_settings_win_when_safe() -> None:
    limits = _batch_limits({"batch.size": 16_384, "message.max.bytes": 2_000_000}, 1_048_588)
    assert limits == {"batch.size": 16_384, "message.max.bytes": 2_000_000}
