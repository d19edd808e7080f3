"""An abort must not race a live committer, and an unreadable staging
area is retried, never aborted.

Real broker, real Spark prepare, committer children stopped at a named step (SIGSTOP).
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from eo_faultlib import assert_group_offsets_match_ledger, finish, kill_child, paused_commit, sigcont
from eo_harness import Harness
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from airflow_provider_eo import names
from airflow_provider_eo.errors import AbortRefused, EoError, StagingError, StagingUnreadable
from airflow_provider_eo.ledger import CheckpointState, ShardState
from airflow_provider_eo.ledger.models import Checkpoint, Pipeline

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def _expire_lease(h: Harness, checkpoint_id: int) -> None:
    """Move the commit lease's end into the past: what the clock passing the TTL does (the
    paused committer cannot renew it)."""
    past = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)
    with Session(h.ledger.engine) as s, s.begin():
        pid = s.execute(select(Pipeline.id).where(Pipeline.name == h.pipeline.name)).scalar_one()
        s.execute(
            update(Checkpoint)
            .where(Checkpoint.pipeline_id == pid, Checkpoint.checkpoint_id == checkpoint_id)
            .values(commit_lease_until=past)
        )


def _corrupt_staging(location: str) -> None:
    victim = next(Path(location).rglob("*.parquet"))
    victim.write_bytes(victim.read_bytes()[:100])  # a verified mismatch (size and checksum)


def test_abort_refused_while_committer_live_then_fences_it(harness: Callable[..., Harness]) -> None:
    """A committer paused with its records produced (before ``send_offsets_to_transaction``)
    while a second commit finds the staging corrupt and tries to abort.

    Old code: the abort only read the markers (none yet), aborted, the range was replanned
    and published, and the resumed committer then committed the same records: duplicates.
    Now: refused while the committer's shard is PENDING under a live lease; once the lease
    expired, the abort fences the paused committer before reading the markers, so it fails
    on resume, none of its records are visible, and the range is published exactly once.
    """
    h = harness(source_partitions=2, sink_partitions=1)
    h.produce(60)
    planned = h.plan()
    prepared = h.prepare(planned.checkpoint_id).checkpoint
    zombie = paused_commit(h, "commit.before_commit_txn")
    outcomes: list[str] = []
    try:
        cp = h.ledger.get(h.pipeline.name, planned.checkpoint_id)
        assert [s.state for s in cp.shards] == [ShardState.PENDING]
        _corrupt_staging(prepared.staging_location or "")
        # 1. The second commit finds a verified mismatch and tries to abort.
        try:
            h.commit(planned.checkpoint_id)
        except EoError as exc:
            outcomes.append(f"{type(exc).__name__}: {exc}")
        state_after_first = h.ledger.get(h.pipeline.name, planned.checkpoint_id).state
        if state_after_first is CheckpointState.PREPARED:
            # 2. The lease expired (the committer stays paused): the abort fences it.
            _expire_lease(h, planned.checkpoint_id)
            with pytest.raises(StagingError, match="ABORTED"):
                h.commit(planned.checkpoint_id)
    finally:
        sigcont(zombie.pid)
    try:
        rc, _out, err = finish(zombie)
    finally:
        kill_child(zombie)
    # 3. The range is replanned and published (old code: a second time).
    results = h.drain()
    h.assert_exactly_once(expected_records=60)
    assert_group_offsets_match_ledger(h.pipeline, h.ledger)
    # What each step did (checked after the audit, so old code shows its double publish).
    assert state_after_first is CheckpointState.PREPARED, outcomes
    assert outcomes and outcomes[0].startswith("AbortRefused") and "live committer" in outcomes[0]
    assert h.ledger.get(h.pipeline.name, planned.checkpoint_id).state is CheckpointState.ABORTED
    assert rc != 0 and ("fenced" in err.lower() or "epoch" in err.lower()), err[-3000:]
    (replanned,) = results
    assert replanned.checkpoint.ranges == planned.ranges


def test_abort_of_committed_checkpoint_is_refused(harness: Callable[..., Harness]) -> None:
    from airflow_provider_eo.core.abort import abort_checkpoint

    h = harness(source_partitions=1, sink_partitions=1)
    h.produce(10)
    (result,) = h.drain()
    with pytest.raises(AbortRefused, match="COMMITTED"):
        abort_checkpoint(h.pipeline, h.ledger, result.checkpoint.checkpoint_id, reason="test")
    h.assert_exactly_once(expected_records=10)


def test_unreadable_staging_is_retried_not_aborted(harness: Callable[..., Harness]) -> None:
    """An I/O error while reading the staging area (here: the manifest's path is a folder,
    so opening it fails with an OSError as a storage outage would) fails the commit
    retryably: the checkpoint stays PREPARED, nothing is published. Old code aborted it."""
    h = harness(source_partitions=2, sink_partitions=2)
    h.produce(80)
    planned = h.plan()
    prepared = h.prepare(planned.checkpoint_id).checkpoint
    manifest = Path(prepared.staging_location or "") / names.MANIFEST
    saved = manifest.with_name("manifest.saved")
    shutil.move(manifest, saved)
    manifest.mkdir()
    with pytest.raises(StagingUnreadable, match="retry the commit once the storage answers"):
        h.commit(planned.checkpoint_id)
    cp = h.ledger.get(h.pipeline.name, planned.checkpoint_id)
    assert cp.state is CheckpointState.PREPARED
    assert sum(c.observed for c in h.audit().checkpoints) == 0  # nothing published
    # The storage answers again: the retry commits exactly once.
    manifest.rmdir()
    shutil.move(saved, manifest)
    result = h.commit(planned.checkpoint_id)
    assert result.checkpoint.state is CheckpointState.COMMITTED and result.published == 80
    h.assert_exactly_once(expected_records=80)
    assert_group_offsets_match_ledger(h.pipeline, h.ledger)
