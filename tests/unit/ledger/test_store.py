"""The ledger's transitions, conflicts and invariants on a SQLite file."""

from __future__ import annotations

import datetime as dt

import pytest

from airflow_provider_eo.ledger import (
    ALLOWED_TRANSITIONS,
    TERMINAL_STATES,
    Actor,
    CheckpointConflict,
    CheckpointNotFound,
    CheckpointState,
    CommitLeaseHeld,
    InvariantViolation,
    Ledger,
    LedgerUnavailable,
    PipelineFingerprintMismatch,
    RangeSpec,
    SavepointNotFound,
    ShardState,
)

P = "orders"
S = CheckpointState


def prepare(ledger: Ledger, cp: int, attempt: str = "a1") -> None:
    ledger.mark_prepared(
        P,
        cp,
        attempt=attempt,
        staging_location=f"/stage/{cp}/{attempt}",
        records=10,
        bytes_=100,
        shard_counts={0: 6, 1: 4},
    )


def run_one(ledger: Ledger, *ranges: RangeSpec) -> int:
    cp = ledger.plan(P, list(ranges)).checkpoint_id
    prepare(ledger, cp)
    ledger.mark_committed(P, cp)
    return cp


# -- the state machine table --------------------------------------------------------------


def test_transition_table_is_the_documented_one() -> None:
    assert {(a.value, b.value) for a, b in ALLOWED_TRANSITIONS} == {
        ("PLANNED", "PREPARED"),
        ("PREPARED", "COMMITTED"),
        ("PLANNED", "ABORTED"),
        ("PREPARED", "ABORTED"),
    }
    assert frozenset({S.COMMITTED, S.ABORTED}) == TERMINAL_STATES
    assert not any(src in TERMINAL_STATES for src, _ in ALLOWED_TRANSITIONS)


def test_range_spec_validates() -> None:
    with pytest.raises(ValueError, match="start <= end"):
        RangeSpec("t", 0, 5, 4)
    with pytest.raises(ValueError, match="skipped_from"):
        RangeSpec("t", 0, 5, 9, skipped_from=5)
    assert RangeSpec("t", 1, 3, 3).compact() == "t[1]:3-3"


# -- happy path and every transition --------------------------------------------------------


def test_full_life_records_every_transition(ledger: Ledger) -> None:
    actor = Actor(dag_id="d", run_id="r", task_id="plan", try_number=2, hostname="h", pid=7)
    cp = ledger.plan(P, [RangeSpec("t", 0, 0, 10), RangeSpec("t", 1, 5, 8)], actor=actor)
    assert (cp.checkpoint_id, cp.state, cp.lineage) == (1, S.PLANNED, 1)
    assert cp.dag_id == "d" and cp.try_number == 2
    assert ledger.unfinished(P) == cp
    assert ledger.last_committed(P) is None

    prepared = ledger.mark_prepared(
        P,
        1,
        attempt="att-1",
        staging_location="/s/1",
        records=13,
        bytes_=1300,
        shard_counts={0: 13},
        range_stats={("t", 0): (1000, 2000)},
        spark_app_id="app-1",
    )
    assert prepared.state == S.PREPARED and prepared.prepared_attempt == "att-1"
    assert prepared.range_stats[("t", 0)] == (1000, 2000)
    assert prepared.range_stats[("t", 1)] == (None, None)
    assert prepared.shard_counts == {0: 13} and prepared.spark_app_id == "app-1"

    ledger.record_shard(
        P,
        1,
        0,
        transactional_id="eo.orders.0",
        producer_id=5,
        producer_epoch=1,
        state="COMMITTED",
        records=13,
    )
    done = ledger.mark_committed(P, 1)
    assert done.state == S.COMMITTED
    assert done.planned_at <= done.prepared_at <= done.committed_at  # type: ignore[operator]
    assert done.committed_at is not None and done.committed_at.tzinfo is not None
    assert done.shards[0].state == ShardState.COMMITTED
    assert ledger.unfinished(P) is None
    assert ledger.last_committed(P) == done
    assert ledger.next_starts(P) == {("t", 0): 10, ("t", 1): 8}

    moves = [(e.from_state, e.to_state) for e in ledger.events(P, 1) if e.kind == "transition"]
    assert moves == [(None, S.PLANNED), (S.PLANNED, S.PREPARED), (S.PREPARED, S.COMMITTED)]
    first = ledger.events(P, 1)[0]
    assert first.actor == "d/r/plan#2@h:7" and first.task_id == "plan"


