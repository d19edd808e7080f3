"""The fence lease (an abort's or a recovery's hold on every unfinished checkpoint's commit
lease) and the conditional abort it guards, on a real SQLite ledger.

A pipeline's transactional ids are one per commit shard, shared by all its checkpoints, so
fencing them for one checkpoint fences the committer of any other: the fence lease is refused
while any committer holds a live lease, and while it is held no committer passes its lease
check. The abort is refused while a committer holds a live lease on what it aborts.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

import pytest

from airflow_provider_eo.ledger import (
    CheckpointConflict,
    CheckpointState,
    CommitLeaseHeld,
    Ledger,
    RangeSpec,
    leases,
)

if TYPE_CHECKING:
    from tests.unit.ledger.conftest import LedgerSteps

P = "orders"
FENCE = "fence:alice@host:42"
COMMITTER = "eo.orders"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[dt.timedelta]:
    """How far the database's clock is moved on (append to move it further)."""
    moved = [dt.timedelta(0)]
    real = leases.database_now
    monkeypatch.setattr(leases, "database_now", lambda s: real(s) + sum(moved, dt.timedelta(0)))
    return moved


def _two_prepared(ledger: Ledger, steps: LedgerSteps) -> None:
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)], max_pending=3)
    ledger.plan(P, [RangeSpec("t", 0, 10, 20)], max_pending=3)
    steps.prepare(1)
    steps.prepare(2)


def test_abort_is_refused_while_a_committer_holds_a_live_lease(ledger: Ledger, steps: LedgerSteps) -> None:
    _two_prepared(ledger, steps)
    held = ledger.acquire_commit_lease(P, 1, owner=COMMITTER, ttl_s=300)
    with pytest.raises(leases.CommitInProgress) as refused:
        ledger.abort(P, 1, reason="staging lost")
    error = refused.value
    assert isinstance(error, CommitLeaseHeld)
    assert (error.pipeline, error.checkpoint_id, error.owner) == (P, 1, COMMITTER)
    assert error.until == held.commit_lease_until
    message = str(error)
    assert "pipeline 'orders'" in message and "checkpoint 1" in message and f"{COMMITTER!r}" in message
    assert "wait" in message and "stop it first" in message
    # Nothing changed: both checkpoints stay PREPARED, the heads do not move back.
    assert [c.state for c in ledger.list_checkpoints(P)] == [CheckpointState.PREPARED] * 2
    assert ledger.next_starts(P) == {("t", 0): 20}


def test_abort_is_refused_while_a_later_checkpoint_it_cascades_to_is_leased(
    ledger: Ledger, steps: LedgerSteps
) -> None:
    """Every checkpoint the abort takes with it is checked like the target: here another
    fence holds checkpoint 2 (its hold on 1 is released)."""
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)], max_pending=3)
    ledger.plan(P, [RangeSpec("t", 0, 10, 20)], max_pending=3)
    steps.prepare(2)
    assert ledger.acquire_fence_lease(P, owner="fence:other", ttl_s=300) == [1, 2]
    assert ledger.release_commit_lease(P, 1, owner="fence:other")
    with pytest.raises(leases.CommitInProgress, match="checkpoint 2") as refused:
        ledger.abort(P, 1, reason="replan")
    assert refused.value.checkpoint_id == 2 and refused.value.owner == "fence:other"
    assert ledger.get(P, 1).state is CheckpointState.PLANNED


def test_an_expired_lease_does_not_stop_the_abort(
    ledger: Ledger, steps: LedgerSteps, clock: list[dt.timedelta]
) -> None:
    _two_prepared(ledger, steps)
    ledger.acquire_commit_lease(P, 1, owner=COMMITTER, ttl_s=30)
    clock.append(dt.timedelta(seconds=31))
    assert ledger.abort(P, 1, reason="committer died").state is CheckpointState.ABORTED


