"""kafka/admin.py's offset read of a group: a refused group is told apart from a slow read
within seconds (the consumer and the broker's answer faked; the authorizing broker's cases
are tests/integration/core/test_kafka_acls.py)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from airflow_provider_eo.errors import KafkaAccessDenied, KafkaAdminError
from airflow_provider_eo.kafka import admin

CONFIG = {"bootstrap.servers": "127.0.0.1:1", "sasl.username": "eo"}


class SlowConsumer:
    """``committed()`` that times out like librdkafka retrying a refused coordinator look-up
    (it never reports the refusal), then answers once ``answer_after`` calls were made."""

    def __init__(self, answer_after: int | None = None) -> None:
        self.timeouts: list[float] = []
        self.answer_after = answer_after

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        self.timeouts.append(timeout)
        if self.answer_after is not None and len(self.timeouts) > self.answer_after:
            return [TopicPartition(tp.topic, tp.partition, 7) for tp in tps]
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT))


def _install(monkeypatch: pytest.MonkeyPatch, consumer: SlowConsumer, access: KafkaError | None) -> list[str]:
    asked: list[str] = []

    def group_access(config: Any, group: str) -> KafkaError | None:
        asked.append(group)
        return access

    monkeypatch.setattr(admin, "group_consumer", lambda *_a, **_k: consumer)
    monkeypatch.setattr(admin, "_group_access", group_access)
    return asked


def test_a_refused_group_fails_after_the_first_short_wait_naming_the_acl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    consumer = SlowConsumer()
    asked = _install(monkeypatch, consumer, KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED))
    with pytest.raises(KafkaAccessDenied) as caught:
        admin.committed_group_marks(CONFIG, "eo-marker.P", [("SINK", 0)], timeout_s=30)
    # One short wait (not the 30 s time-out), then the broker was asked about the group.
    assert consumer.timeouts == [admin.ACCESS_CHECK_AFTER_S] and asked == ["eo-marker.P"]
    assert admin.ACCESS_CHECK_AFTER_S <= 3
    text = str(caught.value)
    assert "User:eo DESCRIBE on group 'eo-marker.P'" in text and "--group eo-marker.P" in text, text
    assert (caught.value.operation, caught.value.resource_type) == ("DESCRIBE", "group")


def test_a_slow_read_of_a_group_it_may_describe_goes_on_until_it_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    consumer = SlowConsumer(answer_after=1)
    asked = _install(monkeypatch, consumer, None)
    found = admin.committed_group_marks(CONFIG, "eo-marker.P", [("SINK", 0)], timeout_s=30)
    assert found == {("SINK", 0): (7, "")}
    # Asked once; the second wait is the rest of the time-out, not another short one.
    assert asked == ["eo-marker.P"] and len(consumer.timeouts) == 2 and consumer.timeouts[1] > 20


def test_a_read_that_never_answers_fails_at_its_time_out(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = SlowConsumer()
    clock = [0.0]  # a read that times out uses up its wait: the fake clock moves by it
    monkeypatch.setattr(admin.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(SlowConsumer, "committed", _waiting(SlowConsumer.committed, clock))
    _install(monkeypatch, consumer, None)
    with pytest.raises(KafkaAdminError, match="reading offsets of group 'g' failed"):
        admin.committed_group_marks(CONFIG, "g", [("SINK", 0)], timeout_s=1.5)
    assert clock[0] >= 1.5 and len(consumer.timeouts) <= 3


def _waiting(committed: Any, clock: list[float]) -> Any:
    def slow(self: SlowConsumer, tps: list[TopicPartition], timeout: float) -> Any:
        clock[0] += timeout
        return committed(self, tps, timeout)

    return slow
