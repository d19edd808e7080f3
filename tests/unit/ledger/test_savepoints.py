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
