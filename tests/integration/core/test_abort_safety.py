"""Aborting a later checkpoint, or ``eo recover``, while a committer of an earlier checkpoint
is live: real broker, real Spark prepare, the committer a child ``eo commit`` stopped
(SIGSTOP) with its transaction open.

The pipeline's transactional ids are one per commit shard, shared by all its checkpoints:
fencing them for checkpoint 2 fences the committer of checkpoint 1. Both are refused while
that committer holds its lease; it resumes and commits; then the abort goes through and the
range is replanned and published exactly once.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from eo_faultlib import assert_group_offsets_match_ledger, finish, kill_child, paused_commit, sigcont
from eo_harness import Harness

from airflow_provider_eo.core.abort import abort_checkpoint
from airflow_provider_eo.core.plan import plan_checkpoint
from airflow_provider_eo.errors import EoError
from airflow_provider_eo.ledger import CheckpointState

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_abort_of_a_later_checkpoint_and_recover_leave_the_live_committer_alone(
    harness: Callable[..., Harness],
) -> None:
    h = harness(source_partitions=2, sink_partitions=1, max_pending=2)
    h.produce(60)
    first = h.plan()
    h.prepare(first.checkpoint_id)
    h.produce(40, start=60)
    second = plan_checkpoint(h.pipeline, h.ledger, next_only=True)
    assert second is not None and second.checkpoint_id == first.checkpoint_id + 1
    h.prepare(second.checkpoint_id)
    committer = paused_commit(h, "commit.before_commit_txn")  # commits `first`: the lowest
    outcomes: list[str] = []
    try:
        # 1. Abort the later checkpoint while the committer of the earlier one is live.
        try:
            abort_checkpoint(h.pipeline, h.ledger, second.checkpoint_id, reason="test")
            outcomes.append("aborted")
        except EoError as exc:
            outcomes.append(f"{type(exc).__name__}: {exc}")
        # 2. `eo recover` at the same moment.
        recover = h.cli("recover")
        # The whole refusal, its line wrapping undone (the terminal width wraps it).
        outcomes.append(f"recover rc={recover.returncode}: {' '.join(recover.stderr.split())}")
    finally:
        sigcont(committer.pid)
    try:
        rc, _out, err = finish(committer)
    finally:
        kill_child(committer)
    # 3. The committer was not fenced; now nothing commits, the abort goes through.
    abort_checkpoint(h.pipeline, h.ledger, second.checkpoint_id, reason="test")
    results = h.drain()
    h.assert_exactly_once(expected_records=100)
    assert_group_offsets_match_ledger(h.pipeline, h.ledger)
    # What each step did (after the audit, so a regression shows its effect first).
    assert rc == 0, (outcomes, err[-3000:])
    abort_refusal, recover_refusal = outcomes
    assert abort_refusal.startswith("AbortRefused"), outcomes
    assert f"checkpoint {first.checkpoint_id} is being committed by " in abort_refusal
    assert "wait, or stop it first" in abort_refusal
    assert recover_refusal.startswith("recover rc=1"), outcomes
    assert f"checkpoint {first.checkpoint_id} is being committed by " in recover_refusal
    assert h.ledger.get(h.pipeline.name, first.checkpoint_id).state is CheckpointState.COMMITTED
    assert h.ledger.get(h.pipeline.name, second.checkpoint_id).state is CheckpointState.ABORTED
    (replanned,) = results
    assert replanned.checkpoint.ranges == second.ranges
