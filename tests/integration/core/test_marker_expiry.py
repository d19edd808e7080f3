"""Commit markers are group offsets and expire; the proof of a commit
must not. A checkpoint killed after one shard's Kafka commit (before the ledger update),
retried after that shard's marker expired, must not publish the shard again: the retry
reads the proof back from the committed output (the provenance header names the
checkpoint and the pipeline identity).

The markers' expiry is the marker group's deletion: once the broker has expired every
offset of a group with no members (``offsets.retention.minutes`` after the last commit), it
removes the group, which is the state ``kafka-consumer-groups --delete`` leaves at once.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from eo_faultlib import assert_group_offsets_match_ledger, marker
from eo_harness import Harness

from airflow_provider_eo import names
from airflow_provider_eo.kafka.admin import admin_client, ensure_topic
from airflow_provider_eo.ledger import CheckpointState, ShardState
from airflow_provider_eo.pipeline import Pipeline

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.fixture()
def expiring(tmp_path: Path, kafka_config: dict[str, Any], spark: Any) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def _make(**kw: Any) -> Harness:
        source, sink = f"src-{uuid.uuid4().hex[:10]}", f"sink-{uuid.uuid4().hex[:10]}"
        ensure_topic(kafka_config, source, partitions=2)
        ensure_topic(kafka_config, sink, partitions=3)
        pipeline = Pipeline(
            name=f"p-{uuid.uuid4().hex[:8]}",
            kafka=dict(kafka_config),
            source_topics=[source],
            sink_topic=sink,
            transform="eo_test_transforms:identity",
            ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
            staging_dir=str(tmp_path / "staging"),
            **kw,
        )
        h = Harness(pipeline, dict(kafka_config), spark)
        made.append(h)
        return h

    yield _make
    for h in made:
        h.ledger.close()


def _expire_markers(pipeline: Pipeline) -> None:
    """What the broker does once the markers' retention passed: the group and its offsets go."""
    group = names.marker_group(pipeline)
    futures = admin_client(pipeline.kafka).delete_consumer_groups([group], request_timeout=30)
    futures[group].result(timeout=60)


def test_expired_marker_of_a_published_shard_does_not_republish(expiring: Callable[..., Harness]) -> None:
    h = expiring(commit_shards=3)
    h.produce(300)
    assert len(h.drain()) == 1  # an earlier COMMITTED checkpoint (its markers expire too)
    h.produce(300, start=300)
    planned = h.plan()
    h.prepare(planned.checkpoint_id)
    # Shard 0's transaction commits, then the committer dies before the ledger update.
    proc = h.cli("commit", fault="commit.after_commit_txn")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    cp = h.ledger.get(h.pipeline.name, planned.checkpoint_id)
    assert cp.state is CheckpointState.PREPARED
    assert [(s.shard, s.state) for s in cp.shards] == [(0, ShardState.PENDING)]
    assert marker(h.pipeline, 0) == planned.checkpoint_id

    _expire_markers(h.pipeline)
    assert [marker(h.pipeline, s) for s in range(3)] == [-1, -1, -1]
    result = h.commit(planned.checkpoint_id)
    assert result.checkpoint.state is CheckpointState.COMMITTED
    assert result.shards_skipped == 1  # shard 0: proven by its committed output
    h.assert_exactly_once(expected_records=600)
    assert_group_offsets_match_ledger(h.pipeline, h.ledger)
    # The next checkpoint, with no marker and no try begun, publishes normally.
    h.produce(90, start=600)
    assert len(h.drain()) == 1
    h.assert_exactly_once(expected_records=690)
