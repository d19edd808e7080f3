"""The driver's kept source readers: one per config while in use, handed back unassigned,
closed once idle (no broker: the consumer is a fake)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_eo.kafka import source_read


class FakeConsumer:
    made: list[FakeConsumer] = []

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.unassigned = 0
        self.closed = False
        FakeConsumer.made.append(self)

    def unassign(self) -> None:
        self.unassigned += 1

    def close(self) -> None:
        self.closed = True


@pytest.fixture()
def fake(monkeypatch: pytest.MonkeyPatch) -> type[FakeConsumer]:
    FakeConsumer.made = []
    monkeypatch.setattr(source_read, "Consumer", FakeConsumer)
    monkeypatch.setattr(source_read, "_READERS", {})
    return FakeConsumer


def test_a_reader_is_kept_per_config_and_never_shared(fake: type[FakeConsumer]) -> None:
    conf = {"bootstrap.servers": "b:1", "group.id": "g"}
    # a second read while the first is in progress (another thread's)
    with source_read._reader(conf) as first, source_read._reader(conf) as second:
        assert second is not first
    with source_read._reader(conf) as again:
        assert again in (first, second)
    with source_read._reader({**conf, "bootstrap.servers": "other:1"}) as other:
        assert other not in (first, second)
    assert len(fake.made) == 3
    assert all(c.unassigned >= 1 for c in fake.made) and not any(c.closed for c in fake.made)


def test_an_idle_reader_is_closed_at_the_next_read(
    fake: type[FakeConsumer], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(source_read.time, "monotonic", lambda: clock[0])
    with source_read._reader({"bootstrap.servers": "b:1"}) as old:
        pass
    clock[0] += source_read.READER_IDLE_S + 1
    with source_read._reader({"bootstrap.servers": "b:2"}):
        assert old.closed
    with source_read._reader({"bootstrap.servers": "b:1"}) as fresh:
        assert fresh is not old and not fresh.closed