def test_the_fence_lease_holds_every_unfinished_checkpoint(
    ledger: Ledger, steps: LedgerSteps, clock: list[dt.timedelta]
) -> None:
    steps.run_one(RangeSpec("t", 0, 0, 10))
    ledger.plan(P, [RangeSpec("t", 0, 10, 20)], max_pending=3)
    ledger.plan(P, [RangeSpec("t", 0, 20, 30)], max_pending=3)
    steps.prepare(2)  # 2 PREPARED, 3 PLANNED
    assert ledger.acquire_fence_lease(P, owner=FENCE, ttl_s=60) == [2, 3]
    assert [ledger.get(P, n).commit_owner for n in (1, 2, 3)] == [None, FENCE, FENCE]
    # No committer of 2 begins while the lease runs.
    with pytest.raises(CommitLeaseHeld, match=f"being committed by {FENCE!r}"):
        ledger.acquire_commit_lease(P, 2, owner=COMMITTER, ttl_s=60)
    clock.append(dt.timedelta(seconds=59))
    with pytest.raises(CommitLeaseHeld):
        ledger.acquire_commit_lease(P, 2, owner=COMMITTER, ttl_s=60)
    # Released: committers go on at once.
    assert ledger.release_fence_lease(P, owner=FENCE) == 2
    assert ledger.acquire_commit_lease(P, 2, owner=COMMITTER, ttl_s=60).commit_owner == COMMITTER
    kinds = [(e.checkpoint_id, e.details.get("owner")) for e in ledger.events(P) if e.kind == "lease"]
    assert (2, FENCE) in kinds and (3, FENCE) in kinds


def test_a_planned_checkpoint_leased_by_the_fence_is_not_committed_once_prepared(
    ledger: Ledger, steps: LedgerSteps
) -> None:
    """Prepare may finish while the abort of a PLANNED checkpoint fences: the lease taken on the
    PLANNED row still keeps its committer from beginning."""
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    assert ledger.acquire_fence_lease(P, owner=FENCE, ttl_s=60) == [1]
    steps.prepare(1)
    with pytest.raises(CommitLeaseHeld, match=f"being committed by {FENCE!r}"):
        ledger.acquire_commit_lease(P, 1, owner=COMMITTER, ttl_s=60)


def test_the_fence_lease_is_refused_while_any_checkpoint_is_being_committed(
    ledger: Ledger, steps: LedgerSteps
) -> None:
    _two_prepared(ledger, steps)
    held = ledger.acquire_commit_lease(P, 1, owner=COMMITTER, ttl_s=300)
    with pytest.raises(leases.CommitInProgress) as refused:
        ledger.acquire_fence_lease(P, owner=FENCE, ttl_s=60)
    error = refused.value
    assert (error.checkpoint_id, error.owner, error.until) == (1, COMMITTER, held.commit_lease_until)
    assert f"checkpoint 1 is being committed by {COMMITTER!r} until" in str(error)
    assert "wait, or stop it first" in str(error)
    # All or nothing: checkpoint 2 was not leased either.
    assert ledger.get(P, 2).commit_owner is None
    # take_over (a committer known to be dead): the lease is taken anyway.
    assert ledger.acquire_fence_lease(P, owner=FENCE, ttl_s=60, take_over=True) == [1, 2]
    assert ledger.get(P, 1).commit_owner == FENCE


def test_a_committed_checkpoints_lease_does_not_count(ledger: Ledger, steps: LedgerSteps) -> None:
    ledger.plan(P, [RangeSpec("t", 0, 0, 10)])
    steps.prepare(1)
    ledger.acquire_commit_lease(P, 1, owner=COMMITTER, ttl_s=300)
    ledger.mark_committed(P, 1)  # the committer is done; its lease runs on, unused
    ledger.plan(P, [RangeSpec("t", 0, 10, 20)])
    assert ledger.acquire_fence_lease(P, owner=FENCE, ttl_s=60) == [2]


