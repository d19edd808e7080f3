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
