"""Plan, prepare, commit, abort: each transition, its conflicts and the invariants it keeps."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from airflow_provider_eo.ledger import (
    Actor,
    CheckpointConflict,
    CheckpointState,
    CommitPlan,
    InvariantViolation,
    Ledger,
    RangeSpec,
    ShardState,
)
from airflow_provider_eo.ledger.pipelines import TransactionalIdPrefixMismatch

if TYPE_CHECKING:
    from tests.unit.ledger.conftest import LedgerSteps

P = "orders"
S = CheckpointState


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


def test_abort_from_planned_and_prepared(ledger: Ledger, steps: LedgerSteps) -> None:
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    assert ledger.abort(P, 1, reason="spark died").state == S.ABORTED
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    steps.prepare(2)
    aborted = ledger.abort(P, 2, reason="staging lost")
    assert aborted.state == S.ABORTED and aborted.abort_reason == "staging lost"
    assert aborted.aborted_at is not None
    # Idempotent: aborting again changes nothing.
    assert ledger.abort(P, 2, reason="again").abort_reason == "staging lost"
    assert [e.to_state for e in ledger.events(P, 2)] == [S.PLANNED, S.PREPARED, S.ABORTED]


def test_commit_is_idempotent(ledger: Ledger, steps: LedgerSteps) -> None:
    cp = steps.run_one(RangeSpec("t", 0, 0, 5))
    again = ledger.mark_committed(P, cp)
    assert again.state == S.COMMITTED
    assert len([e for e in ledger.events(P, cp) if e.to_state == S.COMMITTED]) == 1


def test_second_prepare_attempt_conflicts_naming_states(ledger: Ledger, steps: LedgerSteps) -> None:
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    steps.prepare(1, attempt="winner")
    steps.prepare(1, attempt="winner")  # same attempt: idempotent
    with pytest.raises(CheckpointConflict) as info:
        steps.prepare(1, attempt="loser")
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
    ledger: Ledger, steps: LedgerSteps, setup: str, action: str, expected: str, found: str
) -> None:
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    if setup == "aborted":
        ledger.abort(P, 1, reason="x")
    if setup == "committed":
        steps.prepare(1)
        ledger.mark_committed(P, 1)
    actions = {
        "commit": lambda: ledger.mark_committed(P, 1),
        "prepare": lambda: steps.prepare(1, attempt="other"),
        "abort": lambda: ledger.abort(P, 1, reason="late"),
        "lease": lambda: ledger.acquire_commit_lease(P, 1, owner="o", ttl_s=5),
    }
    with pytest.raises(CheckpointConflict, match=f"expected state {expected}, found {found}"):
        actions[action]()
    assert ledger.get(P, 1).state.value == found


def test_gap_and_overlap_are_refused_with_offsets(ledger: Ledger, steps: LedgerSteps) -> None:
    steps.run_one(RangeSpec("t", 0, 0, 10))
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


def test_skipped_start_is_recorded_not_silent(ledger: Ledger, steps: LedgerSteps) -> None:
    steps.run_one(RangeSpec("t", 0, 0, 10))
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


def test_commits_happen_in_order(ledger: Ledger, steps: LedgerSteps) -> None:
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    ledger.plan(P, [RangeSpec("t", 0, 10, 20)], max_pending=2)
    steps.prepare(2)
    with pytest.raises(InvariantViolation, match="cannot commit checkpoint 2 while checkpoint 1 is PLANNED"):
        ledger.mark_committed(P, 2)
    with pytest.raises(InvariantViolation, match="commit or abort checkpoint 1 first"):
        ledger.acquire_commit_lease(P, 2, owner="o", ttl_s=5)
    steps.prepare(1)
    ledger.mark_committed(P, 1)
    assert ledger.mark_committed(P, 2).state == S.COMMITTED


def test_abort_replans_from_the_same_start(ledger: Ledger, steps: LedgerSteps) -> None:
    steps.run_one(RangeSpec("t", 0, 0, 10))
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


def _plan(shards: int, partitions: int = 3, prefix: str = "eo", sink: str = "out") -> CommitPlan:
    return CommitPlan(
        sink_topic=sink,
        sink_partitions=partitions,
        transactional_id_prefix=prefix,
        marker_group=f"eo-marker.{P}",
        shard_of_partition=tuple(p % shards for p in range(partitions)),
    )


def _shard(ledger: Ledger, cp: int, shard: int, state: str) -> None:
    ledger.record_shard(
        P,
        cp,
        shard,
        transactional_id=f"eo.{P}.{shard}",
        producer_id=None,
        producer_epoch=None,
        state=state,
        records=1,
    )


def test_commit_plan_is_stored_with_the_checkpoint_and_pins_the_prefix(ledger: Ledger) -> None:
    planned = ledger.plan(P, [RangeSpec("t", 0, 0, 10)], commit_plan=_plan(3))
    assert planned.commit_plan == _plan(3)
    assert ledger.get(P, 1).commit_plan == _plan(3)
    assert ledger.get_pipeline(P).transactional_id_prefix == "eo"
    assert [e.kind for e in ledger.events(P)].count("prefix_pinned") == 1
    assert ledger.pin_transactional_id_prefix(P, "eo") == "eo"  # idempotent
    with pytest.raises(TransactionalIdPrefixMismatch, match="Restore the setting") as refused:
        ledger.pin_transactional_id_prefix(P, "other")
    message = str(refused.value)
    assert "'orders'" in message and "'eo'" in message and "'other'" in message
    assert "transactional_id_prefix" in message
    # A plan under another prefix is refused and records nothing.
    ledger.abort(P, 1, reason="test")
    with pytest.raises(TransactionalIdPrefixMismatch):
        ledger.plan(P, [RangeSpec("t", 0, 0, 10)], commit_plan=_plan(1, prefix="other"))
    assert ledger.unfinished(P) is None


def test_freeze_commit_plan_first_caller_wins(ledger: Ledger, steps: LedgerSteps) -> None:
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])  # as planned before revision 0002
    assert ledger.get(P, 1).commit_plan is None
    assert ledger.freeze_commit_plan(P, 1, _plan(3)).commit_plan == _plan(3)
    # A later try with other settings gets the frozen plan, not its own.
    assert ledger.freeze_commit_plan(P, 1, _plan(1)).commit_plan == _plan(3)
    assert ledger.get_pipeline(P).transactional_id_prefix == "eo"
    assert [e.kind for e in ledger.events(P, 1)].count("commit_plan_frozen") == 1
    steps.prepare(1)
    assert ledger.get(P, 1).commit_plan == _plan(3)


def test_freeze_commit_plan_refuses_a_finished_checkpoint_without_plan(
    ledger: Ledger, steps: LedgerSteps
) -> None:
    steps.run_one(RangeSpec("t", 0, 0, 10))
    with pytest.raises(CheckpointConflict):
        ledger.freeze_commit_plan(P, 1, _plan(1))


def test_mark_committed_checks_every_shard_of_the_frozen_plan(ledger: Ledger, steps: LedgerSteps) -> None:
    """Shard rows are checked against the plan's shard count: a missing shard blocks, and a
    row outside the plan (a try made with other settings) neither blocks nor counts."""
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)], commit_plan=_plan(2))
    steps.prepare(1)
    _shard(ledger, 1, 0, "COMMITTED")
    with pytest.raises(InvariantViolation, match=r"shards \[1\]"):
        ledger.mark_committed(P, 1)  # shard 1 has no row yet: not published
    _shard(ledger, 1, 2, "PENDING")  # outside the plan
    _shard(ledger, 1, 1, "PENDING")
    with pytest.raises(InvariantViolation, match=r"shards \[1\]"):
        ledger.mark_committed(P, 1)
    _shard(ledger, 1, 1, "COMMITTED")
    assert ledger.mark_committed(P, 1).state is S.COMMITTED