def test_abort_from_planned_and_prepared(ledger: Ledger) -> None:
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    assert ledger.abort(P, 1, reason="spark died").state == S.ABORTED
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    prepare(ledger, 2)
    aborted = ledger.abort(P, 2, reason="staging lost")
    assert aborted.state == S.ABORTED and aborted.abort_reason == "staging lost"
    assert aborted.aborted_at is not None
    # Idempotent: aborting again changes nothing.
    assert ledger.abort(P, 2, reason="again").abort_reason == "staging lost"
    assert [e.to_state for e in ledger.events(P, 2)] == [S.PLANNED, S.PREPARED, S.ABORTED]


def test_commit_is_idempotent(ledger: Ledger) -> None:
    cp = run_one(ledger, RangeSpec("t", 0, 0, 5))
    again = ledger.mark_committed(P, cp)
    assert again.state == S.COMMITTED
    assert len([e for e in ledger.events(P, cp) if e.to_state == S.COMMITTED]) == 1


# -- conflicts ----------------------------------------------------------------------------


def test_second_prepare_attempt_conflicts_naming_states(ledger: Ledger) -> None:
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    prepare(ledger, 1, attempt="winner")
    prepare(ledger, 1, attempt="winner")  # same attempt: idempotent
    with pytest.raises(CheckpointConflict) as info:
        prepare(ledger, 1, attempt="loser")
    msg = str(info.value)
    assert "checkpoint 1" in msg and "'orders'" in msg
    assert "expected state PLANNED, found PREPARED" in msg and "'winner'" in msg
    assert (info.value.expected, info.value.actual) == ("PLANNED", "PREPARED")
    assert ledger.get(P, 1).prepared_attempt == "winner"


@pytest.mark.parametrize(
    ("setup", "action", "expected", "found"),
    [
        ("planned", "commit", "PREPARED", "PLANNED"),
        ("aborted", "commit", "PREPARED", "ABORTED"),
        ("aborted", "prepare", "PLANNED", "ABORTED"),
        ("committed", "prepare", "PLANNED", "COMMITTED"),
        ("committed", "abort", "PLANNED or PREPARED", "COMMITTED"),
        ("planned", "lease", "PREPARED", "PLANNED"),
    ],
)
def test_illegal_transitions_conflict(
    ledger: Ledger, setup: str, action: str, expected: str, found: str
) -> None:
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    if setup == "aborted":
        ledger.abort(P, 1, reason="x")
    if setup == "committed":
        prepare(ledger, 1)
        ledger.mark_committed(P, 1)
    actions = {
        "commit": lambda: ledger.mark_committed(P, 1),
        "prepare": lambda: prepare(ledger, 1, attempt="other"),
        "abort": lambda: ledger.abort(P, 1, reason="late"),
        "lease": lambda: ledger.acquire_commit_lease(P, 1, owner="o", ttl_s=5),
    }
    with pytest.raises(CheckpointConflict, match=f"expected state {expected}, found {found}"):
        actions[action]()
    assert ledger.get(P, 1).state.value == found


def test_not_found_errors(ledger: Ledger) -> None:
    with pytest.raises(CheckpointNotFound, match="checkpoint 9 of pipeline 'orders'"):
        ledger.get(P, 9)
    with pytest.raises(CheckpointNotFound, match="pipeline 'nope' is not in the ledger"):
        ledger.unfinished("nope")
    with pytest.raises(SavepointNotFound, match="no savepoint 'x'"):
        ledger.get_savepoint(P, "x")


