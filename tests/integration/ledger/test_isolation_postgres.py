"""The ledger runs READ COMMITTED on PostgreSQL whatever the server or database default.

Its concurrency rests on READ COMMITTED (docs/design.md §2, ledger/engine.py): a
conditional UPDATE that waited for a concurrent winner re-reads the row and matches
nothing, which the ledger reports as the ordinary conflict. Under REPEATABLE READ the same
wait ends in a serialization failure instead, which would reach the caller as
``LedgerUnavailable`` (a driver failure) for what is an ordinary lost race. These tests set
``default_transaction_isolation = 'repeatable read'`` on the ledger's database and hold a
competing write open while the ledger waits behind it, so the interleaving is exact.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import make_url

from airflow_provider_eo.ledger import CheckpointConflict, Ledger, RangeSpec

if TYPE_CHECKING:
    from eo_ledgers import LedgerFactory

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

P = "orders"
WAIT_S = 30.0


@pytest.fixture
def rr_url(make_ledger: LedgerFactory) -> Iterator[str]:
    """A migrated PostgreSQL ledger database whose default isolation is REPEATABLE READ."""
    url = make_ledger.url("postgres")
    name = make_url(url).database
    admin = create_engine(make_url(url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(
                f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'repeatable read'"
            )
    finally:
        admin.dispose()
    yield url


@pytest.fixture
def other(rr_url: str) -> Iterator[Any]:
    """A plain engine on the same database (no ledger settings): the competing writer."""
    engine = create_engine(rr_url)
    try:
        yield engine
    finally:
        engine.dispose()


def _waiting_on_lock(engine: Any, database: str) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = :db "
                    "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                ),
                {"db": database},
            ).scalar_one()
        )


def _behind(other: Any, database: str, hold: Callable[[Connection], None], call: Callable[[], Any]) -> Any:
    """Run ``call`` in a thread while ``hold`` keeps a write open on another connection; let
    the write commit once ``call`` waits on its lock. Returns what ``call`` returned or raised."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except Exception as exc:  # judged by the caller
            outcome["value"] = exc

    with other.connect() as conn:
        conn.begin()
        hold(conn)
        worker = threading.Thread(target=run)
        worker.start()
        deadline = time.monotonic() + WAIT_S
        while not _waiting_on_lock(other, database):
            assert worker.is_alive(), f"the ledger call did not wait on the held write: {outcome}"
            assert time.monotonic() < deadline, "the ledger call never waited on the held write"
            time.sleep(0.02)
        conn.commit()
    worker.join(WAIT_S)
    assert not worker.is_alive()
    return outcome["value"]


def test_the_database_default_is_repeatable_read_but_the_ledger_reads_committed(
    rr_url: str, other: Any
) -> None:
    with other.connect() as conn:
        assert conn.exec_driver_sql("SHOW transaction_isolation").scalar_one() == "repeatable read"
    ledger = Ledger(rr_url)
    try:
        with ledger.engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW transaction_isolation").scalar_one() == "read committed"
    finally:
        ledger.close()


def test_a_lost_transition_is_a_conflict_not_unavailable(rr_url: str, other: Any) -> None:
    ledger = Ledger(rr_url)
    try:
        ledger.ensure_pipeline(P, "fp")
        cp = ledger.plan(P, [RangeSpec("t", 0, 0, 10)]).checkpoint_id

        def winner_prepares(conn: Connection) -> None:
            moved = conn.execute(
                text(
                    "UPDATE eo_checkpoints SET state = 'PREPARED', prepared_attempt = 'winner', "
                    "prepared_at = now() WHERE checkpoint_id = :cp AND state = 'PLANNED'"
                ),
                {"cp": cp},
            ).rowcount
            assert moved == 1

        def loser_prepares() -> Any:
            return ledger.mark_prepared(
                P, cp, attempt="loser", staging_location="/s", records=1, bytes_=1, shard_counts={0: 1}
            )

        lost = _behind(other, make_url(rr_url).database or "", winner_prepares, loser_prepares)
        assert isinstance(lost, CheckpointConflict), repr(lost)
        assert "PREPARED" in str(lost)
        record = ledger.get(P, cp)
        assert (record.state.value, record.prepared_attempt) == ("PREPARED", "winner")
    finally:
        ledger.close()


def test_a_plan_behind_another_writer_of_the_pipeline_plans(rr_url: str, other: Any) -> None:
    ledger = Ledger(rr_url)
    try:
        ledger.ensure_pipeline(P, "fp")

        def writer_touches_pipeline(conn: Connection) -> None:
            conn.execute(text("UPDATE eo_pipelines SET updated_at = now() WHERE name = :p"), {"p": P})

        def plan() -> Any:
            return ledger.plan(P, [RangeSpec("t", 0, 0, 10)])

        planned = _behind(other, make_url(rr_url).database or "", writer_touches_pipeline, plan)
        assert not isinstance(planned, Exception), repr(planned)
        assert planned.checkpoint_id == 1
        assert [c.checkpoint_id for c in ledger.list_checkpoints(P)] == [1]
    finally:
        ledger.close()
