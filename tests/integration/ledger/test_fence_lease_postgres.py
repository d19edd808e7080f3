"""The fence lease and the conditional abort against a committer's lease on PostgreSQL, where
writers do not queue for the whole database as on SQLite: the check a ledger call reads first
can be overtaken by a committer's write it then waits behind. Each test holds that write open
until the ledger call waits on its row lock, so the interleaving is exact; the lease condition
inside each UPDATE is what refuses.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, text

from airflow_provider_eo.ledger import CheckpointState, Ledger, RangeSpec
from airflow_provider_eo.ledger.leases import CommitInProgress

if TYPE_CHECKING:
    from eo_ledgers import LedgerFactory

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

P = "orders"
FENCE = "fence:alice@host:42"
COMMITTER = "eo.orders"
WAIT_S = 30.0


def _committer_takes_the_lease(conn: Connection) -> None:
    """What a committer's lease compare-and-set writes, left uncommitted."""
    taken = conn.execute(
        text(
            "UPDATE eo_checkpoints SET commit_owner = :owner, "
            "commit_lease_until = CURRENT_TIMESTAMP + interval '5 minutes' WHERE checkpoint_id = 1"
        ),
        {"owner": COMMITTER},
    ).rowcount
    assert taken == 1


def _behind(engine: Engine, hold: Callable[[Connection], None], call: Callable[[], Any]) -> Any:
    """Run ``call`` in a thread while ``hold`` keeps a write open on another connection; commit
    that write once ``call`` waits on its lock. Returns what ``call`` returned or raised."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except Exception as exc:  # judged by the caller
            outcome["value"] = exc

    def waiting() -> bool:
        with engine.connect() as probe:
            return bool(
                probe.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                    )
                ).scalar_one()
            )

    with engine.connect() as conn:
        conn.begin()
        hold(conn)
        worker = threading.Thread(target=run)
        worker.start()
        deadline = time.monotonic() + WAIT_S
        while not waiting():
            assert worker.is_alive(), f"the ledger call did not wait on the held write: {outcome}"
            assert time.monotonic() < deadline, "the ledger call never waited on the held write"
            time.sleep(0.02)
        conn.commit()
    worker.join(WAIT_S)
    assert not worker.is_alive()
    return outcome["value"]


@pytest.fixture
def prepared(make_ledger: LedgerFactory) -> Iterator[tuple[Ledger, Engine]]:
    """A PostgreSQL ledger with checkpoint 1 PREPARED, and a plain engine on its database."""
    ledger = make_ledger("postgres", pipeline=P)
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    ledger.mark_prepared(P, 1, attempt="a", staging_location="/s", records=10, bytes_=1, shard_counts={0: 10})
    engine = create_engine(ledger.engine.url)
    yield ledger, engine
    engine.dispose()


def test_a_committer_that_took_the_lease_while_the_abort_waited_refuses_it(
    prepared: tuple[Ledger, Engine],
) -> None:
    ledger, engine = prepared
    assert ledger.acquire_fence_lease(P, owner=FENCE, ttl_s=300) == [1]
    # The abort reads its lease as its own, then waits behind the committer's write.
    refused = _behind(
        engine,
        _committer_takes_the_lease,
        lambda: ledger.abort(P, 1, reason="replan", lease_owner=FENCE),
    )
    assert isinstance(refused, CommitInProgress), repr(refused)
    assert refused.owner == COMMITTER and refused.checkpoint_id == 1
    assert ledger.get(P, 1).state is CheckpointState.PREPARED


def test_a_committer_that_took_the_lease_while_the_fence_lease_waited_refuses_it(
    prepared: tuple[Ledger, Engine],
) -> None:
    ledger, engine = prepared
    refused = _behind(
        engine, _committer_takes_the_lease, lambda: ledger.acquire_fence_lease(P, owner=FENCE, ttl_s=300)
    )
    assert isinstance(refused, CommitInProgress), repr(refused)
    assert refused.owner == COMMITTER
    assert ledger.get(P, 1).commit_owner == COMMITTER  # nothing taken from it
