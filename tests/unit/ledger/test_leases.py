"""The commit lease (a compare-and-set) and the commit shard rows."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

import pytest

from airflow_provider_eo.ledger import (
    CheckpointConflict,
    CommitLeaseHeld,
    InvariantViolation,
    Ledger,
    RangeSpec,
)

if TYPE_CHECKING:
    from tests.unit.ledger.conftest import LedgerSteps

P = "orders"


def test_commit_lease_cas(ledger: Ledger, steps: LedgerSteps, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_eo.ledger import leases

    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    steps.prepare(1)
    now = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
    monkeypatch.setattr(leases, "database_now", lambda _s: now)  # the database's clock moves
    lease = ledger.acquire_commit_lease(P, 1, owner="worker-a", ttl_s=30)
    assert lease.commit_owner == "worker-a"
    assert lease.commit_lease_until == now + dt.timedelta(seconds=30)
    with pytest.raises(CommitLeaseHeld, match="being committed by 'worker-a'") as held:
        ledger.acquire_commit_lease(P, 1, owner="worker-b", ttl_s=30)
    assert held.value.owner == "worker-a"
    # Same owner renews.
    now += dt.timedelta(seconds=20)
    assert ledger.acquire_commit_lease(P, 1, owner="worker-a", ttl_s=30).commit_lease_until == (
        now + dt.timedelta(seconds=30)
    )
    now += dt.timedelta(seconds=29)
    with pytest.raises(CommitLeaseHeld):
        ledger.acquire_commit_lease(P, 1, owner="worker-b", ttl_s=30)
    # Expired: another owner takes over.
    now += dt.timedelta(seconds=2)
    assert ledger.acquire_commit_lease(P, 1, owner="worker-b", ttl_s=30).commit_owner == "worker-b"
    assert ledger.release_commit_lease(P, 1, owner="worker-a") is False
    assert ledger.release_commit_lease(P, 1, owner="worker-b") is True
    assert ledger.acquire_commit_lease(P, 1, owner="worker-c", ttl_s=1).commit_owner == "worker-c"
    owners = [e.details["owner"] for e in ledger.events(P, 1) if e.kind == "lease"]
    assert owners == ["worker-a", "worker-b", "worker-c"]


def test_a_live_lease_is_taken_over_only_from_exactly_the_holder_named_gone(
    ledger: Ledger, steps: LedgerSteps
) -> None:
    """Two retries both find the holder's process gone and race to take its lease over: the
    first wins, the second names it (its own ``replacing`` no longer matches)."""
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    steps.prepare(1)
    ledger.acquire_commit_lease(P, 1, owner="dead", ttl_s=300)
    with pytest.raises(CommitLeaseHeld, match="'dead'"):
        ledger.acquire_commit_lease(P, 1, owner="retry-a", ttl_s=300, replacing="someone-else")
    assert ledger.acquire_commit_lease(P, 1, owner="retry-a", ttl_s=300, replacing="dead").commit_owner == (
        "retry-a"
    )
    with pytest.raises(CommitLeaseHeld, match="being committed by 'retry-a'"):
        ledger.acquire_commit_lease(P, 1, owner="retry-b", ttl_s=300, replacing="dead")
    taken = [e.details for e in ledger.events(P, 1) if e.kind == "lease"][-1]
    assert (taken["owner"], taken["previous_owner"], taken["previous_owner_gone"]) == (
        "retry-a",
        "dead",
        True,
    )


def test_lease_ignores_the_ledger_codes_python_clock(
    ledger: Ledger, steps: LedgerSteps, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease compares times read by :func:`~airflow_provider_eo.ledger.leases.database_now`,
    never the Python clock the ledger code stamps rows with (``utcnow``): with that clock a day
    ahead, another worker's lease is still held. What it does not show: on SQLite
    ``database_now`` is this process's own clock too (SQLite runs inside it), so a worker whose
    host clock runs ahead is only harmless on PostgreSQL (the server's clock):
    tests/integration/ledger/test_lease_clock.py moves the clock the database reads."""
    from airflow_provider_eo.ledger import engine, leases, transitions

    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    steps.prepare(1)
    before = dt.datetime.now(dt.timezone.utc)
    held = ledger.acquire_commit_lease(P, 1, owner="worker-a", ttl_s=30)
    assert held.commit_lease_until is not None
    # The lease runs on the database's clock (SQLite: this process's): about now + 30 s.
    assert before + dt.timedelta(seconds=29) <= held.commit_lease_until <= before + dt.timedelta(seconds=40)
    ahead = before + dt.timedelta(days=1)
    for module in (engine, leases, transitions):
        monkeypatch.setattr(module, "utcnow", lambda: ahead, raising=False)
    with pytest.raises(CommitLeaseHeld, match="being committed by 'worker-a'"):
        ledger.acquire_commit_lease(P, 1, owner="worker-b", ttl_s=30)
    assert ledger.get(P, 1).commit_owner == "worker-a"


def test_database_now_is_utc_and_current(ledger: Ledger) -> None:
    from airflow_provider_eo.ledger.leases import database_now

    with ledger._db.read() as s:
        now = database_now(s)
    assert now.tzinfo is not None
    assert abs((now - dt.datetime.now(dt.timezone.utc)).total_seconds()) < 5


def test_shards_gate_the_commit(ledger: Ledger, steps: LedgerSteps) -> None:
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    with pytest.raises(CheckpointConflict, match="expected state PREPARED, found PLANNED"):
        ledger.record_shard(
            P, 1, 0, transactional_id="x", producer_id=None, producer_epoch=None, state="PENDING", records=0
        )
    steps.prepare(1)
    for shard in (0, 1):
        ledger.record_shard(
            P,
            1,
            shard,
            transactional_id=f"eo.orders.{shard}",
            producer_id=1,
            producer_epoch=0,
            state="PENDING",
            records=5,
        )
    ledger.record_shard(
        P, 1, 0, transactional_id="eo.orders.0", producer_id=1, producer_epoch=0, state="COMMITTED", records=5
    )
    with pytest.raises(InvariantViolation, match=r"shards \[1\] are not recorded COMMITTED"):
        ledger.mark_committed(P, 1)
    with pytest.raises(InvariantViolation, match="cannot go back to PENDING"):
        ledger.record_shard(
            P,
            1,
            0,
            transactional_id="eo.orders.0",
            producer_id=1,
            producer_epoch=0,
            state="PENDING",
            records=5,
        )
    ledger.record_shard(
        P, 1, 1, transactional_id="eo.orders.1", producer_id=2, producer_epoch=3, state="COMMITTED", records=5
    )
    done = ledger.mark_committed(P, 1)
    assert [(s.shard, s.producer_epoch) for s in done.shards] == [(0, 0), (1, 3)]
    with pytest.raises(ValueError):
        ledger.record_shard(
            P, 1, 2, transactional_id="x", producer_id=None, producer_epoch=None, state="DONE", records=0
        )
