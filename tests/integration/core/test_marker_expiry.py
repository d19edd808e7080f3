"""Commit markers are group offsets and expire; the proof of a commit
must not. A checkpoint killed after one shard's Kafka commit (before the ledger update),
retried after that shard's marker expired, must not publish the shard again: the retry
reads the proof back from the committed output (the provenance header names the
checkpoint and the pipeline identity).

Runs its own broker with ``offsets.retention.minutes=1`` (the session broker keeps the
default seven days).
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from eo_faultlib import assert_group_offsets_match_ledger, marker
from eo_harness import Harness, wait_for

from airflow_provider_eo.errors import KafkaAdminError
from airflow_provider_eo.kafka.admin import ensure_topic
from airflow_provider_eo.ledger import CheckpointState, ShardState
from airflow_provider_eo.pipeline import Pipeline
from airflow_provider_eo.stack.kafka import LocalKafka

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def short_retention_kafka() -> Iterator[dict[str, Any]]:
    """A broker of our own whose group offsets expire one minute after their commit (the
    expiry check runs every second)."""
    import os

    kafka = LocalKafka(
        home=ROOT / ".eo" / "test-kafka" / f"{os.getpid()}-retention",
        extra_config={
            "offsets.retention.minutes": "1",
            "offsets.retention.check.interval.ms": "1000",
        },
    )
    kafka.wipe()
    info = kafka.up(timeout_s=120)
    try:
        yield {"bootstrap.servers": info.bootstrap}
    finally:
        kafka.wipe()


@pytest.fixture()
def expiring(
    tmp_path: Path, short_retention_kafka: dict[str, Any], spark: Any
) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def _make(**kw: Any) -> Harness:
        source, sink = f"src-{uuid.uuid4().hex[:10]}", f"sink-{uuid.uuid4().hex[:10]}"
        ensure_topic(short_retention_kafka, source, partitions=2)
        ensure_topic(short_retention_kafka, sink, partitions=3)
        pipeline = Pipeline(
            name=f"p-{uuid.uuid4().hex[:8]}",
            kafka=dict(short_retention_kafka),
            source_topics=[source],
            sink_topic=sink,
            transform="eo_test_transforms:identity",
            ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
            staging_dir=str(tmp_path / "staging"),
            **kw,
        )
        h = Harness(pipeline, dict(short_retention_kafka), spark)
        made.append(h)
        return h

    yield _make
    for h in made:
        h.ledger.close()


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

    # Wait (poll) until the broker expired every marker of the pipeline.
    def expired() -> bool:
        try:
            return all(marker(h.pipeline, s) == -1 for s in range(3))
        except KafkaAdminError:  # a read timed out (a loaded machine): poll again
            return False

    wait_for(expired, "the commit markers to expire", timeout=300)
    result = h.commit(planned.checkpoint_id)
    assert result.checkpoint.state is CheckpointState.COMMITTED
    assert result.shards_skipped == 1  # shard 0: proven by its committed output
    h.assert_exactly_once(expected_records=600)
    assert_group_offsets_match_ledger(h.pipeline, h.ledger)
    # The next checkpoint, with no marker and no try begun, publishes normally.
    h.produce(90, start=600)
    assert len(h.drain()) == 1
    h.assert_exactly_once(expected_records=690)