# -- invariants ---------------------------------------------------------------------------


def test_gap_and_overlap_are_refused_with_offsets(ledger: Ledger) -> None:
    run_one(ledger, RangeSpec("t", 0, 0, 10))
    with pytest.raises(InvariantViolation) as gap:
        ledger.plan(P, [RangeSpec("t", 0, 12, 20)])
    assert "t[0] must start at 10, got 12 (gap of 2 offsets)" in str(gap.value)
    assert "'orders', checkpoint 2" in str(gap.value)
    with pytest.raises(InvariantViolation, match=r"t\[0\] must start at 10, got 7 \(overlap of 3"):
        ledger.plan(P, [RangeSpec("t", 0, 7, 20)])
    with pytest.raises(InvariantViolation, match="appears twice"):
        ledger.plan(P, [RangeSpec("t", 0, 10, 20), RangeSpec("t", 0, 20, 30)])
    assert ledger.unfinished(P) is None  # nothing was recorded by the refused plans
    # A new partition may start anywhere; the known one continues.
    cp = ledger.plan(P, [RangeSpec("t", 0, 10, 20), RangeSpec("t", 5, 1234, 1300)])
    assert cp.checkpoint_id == 2


def test_skipped_start_is_recorded_not_silent(ledger: Ledger) -> None:
    run_one(ledger, RangeSpec("t", 0, 0, 10))
    with pytest.raises(InvariantViolation, match="must start at 10, got 8"):
        ledger.plan(P, [RangeSpec("t", 0, 50, 60, skipped_from=8)])
    cp = ledger.plan(P, [RangeSpec("t", 0, 50, 60, skipped_from=10)])
    assert cp.ranges[0].skipped_from == 10
    assert ledger.events(P, cp.checkpoint_id)[0].details["skipped"] == {"t[0]": [10, 50]}


def test_max_pending(ledger: Ledger) -> None:
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    with pytest.raises(InvariantViolation, match=r"1 unfinished checkpoint\(s\).*lowest: 1, PLANNED"):
        ledger.plan(P, [RangeSpec("t", 0, 10, 20)])
    ledger.plan(P, [RangeSpec("t", 0, 10, 20)], max_pending=2)
    with pytest.raises(InvariantViolation, match="max_pending=2"):
        ledger.plan(P, [RangeSpec("t", 0, 20, 30)], max_pending=2)
    assert ledger.unfinished(P).checkpoint_id == 1  # type: ignore[union-attr]


def test_commits_happen_in_order(ledger: Ledger) -> None:
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    ledger.plan(P, [RangeSpec("t", 0, 10, 20)], max_pending=2)
    prepare(ledger, 2)
    with pytest.raises(InvariantViolation, match="cannot commit checkpoint 2 while checkpoint 1 is PLANNED"):
        ledger.mark_committed(P, 2)
    with pytest.raises(InvariantViolation, match="commit or abort checkpoint 1 first"):
        ledger.acquire_commit_lease(P, 2, owner="o", ttl_s=5)
    prepare(ledger, 1)
    ledger.mark_committed(P, 1)
    assert ledger.mark_committed(P, 2).state == S.COMMITTED


def test_abort_replans_from_the_same_start(ledger: Ledger) -> None:
    run_one(ledger, RangeSpec("t", 0, 0, 10))
    ledger.plan(P, [RangeSpec("t", 0, 10, 20), RangeSpec("u", 0, 100, 150)])
    assert ledger.next_starts(P) == {("t", 0): 20, ("u", 0): 150}
    ledger.abort(P, 2, reason="spark died")
    # t[0] goes back to the aborted start (= previous end); u[0], first seen in the aborted
    # checkpoint, must also be replanned from its start, not skipped.
    assert ledger.next_starts(P) == {("t", 0): 10, ("u", 0): 100}
    with pytest.raises(InvariantViolation, match="must start at 10, got 20"):
        ledger.plan(P, [RangeSpec("t", 0, 20, 30)])
    with pytest.raises(InvariantViolation, match=r"u\[0\] must start at 100, got 150"):
        ledger.plan(P, [RangeSpec("t", 0, 10, 30), RangeSpec("u", 0, 150, 160)])
    cp = ledger.plan(P, [RangeSpec("t", 0, 10, 25), RangeSpec("u", 0, 100, 120)])
    assert cp.checkpoint_id == 3


