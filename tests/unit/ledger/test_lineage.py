"""Restore: a recorded lineage break that moves the partition heads."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from airflow_provider_eo.ledger import (
    Actor,
    InvariantViolation,
    Ledger,
    RangeSpec,
)

if TYPE_CHECKING:
    from tests.unit.ledger.conftest import LedgerSteps

P = "orders"


def test_restore_is_a_lineage_break(ledger: Ledger, steps: LedgerSteps) -> None:
    steps.run_one(RangeSpec("t", 0, 0, 10))
    ledger.plan(P, [RangeSpec("t", 0, 10, 20)])
    with pytest.raises(InvariantViolation, match="cannot restore while checkpoint 2 is PLANNED"):
        ledger.restore(P, {("t", 0): 3}, reason="replay")
    ledger.abort(P, 2, reason="make way")
    lineage = ledger.restore(P, {("t", 0): 3}, reason="replay", actor=Actor(task_id="restore"))
    assert lineage == 2
    assert ledger.get_pipeline(P).current_lineage == 2
    assert ledger.next_starts(P) == {("t", 0): 3}
    with pytest.raises(InvariantViolation, match="must start at 3, got 10"):
        ledger.plan(P, [RangeSpec("t", 0, 10, 20)])
    cp = ledger.plan(P, [RangeSpec("t", 0, 3, 8), RangeSpec("t", 1, 40, 50)])
    assert cp.lineage == 2
    restore_event = next(e for e in ledger.events(P) if e.kind == "restore")
    assert restore_event.details["from_lineage"] == 1 and restore_event.details["to_lineage"] == 2
    assert restore_event.task_id == "restore"
    # A full reset: any start is allowed.
    ledger.abort(P, cp.checkpoint_id, reason="reset")
    assert ledger.restore(P, {}, reason="reset") == 3
    assert ledger.next_starts(P) == {}
    ledger.plan(P, [RangeSpec("t", 0, 999, 1000)])


def test_restore_once_request_key_and_expected_lineage(ledger: Ledger, steps: LedgerSteps) -> None:
    from airflow_provider_eo.ledger import CheckpointConflict

    steps.run_one(RangeSpec("t", 0, 0, 10))
    first = ledger.restore_once(
        P, {("t", 0): 3}, reason="r", expected_lineage=1, request_key="dag/run1", details={"savepoint": "s"}
    )
    assert (first.lineage, first.from_lineage, first.repeated) == (2, 1, False)
    assert first.details["savepoint"] == "s" and first.details["request_key"] == "dag/run1"
    # the same request again (an Airflow retry): no second break, the first outcome
    again = ledger.restore_once(P, {("t", 0): 7}, reason="r", expected_lineage=1, request_key="dag/run1")
    assert (again.lineage, again.repeated) == (2, True)
    assert ledger.find_restore(P, "dag/run1") == again
    assert ledger.find_restore(P, "dag/other") is None
    assert ledger.next_starts(P) == {("t", 0): 3}
    # a second request decided on lineage 1: someone else moved it, refused, nothing changed
    before = ledger.events(P)
    with pytest.raises(CheckpointConflict, match="moved it from lineage 1 to 2"):
        ledger.restore_once(P, {("t", 0): 5}, reason="late", expected_lineage=1, request_key="dag/run2")
    assert ledger.events(P) == before and ledger.get_pipeline(P).current_lineage == 2