def test_an_expired_committer_lease_is_taken_over(
    ledger: Ledger, steps: LedgerSteps, clock: list[dt.timedelta]
) -> None:
    """A committer whose lease ran out is dead or paused: the fence that follows stops it."""
    _two_prepared(ledger, steps)
    ledger.acquire_commit_lease(P, 1, owner=COMMITTER, ttl_s=30)
    clock.append(dt.timedelta(seconds=31))
    assert ledger.acquire_fence_lease(P, owner=FENCE, ttl_s=60) == [1, 2]
    event = next(e for e in reversed(ledger.events(P, 1)) if e.kind == "lease")
    assert event.details["owner"] == FENCE and event.details["previous_owner"] == COMMITTER


def test_renewal_extends_a_lease_that_is_still_ours_even_when_it_ran_out(
    ledger: Ledger, steps: LedgerSteps, clock: list[dt.timedelta]
) -> None:
    _two_prepared(ledger, steps)
    ledger.acquire_fence_lease(P, owner=FENCE, ttl_s=30)
    clock.append(dt.timedelta(minutes=10))  # the fence took long; nobody took the lease
    assert ledger.renew_fence_lease(P, owner=FENCE, ttl_s=30) == [1, 2]
    with pytest.raises(CommitLeaseHeld):
        ledger.acquire_commit_lease(P, 1, owner=COMMITTER, ttl_s=60)


def test_renewal_fails_once_a_committer_took_the_lease_over(
    ledger: Ledger, steps: LedgerSteps, clock: list[dt.timedelta]
) -> None:
    _two_prepared(ledger, steps)
    ledger.acquire_fence_lease(P, owner=FENCE, ttl_s=30)
    clock.append(dt.timedelta(seconds=31))
    ledger.acquire_commit_lease(P, 1, owner=COMMITTER, ttl_s=30)
    clock.append(dt.timedelta(seconds=31))  # and even when that committer's lease ran out too
    with pytest.raises(leases.CommitInProgress, match=f"checkpoint 1 .*{COMMITTER!r}") as lost:
        ledger.renew_fence_lease(P, owner=FENCE, ttl_s=30)
    assert lost.value.owner == COMMITTER
    assert ledger.get(P, 1).commit_owner == COMMITTER  # nothing taken back


def test_the_abort_under_a_fence_lease_that_a_committer_took_over_is_refused(
    ledger: Ledger, steps: LedgerSteps, clock: list[dt.timedelta]
) -> None:
    """The committer that took the lease over may have begun a transaction after the abort read
    the markers: the abort must not go on, expired or not."""
    _two_prepared(ledger, steps)
    ledger.acquire_fence_lease(P, owner=FENCE, ttl_s=30)
    clock.append(dt.timedelta(seconds=31))
    ledger.acquire_commit_lease(P, 1, owner=COMMITTER, ttl_s=30)
    clock.append(dt.timedelta(seconds=31))
    with pytest.raises(leases.CommitInProgress, match=f"{COMMITTER!r}"):
        ledger.abort(P, 1, reason="replan", lease_owner=FENCE)
    assert ledger.get(P, 1).state is CheckpointState.PREPARED


def test_the_abort_under_its_own_fence_lease_releases_what_stays_unfinished(
    ledger: Ledger, steps: LedgerSteps
) -> None:
    _two_prepared(ledger, steps)
    ledger.acquire_fence_lease(P, owner=FENCE, ttl_s=300)
    assert ledger.abort(P, 2, reason="replan", lease_owner=FENCE).state is CheckpointState.ABORTED
    # Checkpoint 1 stays: its committer may go on at once.
    assert ledger.acquire_commit_lease(P, 1, owner=COMMITTER, ttl_s=60).commit_owner == COMMITTER


def test_the_abort_is_idempotent_and_refuses_a_committed_checkpoint(
    ledger: Ledger, steps: LedgerSteps
) -> None:
    _two_prepared(ledger, steps)
    ledger.abort(P, 2, reason="first")
    assert ledger.abort(P, 2, reason="again").abort_reason == "first"
    ledger.mark_committed(P, 1)
    with pytest.raises(CheckpointConflict, match="found COMMITTED"):
        ledger.abort(P, 1, reason="late")
