"""Which clock decides the commit lease: the one the database statement reads
(:func:`~airflow_provider_eo.ledger.leases.database_now`), never the ledger code's Python
clock (``engine.utcnow``).

- PostgreSQL: the server's clock (``CURRENT_TIMESTAMP``), one for every worker, so a worker
  whose clock runs ahead cannot take over a lease that is still held.
- SQLite: the database is a library inside each worker process, so ``'now'`` is read from
  that process's own clock (its host's). A SQLite ledger is a local file whose workers all
  run on that one host and share its clock; a caller whose SQLite clock ran a day ahead
  WOULD take the lease over, and the test states that, so nobody relies on more.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from typing import Any

import pytest
from sqlalchemy import event

from airflow_provider_eo.ledger import CommitLeaseHeld, Ledger, RangeSpec

P = "clocked"
#: SQLite's date functions that read the clock when given ``'now'``; each takes the time
#: value first, except ``strftime`` (format first).
_SQLITE_CLOCK_FUNCTIONS = {"strftime": 1, "datetime": 0, "julianday": 0, "unixepoch": 0}


def _prepared_checkpoint(ledger: Ledger) -> None:
    ledger.ensure_pipeline(P, "fp")
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    ledger.mark_prepared(P, 1, attempt="a", staging_location="/s", records=10, bytes_=1, shard_counts={0: 10})


def _ahead_python_clock(monkeypatch: pytest.MonkeyPatch, by: dt.timedelta) -> None:
    """Move the ledger code's Python clock (``utcnow`` wherever it is imported) by ``by``."""
    from airflow_provider_eo.ledger import engine, leases, transitions

    moved = dt.datetime.now(dt.timezone.utc) + by
    for module in (engine, leases, transitions):
        monkeypatch.setattr(module, "utcnow", lambda: moved, raising=False)


def _skew_sqlite_clock(ledger: Ledger, by: dt.timedelta) -> None:
    """Make every connection of ``ledger`` read a clock ``by`` ahead of this host's, as a
    process on a host whose clock is off by ``by`` would: SQLite's date functions are
    redefined on the connection to add ``by`` to ``'now'`` and otherwise answer as SQLite's
    own (they are evaluated by a plain in-memory SQLite connection)."""
    reference = sqlite3.connect(":memory:", check_same_thread=False)
    shift = f"{by.total_seconds():+.3f} seconds"

    def shifted(name: str, value_at: int) -> Any:
        def call(*args: Any) -> Any:
            values = list(args)
            if len(values) > value_at and values[value_at] == "now":
                values.insert(value_at + 1, shift)
            marks = ", ".join("?" * len(values))
            return reference.execute(f"SELECT {name}({marks})", values).fetchone()[0]

        return call

    def install(dbapi_connection: Any, *_: Any) -> None:
        for name, value_at in _SQLITE_CLOCK_FUNCTIONS.items():
            dbapi_connection.create_function(name, -1, shifted(name, value_at))

    event.listen(ledger._db.engine, "checkout", install)


def test_sqlite_lease_runs_on_the_calling_process_clock(
    make_ledger: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite: the Python clock decides nothing; the clock SQLite reads in the caller's
    process decides: a caller 10 s ahead is refused a 30 s lease, one a day ahead takes it
    over, after which the holder (on the true clock) is locked out for that day."""
    from airflow_provider_eo.ledger.leases import database_now

    url = make_ledger.url("sqlite")
    with Ledger(url) as worker_a, Ledger(url) as worker_b, Ledger(url) as worker_c:
        _prepared_checkpoint(worker_a)
        # The lease's end is read against the database clock on both sides of the call, so
        # a slow call on a loaded machine cannot move it out of the bounds.
        with worker_a._db.read() as s:
            before = database_now(s)
        held = worker_a.acquire_commit_lease(P, 1, owner="worker-a", ttl_s=30)
        assert held.commit_lease_until is not None
        with worker_a._db.read() as s:
            db_now = database_now(s)
        assert abs((db_now - dt.datetime.now(dt.timezone.utc)).total_seconds()) < 5
        until = held.commit_lease_until
        second = dt.timedelta(seconds=1)
        assert before + 30 * second - second <= until <= db_now + 30 * second + second

        # The ledger code's Python clock a day ahead: ignored, the lease is still held.
        with monkeypatch.context() as m:
            _ahead_python_clock(m, dt.timedelta(days=1))
            with pytest.raises(CommitLeaseHeld, match="being committed by 'worker-a'"):
                worker_b.acquire_commit_lease(P, 1, owner="worker-b", ttl_s=30)

        # The clock SQLite reads, 10 s ahead in worker-b's process: still inside the lease.
        _skew_sqlite_clock(worker_b, dt.timedelta(seconds=10))
        with worker_b._db.read() as s:
            b_now = database_now(s)
        assert dt.timedelta(seconds=9) <= b_now - db_now <= dt.timedelta(seconds=15)
        with pytest.raises(CommitLeaseHeld, match="being committed by 'worker-a'"):
            worker_b.acquire_commit_lease(P, 1, owner="worker-b", ttl_s=30)

        # A day ahead in worker-c's process: the held lease looks expired to it and it takes
        # it over. This is what the lease is on SQLite: only as good as the clock of the
        # process that asks, which on one host is the same clock for every worker.
        _skew_sqlite_clock(worker_c, dt.timedelta(days=1))
        taken = worker_c.acquire_commit_lease(P, 1, owner="worker-c", ttl_s=30)
        assert taken.commit_owner == "worker-c"
        assert taken.commit_lease_until is not None
        assert taken.commit_lease_until - until >= dt.timedelta(hours=23)
        with pytest.raises(CommitLeaseHeld, match="being committed by 'worker-c'"):
            worker_a.acquire_commit_lease(P, 1, owner="worker-a", ttl_s=30)
        assert worker_a.get(P, 1).commit_owner == "worker-c"


@pytest.mark.postgres
def test_postgres_lease_ignores_a_skewed_worker_clock(
    make_ledger: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: the lease runs on the server's clock; a worker whose clock is a day ahead
    (the ledger code's clock, the only one a worker brings to the comparison) is refused."""
    from airflow_provider_eo.ledger.leases import database_now

    url = make_ledger.url("postgres")
    with Ledger(url) as worker_a, Ledger(url) as worker_b:
        _prepared_checkpoint(worker_a)
        with worker_a._db.read() as s:
            db_now = database_now(s)
        assert abs((db_now - dt.datetime.now(dt.timezone.utc)).total_seconds()) < 5
        held = worker_a.acquire_commit_lease(P, 1, owner="worker-a", ttl_s=30)
        assert held.commit_lease_until is not None
        until = held.commit_lease_until
        assert db_now + dt.timedelta(seconds=29) <= until <= db_now + dt.timedelta(seconds=40)
        _ahead_python_clock(monkeypatch, dt.timedelta(days=1))
        with pytest.raises(CommitLeaseHeld, match="being committed by 'worker-a'"):
            worker_b.acquire_commit_lease(P, 1, owner="worker-b", ttl_s=30)
        assert worker_b.get(P, 1).commit_owner == "worker-a"
