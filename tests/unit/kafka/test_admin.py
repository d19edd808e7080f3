"""kafka/admin.py's offset read of a group: a refused group is told apart from a slow read
within seconds (the consumer and its error events faked; the authorizing broker's cases
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

    def group_refusal(asked_of: Any) -> KafkaError | None:
        assert asked_of is consumer
        asked.append("eo-marker.P")
        return access

    monkeypatch.setattr(admin, "group_consumer", lambda *_a, **_k: consumer)
    monkeypatch.setattr(admin, "group_refusal", group_refusal)
    return asked


def test_a_refused_group_fails_after_the_first_short_wait_naming_the_acl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    consumer = SlowConsumer()
    asked = _install(monkeypatch, consumer, KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED))
    with pytest.raises(KafkaAccessDenied) as caught:
        admin.committed_group_marks(CONFIG, "eo-marker.P", [("SINK", 0)], timeout_s=30)
    # One short wait (not the 30 s time-out), then the consumer's refusal looked for.
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


class _Event:
    def __init__(self, err: KafkaError) -> None:
        self._err = err

    def error(self) -> KafkaError:
        return self._err


class EventConsumer:
    """A never-subscribed consumer whose queue holds ``events`` (librdkafka's error events),
    each handed out once by ``poll``, and whose ``committed()`` answers or times out."""

    def __init__(self, events: list[KafkaError], answers: bool = False) -> None:
        self.events = list(events)
        self.answers = answers

    def poll(self, timeout: float) -> _Event | None:
        return _Event(self.events.pop(0)) if self.events else None

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        if self.answers:
            return [TopicPartition(tp.topic, tp.partition, 3) for tp in tps]
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT))


def _kept(monkeypatch: pytest.MonkeyPatch, consumer: EventConsumer) -> None:
    """``consumer`` as the process's kept group consumer of CONFIG's group."""
    monkeypatch.setattr(admin, "Consumer", lambda conf: consumer)
    monkeypatch.setattr(admin, "_GROUP_CONSUMERS", {})
    monkeypatch.setattr(admin, "_GROUP_REFUSALS", {})
    monkeypatch.setattr(admin, "_LAST_USED", {})


def test_a_refusal_reported_once_is_kept_for_every_later_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """librdkafka reports a refused coordinator look-up once, as an error event; any fetch
    of the kept consumer may poll it: every later read of the group still fails naming it."""
    consumer = EventConsumer(
        [KafkaError(KafkaError._TRANSPORT), KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)]
    )
    _kept(monkeypatch, consumer)
    admin.group_consumer(CONFIG, "eo-marker.P")  # another caller's fetch polls the event
    assert consumer.events == []
    for _ in range(2):
        with pytest.raises(KafkaAccessDenied, match=r"DESCRIBE on group 'eo-marker\.P'"):
            admin.committed_group_marks(CONFIG, "eo-marker.P", [("SINK", 0)], timeout_s=30)


def test_a_group_read_once_its_acl_is_granted_forgets_the_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = EventConsumer([KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)])
    _kept(monkeypatch, consumer)
    with pytest.raises(KafkaAccessDenied):
        admin.committed_group_marks(CONFIG, "eo-marker.P", [("SINK", 0)], timeout_s=30)
    consumer.answers = True  # the ACL granted: the look-up answers
    assert admin.committed_group_marks(CONFIG, "eo-marker.P", [("SINK", 0)]) == {("SINK", 0): (3, "")}
    assert admin._GROUP_REFUSALS == {}
    consumer.answers = False  # a slow read later is not taken for the old refusal
    with pytest.raises(KafkaAdminError, match="failed") as caught:
        admin.committed_group_marks(CONFIG, "eo-marker.P", [("SINK", 0)], timeout_s=0.5)
    assert not isinstance(caught.value, KafkaAccessDenied)