def test_abort_cascades_to_later_unfinished(ledger: Ledger) -> None:
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    ledger.plan(P, [RangeSpec("t", 0, 10, 20)], max_pending=3)
    ledger.plan(P, [RangeSpec("t", 0, 20, 30)], max_pending=3)
    ledger.abort(P, 2, reason="boom")
    states = [c.state for c in ledger.list_checkpoints(P)]
    assert states == [S.PLANNED, S.ABORTED, S.ABORTED]
    assert "checkpoint 2 aborted: boom" in (ledger.get(P, 3).abort_reason or "")
    assert ledger.next_starts(P) == {("t", 0): 10}
    assert ledger.events(P, 3)[-1].details["cascade_from"] == 2


def test_restore_is_a_lineage_break(ledger: Ledger) -> None:
    run_one(ledger, RangeSpec("t", 0, 0, 10))
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


# -- pipelines ----------------------------------------------------------------------------


def test_fingerprint_mismatch(ledger: Ledger) -> None:
    assert ledger.ensure_pipeline(P, "fp-1").fingerprint == "fp-1"  # idempotent
    with pytest.raises(PipelineFingerprintMismatch) as info:
        ledger.ensure_pipeline(P, "fp-2")
    msg = str(info.value)
    assert "'orders'" in msg and "fp-1" in msg and "fp-2" in msg
    assert "allow_fingerprint_change=True" in msg
    assert ledger.get_pipeline(P).fingerprint == "fp-1"
    changed = ledger.ensure_pipeline(P, "fp-2", allow_fingerprint_change=True)
    assert changed.fingerprint == "fp-2"
    assert ledger.events(P)[-1].details == {"old": "fp-1", "new": "fp-2"}
    assert [p.name for p in ledger.list_pipelines()] == [P]


def test_pipelines_are_independent(ledger: Ledger) -> None:
    ledger.ensure_pipeline("other", "x")
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    assert ledger.plan("other", [RangeSpec("t", 0, 500, 510)]).checkpoint_id == 1
    assert ledger.unfinished("other").ranges[0].start == 500  # type: ignore[union-attr]


# -- savepoints ---------------------------------------------------------------------------


def test_savepoints(ledger: Ledger) -> None:
    cp = run_one(ledger, RangeSpec("t", 0, 0, 10), RangeSpec("t", 1, 0, 4))
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


# -- commit lease -------------------------------------------------------------------------


