"""What a stream reads at start: the unfinished checkpoints only, through their partial index."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy import event

from airflow_provider_eo.core.stream import unfinished_checkpoints
from airflow_provider_eo.ledger import Ledger, RangeSpec
from airflow_provider_eo.ledger.models import UNFINISHED_PREDICATE
from airflow_provider_eo.ledger.schema import MIGRATIONS_DIR
from airflow_provider_eo.ledger.states import UNFINISHED_STATES

if TYPE_CHECKING:
    from tests.unit.ledger.conftest import LedgerSteps

P = "orders"


@contextmanager
def selects(ledger: Ledger) -> Iterator[list[tuple[str, Any]]]:
    """The SELECT statements (and parameters) run on the ledger inside the block."""
    seen: list[tuple[str, Any]] = []

    def capture(_c: object, _cur: object, statement: str, params: Any, *_a: object) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append((statement, params))

    event.listen(ledger.engine, "before_cursor_execute", capture)
    try:
        yield seen
    finally:
        event.remove(ledger.engine, "before_cursor_execute", capture)


def _history(ledger: Ledger, steps: LedgerSteps, finished: int) -> list[int]:
    """``finished`` COMMITTED/ABORTED checkpoints, then one PREPARED and one PLANNED: the
    ids of the two unfinished ones."""
    end = 0
    for i in range(finished):
        if i % 4 == 3:  # an aborted one is replanned from the same start
            cp = ledger.plan(P, [RangeSpec("t", 0, end, end + 5), RangeSpec("t", 1, end, end + 5)])
            ledger.abort(P, cp.checkpoint_id, reason="test")
            continue
        steps.run_one(RangeSpec("t", 0, end, end + 5), RangeSpec("t", 1, end, end + 5))
        end += 5
    prepared = ledger.plan(
        P, [RangeSpec("t", 0, end, end + 5), RangeSpec("t", 1, end, end + 5)]
    ).checkpoint_id
    steps.prepare(prepared)
    planned = ledger.plan(
        P, [RangeSpec("t", 0, end + 5, end + 7), RangeSpec("t", 1, end + 5, end + 9)], max_pending=2
    ).checkpoint_id
    return [prepared, planned]


def test_none_when_nothing_is_unfinished(ledger: Ledger, steps: LedgerSteps) -> None:
    assert unfinished_checkpoints(ledger, P) == []
    steps.run_one(RangeSpec("t", 0, 0, 5))
    assert unfinished_checkpoints(ledger, P) == []


def test_the_unfinished_ones_in_id_order_with_their_ranges(ledger: Ledger, steps: LedgerSteps) -> None:
    prepared, planned = _history(ledger, steps, 12)
    found = unfinished_checkpoints(ledger, P)
    assert [(c.checkpoint_id, c.state.value) for c in found] == [(prepared, "PREPARED"), (planned, "PLANNED")]
    assert found == [ledger.get(P, prepared), ledger.get(P, planned)]  # the full records
    assert [(r.partition, r.start, r.end) for r in found[1].ranges] == [(0, 50, 52), (1, 50, 54)]
    ledger.mark_committed(P, prepared)
    assert [c.checkpoint_id for c in unfinished_checkpoints(ledger, P)] == [planned]


def test_reads_only_the_unfinished_rows_through_the_partial_index(ledger: Ledger, steps: LedgerSteps) -> None:
    unfinished = _history(ledger, steps, 40)
    with selects(ledger) as statements:
        found = unfinished_checkpoints(ledger, P)
    assert [c.checkpoint_id for c in found] == unfinished
    with ledger.engine.connect() as conn:
        plans = {
            sql: " ".join(str(row[-1]) for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, params))
            for sql, params in statements
        }
    on_checkpoints = [sql for sql in plans if re.search(r"FROM eo_checkpoints\b", sql)]
    assert len(on_checkpoints) == 1, on_checkpoints
    assert "USING INDEX ix_eo_checkpoints_unfinished" in plans[on_checkpoints[0]], plans
    assert all("SCAN" not in plan for plan in plans.values()), plans
    # the ranges (and shards) are read for the two unfinished checkpoints, not the 42
    children = [
        (sql, params)
        for sql, params in statements
        if re.search(r"FROM eo_(checkpoint_ranges|commit_shards)\b", sql)
    ]
    assert len(children) == 2, children
    for sql, params in children:
        assert set(params[1:]) == set(unfinished), (sql, params)


def test_the_predicate_is_the_unfinished_states_and_the_migrations() -> None:
    named = set(re.findall(r"'([A-Z]+)'", UNFINISHED_PREDICATE))
    assert named == {s.value for s in UNFINISHED_STATES}
    path = MIGRATIONS_DIR / "versions" / "0005_unfinished_index.py"
    spec = importlib.util.spec_from_file_location("eo_migration_0005", path)
    assert spec is not None and spec.loader is not None
    migration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migration)
    assert migration._UNFINISHED == UNFINISHED_PREDICATE
