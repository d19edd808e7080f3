"""Read-only queries: lookups, not-found errors, index use."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from airflow_provider_eo.ledger import (
    CheckpointNotFound,
    Ledger,
    RangeSpec,
    SavepointNotFound,
)

if TYPE_CHECKING:
    from tests.unit.ledger.conftest import LedgerSteps

P = "orders"


def test_not_found_errors(ledger: Ledger) -> None:
    with pytest.raises(CheckpointNotFound, match="checkpoint 9 of pipeline 'orders'"):
        ledger.get(P, 9)
    with pytest.raises(CheckpointNotFound, match="pipeline 'nope' is not in the ledger"):
        ledger.unfinished("nope")
    with pytest.raises(SavepointNotFound, match="no savepoint 'x'"):
        ledger.get_savepoint(P, "x")


def test_list_checkpoints_limit_keeps_latest(ledger: Ledger, steps: LedgerSteps) -> None:
    end = 0
    for _ in range(5):
        steps.run_one(RangeSpec("t", 0, end, end + 3))
        end += 3
    assert [c.checkpoint_id for c in ledger.list_checkpoints(P)] == [1, 2, 3, 4, 5]
    assert [c.checkpoint_id for c in ledger.list_checkpoints(P, limit=2)] == [4, 5]
    assert ledger.last_committed(P).checkpoint_id == 5  # type: ignore[union-attr]


def test_hot_queries_seek_an_index(ledger: Ledger, steps: LedgerSteps) -> None:
    """unfinished()/last_committed() must not scan: their cost must not grow with the table."""
    from sqlalchemy import event

    steps.run_one(RangeSpec("t", 0, 0, 10))
    ledger.plan(P, [RangeSpec("t", 0, 10, 20)])
    statements: list[tuple[str, object]] = []

    def capture(_c: object, _cur: object, statement: str, params: object, *_a: object) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            statements.append((statement, params))

    event.listen(ledger.engine, "before_cursor_execute", capture)
    try:
        ledger.unfinished(P)
        ledger.last_committed(P)
    finally:
        event.remove(ledger.engine, "before_cursor_execute", capture)
    assert statements
    with ledger.engine.connect() as conn:
        for sql, params in statements:
            plan = " ".join(
                str(row[-1])
                for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, params)  # type: ignore[arg-type]
            )
            assert "SCAN" not in plan, (sql, plan)
            if "FROM eo_checkpoints" in sql and "eo_checkpoints.state = " in sql:
                assert "ix_eo_checkpoints_pipeline_state_id" in plan, (sql, plan)
