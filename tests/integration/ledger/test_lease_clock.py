"""The commit lease runs on the database's clock, on SQLite and on PostgreSQL: a worker whose
clock runs ahead cannot take over a lease that is still held."""

from __future__ import annotations

import datetime as dt

import pytest

from airflow_provider_eo.ledger import CommitLeaseHeld, Ledger, RangeSpec

P = "clocked"


def test_lease_ignores_a_skewed_worker_clock(ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_eo.ledger import engine, leases, transitions
    from airflow_provider_eo.ledger.leases import database_now

    with Ledger(ledger_url) as ledger:
        ledger.ensure_pipeline(P, "fp")
        ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
        ledger.mark_prepared(
            P, 1, attempt="a", staging_location="/s", records=10, bytes_=1, shard_counts={0: 10}
        )
        with ledger._db.read() as s:
            db_now = database_now(s)
        assert abs((db_now - dt.datetime.now(dt.timezone.utc)).total_seconds()) < 5
        held = ledger.acquire_commit_lease(P, 1, owner="worker-a", ttl_s=30)
        assert held.commit_lease_until is not None
        until = held.commit_lease_until
        assert db_now + dt.timedelta(seconds=29) <= until <= db_now + dt.timedelta(seconds=40)
        ahead = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)
        for module in (engine, leases, transitions):
            monkeypatch.setattr(module, "utcnow", lambda: ahead, raising=False)
        with pytest.raises(CommitLeaseHeld, match="being committed by 'worker-a'"):
            ledger.acquire_commit_lease(P, 1, owner="worker-b", ttl_s=30)
        assert ledger.get(P, 1).commit_owner == "worker-a"
