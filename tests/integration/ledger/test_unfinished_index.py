"""The unfinished checkpoints on real databases (SQLite file, PostgreSQL): the right rows, read
through the partial index ``ix_eo_checkpoints_unfinished`` that migration 0005 makes."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from sqlalchemy import inspect

from airflow_provider_eo.ledger import Ledger, RangeSpec

if TYPE_CHECKING:
    from eo_ledgers import LedgerFactory

P = "orders"


@pytest.fixture
def ledger(ledger_url: str, make_ledger: LedgerFactory) -> Ledger:
    return make_ledger(url=ledger_url, pipeline=P)


def _step(ledger: Ledger, start: int, *, state: str) -> int:
    cid = ledger.plan(P, [RangeSpec("t", 0, start, start + 10)], max_pending=3).checkpoint_id
    if state != "PLANNED":
        ledger.mark_prepared(
            P, cid, attempt="a", staging_location="/s", records=1, bytes_=1, shard_counts={0: 1}
        )
    if state == "COMMITTED":
        ledger.mark_committed(P, cid)
    return cid


def test_unfinished_checkpoints_after_a_history(ledger: Ledger) -> None:
    for i in range(30):
        _step(ledger, i * 10, state="COMMITTED")
    aborted = _step(ledger, 300, state="PLANNED")
    ledger.abort(P, aborted, reason="test")
    prepared = _step(ledger, 300, state="PREPARED")
    planned = _step(ledger, 310, state="PLANNED")
    found = ledger.unfinished_checkpoints(P)
    assert [(c.checkpoint_id, c.state.value) for c in found] == [(prepared, "PREPARED"), (planned, "PLANNED")]
    assert [(r.start, r.end) for c in found for r in c.ranges] == [(300, 310), (310, 320)]
    ledger.abort(P, planned, reason="test")
    ledger.mark_committed(P, prepared)
    assert ledger.unfinished_checkpoints(P) == []


def test_the_partial_index_exists_and_serves_the_query(ledger: Ledger) -> None:
    indexes = {ix["name"]: ix for ix in inspect(ledger.engine).get_indexes("eo_checkpoints")}
    assert indexes["ix_eo_checkpoints_unfinished"]["column_names"] == ["pipeline_id", "checkpoint_id"]
    _step(ledger, 0, state="COMMITTED")
    _step(ledger, 10, state="PLANNED")
    with ledger.engine.connect() as conn:
        pid = conn.exec_driver_sql(f"SELECT id FROM eo_pipelines WHERE name = '{P}'").scalar_one()
        sql = (
            f"SELECT checkpoint_id FROM eo_checkpoints WHERE pipeline_id = {int(pid)} "
            "AND state IN ('PLANNED', 'PREPARED') ORDER BY checkpoint_id"
        )
        if ledger.dialect == "postgresql":
            conn.exec_driver_sql("SET enable_seqscan = off")  # a tiny table: ask for the index
            plan = " ".join(str(row[0]) for row in conn.exec_driver_sql("EXPLAIN " + sql))
        else:
            plan = " ".join(str(row[-1]) for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql))
        assert "ix_eo_checkpoints_unfinished" in plan, plan
        assert [r[0] for r in conn.exec_driver_sql(sql)] == [2]