def test_commit_lease_cas(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_eo.ledger import leases

    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    prepare(ledger, 1)
    now = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
    monkeypatch.setattr(leases, "utcnow", lambda: now)
    lease = ledger.acquire_commit_lease(P, 1, owner="worker-a", ttl_s=30)
    assert lease.commit_owner == "worker-a"
    assert lease.commit_lease_until == now + dt.timedelta(seconds=30)
    with pytest.raises(CommitLeaseHeld, match="being committed by 'worker-a'") as held:
        ledger.acquire_commit_lease(P, 1, owner="worker-b", ttl_s=30)
    assert held.value.owner == "worker-a"
    # Same owner renews.
    now += dt.timedelta(seconds=20)
    assert ledger.acquire_commit_lease(P, 1, owner="worker-a", ttl_s=30).commit_lease_until == (
        now + dt.timedelta(seconds=30)
    )
    now += dt.timedelta(seconds=29)
    with pytest.raises(CommitLeaseHeld):
        ledger.acquire_commit_lease(P, 1, owner="worker-b", ttl_s=30)
    # Expired: another owner takes over.
    now += dt.timedelta(seconds=2)
    assert ledger.acquire_commit_lease(P, 1, owner="worker-b", ttl_s=30).commit_owner == "worker-b"
    assert ledger.release_commit_lease(P, 1, owner="worker-a") is False
    assert ledger.release_commit_lease(P, 1, owner="worker-b") is True
    assert ledger.acquire_commit_lease(P, 1, owner="worker-c", ttl_s=1).commit_owner == "worker-c"
    owners = [e.details["owner"] for e in ledger.events(P, 1) if e.kind == "lease"]
    assert owners == ["worker-a", "worker-b", "worker-c"]


def test_shards_gate_the_commit(ledger: Ledger) -> None:
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    with pytest.raises(CheckpointConflict, match="expected state PREPARED, found PLANNED"):
        ledger.record_shard(
            P, 1, 0, transactional_id="x", producer_id=None, producer_epoch=None, state="PENDING", records=0
        )
    prepare(ledger, 1)
    for shard in (0, 1):
        ledger.record_shard(
            P,
            1,
            shard,
            transactional_id=f"eo.orders.{shard}",
            producer_id=1,
            producer_epoch=0,
            state="PENDING",
            records=5,
        )
    ledger.record_shard(
        P, 1, 0, transactional_id="eo.orders.0", producer_id=1, producer_epoch=0, state="COMMITTED", records=5
    )
    with pytest.raises(InvariantViolation, match=r"shards \[1\] are not recorded COMMITTED"):
        ledger.mark_committed(P, 1)
    with pytest.raises(InvariantViolation, match="cannot go back to PENDING"):
        ledger.record_shard(
            P,
            1,
            0,
            transactional_id="eo.orders.0",
            producer_id=1,
            producer_epoch=0,
            state="PENDING",
            records=5,
        )
    ledger.record_shard(
        P, 1, 1, transactional_id="eo.orders.1", producer_id=2, producer_epoch=3, state="COMMITTED", records=5
    )
    done = ledger.mark_committed(P, 1)
    assert [(s.shard, s.producer_epoch) for s in done.shards] == [(0, 0), (1, 3)]
    with pytest.raises(ValueError):
        ledger.record_shard(
            P, 1, 2, transactional_id="x", producer_id=None, producer_epoch=None, state="DONE", records=0
        )


# -- reading ------------------------------------------------------------------------------


def test_list_checkpoints_limit_keeps_latest(ledger: Ledger) -> None:
    end = 0
    for _ in range(5):
        run_one(ledger, RangeSpec("t", 0, end, end + 3))
        end += 3
    assert [c.checkpoint_id for c in ledger.list_checkpoints(P)] == [1, 2, 3, 4, 5]
    assert [c.checkpoint_id for c in ledger.list_checkpoints(P, limit=2)] == [4, 5]
    assert ledger.last_committed(P).checkpoint_id == 5  # type: ignore[union-attr]


def test_ledger_unavailable_redacts_password() -> None:
    with pytest.raises(LedgerUnavailable) as info:
        Ledger("postgresql+psycopg://eo:hunter2@127.0.0.1:1/eo")
    msg = str(info.value)
    assert "hunter2" not in msg
    assert "ledger database at postgresql+psycopg://eo:***@127.0.0.1:1/eo unavailable" in msg
    assert "retry later" in msg


def test_new_sqlite_file_is_created_and_upgraded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "sub" / "dir" / "ledger.db"
    ledger = Ledger(f"sqlite:///{path}")
    assert path.exists() and ledger.current_revision() == ledger.head_revision()
    with ledger.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
    ledger.close()


def test_hot_queries_seek_an_index(ledger: Ledger) -> None:
    """unfinished()/last_committed() must not scan: their cost must not grow with the table."""
    from sqlalchemy import event

    run_one(ledger, RangeSpec("t", 0, 0, 10))
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
