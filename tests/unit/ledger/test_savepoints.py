"""Named, retained savepoints."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from airflow_provider_eo.ledger import (
    InvariantViolation,
    Ledger,
    RangeSpec,
)

if TYPE_CHECKING:
    from tests.unit.ledger.conftest import LedgerSteps

P = "orders"


def test_savepoints(ledger: Ledger, steps: LedgerSteps) -> None:
    cp = steps.run_one(RangeSpec("t", 0, 0, 10), RangeSpec("t", 1, 0, 4))
    offsets = ledger.get(P, cp).end_offsets
    sp = ledger.create_savepoint(
        P, "before-upgrade", checkpoint_id=cp, offsets=offsets, note="n", created_by="alice"
    )
    assert sp.offsets == {"t": {0: 10, 1: 4}} and sp.checkpoint_id == cp
    assert ledger.get_savepoint(P, "before-upgrade") == sp
    with pytest.raises(InvariantViolation, match="savepoint 'before-upgrade' already exists"):
        ledger.create_savepoint(P, "before-upgrade", checkpoint_id=None, offsets={})
    ledger.ensure_pipeline("other", "x")
    ledger.create_savepoint("other", "before-upgrade", checkpoint_id=None, offsets={})
    ledger.plan(P, [RangeSpec("t", 0, 10, 20)])
    with pytest.raises(InvariantViolation, match="must point at a COMMITTED checkpoint"):
        ledger.create_savepoint(P, "bad", checkpoint_id=2, offsets={})
    assert [s.name for s in ledger.list_savepoints(P)] == ["before-upgrade"]


def test_savepoint_at_checkpoint_reads_that_committed_checkpoints_ends(
    ledger: Ledger, steps: LedgerSteps
) -> None:
    from airflow_provider_eo.ledger import Actor

    first = steps.run_one(RangeSpec("t", 0, 0, 10), RangeSpec("t", 1, 0, 4))
    second = ledger.plan(P, [RangeSpec("t", 0, 10, 20), RangeSpec("t", 1, 4, 4)]).checkpoint_id
    steps.prepare(second)
    # in flight: the savepoint at or below it is the newest COMMITTED one, the first
    sp = ledger.savepoint_at_checkpoint(
        P, "a", at_or_below=second, note="n", created_by="bob@h", actor=Actor(dag_id="d", run_id="r")
    )
    assert (sp.checkpoint_id, sp.offsets) == (first, {"t": {0: 10, 1: 4}})
    assert (sp.fingerprint, sp.dag_id, sp.run_id, sp.created_by) == ("fp-1", "d", "r", "bob@h")
    ledger.mark_committed(P, second)
    third = steps.run_one(RangeSpec("t", 0, 20, 25), RangeSpec("t", 1, 4, 9))
    # asked when `second` was the highest in flight: never the later `third`
    assert ledger.savepoint_at_checkpoint(P, "b", at_or_below=second).checkpoint_id == second
    assert ledger.savepoint_at_checkpoint(P, "c").offsets == {"t": {0: 25, 1: 9}}
    assert ledger.get_savepoint(P, "c").checkpoint_id == third
    event = next(e for e in ledger.events(P) if e.kind == "savepoint")
    assert event.details["created_by"] == "bob@h" and event.run_id == "r"


def test_savepoint_at_checkpoint_refusals_record_nothing(ledger: Ledger, steps: LedgerSteps) -> None:
    from airflow_provider_eo.ledger.savepoints import NothingCommitted

    with pytest.raises(NothingCommitted, match="pipeline 'orders' has no COMMITTED checkpoint yet"):
        ledger.savepoint_at_checkpoint(P, "a")
    cp = ledger.plan(P, [RangeSpec("t", 0, 0, 10)]).checkpoint_id
    steps.prepare(cp)
    with pytest.raises(NothingCommitted, match="at or below checkpoint 1"):
        ledger.savepoint_at_checkpoint(P, "a", at_or_below=cp)
    ledger.mark_committed(P, cp)
    ledger.savepoint_at_checkpoint(P, "a")
    before = ledger.events(P)
    with pytest.raises(InvariantViolation, match="savepoint 'a' already exists"):
        ledger.savepoint_at_checkpoint(P, "a")
    assert ledger.events(P) == before and len(ledger.list_savepoints(P)) == 1


def test_delete_savepoint(ledger: Ledger, steps: LedgerSteps) -> None:
    from airflow_provider_eo.ledger import SavepointNotFound

    steps.run_one(RangeSpec("t", 0, 0, 10))
    ledger.savepoint_at_checkpoint(P, "a")
    gone = ledger.delete_savepoint(P, "a")
    assert gone.name == "a" and ledger.list_savepoints(P) == []
    assert ledger.events(P)[-1].kind == "savepoint_deleted"
    before = ledger.events(P)
    with pytest.raises(SavepointNotFound, match=r"pipeline 'orders' has no savepoint 'a'.*eo savepoint list"):
        ledger.delete_savepoint(P, "a")
    assert ledger.events(P) == before
    ledger.savepoint_at_checkpoint(P, "a")  # the name is free again
