"""Savepoints, stop/resume and guarded restore on real databases (SQLite file, PostgreSQL)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import select

from airflow_provider_eo.errors import PipelineStopped
from airflow_provider_eo.ledger import CheckpointConflict, InvariantViolation, Ledger, RangeSpec
from airflow_provider_eo.ledger.models import Base

if TYPE_CHECKING:
    from eo_ledgers import LedgerFactory

P = "orders"


def snapshot(ledger: Ledger) -> dict[str, list[Any]]:
    """Every row of every ledger table, in a stable order."""
    with ledger.engine.connect() as conn:
        return {
            t.name: sorted((tuple(map(repr, row)) for row in conn.execute(select(t))), key=repr)
            for t in Base.metadata.sorted_tables
        }


@pytest.fixture
def ledger(ledger_url: str, make_ledger: LedgerFactory) -> Ledger:
    return make_ledger(url=ledger_url, pipeline=P)


def _cp(ledger: Ledger, start: int, end: int, *, commit: bool = True) -> int:
    cid = ledger.plan(P, [RangeSpec("t", 0, start, end), RangeSpec("t", 1, start, end)]).checkpoint_id
    ledger.mark_prepared(P, cid, attempt="a", staging_location="/s", records=1, bytes_=1, shard_counts={0: 1})
    if commit:
        ledger.mark_committed(P, cid)
    return cid


def test_restore_while_prepared_is_refused_and_changes_nothing(ledger: Ledger) -> None:
    _cp(ledger, 0, 10)
    ledger.savepoint_at_checkpoint(P, "sp")
    prepared = _cp(ledger, 10, 20, commit=False)
    before = snapshot(ledger)
    with pytest.raises(InvariantViolation, match=f"cannot restore while checkpoint {prepared} is PREPARED"):
        ledger.restore_once(P, {("t", 0): 10, ("t", 1): 10}, reason="r", expected_lineage=1, request_key="k")
    assert snapshot(ledger) == before


def test_two_concurrent_restores_one_wins(ledger: Ledger, ledger_url: str) -> None:
    _cp(ledger, 0, 10)
    barrier = threading.Barrier(2)
    results: list[Any] = []

    def restore(offset: int) -> None:
        own = Ledger(ledger_url, create=False)
        try:
            barrier.wait(timeout=30)
            results.append(own.restore_once(P, {("t", 0): offset}, reason=f"r{offset}", expected_lineage=1))
        except CheckpointConflict as exc:
            results.append(exc)
        finally:
            own.close()

    threads = [threading.Thread(target=restore, args=(o,)) for o in (3, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(type(r).__name__ for r in results) == ["CheckpointConflict", "RestoreOutcome"]
    won = next(r for r in results if not isinstance(r, Exception))
    assert won.lineage == 2 and ledger.get_pipeline(P).current_lineage == 2
    assert [e.kind for e in ledger.events(P)].count("restore") == 1
    assert ledger.next_starts(P) == {("t", 0): 3 if won.details["reason"] == "r3" else 7}


def test_stop_while_prepared_commit_allowed_then_plan_refused(ledger: Ledger) -> None:
    _cp(ledger, 0, 10)
    prepared = _cp(ledger, 10, 20, commit=False)
    ledger.stop_pipeline(P, stopped_by="alice@h", reason="maintenance")
    ledger.mark_committed(P, prepared)  # the in-flight one finishes
    before = snapshot(ledger)
    with pytest.raises(PipelineStopped, match=r"alice@h.*maintenance.*eo resume"):
        ledger.plan(P, [RangeSpec("t", 0, 20, 30), RangeSpec("t", 1, 20, 30)])
    assert snapshot(ledger) == before
    assert ledger.savepoint_at_checkpoint(P, "sp", at_or_below=prepared).checkpoint_id == prepared
    ledger.resume_pipeline(P, resumed_by="alice@h")
    _cp(ledger, 20, 30)


def test_savepoint_points_at_the_in_flight_checkpoint_once_committed(ledger: Ledger) -> None:
    _cp(ledger, 0, 10)
    in_flight = _cp(ledger, 10, 20, commit=False)
    target = ledger.get_pipeline(P).last_checkpoint_id
    ledger.mark_committed(P, in_flight)
    _cp(ledger, 20, 30)  # live commits continue
    sp = ledger.savepoint_at_checkpoint(P, "sp", at_or_below=target)
    assert sp.checkpoint_id == in_flight and sp.offsets == {"t": {0: 20, 1: 20}}
    assert sp.fingerprint == "fp"
