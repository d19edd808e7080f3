"""The commit producer's batches stay below the sink topic's max.message.bytes."""

from __future__ import annotations

from airflow_provider_eo.kafka.producer_pool import _batch_limits
from airflow_provider_eo.kafka.publisher import BATCH_FRAMING_BYTES, with_dead_letter_limits


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


def test_a_producer_of_dead_letters_is_sized_for_both_topics() -> None:
    # A small sink, a roomy dead-letter topic: a dead letter over the sink's limit (and over
    # librdkafka's default message.max.bytes) is not refused locally.
    roomy = _batch_limits(with_dead_letter_limits({}, 4_000_000), 3_000)
    assert roomy["message.max.bytes"] >= 4_000_000
    assert roomy["batch.size"] == 3_000 - BATCH_FRAMING_BYTES
    # A dead-letter topic smaller than the sink: batches fit it too.
    small = _batch_limits(with_dead_letter_limits({"bootstrap.servers": "b"}, 50_000), 1_048_588)
    assert small["batch.size"] == 50_000 - BATCH_FRAMING_BYTES
    assert small["message.max.bytes"] >= 1_048_588
    assert with_dead_letter_limits({"bootstrap.servers": "b"}, 50_000)["bootstrap.servers"] == "b"
