"""The process's shared Kafka clients stay bounded: a client unused for minutes is closed,
and above the cap the least recently used idle ones go (never one handed out recently)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_eo.kafka import admin


class FakeClient:
    """Stands in for AdminClient and Consumer: records polls and closes."""

    made: list[FakeClient] = []

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.closed = False
        FakeClient.made.append(self)

    def poll(self, timeout: float) -> None:
        assert not self.closed, "a closed client was used"

    def close(self) -> None:
        self.closed = True


class FakeConsumer(FakeClient):
    pass


@pytest.fixture()
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    now = [1000.0]
    FakeClient.made = []
    monkeypatch.setattr(admin, "AdminClient", FakeClient)
    monkeypatch.setattr(admin, "Consumer", FakeConsumer)
    monkeypatch.setattr(admin.time, "monotonic", lambda: now[0])
    admin.close_shared_clients()
    yield now
    admin.close_shared_clients()


def test_the_same_config_and_group_share_one_client(clock: list[float]) -> None:
    config = {"bootstrap.servers": "127.0.0.1:1"}
    assert admin.admin_client(config) is admin.admin_client(dict(config))
    assert admin.group_consumer(config, "g") is admin.group_consumer(config, "g")
    assert admin.group_consumer(config, "g") is not admin.group_consumer(config, "h")
    assert len(FakeClient.made) == 3


def test_a_client_unused_for_minutes_is_closed_at_the_next_fetch(clock: list[float]) -> None:
    config = {"bootstrap.servers": "127.0.0.1:1"}
    old = admin.group_consumer(config, "old-pipeline")
    clock[0] += admin.SHARED_CLIENT_IDLE_S - 1
    kept = admin.admin_client(config)
    assert not old.closed  # not idle long enough yet
    clock[0] += 2
    admin.admin_client(config)
    assert old.closed and not kept.closed
    assert admin.group_consumer(config, "old-pipeline") is not old  # a fresh one on demand


def test_above_the_cap_the_least_recently_used_idle_clients_go(clock: list[float]) -> None:
    config = {"bootstrap.servers": "127.0.0.1:1"}
    first = [admin.group_consumer(config, f"g{i}") for i in range(admin.SHARED_CLIENT_MAX)]
    clock[0] += admin.SHARED_CLIENT_BUSY_S + 1
    recent = admin.group_consumer(config, "g0")  # used again: now the most recent
    extra = [admin.group_consumer(config, f"x{i}") for i in range(3)]
    closed = [c for c in first if c.closed]
    # Three over the cap: the three least recently used idle ones (g1, g2, g3) are closed.
    assert closed == first[1:4] and not recent.closed and not any(c.closed for c in extra)


def test_clients_handed_out_recently_are_never_closed_for_the_cap(clock: list[float]) -> None:
    config = {"bootstrap.servers": "127.0.0.1:1"}
    many = [admin.group_consumer(config, f"g{i}") for i in range(admin.SHARED_CLIENT_MAX + 5)]
    assert not any(c.closed for c in many)  # all in use moments ago: the cap waits
    clock[0] += admin.SHARED_CLIENT_BUSY_S + 1
    admin.admin_client(config)
    assert sum(c.closed for c in many) == 6  # back to the cap, counting the new admin client
