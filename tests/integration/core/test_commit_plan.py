"""A checkpoint's commit plan is frozen when it is planned.

Sink topic, its partition count, the shard -> partition map and the transactional-id prefix
are recorded with the checkpoint; every commit try uses the recorded plan, so settings
changed between a partial commit and its retry apply only from the next checkpoint, and a
change that cannot apply (the sink lost partitions) is refused, naming the setting.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import NewPartitions, NewTopic
from eo_faultlib import assert_group_offsets_match_ledger, finish, spawn_commit, stable_and_high
from eo_harness import wait_for

from airflow_provider_eo.errors import EoError
from airflow_provider_eo.kafka import admin
from airflow_provider_eo.ledger import CheckpointState

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

RECORDS = 150


def _grow_sink(h: Any, partitions: int) -> None:
    """Add partitions to the harness's sink topic and wait until the metadata shows them."""
    client = admin.admin_client(h.config)
    client.create_partitions([NewPartitions(h.pipeline.sink_topic, partitions)])[
        h.pipeline.sink_topic
    ].result(timeout=30)
    _wait_for_partitions(h, partitions)


def _wait_for_partitions(h: Any, partitions: int) -> None:
    def shows() -> bool:
        try:
            return admin.partition_count(h.config, h.pipeline.sink_topic) == partitions
        except EoError:  # not there yet (re-creation)
            return False

    wait_for(shows, f"sink {h.pipeline.sink_topic!r} to show {partitions} partitions", timeout=60)


def _recreate_sink(h: Any, partitions: int) -> None:
    """Delete the sink topic and create it again with ``partitions`` partitions."""
    client = admin.admin_client(h.config)
    topic = h.pipeline.sink_topic
    client.delete_topics([topic], operation_timeout=30)[topic].result(timeout=30)

    def created() -> bool:  # the deletion finishes asynchronously: retry until it takes
        try:
            client.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=30)[topic].result(
                timeout=30
            )
            return True
        except KafkaException:
            return False

    wait_for(created, f"sink {topic!r} to be created again", timeout=60)
    _wait_for_partitions(h, partitions)


def _kill_after_first_shard(h: Any) -> None:
    """An ``eo commit`` child killed right after shard 0's ``commit_transaction``."""
    child = spawn_commit(h, fault="commit.after_commit_txn", action="kill", hit=1)
    code, _out, err = finish(child)
    assert code == -signal.SIGKILL, err[-3000:]


@pytest.mark.parametrize(("before", "after"), [(1, 3), (3, 1)])
def test_commit_shards_changed_between_partial_commit_and_retry(
    harness: Callable[..., Any], before: int, after: int
) -> None:
    """Shard 0 of the checkpoint is committed in Kafka, then the committer dies; the retry
    runs with another ``commit_shards``. It must use the checkpoint's frozen shard map:
    every record exactly once, the checkpoint COMMITTED, the group offsets at its ends."""
    h = harness(source_partitions=2, sink_partitions=3, commit_shards=before)
    h.produce(RECORDS, keys=11)
    cid = h.plan().checkpoint_id
    h.prepare(cid)
    _kill_after_first_shard(h)
    assert h.ledger.get(h.pipeline.name, cid).state is CheckpointState.PREPARED
    retry = h.with_(commit_shards=after)
    result = retry.commit(cid)
    assert result.checkpoint.state is CheckpointState.COMMITTED
    h.assert_exactly_once(expected_records=RECORDS)
    assert_group_offsets_match_ledger(h.pipeline, h.ledger)
    # The changed setting applies from the next checkpoint.
    retry.produce(10, start=RECORDS)
    nxt = retry.plan()
    assert nxt.commit_plan is not None and nxt.commit_plan.shards == after


