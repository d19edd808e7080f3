"""Faults of a checkpoint committed in several shards (one Kafka transaction each).

Three sink partitions, ``commit_shards=3``: shard ``n`` publishes sink partition ``n``
and holds its commit marker; the last shard also moves the pipeline's group offsets.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import pytest
from eo_faultlib import (
    assert_group_offsets_match_ledger,
    finish,
    group_offsets,
    kill_child,
    marker,
    paused_commit,
    sigcont,
    spawn_commit,
    stable_and_high,
)

from airflow_provider_eo.ledger import CheckpointState

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

RECORDS = 150


def _prepared(harness: Callable[..., Any]) -> tuple[Any, Any]:
    h = harness(source_partitions=2, sink_partitions=3, commit_shards=3)
    h.produce(RECORDS, keys=11)
    planned = h.plan()
    h.prepare(planned.checkpoint_id)
    return h, planned


def _staged_per_partition(h: Any, checkpoint_id: int) -> dict[int, int]:
    from airflow_provider_eo import staging

    cp = h.ledger.get(h.pipeline.name, checkpoint_id)
    manifest = staging.read_manifest(cp.staging_location or "")
    return {p: sum(f.records for f in files) for p, files in manifest.files.items()}


def test_multishard_zombie_is_fenced(harness: Callable[..., Any]) -> None:
    """A committer stopped inside shard 1 (shard 0 committed, shard 1's records produced and
    flushed, its transaction open) while a second committer finishes the checkpoint: when
    the zombie resumes, none of its records become visible."""
    h, planned = _prepared(harness)
    cid = planned.checkpoint_id
    per_partition = _staged_per_partition(h, cid)
    assert all(per_partition.get(p, 0) > 0 for p in range(3)), per_partition
    zombie = paused_commit(h, "commit.before_commit_txn", hit=2)
    try:
        # shard 0 is published, shard 1's records sit on the broker in an open transaction
        assert [marker(h.pipeline, s) >= cid for s in range(3)] == [True, False, False]
        lso, hw = stable_and_high(h.pipeline)
        sink = h.pipeline.sink_topic
        assert lso[(sink, 0)] > 0 and hw[(sink, 1)] - lso[(sink, 1)] >= per_partition[1], (lso, hw)
        h.expire_lease(cid)  # paused, the zombie cannot renew its lease: it runs out
        result = h.commit(cid)  # init_transactions of shard 1 fences the zombie
        assert result.checkpoint.state is CheckpointState.COMMITTED
        assert result.shards_skipped == 1
        assert result.published == per_partition[1] + per_partition[2]
        ends_before = stable_and_high(h.pipeline)[0]
    finally:
        sigcont(zombie.pid)
    try:
        code, _out, err = finish(zombie)
    finally:
        kill_child(zombie)
    assert code != 0, err[-3000:]
    assert "fenced" in err.lower() or "epoch" in err.lower(), err[-3000:]
    # the zombie's resume added nothing a read_committed consumer can see
    assert stable_and_high(h.pipeline)[0] == ends_before
    h.assert_exactly_once(expected_records=RECORDS)
    assert_group_offsets_match_ledger(h.pipeline, h.ledger)


@pytest.mark.parametrize(
    ("step", "hit", "done_shards"),
    [
        ("commit.after_commit_txn", 1, 1),  # shard 0 committed in Kafka, nothing after it
        ("commit.after_begin", 2, 1),  # inside shard 1, its transaction open
        ("commit.before_end_txn", 3, 2),  # last shard: group offsets sent, not committed
    ],
)
def test_crash_between_shards(harness: Callable[..., Any], step: str, hit: int, done_shards: int) -> None:
    """The committer is killed part-way through the shards; the group offsets move only
    with the last shard's commit, and the retry publishes only the missing shards."""
    h, planned = _prepared(harness)
    cid = planned.checkpoint_id
    per_partition = _staged_per_partition(h, cid)
    child = spawn_commit(h, fault=step, action="kill", hit=hit)
    code, _out, err = finish(child)
    assert code == -signal.SIGKILL, err[-3000:]
    assert h.ledger.get(h.pipeline.name, cid).state is CheckpointState.PREPARED
    # Markers are read read_committed: a shard whose transaction holds pending offsets would
    # be waited out until the broker aborts it, so only shards with nothing pending are read.
    readable = range(3) if step != "commit.before_end_txn" else range(done_shards)
    assert [marker(h.pipeline, s) >= cid for s in readable] == [s < done_shards for s in readable]
    if step != "commit.before_end_txn":  # not moved: the last shard never committed
        assert group_offsets(h.pipeline, [(r.topic, r.partition) for r in planned.ranges]) == {}
    result = h.commit(cid)
    assert result.checkpoint.state is CheckpointState.COMMITTED
    assert result.shards_skipped == done_shards
    assert result.published == sum(per_partition[p] for p in range(done_shards, 3))
    h.assert_exactly_once(expected_records=RECORDS)
    assert_group_offsets_match_ledger(h.pipeline, h.ledger)
