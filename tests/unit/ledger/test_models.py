"""The models' state columns: enums in Python, the same strings in the database as before."""

from __future__ import annotations

from sqlalchemy import text

from airflow_provider_eo.ledger import CheckpointState, Ledger, RangeSpec, ShardState


def test_states_are_enums_and_stored_as_their_names(ledger: Ledger) -> None:
    ledger.plan("orders", [RangeSpec("t", 0, 0, 10)])
    ledger.mark_prepared(
        "orders", 1, attempt="a", staging_location="/s", records=1, bytes_=1, shard_counts={0: 1}
    )
    ledger.record_shard(
        "orders",
        1,
        0,
        transactional_id="eo.orders.0",
        producer_id=None,
        producer_epoch=None,
        state=ShardState.COMMITTED,
        records=1,
    )
    cp = ledger.mark_committed("orders", 1)
    assert type(cp.state) is CheckpointState and type(cp.shards[0].state) is ShardState
    events = [e for e in ledger.events("orders", 1) if e.kind == "transition"]
    assert all(type(e.to_state) is CheckpointState for e in events)
    with ledger.engine.connect() as conn:
        assert conn.execute(text("SELECT state FROM eo_checkpoints")).scalar_one() == "COMMITTED"
        assert conn.execute(text("SELECT state FROM eo_commit_shards")).scalar_one() == "COMMITTED"
        moves = conn.execute(
            text("SELECT from_state, to_state FROM eo_events WHERE kind = 'transition' ORDER BY id")
        ).all()
    assert [tuple(m) for m in moves] == [
        (None, "PLANNED"),
        ("PLANNED", "PREPARED"),
        ("PREPARED", "COMMITTED"),
    ]


def test_rows_written_as_plain_strings_read_back_as_enums(ledger: Ledger) -> None:
    """Rows written before the enum mapping (or by bench/ledger.py's bulk load) still read."""
    ledger.plan("orders", [RangeSpec("t", 0, 0, 10)])
    with ledger.engine.begin() as conn:
        conn.execute(text("UPDATE eo_checkpoints SET state = 'ABORTED'"))
    assert ledger.get("orders", 1).state is CheckpointState.ABORTED