@pytest.mark.parametrize("when", ["before_prepare", "before_commit"])
def test_sink_partitions_grown_after_plan(harness: Callable[..., Any], when: str) -> None:
    """The sink grows from 2 to 4 partitions after the checkpoint was planned: the checkpoint
    is staged and published for the frozen 2 partitions, exactly once."""
    h = harness(source_partitions=2, sink_partitions=2, commit_shards=3)
    h.produce(RECORDS, keys=11)
    cid = h.plan().checkpoint_id
    if when == "before_prepare":
        _grow_sink(h, 4)
    h.prepare(cid)
    if when == "before_commit":
        _grow_sink(h, 4)
    result = h.commit(cid)
    assert result.checkpoint.state is CheckpointState.COMMITTED
    h.assert_exactly_once(expected_records=RECORDS)
    assert_group_offsets_match_ledger(h.pipeline, h.ledger)
    assert {r.partition() for r in h.sink_records()} <= {0, 1}
    cp = h.ledger.get(h.pipeline.name, cid)
    assert cp.commit_plan is not None
    assert (cp.commit_plan.sink_partitions, cp.commit_plan.shards) == (2, 2)


def test_sink_recreated_with_fewer_partitions_is_refused(harness: Callable[..., Any]) -> None:
    """The sink topic is re-created with fewer partitions than the checkpoint was staged for:
    the staged output cannot be placed, so the commit (and the plan that would resume the
    checkpoint) is refused naming the topic and the partition counts; nothing is published
    and the checkpoint stays PREPARED (not silently aborted)."""
    h = harness(source_partitions=2, sink_partitions=3, commit_shards=3)
    h.produce(RECORDS, keys=11)
    cid = h.plan().checkpoint_id
    h.prepare(cid)
    _recreate_sink(h, 2)
    sink = h.pipeline.sink_topic
    with pytest.raises(EoError) as refused:
        h.commit(cid)
    message = str(refused.value)
    assert sink in message and "3 partitions" in message and "sink_topic" in message, message
    assert h.ledger.get(h.pipeline.name, cid).state is CheckpointState.PREPARED
    assert all(v == 0 for v in stable_and_high(h.pipeline)[1].values())
    with pytest.raises(EoError, match="3 partitions"):
        h.plan()


def _forget_commit_plan(h: Any, checkpoint_id: int) -> None:
    """Make the checkpoint look planned before ledger revision 0002 (no frozen plan)."""
    from sqlalchemy import null, update

    from airflow_provider_eo.ledger.models import Checkpoint

    with h.ledger._db.write() as s:
        row = Checkpoint.checkpoint_id == checkpoint_id
        s.execute(update(Checkpoint).where(row).values(commit_plan=null()))
    assert h.ledger.get(h.pipeline.name, checkpoint_id).commit_plan is None


def test_checkpoint_from_before_the_plan_column_freezes_at_prepare_and_first_commit(
    harness: Callable[..., Any],
) -> None:
    """A checkpoint without a frozen plan (planned before revision 0002) gets one at prepare
    (still PLANNED) or at its first commit try (PREPARED, for the partition count its output
    was staged for); a retry with other settings then uses it."""
    h = harness(source_partitions=2, sink_partitions=3, commit_shards=3)
    h.produce(RECORDS, keys=11)
    cid = h.plan().checkpoint_id
    _forget_commit_plan(h, cid)
    h.prepare(cid)
    frozen = h.ledger.get(h.pipeline.name, cid).commit_plan
    assert frozen is not None and (frozen.sink_partitions, frozen.shards) == (3, 3)
    _forget_commit_plan(h, cid)  # as if prepared before revision 0002 too
    _kill_after_first_shard(h)
    frozen = h.ledger.get(h.pipeline.name, cid).commit_plan
    assert frozen is not None and frozen.shards == 3  # frozen by the first commit try
    result = h.with_(commit_shards=1).commit(cid)
    assert result.checkpoint.state is CheckpointState.COMMITTED
    h.assert_exactly_once(expected_records=RECORDS)
    assert_group_offsets_match_ledger(h.pipeline, h.ledger)
